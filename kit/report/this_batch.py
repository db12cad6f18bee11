"""This batch's own runs, whatever they ran on (the demo: the mini engine on CPU): the rung, and the reader
of the batch's analysed run directories behind it (one row per run, outputs compared within each group of
runs that differ only by arm, the draft step of each bug/fix pair against its per-round spread), with its
figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from kit.compare.equivalence import pooled_accept
from kit.compare.runs import load_run, request_table, summarize
from kit.report.about import ARM_COLORS, context_label, describe_runs, shown
from kit.report.rung import Batch, Plot, Rung, Table, per_request_table, rung
from kit.rundir import is_complete, read_json

BASIS = {"gpu": "GPU time", "wall": "NVTX wall time"}


def batch_runs(batch_dir: Path) -> list[Path]:
    """Completed run directories of a batch, in name order (set-aside failures are not counted twice)."""
    return sorted(p for p in Path(batch_dir).iterdir() if p.is_dir() and is_complete(p))


def _answers(accuracy: dict[str, dict[str, Any]] | None) -> str | None:
    """'right/requests' over the run's scored requests (task runs); None where no request has an answer."""
    if not accuracy:
        return None
    right, asked = sum(w["correct"] for w in accuracy.values()), sum(w["requests"] for w in accuracy.values())
    return f"{right}/{asked}"


def summary_table(batch: Batch) -> pd.DataFrame:
    """One row per completed run. The accept length is pooled over the run's requests (total tokens / total
    verify rounds), as the engine reports it and as `kit compare` pools it; summarize() averages the
    per-request ratios instead, which weighs a short request like a long one."""
    rows = []
    for run_dir in batch_runs(batch.path):
        run = load_run(run_dir)
        s = summarize(run)
        accept = pooled_accept(run["outputs"])
        rows.append(
            {
                "group": batch.group_of(run["params"]),
                "workload": run["params"].get("workload"),
                "arm": s["arm"],
                "context_len": s["context_len"],
                "steps": run["params"].get("num_steps"),
                "status": s["status"],
                "launches/round": ",".join(map(str, s["launches_per_round"])),
                "expected": s["expected_per_round"],
                "rounds": s["num_rounds"],
                "indexer GPU ms/round": s["indexer_gpu_ms_per_round"],
                "draft step ms (median)": s["draft_step_ms"]["median"],
                "p10": s["draft_step_ms"]["p10"],
                "p90": s["draft_step_ms"]["p90"],
                "basis": s["draft_step_basis"],
                "accept length": round(accept, 4) if accept is not None else None,
                "answers right": _answers(s["accuracy"]),
                "source": s["source"],
                "method": s["method"],
                "run": run_dir.name,
            }
        )
    return pd.DataFrame(rows)


def outputs_identical(batch: Batch) -> dict[str, bool]:
    """Per group (batch.group_of: the runs that differ only by arm, so one context and one workload): are all
    arms' greedy outputs identical to each other? Runs of two workloads or contexts had other prompts."""
    by_group: dict[str, list[list[Any]]] = {}
    for run_dir in batch_runs(batch.path):
        run = load_run(run_dir)
        by_group.setdefault(batch.group_of(run["params"]), []).append(
            [o["output_ids"] for o in sorted(run["outputs"], key=lambda o: o["prompt_id"])]
        )
    return {group: all(o == outs[0] for o in outs) for group, outs in by_group.items()}


def comparisons(batch_dir: Path) -> list[tuple[dict[str, str], dict[str, Any]]]:
    """(labels, per-request table) of each comparison the batch's compare stage wrote (compare-<group>/, not
    those set aside), labelled by its group and its gate's verdict."""
    out = []
    for f in sorted(Path(batch_dir).glob("compare-*/comparison.json")):
        if ".superseded-" in f.parent.name:
            continue
        gate = "FAIL" if read_json(f).get("gate_failures") else "PASS"
        out.append(({"comparison": f.parent.name.removeprefix("compare-"), "gate": gate}, request_table(f)))
    return out


