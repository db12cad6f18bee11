"""The committed 4k graph cells of bug, fix and 0.5.16 (data/results/h200-pr29654/profiles/, issue 33 item 6):
their SQLite exports, trimmed on the H200 to 8 draft rounds, analyse here (no GPU, no nsys 2025.3) to the
verdict the H200 committed for the cell: 4 indexer launches per draft round, 1, 0."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kit.analysis.analyze import analyze
from kit.paths import REPO

PROFILES = REPO / "data" / "results" / "h200-pr29654" / "profiles"
EXPECTED = {"bug": 4, "fix": 1, "upstream": 0}


@pytest.mark.parametrize("arm", sorted(EXPECTED))
def test_each_trimmed_export_analyses_to_the_committed_verdict(tmp_path: Path, arm: str) -> None:
    committed = PROFILES / f"sglang-{arm}-ctx4096-s5-graph-cuda"
    run = shutil.copytree(committed, tmp_path / committed.name)
    for name in ("verdict.json", "rounds.csv"):
        (run / name).unlink()
    analyze(run)
    got = json.loads((run / "verdict.json").read_text())
    was = json.loads((committed / "verdict.json").read_text())
    assert got["status"] == was["status"] == "pass"
    assert set(got["launches_per_round"]) == set(was["launches_per_round"]) == {EXPECTED[arm]}
    assert len(got["launches_per_round"]) == 8  # the rounds the trim kept
