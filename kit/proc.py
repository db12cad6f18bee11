"""Child processes that never outlive the kit: own process group, stopped on any exit path."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path


def stop_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the whole group (nsys and the program it launched), then SIGKILL what is left."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def start_logged(cmd: list[str], log: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """Start cmd (an argument list) in its own session, stdout+stderr appended to log, no stdin."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )


def run_logged(
    cmd: list[str], log: Path, env: Mapping[str, str] | None = None, timeout: float | None = None
) -> int:
    """Run cmd to completion (see start_logged); return its exit code."""
    proc = start_logged(cmd, log, env)
    try:
        return proc.wait(timeout=timeout)
    finally:  # Ctrl-C, timeout or any error: leave no orphan behind
        stop_group(proc)


def log_tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(Path(log).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