def spreads_overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two (p10, p90) ranges share any value: a ratio of medians inside that is noise."""
    return a[0] <= b[1] and b[0] <= a[1]


def draft_step_pairs(table: pd.DataFrame) -> pd.DataFrame:
    """Per group with a bug and a fix run: each arm's draft-step median and its per-round p10-p90 (from
    summarize()), the ratio of medians bug/fix, and whether it is within noise: the two arms' p10-p90
    spreads overlap, so round-to-round variation (a loaded machine) covers the difference."""
    rows = []
    for group, runs in table.groupby("group", sort=False):
        arms = {r["arm"]: r for _, r in runs.iterrows()}
        bug, fix = arms.get("bug"), arms.get("fix")
        if bug is None or fix is None or pd.isna(bug["draft step ms (median)"]):
            continue
        if pd.isna(fix["draft step ms (median)"]) or not fix["draft step ms (median)"]:
            continue
        spread_bug, spread_fix = (bug["p10"], bug["p90"]), (fix["p10"], fix["p90"])
        within = spreads_overlap(spread_bug, spread_fix)
        rows.append(
            {
                "group": group,
                "context_len": bug["context_len"],
                "workload": bug.get("workload"),
                "bug ms": bug["draft step ms (median)"],
                "bug p10-p90": spread_bug,
                "fix ms": fix["draft step ms (median)"],
                "fix p10-p90": spread_fix,
                "ratio": round(float(bug["draft step ms (median)"] / fix["draft step ms (median)"]), 2),
                "within noise": within,
            }
        )
    return pd.DataFrame(rows)


def verdict_line(table: pd.DataFrame, identical: dict[str, bool]) -> str:
    if table.empty:
        return "NO RUNS: nothing to report"
    fix = table[table["arm"].isin(["fix", "upstream"])]
    bug = table[table["arm"] == "bug"]
    ok_fix = not fix.empty and (fix["status"] == "pass").all()
    ok_bug = bug.empty or (bug["status"] == "pass").all()
    same = all(identical.values())
    measured = "under Nsight Systems" if (table["source"] == "nsys").all() else "NOT all under Nsight"
    if ok_fix and ok_bug and same:
        return (
            f"CONFIRMED ({measured}): fix = 1 indexer launch per draft round, bug = num_steps-1, "
            "outputs identical"
        )
    parts = [] if ok_fix else ["fix arm does not show 1 launch/round"]
    parts += [] if ok_bug else ["bug arm did not reproduce"]
    parts += [] if same else ["outputs differ"]
    return "NOT CONFIRMED: " + "; ".join(parts)


CROWDED_BARS = 8  # more bars than this on one axis: values overlap, so the table beside the plot has them


def _bar_labels(table: pd.DataFrame) -> list[str]:
    """arm and context per bar; with the attribution method where those alone repeat (a batch with graph
    and eager cells of one context)."""
    sep = " " if len(table) > CROWDED_BARS else "\n"  # rotated when crowded: one line each
    labels = [f"{r.arm}{sep}{context_label(r.context_len)}" for r in table.itertuples()]
    if len(set(labels)) < len(labels) and "method" in table:
        labels = [f"{label} {m}" for label, m in zip(labels, table["method"], strict=True)]
    return labels


def _label_bars(ax: Axes, bars: Any, texts: list[str]) -> None:
    if len(texts) <= CROWDED_BARS:
        ax.bar_label(bars, texts, padding=2, fontsize=8)
    ax.margins(y=0.18)  # room above the tallest bar for its value


def plot_batch(table: pd.DataFrame, fig: Figure, scope: str) -> None:
    """This batch's runs, one bar per run: launches per round (against what the arm must show), the
    draft-step median with its p10-p90 range, and the pooled accept length; each bar carries its value.
    `scope` names what ran (e.g. "mini engine on CPU"); times are on this rung's own axis only."""
    launch_ax, step_ax, accept_ax = fig.subplots(1, 3)
    x = range(len(table))
    colors = [ARM_COLORS.get(a, "grey") for a in table["arm"]]
    launches = [max((int(v) for v in str(s).split(",") if v), default=0) for s in table["launches/round"]]
    bars = launch_ax.bar(x, launches, color=colors)
    _label_bars(
        launch_ax, bars, [f"{n} (expected {e})" for n, e in zip(launches, table["expected"], strict=True)]
    )
    launch_ax.set(ylabel="indexer launches per draft round", title="Indexer launches per draft round")
    median = pd.to_numeric(table["draft step ms (median)"], errors="coerce")
    low = (median - pd.to_numeric(table["p10"], errors="coerce")).clip(lower=0).fillna(0)
    high = (pd.to_numeric(table["p90"], errors="coerce") - median).clip(lower=0).fillna(0)
    bars = step_ax.bar(x, median.fillna(0), color=colors, yerr=[low, high], capsize=3, ecolor="#444")
    _label_bars(step_ax, bars, ["-" if pd.isna(m) else f"{m:.3g} ms" for m in median])
    basis = ", ".join(sorted({BASIS.get(b, str(b)) for b in table["basis"]}))
    step_ax.set(ylabel=f"draft step, ms ({basis})", title="Draft step: median, whiskers p10-p90")
    accept = pd.to_numeric(table["accept length"], errors="coerce")
    bars = accept_ax.bar(x, accept.fillna(0), color=colors)
    _label_bars(accept_ax, bars, ["-" if pd.isna(a) else f"{a:.3f}" for a in accept])
    accept_ax.set(ylabel="tokens per verify round", title="Accept length (pooled over requests)")
    turn = 90 if len(table) > CROWDED_BARS else 0
    for ax in (launch_ax, step_ax, accept_ax):
        ax.set_xticks(list(x), _bar_labels(table), fontsize=8, rotation=turn)
    fig.suptitle(f"This batch: {scope}", fontsize=11)


