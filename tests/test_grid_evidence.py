"""PR #29654's grid on the H200 (data/results/h200-pr29654): the README's figures are what the script prints
from the committed batch, the report's rung reads the same, and the two fixes its host run needed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from kit.paths import REPO, RESULTS
from kit.pipeline.stages import run_group
from kit.report import page
from kit.report import pr_grid as ge
from kit.report.rung import CONFIRMED, Batch


def test_the_readme_block_is_what_the_script_prints() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "h200_pr29654_figures.py")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    readme = (RESULTS / "h200-pr29654" / "README.md").read_text()
    block = readme.split("```", 2)[1].strip("\n")
    assert block == out.strip("\n")


def test_every_cell_launches_as_its_arm_expects_and_the_rung_says_so(tmp_path: Path) -> None:
    rows = ge.cells()
    graph = [r for r in rows if r["mode"] == "graph"]
    assert [r["context_len"] for r in graph] == [4096, 81920, 262144, 500000]
    for r in graph:
        launches = {a: s["launches"] for a, s in r["arms"].items()}
        assert launches == {"bug": [4], "fix": [1], "off": [4], "upstream": [0]}
        assert r["gate_failures"] == [] and r["arms"]["fix"]["tokens_equal_bug"] is True
        assert r["arms"]["upstream"]["build"] == "0.5.16" and r["arms"]["upstream"]["indexer_us"] == 0
    [eager] = [r for r in rows if r["mode"] == "eager"]
    assert {a: s["launches"] for a, s in eager["arms"].items()} == {"bug": [4], "fix": [1], "off": [4]}
    assert eager["gate_failures"] == []
    # eager's step is a launch-bound span; the indexer's own GPU time shows the fix there
    assert eager["arms"]["bug"]["indexer_us"] > 3 * eager["arms"]["fix"]["indexer_us"]
    ratios = [r["bug_over_fix"] for r in graph]
    assert ratios == sorted(ratios)  # the fix buys more the longer the context
    rung = ge.pr_grid_h200(Batch(tmp_path, run_group))
    assert rung is not None and rung.status == CONFIRMED
    assert "bug, fix, off, upstream at 4k-500,000" in rung.title and "upstream (0.5.16)" in rung.scope
    assert "NVIDIA H200" in rung.about["device"] and "2025.3.1" in rung.about["Nsight"]
    assert "0.5.17" in rung.scope and len(rung.tables) == 4
    assert len(ge.overheads()) == 8 and all(o["window_ratio"] for o in ge.overheads())


def test_the_whole_grid_ran_in_one_call_within_ten_minutes_and_sharing_left_graph_timings_alone() -> None:
    """Issue 17's speed goal on the committed run: 19 cells, none failed, kit batch start to report <= 600 s;
    four servers side by side, and each graph cell's step time as when its server ran alone (parts/)."""
    [line] = [ln for ln in ge.batch_seconds() if ln.startswith("batch-grid.txt")]
    m = re.search(r"19 cells: 19 run, 0 already complete, 0 failed \((\d+) s\)", line)
    assert m and int(m[1]) <= 600, line
    starts = ge.servers()
    assert len(starts) == 7 and [s["gap_s"] is None for s in starts].count(True) == 1  # one machine
    assert sum(s["gap_s"] is not None and s["gap_s"] < 0 for s in starts) >= 3  # side by side
    graph = [x["step_ratio"] for x in ge.sharing() if x["mode"] == "graph"]
    assert len(graph) == 16 and all(0.9 < r < 1.1 for r in graph)
    checks = ge.classifier_checks()
    assert len(checks) == 16 and all(c["classifier"] == c["nvtx"] for c in checks)


def test_the_newest_stageable_release_runs_no_indexer_in_the_draft_loop() -> None:
    """Issue 18: sglang 0.5.17 (mode latest) beside 0.5.14 and the fix at 80k and 500k, same lease."""
    rows = ge.cells(batch_name=ge.LATEST)
    assert [r["context_len"] for r in rows] == [81920, 500000]
    for r in rows:
        assert {a: s["launches"] for a, s in r["arms"].items()} == {"bug": [4], "fix": [1], "upstream": [0]}
        assert r["arms"]["upstream"]["build"] == "0.5.17" and r["arms"]["upstream"]["tokens_equal_bug"]
        assert r["gate_failures"] == []
    place = ge.placements(batch_name=ge.LATEST)["sglang-upstream-s5-graph-cuda-server"]
    assert place[0].split()[-3:] == ["0", "in", "59"] and place[1].split()[-3:] == ["1", "in", "59"]


def test_every_server_start_of_the_parts_is_listed_and_a_new_machine_has_no_gap() -> None:
    """Shared servers, a retry's `-server-1` and the one-cell eager runs all started a server."""
    starts = ge.servers(ge.PARTS)
    names = [s["server"] for s in starts]
    assert "sglang-upstream-s5-graph-cuda-noprofile-server-1" in names
    assert "sglang-off-ctx4096-s5-eager-cuda" in names and len(names) == 12
    assert [s["gap_s"] is None for s in starts].count(True) == 2  # two leases, two machines


def test_nbconvert_installed_with_pip_target_finds_its_templates(tmp_path: Path) -> None:
    """The H200 host's report stage failed: `pip --target DIR` puts the templates in DIR/share/..."""
    (tmp_path / "share" / "jupyter" / "nbconvert" / "templates" / "lab").mkdir(parents=True)
    (tmp_path / "nbconvert").mkdir()
    found = page._templates_beside(str(tmp_path / "nbconvert" / "__init__.py"))
    assert found == [str(tmp_path / "share" / "jupyter" / "nbconvert" / "templates")]
    assert page._templates_beside(str(tmp_path / "venv" / "site-packages" / "nbconvert" / "x.py")) == []
