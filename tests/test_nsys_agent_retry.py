"""nsys's own agent failing under a run (CI, nsys 2022.4, other nsys runs beside it: "[QuadDCommon::
tag_message*] = Local Endpoint is not available.", and the demo's bug cell failed; or exit 1 with nothing
in the log but nsys's "End of file", a second kit's nsys runs beside the suite) is retried once; a failure
the program's own log explains never is. The agent's fault cannot be caused on demand, so a stand-in
for nsys (a script that fails as the agent did on its first call, then runs the program) plays it: a
mock at that boundary only. The real nsys path is the rest of the suite."""

from __future__ import annotations

import sys
from pathlib import Path

from kit.proc import NSYS_ONLY
from kit.trace import nsys

FAULT = "[QuadDCommon::tag_message*] = Local Endpoint is not available."


def _standin(tmp_path: Path, fail_first: str) -> list[str]:
    """An 'nsys profile -o BASE PROGRAM...' whose first call prints `fail_first` and exits 1 (leaving a
    partial report), and whose later calls run the program and write BASE.nsys-rep."""
    script = tmp_path / "nsys_standin.py"
    script.write_text(
        "import pathlib, subprocess, sys\n"
        "args = sys.argv[1:]\n"
        "base = pathlib.Path(args[args.index('-o') + 1]); program = args[args.index('-o') + 2:]\n"
        f"seen = pathlib.Path({str(tmp_path / 'calls')!r})\n"
        "n = int(seen.read_text()) if seen.exists() else 0\n"
        "seen.write_text(str(n + 1))\n"
        "if n == 0:\n"
        "    pathlib.Path(str(base) + '.qdstrm').write_text('partial')\n"
        f"    print({fail_first!r}); sys.exit(1)\n"
        "rc = subprocess.call(program)\n"
        "pathlib.Path(str(base) + '.nsys-rep').write_text('report')\n"
        "sys.exit(rc)\n"
    )
    return [sys.executable, str(script), "profile", "-o", str(tmp_path / "profile")]


def test_an_agent_fault_is_run_once_more_with_the_first_log_kept(tmp_path: Path) -> None:
    cmd = [*_standin(tmp_path, FAULT), sys.executable, "-c", "print('engine ran')"]
    log = tmp_path / "engine.log"
    rc, retried = nsys.run_profiled(cmd, log, tmp_path / "profile", {}, 60)
    assert rc == 0 and retried == [FAULT]
    assert "engine ran" in log.read_text() and FAULT in (tmp_path / "attempt-1-engine.log").read_text()
    assert (tmp_path / "profile.nsys-rep").is_file() and not (tmp_path / "profile.qdstrm").exists()


def test_a_failed_run_with_nothing_but_nsys_lines_is_run_once_more(tmp_path: Path) -> None:
    cmd = [*_standin(tmp_path, "End of file"), sys.executable, "-c", "print('engine ran')"]
    rc, retried = nsys.run_profiled(cmd, tmp_path / "engine.log", tmp_path / "profile", {}, 60)
    assert rc == 0 and retried == [NSYS_ONLY] and (tmp_path / "calls").read_text() == "2"


def test_the_programs_own_failure_is_not_retried(tmp_path: Path) -> None:
    cmd = [*_standin(tmp_path, "Traceback (most recent call last):\nValueError: bad"), "true"]
    log = tmp_path / "engine.log"
    rc, retried = nsys.run_profiled(cmd, log, tmp_path / "profile", {}, 60)
    assert rc == 1 and retried == [] and (tmp_path / "calls").read_text() == "1"
    assert not (tmp_path / "attempt-1-engine.log").exists()
