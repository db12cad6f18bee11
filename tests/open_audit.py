"""Watch which files a process opens, stats or lists, and log every one outside the places it may touch.

`install(log, allowed)` adds an audit hook (`open`, `os.listdir`, `os.scandir`) and wraps `os.stat` /
`os.lstat` (an existence check has no audit event, and "is the recorded checkpoint there?" is exactly the
question a reader must never ask). Each path outside `allowed` and the interpreter's own install is appended
to `log`, one line each. Used by tests/test_no_host_paths.py in a child process: `python -c` imports this,
installs it, then runs the reader.
"""

from __future__ import annotations

import os
import site
import sys

SYSTEM = ("/usr", "/lib", "/lib64", "/etc", "/proc", "/sys", "/dev")


def _roots(allowed: list[str]) -> tuple[str, ...]:
    own = [sys.prefix, sys.base_prefix, sys.exec_prefix, *site.getsitepackages()]
    roots = [*allowed, *own, *SYSTEM]
    return tuple(dict.fromkeys(r.rstrip("/") for p in roots for r in (p, os.path.realpath(p))))


def install(log: str, allowed: list[str]) -> None:
    roots = _roots([*allowed, log])
    raw_stat, raw_lstat = os.stat, os.lstat

    def outside(path: object) -> str | None:
        if isinstance(path, int) or path is None:
            return None
        p = os.path.abspath(os.fsdecode(path))  # type: ignore[arg-type]
        inside = any(p == r or p.startswith(r + "/") for r in roots)
        above = any(r.startswith(p.rstrip("/") + "/") for r in roots)  # resolve() and mkdir walk up: harmless
        return None if inside or above else p

    def note(how: str, path: object) -> None:
        p = outside(path)
        if p is not None:
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(fd, f"{how} {p}\n".encode())
            os.close(fd)

    def hook(event: str, args: tuple) -> None:
        if event in ("open", "os.listdir", "os.scandir") and args:
            note(event, args[0])

    def stat(path, *a, **k):  # type: ignore[no-untyped-def]
        note("stat", path)
        return raw_stat(path, *a, **k)

    def lstat(path, *a, **k):  # type: ignore[no-untyped-def]
        note("lstat", path)
        return raw_lstat(path, *a, **k)

    os.stat, os.lstat = stat, lstat
    sys.addaudithook(hook)