@rung(30)
def this_batch(batch: Batch) -> Rung:
    """This batch's own runs, whatever they ran on (the demo: the mini engine on CPU)."""
    table = summary_table(batch)
    runs = batch_runs(batch.path)
    about = describe_runs(runs) if runs else {"short": "no completed runs"}
    about["files"] = (
        f"{shown(batch.path)}/ (one folder per run: verdict.json, rounds.csv, outputs.jsonl, ...)"
    )
    identical = outputs_identical(batch)
    status, _, claim = verdict_line(table, identical).partition(": ")
    if table.empty:
        return Rung(
            "this-batch",
            f"This batch: {batch.path.name}",
            f"this run: {about['short']}",
            status,
            claim,
            about,
        )
    pairs = draft_step_pairs(table)
    claim += _ratio_claim(pairs)
    per_run = pd.DataFrame(
        {
            "run": table["run"],
            "arm": table["arm"],
            "context": [
                _cell_label(c, w) for c, w in zip(table["context_len"], table["workload"], strict=True)
            ],
            "steps": table["steps"],
            "launches/round (expected)": [
                f"{n} ({e})" for n, e in zip(table["launches/round"], table["expected"], strict=True)
            ],
            "rounds": table["rounds"],
            "verdict": table["status"],
            "draft step ms, median": table["draft step ms (median)"],
            "p10-p90 ms": [_spread(a, b) for a, b in zip(table["p10"], table["p90"], strict=True)],
            "accept length": table["accept length"],
            **({"answers right": table["answers right"]} if table["answers right"].notna().any() else {}),
            "outputs identical across arms": [identical.get(g) for g in table["group"]],
        }
    )
    tables = [Table("One row per run", per_run)]
    if not pairs.empty:
        tables.append(
            Table(
                "Draft step, bug vs fix: each arm's median and its per-round spread",
                pd.DataFrame(
                    {
                        "context": [
                            _cell_label(c, w)
                            for c, w in zip(pairs["context_len"], pairs["workload"], strict=True)
                        ],
                        "bug ms, median": pairs["bug ms"],
                        "bug p10-p90 ms": [_spread(*s) for s in pairs["bug p10-p90"]],
                        "fix ms, median": pairs["fix ms"],
                        "fix p10-p90 ms": [_spread(*s) for s in pairs["fix p10-p90"]],
                        "bug/fix": [f"{r:.2f}x" for r in pairs["ratio"]],
                        "noise": [
                            "within noise: spreads overlap" if w else "beyond noise"
                            for w in pairs["within noise"]
                        ],
                    }
                ),
                note="A ratio is within noise when the two arms' p10-p90 draft-step ranges overlap: the "
                "rounds of one run vary by more than the arms differ (a loaded machine does this), so the "
                "ratio of medians says nothing about the fix.",
            )
        )
    compared = comparisons(batch.path)
    if compared:
        tables.append(
            per_request_table(
                "This batch's comparisons (kit compare --gate, the off run as the control where the batch "
                "has one), request by request",
                compared,
            )
        )
    basis = ", ".join(sorted({BASIS.get(b, str(b)) for b in table["basis"]}))
    how = ", ".join(sorted(set(table["method"])))
    plots = [
        Plot(
            "This batch, one bar per run",
            f"{shown(batch.path)}/*/verdict.json, rounds.csv, outputs.jsonl",
            draw=lambda fig: plot_batch(table, fig, about["short"]),
            size=(12.5, 3.9),
            save_as=batch.path / "report_plots.png",
        )
    ]
    plots += [
        Plot(
            f"One draft round on the timeline: {run.name}",
            f"{shown(run)}/timeline.png, drawn from the run's profile report",
            png=run / "timeline.png",
        )
        for run in runs
        if (run / "timeline.png").is_file()
    ]
    return Rung(
        key="this-batch",
        title=f"This batch's own runs: {batch.path.name}",
        scope=f"this run: {about['short']}",
        status=status,
        claim=claim,
        about=about,
        note=(
            f"Launches counted by `{how}` from each run's report; draft-step times are {basis} per draft "
            "forward, medians over the draft rounds; accept length = completion tokens / verify rounds, "
            "pooled over the run's requests. These times belong to this machine only: they are never "
            "drawn beside the GPU figures above or the PR's."
        ),
        tables=tables,
        plots=plots,
    )


