"""Tensor parallel, counted per rank: every TP rank runs its own draft loop and its own indexer (sglang 0.5.14
replicates the indexer's projections on every rank, `ReplicatedLinear`), so a verdict holds each rank to
the arm's count, names the ranks it saw, fails naming any that disagrees, and is inconclusive when the
report lacks ranks the server ran."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest
from kineto_synth import sglang_like, write_trace
from wheels_fixtures import release_wheel

from kit.analysis.analyze import analyze
from kit.analysis.completeness import ranks_in_report
from kit.paths import REPO

FIXTURES = REPO / "tests" / "fixtures"


def test_every_rank_is_named_and_a_rank_that_disagrees_fails_the_verdict(tmp_path: Path) -> None:
    ranks = [
        sglang_like("fix", 5, 3, mode="eager", pid=5001, device=0),
        sglang_like("bug", 5, 3, mode="eager", pid=5002, device=1),  # rank 1 still runs the indexer 4 times
    ]
    path = write_trace(tmp_path / "tp2.json.gz", ranks, layout="compact", labels=["[TP00]", "[TP01]"])
    v = analyze(path, tmp_path / "a", arm="fix", num_steps=5)
    assert v["status"] == "fail" and v["num_processes"] == 2
    assert [(r["pid"], r["rounds"], r["matches"]) for r in v["ranks"]] == [(5001, 3, True), (5002, 3, False)]
    assert v["meaning"].endswith("ranks that disagree: pid 5002 (4 x 3)")
    both_fixed = [sglang_like("fix", 5, 3, mode="eager", pid=p, device=d) for d, p in enumerate((5001, 5002))]
    path = write_trace(tmp_path / "ok.json.gz", both_fixed, layout="compact", labels=["[TP00]", "[TP01]"])
    v = analyze(path, tmp_path / "b", arm="fix", num_steps=5)
    assert v["status"] == "pass" and all(r["matches"] for r in v["ranks"])


def test_a_tp_run_whose_report_lacks_ranks_is_inconclusive(tmp_path: Path) -> None:
    """A real H200 nsys cell (one process) presented as a TP 2 server's: the second rank's draft loop is
    missing from the report, so the verdict cannot pass."""
    run = tmp_path / "graph-bug-ctx4096"
    shutil.copytree(FIXTURES / "h200_sglang" / "graph-bug-ctx4096", run)
    params = json.loads((run / "params.json").read_text())
    assert analyze(run, run / "as-is")["status"] == "pass"
    (run / "params.json").write_text(json.dumps({**params, "tp_size": 2}))
    v = analyze(run, run / "tp2")
    assert v["status"] == "inconclusive"
    assert "rounds of 1 process(es) where the server ran 2 TP ranks" in v["meaning"]


def test_which_ranks_a_report_must_hold() -> None:
    assert ranks_in_report({"backend": "sglang", "tp_size": 4}) == 4
    assert ranks_in_report({"backend": "sglang", "tp_size": 8, "nnodes": 2}) == 4  # this node's ranks
    assert ranks_in_report({"backend": "sglang", "tp_size": 4, "profiler": "torch"}) == 1  # rank 0's trace
    assert ranks_in_report({"backend": "mini"}) == 1


@pytest.mark.network
def test_sglang_0514_replicates_the_indexer_on_every_tp_rank() -> None:
    """Why each rank counts: the indexer's projections are ReplicatedLinear in 0.5.14 (its heads are not
    split across ranks the way attention heads are), so every rank computes the whole top-k itself."""
    with zipfile.ZipFile(release_wheel("0.5.14")) as zf:
        src = zf.read("sglang/srt/layers/attention/dsa/dsa_indexer.py").decode()
    for proj in (
        "self.wq_b = ReplicatedLinear(",
        "self.wk = ReplicatedLinear(",
        "self.weights_proj = ReplicatedLinear(",
    ):
        assert proj in src, proj
    assert "ColumnParallelLinear" not in src and "RowParallelLinear" not in src


@pytest.mark.parametrize(("tp", "ok"), [(1, True), (2, True), (4, True), (8, True), (3, False), (16, False)])
def test_tp_size_must_leave_two_attention_heads_per_rank(tmp_path: Path, tp: int, ok: bool) -> None:
    """The task checkpoint has 16 attention heads: TP 4 (the PR's) leaves 4 per rank."""
    from sglang_run_helpers import make_model, run_params

    from kit.backends.sglang.params import validate
    from kit.checkpoint.layout import DEFAULT_CONFIG
    from kit.errors import UsageError

    model = make_model(tmp_path, {**DEFAULT_CONFIG, "architectures": ["DeepseekV32ForCausalLM"]})
    if ok:
        assert validate(run_params(model, tp_size=tp)).tp_size == tp
    else:
        with pytest.raises(UsageError, match=f"tp_size={tp} does not fit the model's 16 attention heads"):
            validate(run_params(model, tp_size=tp))


@pytest.mark.parametrize(
    "cell", ["graph-bug-ctx4096", "graph-fix-ctx4096", "eager-bug-ctx4096", "eager-fix-ctx4096"]
)
def test_the_tp1_path_of_the_same_code_on_real_h200_cells(tmp_path: Path, cell: str) -> None:
    """Until a 4-GPU node runs it: real TP 1 cells of sglang 0.5.14 and the patched build on an H200
    (tests/fixtures/h200_sglang), analysed, each name their one rank, which holds the arm's count."""
    v = analyze(FIXTURES / "h200_sglang" / cell, tmp_path / "a")
    expected = 4 if "-bug-" in cell else 1
    assert v["status"] == "pass" and len(v["ranks"]) == 1 and v["num_processes"] == 1
    assert v["ranks"][0]["matches"] and v["ranks"][0]["observed_counts"] == {str(expected): v["num_rounds"]}


def test_the_tp1_dry_run_block_is_what_its_script_prints() -> None:
    """data/results/h200-tp4's TP 1 dry run: the README quotes scripts/h200_tp_figures.py, which reads the
    committed cells (all eight pass with 4 and 1 launches per round, every answer right, tokens equal across
    arms and to the earlier TP 1 run alone)."""
    import subprocess
    import sys

    script = REPO / "scripts" / "h200_tp_figures.py"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True).stdout
    readme = (REPO / "data" / "results" / "h200-tp4" / "README.md").read_text()
    assert out.strip("\n") in readme.split("## The TP 1 dry run", 1)[1]
    rows = [line.split() for line in out.splitlines() if line.startswith("tp1-")]
    assert len(rows) == 8 and all(r[1] == "done" and r[2] == "8/8" and r[4] == "pass" for r in rows)
    assert all(r[-1] == "True" for r in rows)  # tokens equal the TP 1 run alone, prompt by prompt
    assert all(r[7] == ("4" if "-bug-" in r[0] else "1") for r in rows)  # launches per round, the one rank


