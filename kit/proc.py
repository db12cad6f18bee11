"""Child processes that never outlive the kit: each starts in a session of its own, and `stop_tree` ends
everything in that session on every exit path (normal end, error, timeout, Ctrl-C).

A session, not a process group or the children of a pid, because what the kit starts starts more: nsys
launches the program it profiles, sglang launches one scheduler per rank, and either may exit before its
children do. Processes are found through /proc (Linux), so nothing beyond the standard library is needed.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path


def session_pids(sid: int, zombies: bool = False) -> list[int]:
    """Processes of session `sid` (this process excepted): what must be gone when a run ends.
    Zombies are dead already (their parent, or init, reaps them) and are skipped unless asked for."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()  # state, ppid, pgrp, session, ...
        if (
            len(fields) > 3
            and int(fields[3]) == sid
            and (zombies or fields[0] != "Z")
            and int(entry) != os.getpid()
        ):
            pids.append(int(entry))
    return pids


def cmdline(pid: int) -> bytes:
    """A process's NUL-separated argument list (empty once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def stop_tree(
    proc: subprocess.Popen,
    graceful: Callable[[], None] | None = None,
    term_wait_s: float = 10.0,
    kill_wait_s: float = 10.0,
) -> None:
    """Stop `proc` (started with start_new_session) and everything left in its session.

    1. While `proc` runs, the caller's `graceful` step, if any: signal what should stop first and wait
       for it (e.g. the profiled program, so that nsys writes its report). Its TimeoutExpired or
       ProcessLookupError only means "go on"; a KeyboardInterrupt (a second Ctrl-C) stops the waiting.
    2. SIGTERM to every process left in the session, up to `term_wait_s` for them to go, then SIGKILL.
    3. `proc` reaped; if steps 1-2 stopped anything, a short wait for init to reap the orphans, so the
       session is truly empty (a program that ended by itself may leave a zombie for init: no wait then).
    A KeyboardInterrupt caught in step 1 is raised again once everything is stopped.
    """
    sid = proc.pid  # start_new_session: the leader's pid is the session and group id
    interrupted: KeyboardInterrupt | None = None
    stopped = False
    if graceful is not None and proc.poll() is None:
        stopped = True
        try:
            graceful()
        except (subprocess.TimeoutExpired, ProcessLookupError):
            pass
        except KeyboardInterrupt as e:
            interrupted = e
    for sig, wait_s in ((signal.SIGTERM, term_wait_s), (signal.SIGKILL, kill_wait_s)):
        left = session_pids(sid)
        if not left:
            break
        stopped = True
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            proc.poll()  # reap our own child as soon as it dies
            if not session_pids(sid):
                break
            time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    deadline = time.monotonic() + (5.0 if stopped else 0.0)
    while session_pids(sid, zombies=True) and time.monotonic() < deadline:
        time.sleep(0.05)
    if interrupted is not None:
        raise interrupted


def hold_interrupts() -> Callable[[], None]:
    """Hold SIGINT back in this thread until the returned `release` is called, which raises the held
    Ctrl-C (KeyboardInterrupt) at once. Why: between creating a run directory and entering the code that
    records a failure in it, a Ctrl-C would leave a run that says nothing about why it stopped. Only the
    main thread receives Python's signals; a child started while held inherits the block, so start none."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})

    def release() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)

    return release


def start_logged(
    cmd: list[str], log: Path, env: Mapping[str, str] | None = None, err: Path | None = None
) -> subprocess.Popen:
    """Start cmd (an argument list) in its own session, stdout+stderr appended to log (stderr to `err`
    instead, when given: a command whose stdout is a JSON document), no stdin."""
    with open(log, "ab") as out, open(err or os.devnull, "ab") as errors:
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=errors if err is not None else subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )


def run_logged(
    cmd: list[str],
    log: Path,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    err: Path | None = None,
) -> int:
    """Run cmd to completion (see start_logged); return its exit code."""
    proc = start_logged(cmd, log, env, err)
    try:
        return proc.wait(timeout=timeout)
    finally:  # Ctrl-C, timeout or any error: leave no orphan behind
        stop_tree(proc, graceful=lambda: interrupt(proc))


