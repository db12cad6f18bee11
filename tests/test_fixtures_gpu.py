"""Real H200 reports (nsys 2025.3.1, CUDA graphs): replayed kernels attributed to capture-time ranges."""

from __future__ import annotations

from pathlib import Path

import pytest

from kit.analysis.analyze import analyze
from kit.paths import REPO

FIXTURES = REPO / "tests" / "fixtures"


@pytest.mark.parametrize("arm,expected", [("bug", 4), ("fix", 1)])
def test_graph_replay_attribution_on_real_h200_probe_reports(tmp_path: Path, arm: str, expected: int) -> None:
    report = FIXTURES / f"nsys2025.3.1_h200_probe_fake_sglang_graph_{arm}.sqlite.xz"
    verdict = analyze(report, tmp_path, arm=arm, num_steps=5)
    assert verdict["method"] == "graph"
    assert len(verdict["launches_per_round"]) >= 3
    assert set(verdict["launches_per_round"]) == {expected}
    assert verdict["passed"] is True


def test_a_single_kernel_path_would_miss_the_capture_ranges(tmp_path: Path) -> None:
    """Joining replayed kernels at their launch time (eager method) finds no indexer range in the replay."""
    report = FIXTURES / "nsys2025.3.1_h200_probe_fake_sglang_graph_bug.sqlite.xz"
    verdict = analyze(report, tmp_path, arm="bug", num_steps=5, method="eager")
    assert set(verdict["launches_per_round"]) == {0}
    assert verdict["passed"] is False
