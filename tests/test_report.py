"""The report's content, from kit code: the ladder of rungs (order, labels, honest headlines), narrow
tables without NaN, figures with sources, the pooled accept length, and a page with no script or prompt."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from kit.errors import KitError
from kit.pipeline.stages import run_group
from kit.report import page as report_page
from kit.report import rung as rungs
from kit.report import this_batch
from kit.report.ladder import ladder
from kit.report.published import published_figures
from kit.rundir import write_json

STEPS = 5


TASK = {"source": "made in memory (kit.task.weights.task_tensors)", "seed": 0, "n_keys": 128}


def _ladder(batch: Path) -> list[rungs.Rung]:
    """The ladder as the 04_report notebook makes it: runs paired by the batch's groups."""
    return ladder(batch, run_group)


def _batch(batch: Path) -> rungs.Batch:
    return rungs.Batch(batch, run_group)


def _run(
    batch: Path,
    arm: str,
    launches: int,
    outputs: list[tuple[int, int]],
    step_ns: float | list[float],
    workload: str | None = None,
    ids: tuple[int, ...] = (1, 2, 3),
) -> Path:
    """A completed mini run on CPU as `kit run` + `kit analyze` leave it (only the files the report reads).
    `outputs`: (completion_tokens, spec_verify_ct) per request; `step_ns`: one draft step time for all
    three rounds, or one per round; `workload`: a task run (model task, its checkpoint in provenance)."""
    run = batch / "-".join(["mini", arm, *([workload] if workload else []), f"ctx4096-s{STEPS}-eager-cpu"])
    run.mkdir(parents=True)
    task = {"model": "task", "workload": workload, "preset": None} if workload else {"preset": "tiny"}
    write_json(
        run / "params.json",
        {
            "backend": "mini",
            "arm": arm,
            "context_len": 4096,
            "num_steps": STEPS,
            "device": "cpu",
            "cuda_graph": False,
            **task,
        },
    )
    write_json(
        run / "provenance.json",
        {
            "backend": "mini",
            "arm": arm,
            "nsys_version": "2022.4.2.1-df9881f",
            "measured_under_nsight": True,
            "gpu": None,
            "engine": {"model": "task", "task": TASK} if workload else {"model": "random"},
        },
    )
    write_json(
        run / "verdict.json",
        {
            "arm": arm,
            "status": "pass",
            "passed": True,
            "expected_per_round": launches,
            "launches_per_round": [launches] * 3,
            "num_rounds": 3,
            "source": "nsys",
            "method": "nvtx",
        },
    )
    steps = step_ns if isinstance(step_ns, list) else [step_ns] * 3
    pd.DataFrame({"round": [1, 2, 3], "step_ns": steps}).to_csv(run / "rounds.csv", index=False)
    rows = [
        {
            "prompt_id": i,
            "input_len": 4096,
            "output_ids": list(ids),
            **({"workload": workload, "correct": True} if workload else {}),
            "completion_tokens": ct,
            "spec_verify_ct": verify,
            "accept_length": ct / verify,
        }
        for i, (ct, verify) in enumerate(outputs)
    ]
    (run / "outputs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


@pytest.fixture
def batch(tmp_path: Path) -> Path:
    b = tmp_path / "runs" / "demo-x"
    for arm, launches, step in (("bug", STEPS - 1, 2.6e6), ("fix", 1, 0.8e6)):
        _run(b, arm, launches, [(10, 4), (20, 5)], step)
    return b


def test_accept_length_is_pooled_over_requests_as_the_engine_reports_it(batch: Path) -> None:
    """10 tokens in 4 verify rounds and 20 in 5: 30/9 = 3.3333 (what engine.json and `kit compare` say),
    not the mean of the per-request ratios (2.5 + 4.0) / 2 = 3.25."""
    table = this_batch.summary_table(_batch(batch))
    assert list(table["accept length"]) == [3.3333, 3.3333]


def test_the_ladder_is_strongest_first_and_says_what_ran(batch: Path) -> None:
    ladder = _ladder(batch)
    keys = [
        "real-sglang-task-h200",
        "pr-grid-h200",
        "real-sglang-h200",
        "tensor-parallel-h200",
        "mini-engine-h200",
        "kineto-h200",
        "this-batch",
        "mutation-suite",
    ]
    assert [r.key for r in ladder] == keys
    task, _, sglang, tp, mini, _, this, _ = ladder
    assert task.headline.startswith(
        "real sglang 0.5.14 vs patched on the task checkpoint, one NVIDIA H200 (committed results): "
        "CONFIRMED: "
    )
    assert (
        "make-checkpoint --task" in task.about["model"]
        and task.about["Nsight"] == "Nsight Systems 2025.3.1.0"
    )
    assert sglang.headline.startswith(
        "real sglang 0.5.14 on one NVIDIA H200 (committed results): CONFIRMED: "
    )
    assert "0.5.14+pr29654" in sglang.about["engine"] and "make-checkpoint" in sglang.about["model"]
    assert (
        sglang.about["Nsight"] == "Nsight Systems 2025.3.1.0" and "1x NVIDIA H200" in sglang.about["device"]
    )
    assert tp.headline.startswith(
        "real sglang 0.5.14 vs patched, the TP 4 step at TP 1 on one NVIDIA H200 (committed results): "
        "CONFIRMED: 8/8 cells pass"
    ) and tp.headline.endswith("TP 4 NOT RUN: no 4-GPU machine has been lent")
    assert mini.headline.startswith("mini engine on one NVIDIA H200 (committed results): CONFIRMED: ")
    assert "not sglang" in mini.about["engine"] and "dsv32" in mini.about["model"]
    assert this.headline.startswith(
        "this run: mini engine on CPU: CONFIRMED (under Nsight Systems): fix = 1 indexer launch per draft"
    )
    assert this.claim.endswith("; draft step bug/fix 3.25x at 4k beyond the per-round noise")
    assert this.tables[1].frame["noise"].tolist() == ["beyond noise"]
    assert this.about["Nsight"] == "Nsight Systems 2022.4.2.1" and this.about["device"] == "CPU, eager"
    assert this.about["files"].startswith(str(batch))
    for rung in (*ladder, published_figures()):
        assert set(rung.about) >= {"engine", "device", "model", "files"}, rung.key


def test_a_failed_arm_makes_this_batch_not_confirmed(batch: Path) -> None:
    verdict = batch / "mini-fix-ctx4096-s5-eager-cpu" / "verdict.json"
    verdict.write_text(json.dumps({**json.loads(verdict.read_text()), "status": "fail", "passed": False}))
    this = next(r for r in _ladder(batch) if r.key == "this-batch")
    assert this.headline == (
        "this run: mini engine on CPU: NOT CONFIRMED: fix arm does not show 1 launch/round; "
        "draft step bug/fix 3.25x at 4k beyond the per-round noise"
    )
    assert "kit-bad" in report_page.headline_html(this)


def test_a_task_batch_compares_outputs_within_a_workload_and_names_its_checkpoint(tmp_path: Path) -> None:
    """A36: cpu_task's off/bug/fix on two workloads at one context. Each workload's prompts are its own, so
    its arms are compared with each other, never with the other workload's (that claimed "outputs
    differ"); the model is the task checkpoint the runs recorded, not "random weights"."""
    batch = tmp_path / "runs" / "cpu_task"
    for workload, ids in (("same-target", (7, 8, 9)), ("moving-target", (4, 5, 6))):
        for arm, launches in (("off", STEPS - 1), ("bug", STEPS - 1), ("fix", 1)):
            _run(batch, arm, launches, [(10, 4), (20, 5)], 2.6e6 if launches > 1 else 0.8e6, workload, ids)
    this = this_batch.this_batch(_batch(batch))
    assert this.status.startswith(rungs.CONFIRMED) and "outputs identical" in this.claim, this.headline
    model = this.about["model"]
    assert model.startswith("the task checkpoint (128 keys, seed 0, made in memory)")
    assert "random" not in model
    [runs, _] = this.tables
    assert runs.frame["outputs identical across arms"].tolist() == [True] * 6
    assert runs.frame["answers right"].tolist() == ["2/2"] * 6
    assert "4k same-target" in runs.frame["context"].tolist()
    _run(batch, "upstream", 0, [(10, 4), (20, 5)], 0.8e6, "same-target", (7, 8, 0))  # one token differs
    this = this_batch.this_batch(_batch(batch))
    assert this.status == rungs.NOT_CONFIRMED and this.claim.startswith("outputs differ; ")
    frame = this.tables[0].frame
    identical = dict(zip(frame["run"], frame["outputs identical across arms"], strict=True))
    assert identical["mini-bug-same-target-ctx4096-s5-eager-cpu"] is False
    assert identical["mini-bug-moving-target-ctx4096-s5-eager-cpu"] is True


def test_a_ratio_inside_the_arms_per_round_spread_is_marked_within_noise(tmp_path: Path) -> None:
    """A loaded machine: the bug run's rounds spread over 1-4 ms, the fix's over 0.8-1.5 ms. Beside each
    median the report shows its p10-p90, and a bug/fix ratio whose spreads overlap is "within noise" in the
    table and the headline; apart (the `batch` fixture's steady rounds) it is beyond noise."""
    batch = tmp_path / "runs" / "busy"
    _run(batch, "bug", STEPS - 1, [(10, 4)], [1.0e6, 2.6e6, 4.0e6])
    _run(batch, "fix", 1, [(10, 4)], [0.8e6, 0.9e6, 1.5e6])
    this = this_batch.this_batch(_batch(batch))
    assert this.claim.endswith(
        "; draft step bug/fix 2.89x at 4k within noise (the arms' p10-p90 draft-step spreads overlap)"
    ), this.claim
    pairs = this.tables[1].frame.iloc[0]
    assert pairs["bug p10-p90 ms"] == "1.32-3.72" and pairs["fix p10-p90 ms"] == "0.82-1.38"
    assert pairs["bug/fix"] == "2.89x" and pairs["noise"] == "within noise: spreads overlap"


def test_a_new_rung_is_one_registered_function(batch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A later rung (say, a task checkpoint's accuracy table) registers itself with a rank and shows up in
    its place on the page, headline and all."""
    monkeypatch.setattr(rungs, "RUNGS", list(rungs.RUNGS))

    @rungs.rung(17)
    def task_checkpoint(batch: rungs.Batch) -> rungs.Rung:
        table = rungs.Table("accuracy", pd.DataFrame({"arm": ["bug", "fix"], "accuracy": [0.9, 0.9]}))
        return rungs.Rung(
            "task",
            "A task checkpoint",
            "real sglang, task checkpoint",
            rungs.CONFIRMED,
            "same accuracy",
            {"engine": "sglang"},
            tables=[table],
        )

    ladder = _ladder(batch)
    assert [r.key for r in ladder] == [
        "real-sglang-task-h200",
        "pr-grid-h200",
        "real-sglang-h200",
        "tensor-parallel-h200",
        "task",
        "mini-engine-h200",
        "kineto-h200",
        "this-batch",
        "mutation-suite",
    ]
    text = re.sub(r"<[^>]+>", "", report_page.overview_html(ladder))
    assert "real sglang, task checkpoint: CONFIRMED: same accuracy" in text


def test_tables_are_narrow_and_never_show_nan(batch: Path) -> None:
    """Every table of every rung: no index column, no NaN/None, at most 12 columns."""
    for rung in (*_ladder(batch), published_figures()):
        for table in rung.tables:
            assert len(table.frame.columns) <= 12, (rung.key, table.title, list(table.frame.columns))
            page = report_page.table_html(table)
            for bad in ("NaN", "nan<", ">None<", "<th></th>"):
                assert bad not in page, (rung.key, table.title, bad)
    assert report_page.table_html(rungs.Table("t", pd.DataFrame({"a": [float("nan"), True, 1.23456]}))) == (
        '<h3>t</h3><table class="kit"><thead><tr><th>a</th></tr></thead><tbody><tr><td>-</td></tr>'
        '<tr><td>yes</td></tr><tr><td class="num">1.235</td></tr></tbody></table>'
    )


def test_every_figure_has_a_source_units_and_no_published_point_beside_cpu_times(batch: Path) -> None:
    for rung in _ladder(batch):
        for plot in rung.plots:
            assert plot.source, (rung.key, plot.title)
            assert report_page.plot_png(plot).startswith(b"\x89PNG"), (rung.key, plot.title)
    assert (batch / "report_plots.png").is_file()  # this batch's figure, kept beside the report
    from matplotlib.figure import Figure

    fig = Figure()
    this_batch.plot_batch(this_batch.summary_table(_batch(batch)), fig, "mini engine on CPU")
    launches, step, accept = fig.axes
    assert "NVTX wall time" in step.get_ylabel() and "ms" in step.get_ylabel()
    assert not any("PR" in t for ax in fig.axes for t in ax.get_legend_handles_labels()[1])
    for ax in (launches, step, accept):  # every bar carries its value
        assert len(ax.texts) == 2 and all(t.get_text() for t in ax.texts), ax.get_title()
    assert [t.get_text() for t in accept.texts] == ["3.333", "3.333"]


def test_page_parts_show_the_rung_label_before_its_detail(batch: Path) -> None:
    this = next(r for r in _ladder(batch) if r.key == "this-batch")
    parts = report_page.rung_parts(this, 3)
    kinds = [k for k, _ in parts]
    assert kinds[0] == "html" and "png" in kinds
    first = parts[0][1]
    assert first.index("3 · This batch") < first.index("this run: mini engine on CPU") < first.index("Nsight")


def test_export_has_no_code_prompts_or_scripts(tmp_path: Path) -> None:
    """nbconvert's page loads require.js and MathJax from a CDN and shows In/Out prompts; ours does not."""
    nb = new_notebook(
        cells=[new_markdown_cell("# Title\n\nnarrative"), new_code_cell("secret_code = 1\n2 + 2")]
    )
    nb.cells[1].outputs = [
        new_output("execute_result", data={"text/plain": "4"}, execution_count=3),
        new_output("display_data", data={"text/html": "<p>shown</p>"}),
    ]
    nb.cells[1].execution_count = 3
    src = tmp_path / "executed.ipynb"
    nbformat.write(nb, src)
    out = report_page.export_html(src, tmp_path / "report.html", title="PR #29654 evidence report: batch b")
    page = out.read_text()
    assert "<title>PR #29654 evidence report: batch b</title>" in page and "<title>Notebook" not in page
    assert "<script" not in page and "http" not in page.split("</head>")[0]
    assert "Out[" not in page and "In [" not in page and "secret_code" not in page
    assert "narrative" in page and "<p>shown</p>" in page
    with pytest.raises(KitError, match="refusing to overwrite"):
        report_page.export_html(src, out, title="again")


def test_a_crowded_batch_plot_names_each_bar_once_and_drops_the_values_that_would_overlap() -> None:
    """The PR grid's batch (19 runs): per-bar values overlapped into an unreadable row and two bars read
    'bug 4k' (graph and eager); past CROWDED_BARS the labels are one rotated line, the method says which
    one where arm and context repeat, and the values are left to the table."""
    from matplotlib.figure import Figure

    small = pd.DataFrame({"arm": ["bug", "fix"], "context_len": [4096, 4096], "method": ["nvtx", "nvtx"]})
    assert this_batch._bar_labels(small) == ["bug\n4k", "fix\n4k"]
    rows = [("bug", 4096, "graph"), ("bug", 4096, "eager")]
    rows += [("fix", 4096 * k, "graph") for k in range(1, 9)]
    crowded = pd.DataFrame(rows, columns=["arm", "context_len", "method"])
    labels = this_batch._bar_labels(crowded)
    assert labels[:2] == ["bug 4k graph", "bug 4k eager"] and len(set(labels)) == len(labels)
    ax = Figure().subplots()
    this_batch._label_bars(ax, ax.bar(range(10), range(10)), [str(n) for n in range(10)])
    assert not ax.texts  # no per-bar values when crowded
    ax = Figure().subplots()
    this_batch._label_bars(ax, ax.bar(range(2), range(2)), ["0", "1"])
    assert len(ax.texts) == 2
