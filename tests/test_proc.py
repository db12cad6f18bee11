"""kit.proc: whatever the kit starts is gone when it stops, including children that outlive their parent
and a second Ctrl-C while a graceful stop is being waited for."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kit.proc import hold_interrupts, run_logged, session_pids, start_logged, stop_tree

# a parent that starts a child (one that ignores SIGTERM if told so), prints its pid and, unless told to
# exit at once, waits
_PARENT = (
    "import subprocess, sys, time\n"
    "code = 'import signal, sys, time\\n'\n"
    "if 'stubborn' in sys.argv: code += 'signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n'\n"
    "child = subprocess.Popen([sys.executable, '-c', code + 'time.sleep(600)'])\n"
    "print('child', child.pid, flush=True)\n"
    "time.sleep(0 if 'exit' in sys.argv else 600)\n"
)


def _child_pid(log: Path) -> int:
    deadline = time.monotonic() + 30
    while "child" not in log.read_text():
        assert time.monotonic() < deadline, "the parent never started its child"
        time.sleep(0.05)
    return int(log.read_text().split("child ")[1].split()[0])


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_run_logged_leaves_no_child_behind(tmp_path: Path) -> None:
    """A program that exits while its child runs on (an orphan) still leaves nothing behind."""
    log = tmp_path / "log"
    assert run_logged([sys.executable, "-c", _PARENT, "exit"], log) == 0
    assert _gone(_child_pid(log))


def test_stop_tree_second_ctrl_c_still_stops_everything(tmp_path: Path) -> None:
    """A Ctrl-C during the graceful step cuts the wait short; the session is swept, then it is raised."""
    log = tmp_path / "log"
    proc = start_logged([sys.executable, "-c", _PARENT, "stubborn"], log)
    child = _child_pid(log)
    calls = []

    def graceful() -> None:
        calls.append("graceful")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        stop_tree(proc, graceful=graceful, term_wait_s=0.5)
    assert calls == ["graceful"] and proc.returncode is not None
    assert _gone(child) and session_pids(proc.pid) == []


def test_stop_tree_skips_the_graceful_step_once_the_program_has_ended(tmp_path: Path) -> None:
    proc = start_logged([sys.executable, "-c", "pass"], tmp_path / "log")
    proc.wait()
    stop_tree(proc, graceful=lambda: pytest.fail("graceful step on a finished program"))


def test_a_server_waiting_for_its_gpu_turn_gives_up_at_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another server measures (holds the lock): the waiting one starts no cell once the deadline passes,
    and says how long it waited; no variable, no lock; the turn comes once the holder lets go."""
    import fcntl

    from kit.proc import GPU_TURNS_ENV, gpu_turn

    facts: dict = {}
    with gpu_turn(facts) as turn:
        assert turn and facts == {}  # KIT_GPU_TURNS unset: every server measures at once
    lock = tmp_path / "turns.lock"
    monkeypatch.setenv(GPU_TURNS_ENV, str(lock))
    with open(lock, "a") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        with gpu_turn(facts, give_up_at=time.time() + 0.5) as turn:
            assert not turn and facts["gpu_wait_s"] >= 0.5
        fcntl.flock(holder, fcntl.LOCK_UN)
    facts = {}
    with gpu_turn(facts, give_up_at=time.time() + 5) as turn:
        assert turn and facts["gpu_wait_s"] < 0.5


def test_gpu_turns_are_first_come_first_served_so_the_servers_cells_interleave(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three servers, three cells each, a turn per cell: they measure in turn (a b c a b c a b c), not one
    server's row after another, so a call cut by its deadline has every arm's first cells. A ticket left
    by a waiter that died, or a torn line, is skipped (it would block every turn after it); waits add up
    per server."""
    from kit.proc import GPU_TURNS_ENV, gpu_turn

    lock = tmp_path / "turns.lock"
    monkeypatch.setenv(GPU_TURNS_ENV, str(lock))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    Path(f"{lock}.queue").write_text(f"{dead.pid}:1\njunk\n")  # a dead waiter's ticket, a torn line
    order: list[str] = []
    waits: dict[str, dict] = {name: {} for name in "abc"}

    def server(name: str) -> None:
        for _ in range(3):
            with gpu_turn(waits[name], give_up_at=time.time() + 30) as turn:
                assert turn
                order.append(name)
                time.sleep(0.3)

    threads = [threading.Thread(target=server, args=(name,)) for name in "abc"]
    for t in threads:
        t.start()
        time.sleep(0.1)
    for t in threads:
        t.join(60)
    assert "".join(order) == "abcabcabc", order
    assert waits["c"]["gpu_wait_s"] > waits["a"]["gpu_wait_s"] >= 1.0, waits
    assert Path(f"{lock}.queue").read_text() == ""


def test_a_held_ctrl_c_is_raised_by_release_and_not_before() -> None:
    release = hold_interrupts()
    reached = False
    try:
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        reached = True  # a Ctrl-C not held would have been raised before this line
        with pytest.raises(KeyboardInterrupt):
            release()
    finally:
        release()  # idempotent: nothing left pending, the mask as it was
    assert reached and signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())


def test_run_logged_ctrl_cs_its_program_before_it_terminates_it(tmp_path: Path) -> None:
    """On a timeout (as on Ctrl-C), what run_logged started gets SIGINT first, as from a terminal, and may
    finish: the program here writes what it got and exits."""
    code = (
        "import signal, sys, time\n"
        "def got(n, f): open(sys.argv[1], 'w').write(signal.Signals(n).name); sys.exit(0)\n"
        "for s in (signal.SIGINT, signal.SIGTERM): signal.signal(s, got)\n"
        "print('ready', flush=True); time.sleep(600)\n"
    )
    seen = tmp_path / "seen"
    with pytest.raises(subprocess.TimeoutExpired):
        run_logged([sys.executable, "-c", code, str(seen)], tmp_path / "log", timeout=3)
    assert seen.read_text() == "SIGINT"
