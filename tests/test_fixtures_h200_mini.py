"""Real H200 reports of the mini engine (nsys 2025.3.1): eager and CUDA graph, bug and fix, end to end."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kit.analysis.analyze import analyze
from kit.compare.runs import compare_runs, gate_failures
from kit.paths import REPO

FIXTURES = REPO / "tests" / "fixtures" / "h200_mini"
RUNS = {(arm, mode): f"tiny-{arm}-ctx8192-{mode}" for arm in ("bug", "fix") for mode in ("eager", "graph")}


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """Copies of the committed run directories, analysed by the kit (the fixtures stay read-only)."""
    root = tmp_path_factory.mktemp("h200")
    out = {}
    for key, name in RUNS.items():
        run = shutil.copytree(FIXTURES / name, root / name)
        analyze(run)
        out[key] = run
    return out


@pytest.mark.parametrize("mode,method", [("eager", "eager"), ("graph", "graph")])
@pytest.mark.parametrize("arm,expected", [("bug", 4), ("fix", 1)])
def test_h200_counts_per_round(analysed, mode: str, method: str, arm: str, expected: int) -> None:
    import json

    verdict = json.loads((analysed[(arm, mode)] / "verdict.json").read_text())
    assert verdict["method"] == method and verdict["source"] == "nsys"
    assert len(verdict["launches_per_round"]) >= 3
    assert set(verdict["launches_per_round"]) == {expected} and verdict["passed"]


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_h200_gate_and_gpu_time(analysed, mode: str) -> None:
    result = compare_runs(analysed[("bug", mode)], analysed[("fix", mode)])
    assert gate_failures(result) == []
    assert result["outputs"]["all_identical"]
    assert result["a"]["draft_step_basis"] == "gpu"
    # bug runs the indexer 4x per round, fix once: its indexer GPU time per round is about 4x larger.
    ratio = result["a"]["indexer_gpu_ms_per_round"] / result["b"]["indexer_gpu_ms_per_round"]
    assert 3.0 < ratio < 5.0


def test_h200_gate_fails_on_a_bug_pair(analysed) -> None:
    # graph vs eager: runs of different parameters are refused unless allowed, and the gate then fails on
    # that too
    result = compare_runs(analysed[("bug", "graph")], analysed[("bug", "eager")], allow_mismatch=True)
    assert any("fix arm" in f for f in gate_failures(result))
    assert any("parameters differ: cuda_graph" in f for f in gate_failures(result))