def _cell_label(context_len: Any, workload: Any) -> str:
    """ "4k", or "4k same-target" where the batch has a workload axis."""
    ctx = context_label(context_len)
    return f"{ctx} {workload}" if isinstance(workload, str) and workload else ctx


def _spread(p10: Any, p90: Any) -> str:
    return f"{p10:.3g}-{p90:.3g}" if pd.notna(p10) and pd.notna(p90) else "-"


WITHIN_WORDS = "within noise (the arms' p10-p90 draft-step spreads overlap)"


def _ratio_claim(pairs: pd.DataFrame) -> str:
    """The headline's draft-step ratios bug/fix, each with its cell, grouped by whether it is beyond or
    within the arms' per-round noise."""
    if pairs.empty:
        return ""
    labels = [_cell_label(c, w) for c, w in zip(pairs["context_len"], pairs["workload"], strict=True)]
    within = pairs["within noise"].astype(bool).tolist()
    out = []
    for inside, words in ((False, "beyond the per-round noise"), (True, WITHIN_WORDS)):
        which = [
            f"{r:.2f}x at {lb}"
            for r, lb, w in zip(pairs["ratio"], labels, within, strict=True)
            if w is inside
        ]
        if which:
            out.append(f"draft step bug/fix {', '.join(which)} {words}")
    return "; " + "; ".join(out)