def test_the_report_fails_the_tp_rung_when_one_cell_fails(tmp_path: Path, monkeypatch) -> None:
    """The TP rung's CONFIRMED rests on every cell's verdict (each rank held to the arm's count): a copy of
    the dry run with one cell failed reads NOT CONFIRMED, and it still says TP 4 was not run; so does one
    whose fix tokens differ from the bug arm's in one request."""
    import json
    import shutil

    from kit.pipeline.stages import run_group
    from kit.report import tensor_parallel as tp_evidence
    from kit.report.rung import NOT_CONFIRMED, Batch

    copy = tmp_path / "tp1-dry-run"
    shutil.copytree(tp_evidence.DRY_RUN, copy, symlinks=True)
    verdict = copy / "task" / "tp1-fix-ctx500000-moving-target" / "verdict.json"
    passing = verdict.read_text()
    verdict.write_text(json.dumps({**json.loads(passing), "status": "fail", "passed": False}))
    monkeypatch.setattr(tp_evidence, "DRY_RUN", copy)
    rung = tp_evidence.tensor_parallel_h200(Batch(tmp_path, run_group))
    assert rung.status == NOT_CONFIRMED and "7/8 cells pass" in rung.claim
    assert rung.claim.endswith("TP 4 NOT RUN: no 4-GPU machine has been lent")
    # and tokens that differ across arms, with every verdict passing again
    verdict.write_text(passing)
    outputs = copy / "task" / "tp1-fix-ctx65536-same-target" / "outputs.jsonl"
    rows = [json.loads(line) for line in outputs.read_text().splitlines()]
    rows[3]["output_ids"][-1] += 1
    outputs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rung = tp_evidence.tensor_parallel_h200(Batch(tmp_path, run_group))
    assert rung.status == NOT_CONFIRMED and "8/8 cells pass" in rung.claim
    assert "tokens NOT equal across arms (and to the task rung's TP 1 cells in 7/8)" in rung.claim
