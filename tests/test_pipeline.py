"""End to end on the mini backend: kit run (under real nsys) -> kit analyze -> kit compare."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kit.cli import main as kit_main

SMALL = ["--context-len", "2560", "--num-steps", "4", "--num-requests", "1", "--max-new-tokens", "12"]


def _kit(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kit.cli", *args], capture_output=True, text=True, env=env, timeout=600
    )


@pytest.fixture(scope="module")
def nsys_runs(tmp_path_factory: pytest.TempPathFactory, require_nsys: str) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    runs = {}
    for arm in ("bug", "fix"):
        res = _kit("run", "--arm", arm, *SMALL, "--out", str(root), "--batch", "t", "--run-id", arm)
        assert res.returncode == 0, res.stderr
        runs[arm] = Path(res.stdout.strip().splitlines()[-1])
        res = _kit("analyze", str(runs[arm]))
        assert res.returncode == 0, res.stderr
    return runs


@pytest.mark.nsys
@pytest.mark.parametrize("arm,expected", [("bug", 3), ("fix", 1)])
def test_launches_per_round_under_nsys(nsys_runs: dict[str, Path], arm: str, expected: int) -> None:
    run = nsys_runs[arm]
    verdict = json.loads((run / "verdict.json").read_text())
    assert verdict["source"] == "nsys"
    assert verdict["expected_per_round"] == expected
    assert verdict["launches_per_round"] and set(verdict["launches_per_round"]) == {expected}
    assert verdict["passed"] is True and verdict["status"] == "pass"
    for name in (
        "params.json",
        "provenance.json",
        "profile.nsys-rep",
        "profile.sqlite",
        "outputs.jsonl",
        "rounds.csv",
        "engine.json",
    ):
        assert (run / name).is_file(), name
    prov = json.loads((run / "provenance.json").read_text())
    assert prov["measured_under_nsight"] is True and prov["nsys_version"]


@pytest.mark.nsys
def test_compare_gate_passes_on_bug_vs_fix_with_identical_outputs(nsys_runs: dict[str, Path]) -> None:
    res = _kit("compare", str(nsys_runs["bug"]), str(nsys_runs["fix"]), "--gate")
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    assert result["outputs"]["all_identical"] is True
    assert result["a"]["launches_per_round"] == [3] and result["b"]["launches_per_round"] == [1]


@pytest.mark.nsys
def test_compare_gate_fails_when_the_fix_arm_is_missing(nsys_runs: dict[str, Path]) -> None:
    res = _kit("compare", str(nsys_runs["bug"]), str(nsys_runs["bug"]), "--gate")
    assert res.returncode == 1
    assert "fix arm" in res.stderr


@pytest.mark.nsys
def test_analyze_never_overwrites(nsys_runs: dict[str, Path]) -> None:
    run = nsys_runs["fix"]
    before = (run / "verdict.json").read_bytes()
    res = _kit("analyze", str(run))
    assert res.returncode == 2
    assert "already exists" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert (run / "verdict.json").read_bytes() == before


def test_existing_run_dir_is_refused_and_kept(tmp_path: Path) -> None:
    (tmp_path / "b" / "r1").mkdir(parents=True)
    (tmp_path / "b" / "r1" / "keep.txt").write_text("precious")
    rc = kit_main(["run", "--arm", "fix", *SMALL, "--out", str(tmp_path), "--batch", "b", "--run-id", "r1"])
    assert rc == 2
    assert (tmp_path / "b" / "r1" / "keep.txt").read_text() == "precious"


def test_bad_params_fail_before_anything_is_written(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rc = kit_main(["run", "--arm", "sideways", "--out", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "arm" in err and len(err.splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_recorder_fallback_says_not_nsight(tmp_path: Path) -> None:
    """Without nsys on PATH (and outside CI) the run still works and every artifact says so."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "KIT_NSYS")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + "/usr/bin/nonexistent"
    assert shutil.which("nsys", path=env["PATH"]) is None
    res = _kit(
        "run", "--arm", "fix", *SMALL, "--out", str(tmp_path), "--batch", "b", "--run-id", "rec", env=env
    )
    assert res.returncode == 0, res.stderr
    assert "NOT measured under Nsight" in res.stderr
    run = tmp_path / "b" / "rec"
    assert not (run / "profile.sqlite").exists() and (run / "recorder.sqlite").is_file()
    res = _kit("analyze", str(run), env=env)
    assert res.returncode == 0, res.stderr
    verdict = json.loads(res.stdout)
    assert verdict["source"] == "recorder" and set(verdict["launches_per_round"]) == {1}
    assert any("NOT measured under Nsight" in w for w in verdict["warnings"])
    prov = json.loads((run / "provenance.json").read_text())
    assert prov["measured_under_nsight"] is False


def test_ci_refuses_to_fall_back(tmp_path: Path) -> None:
    env = {**os.environ, "CI": "true", "PATH": os.path.dirname(sys.executable)}
    env.pop("KIT_NSYS", None)
    res = _kit("run", "--arm", "fix", *SMALL, "--out", str(tmp_path), env=env)
    assert res.returncode == 2 and "CI=true" in res.stderr


def test_git_sha_prefers_kit_git_sha(monkeypatch) -> None:
    """A GPU host's copy may hold a stale .git; the sha the caller states must win over it."""
    from kit import provenance

    monkeypatch.setenv("KIT_GIT_SHA", "0123456789abcdef0123456789abcdef01234567")
    assert provenance.git_sha() == "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.delenv("KIT_GIT_SHA")
    assert provenance.git_sha() != "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.nsys
def test_an_interrupted_run_never_analyses_as_a_pass(tmp_path: Path, require_nsys: str) -> None:
    """Issue 14.1: Ctrl-C during `kit run` leaves error.json and a report with some rounds; `kit analyze`
    says the run did not finish and exits 3 (inconclusive), never "bug reproduced"."""
    import signal
    import time

    args = ["--context-len", "16384", "--num-steps", "3", "--num-requests", "2", "--max-new-tokens", "1024"]
    cmd = [
        sys.executable,
        "-m",
        "kit.cli",
        "run",
        "--arm",
        "bug",
        *args,
        "--out",
        str(tmp_path),
        "--batch",
        "int",
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("int/*/engine.log")) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2.0)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "kit run: interrupted", err
    [run] = tmp_path.glob("int/*")
    assert run.name.startswith("mini-bug-ctx16384-s3-") and (run / "error.json").is_file()
    res = _kit("analyze", str(run))
    assert res.returncode == 3, res.stderr
    verdict = json.loads(res.stdout)
    assert verdict["status"] == "inconclusive" and "the run did not finish" in verdict["meaning"]
    assert "bug reproduced" not in res.stdout
