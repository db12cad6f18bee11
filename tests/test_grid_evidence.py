"""PR #29654's grid on the H200 (data/results/h200-pr29654): the README's figures are what the script prints
from the committed batch, the report's rung reads the same, and the two fixes its host run needed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kit.paths import RESULTS
from kit.pipeline import grid_evidence as ge
from kit.pipeline import rungs
from kit.pipeline.report_page import _templates_beside

REPO = Path(__file__).resolve().parents[1]


def test_the_readme_block_is_what_the_script_prints() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "h200_pr29654_figures.py")],
        capture_output=True, text=True, check=True,
    ).stdout
    readme = (RESULTS / "h200-pr29654" / "README.md").read_text()
    block = readme.split("```", 2)[1].strip("\n")
    assert block == out.strip("\n")


def test_every_cell_launches_as_its_arm_expects_and_the_rung_says_so(tmp_path: Path) -> None:
    rows = ge.cells()
    assert [r["context_len"] for r in rows] == [4096, 81920, 262144, 500000]
    for r in rows:
        assert {a: s["launches"] for a, s in r["arms"].items()} == {"bug": [4], "fix": [1], "off": [4]}
        assert r["gate_failures"] == [] and r["arms"]["fix"]["tokens_equal_bug"] is True
    ratios = [r["bug_over_fix"] for r in rows]
    assert ratios == sorted(ratios)  # the fix buys more the longer the context
    rung = rungs.pr_grid_h200(tmp_path)
    assert rung is not None and rung.status == rungs.CONFIRMED
    assert "NVIDIA H200" in rung.about["device"] and "2025.3.1" in rung.about["Nsight"]
    assert len(ge.overheads()) == 6 and all(o["window_ratio"] for o in ge.overheads())


def test_nbconvert_installed_with_pip_target_finds_its_templates(tmp_path: Path) -> None:
    """The H200 host's report stage failed: `pip --target DIR` puts the templates in DIR/share/..."""
    (tmp_path / "share" / "jupyter" / "nbconvert" / "templates" / "lab").mkdir(parents=True)
    (tmp_path / "nbconvert").mkdir()
    found = _templates_beside(str(tmp_path / "nbconvert" / "__init__.py"))
    assert found == [str(tmp_path / "share" / "jupyter" / "nbconvert" / "templates")]
    assert _templates_beside(str(tmp_path / "venv" / "site-packages" / "nbconvert" / "x.py")) == []