def interrupt(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Ctrl-C what the kit started, as a terminal would, before stop_tree's SIGTERM: nsys then stops its
    program and its agent (which runs in a session of its own) itself. A SIGTERM to nsys's session instead
    left agents behind and, now and then, failed another nsys run on the machine at the same time ("Connection
    reset by peer": the nsys processes of a machine share a session manager), as a stress of concurrent
    runs with one Ctrl-C'd showed (the CI failure of 2026-12-05)."""
    os.kill(proc.pid, signal.SIGINT)
    proc.wait(timeout=grace_s)


def log_tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(Path(log).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# What nsys prints around a profiled program's own output, never the cause of a failure.
_NSYS_TRAILER = re.compile(
    r"^\s*(Generating|Generated:|End of file|\[\d+/\d+\]|Collecting data|Processing "
    r"events|Capture range|Saving|/\S+\.(nsys-rep|qdstrm)$|$)"
)
_CAUSE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b|error:|Error:|FATAL|Killed)")
NSYS_ONLY = "(the log holds nothing but nsys's own lines)"  # the program said nothing at all


def failure_line(log: Path) -> str:
    """The line of a failed process's log that says why: the last exception or error line, else the last line
    that is not nsys's own trailer (a log ending in "End of file" says nothing about the program)."""
    try:
        lines = Path(log).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    cause = [ln for ln in lines if _CAUSE.match(ln.strip())]
    if cause:
        return cause[-1].strip()
    rest = [ln for ln in lines if not _NSYS_TRAILER.match(ln)]
    return rest[-1].strip() if rest else NSYS_ONLY


def engine_failed(rc: int, log: Path) -> str:
    """The one line a failed engine process gets: its exit code, its log, and why."""
    return f"engine failed (exit {rc}); see {log}: {failure_line(log)}"


GPU_TURNS_ENV = "KIT_GPU_TURNS"  # a lock file shared by the servers of one GPU (kit batch -j N sets it)


@contextmanager
def gpu_turn(facts: dict, give_up_at: float | None = None) -> Iterator[bool]:
    """Hold the GPU for one cell's measuring while other servers on it start or wait: several servers may
    load and capture at once (-j N), but only the holder of the lock named by $KIT_GPU_TURNS sends
    requests and profiles, so no two measurements overlap. Turns are first come, first served (a queue
    beside the lock), so the servers' cells interleave in their order: a call cut by its deadline has
    measured every arm's short contexts, and its pairs compare, rather than one arm's whole row.
    Yields False when `give_up_at` (time.time()) passed before the turn came (the caller starts no cell);
    facts['gpu_wait_s'] adds up the waits. No variable: no lock."""
    path = os.environ.get(GPU_TURNS_ENV)
    if not path:
        yield True
        return
    t0 = time.monotonic()
    ticket = f"{os.getpid()}:{time.monotonic_ns()}"
    _queue(path, ticket, add=True)
    try:
        with open(path, "a") as f:
            while True:
                if _queue(path, ticket) == ticket:
                    try:
                        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        pass
                if give_up_at is not None and time.time() >= give_up_at:
                    facts["gpu_wait_s"] = round(facts.get("gpu_wait_s", 0.0) + time.monotonic() - t0, 3)
                    yield False
                    return
                time.sleep(0.1)
            facts["gpu_wait_s"] = round(facts.get("gpu_wait_s", 0.0) + time.monotonic() - t0, 3)
            try:
                yield True
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
    finally:
        _queue(path, ticket, remove=True)


def _queue(lock: str, ticket: str, add: bool = False, remove: bool = False) -> str:
    """The GPU-turn queue (`lock`.queue, one `pid:ns` ticket a line, under its own flock): add or remove
    `ticket`, drop those of processes that died waiting, and return the first ticket left ("" if none)."""
    with open(f"{lock}.queue", "a+") as q:
        fcntl.flock(q, fcntl.LOCK_EX)
        q.seek(0)
        tickets = [t for t in q.read().split() if t != ticket or not remove]
        if add:
            tickets.append(ticket)
        alive = [t for t in tickets if re.fullmatch(r"\d+:\d+", t) and pid_alive(int(t.split(":")[0]))]
        if alive != tickets or add or remove:
            q.seek(0)
            q.truncate()
            q.write("".join(f"{t}\n" for t in alive))
        return alive[0] if alive else ""


def pid_alive(pid: int) -> bool:
    """Whether a process of this pid exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
