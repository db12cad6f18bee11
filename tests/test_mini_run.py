"""kit.backends.mini.run, the profile stage: once its run directory exists, whatever stops it (Ctrl-C at any
moment, even while the directory is being made) leaves error.json, and the run then analyses as
inconclusive. The Ctrl-C is sent to this thread at a chosen point of the stage, so the test is exact."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import pytest

from kit import provenance, rundir
from kit.analysis.analyze import analyze
from kit.backends.mini import run as mini_run


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
