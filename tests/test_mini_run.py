"""kit.backends.mini.run, the profile stage: once its run directory exists, whatever stops it (Ctrl-C at any
moment, even while the directory is being made) leaves error.json, and the run then analyses as
inconclusive. The Ctrl-C is sent to this thread at a chosen point of the stage, so the test is exact."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kit import provenance, rundir
from kit.analysis.analyze import analyze
from kit.backends.mini import run as mini_run
from kit.paths import REPO


def _ctrl_c() -> None:
    """SIGINT to this (the main) thread, as a terminal's Ctrl-C reaches a single-threaded `kit run`."""
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)


def _the_run(root: Path) -> Path:
    (run,) = (root / "b").iterdir()
    return run


@pytest.mark.parametrize("profiler", ["nsys", "torch"])
def test_ctrl_c_while_the_run_dir_is_being_made_leaves_error_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profiler: str
) -> None:
    """Right after params.json is written, before anything that could record a failure had started."""
    real = rundir.write_json

    def write_then_ctrl_c(path: Path, obj: object) -> Path:
        out = real(path, obj)
        if Path(path).name == "params.json":
            _ctrl_c()
        return out

    monkeypatch.setattr(rundir, "write_json", write_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        mini_run.run({"arm": "bug", "profiler": profiler}, tmp_path, "b", "r")
    run = _the_run(tmp_path)
    assert json.loads((run / "error.json").read_text())["error"] == "KeyboardInterrupt"
    v = analyze(run)
    assert v["status"] == "inconclusive" and v["meaning"].startswith("inconclusive: the run did not finish")


@pytest.mark.parametrize("profiler", ["nsys", "torch"])
def test_ctrl_c_in_the_first_seconds_leaves_error_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profiler: str
) -> None:
    """Collecting the provenance takes the first seconds of a run (torch, git, the host): a Ctrl-C there
    left only params.json, which analysed as "holds no profile" (exit 2)."""

    def collect_until_ctrl_c(*_: object) -> dict:
        _ctrl_c()
        raise AssertionError("the Ctrl-C was not raised where it was sent")

    monkeypatch.setattr(provenance, "collect", collect_until_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        mini_run.run({"arm": "fix", "profiler": profiler}, tmp_path, "b", "r")
    run = _the_run(tmp_path)
    assert sorted(p.name for p in run.iterdir()) == ["error.json", "params.json"]
    v = analyze(run)
    assert v["status"] == "inconclusive" and v["num_rounds"] == 0 and v["report"] is None
    assert v["source"] == ("kineto" if profiler == "torch" else "nsys") and v["method"] == "none"
    assert any(w.startswith("nothing was counted: the run left no profile report") for w in v["warnings"])


def test_ctrl_c_while_the_cli_is_being_built_is_an_interruption(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the parser imports most of the kit (the first tenth of a second of every command): a Ctrl-C
    there exits 130 with one line, not a traceback."""
    import kit.cli

    def parser_until_ctrl_c(**_: object) -> None:
        _ctrl_c()
        raise AssertionError("the Ctrl-C was not raised where it was sent")

    monkeypatch.setattr(kit.cli, "build_parser", parser_until_ctrl_c)
    try:
        rc = kit.cli.main(["run", "--arm", "bug"])
    except KeyboardInterrupt:
        pytest.fail("the Ctrl-C escaped kit's main: a traceback, not exit 130")
    assert rc == 130


def test_ctrl_c_right_after_kit_run_starts_leaves_no_run_without_error_json(tmp_path: Path) -> None:
    """The earliest Ctrl-C: the process is interrupted (130; dead of SIGINT when Python had not yet set up
    its handler, which a shell shows as 130 too) and leaves no run directory, or one that says why."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "kit.cli", "run", "--arm", "bug", "--batch", "t", "--run-id", "X"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode in (130, -signal.SIGINT), out.decode()[-2000:]
    run = tmp_path / "runs" / "t" / "X"
    assert not run.exists() or (run / "error.json").is_file()
