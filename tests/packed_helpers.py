"""Committed exports are xz-packed (`*.sqlite.xz`, kit.trace.sqlite); a test that copies, cuts or writes a
report, or hands it to sqlite3 or nsys, needs it as a plain file. `plain` unpacks each once per test process
into a temp folder removed at exit; the kit's own readers open the packed files directly."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from kit.rundir import RunDir
from kit.trace.sqlite import PACKED, unpack

_dir: Path | None = None
_done: dict[Path, Path] = {}


def plain(packed: Path) -> Path:
    """The plain SQLite file of a committed `X.sqlite.xz` (read-only use: copy it before changing it)."""
    global _dir
    packed = packed.resolve()
    if packed not in _done:
        if _dir is None:
            _dir = Path(tempfile.mkdtemp(prefix="kit-plain-"))
            atexit.register(shutil.rmtree, _dir, True)
        dst = _dir / str(len(_done)) / packed.parent.name / packed.name.removesuffix(".xz")  # names kept
        dst.parent.mkdir(parents=True)
        _done[packed] = unpack(packed, dst)
        dst.chmod(0o444)
    return _done[packed]


def plain_run(run: Path, dst: Path) -> Path:
    """A copy of a committed run directory with its export as plain `profile.sqlite` (the packed one left
    out)."""
    shutil.copytree(run, dst, symlinks=True, ignore=shutil.ignore_patterns("*" + PACKED))
    unpack(RunDir(run).nsys_sqlite_packed, RunDir(dst).nsys_sqlite)
    return dst
