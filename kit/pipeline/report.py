"""The batch report: a table and plots answering "one launch per round? same outputs? what gain?"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import yaml

from kit.compare.runs import load_run, summarize
from kit.errors import ExistsError
from kit.paths import PUBLISHED, RESULTS
from kit.rundir import is_complete

H200_RATIOS = RESULTS / "h200" / "ratios.csv"
SGLANG_H200_RATIOS = RESULTS / "h200-sglang" / "ratios.csv"
SGLANG_H200_COLUMNS = {
    "checkpoint": "checkpoint",
    "mode": "mode",
    "num_steps": "steps",
    "context_len": "context",
    "launches_bug": "launches/round 0.5.14",
    "launches_fix": "launches/round patched",
    "step_ms_bug": "draft step ms 0.5.14",
    "step_ms_fix": "draft step ms patched",
    "ratio_bug_over_fix": "bug/fix",
    "accept_bug": "accept 0.5.14",
    "accept_fix": "accept patched",
    "outputs_identical": "outputs identical",
    "logprob_median_abs_diff": "median |logprob diff|",
    "logprob_max_abs_diff": "max |logprob diff|",
}
# Result sets of the real-sglang rung, newest first, by the generated checkpoint's attention gain: with the
# first runs' gain (attn_out 5.5) attention decided some tokens at near-ties, so their outputs could not
# match (data/results/h200-sglang/README.md).
SGLANG_H200_SETS = {
    "attn_out 3.5": SGLANG_H200_RATIOS,
    "attn_out 5.5 (first runs)": SGLANG_H200_RATIOS.parent / "v1" / "ratios.csv",
}
ARM_COLORS = {"off": "#8172b2", "bug": "#c44e52", "fix": "#55a868", "upstream": "#4c72b0"}


def batch_runs(batch_dir: Path) -> list[Path]:
    """Completed run directories of a batch, in name order (set-aside failures are not counted twice)."""
    return sorted(p for p in Path(batch_dir).iterdir() if p.is_dir() and is_complete(p))


def summary_table(batch_dir: Path) -> pd.DataFrame:
    rows = []
    for run_dir in batch_runs(batch_dir):
        s = summarize(load_run(run_dir))
        rows.append(
            {
                "arm": s["arm"],
                "context_len": s["context_len"],
                "status": s["status"],
                "launches/round": ",".join(map(str, s["launches_per_round"])),
                "expected": s["expected_per_round"],
                "rounds": s["num_rounds"],
                "indexer GPU ms/round": s["indexer_gpu_ms_per_round"],
                "draft step ms (median)": s["draft_step_ms"]["median"],
                "p10": s["draft_step_ms"]["p10"],
                "p90": s["draft_step_ms"]["p90"],
                "accept length": s["accept_length"],
                "source": s["source"],
                "method": s["method"],
                "run": run_dir.name,
            }
        )
    return pd.DataFrame(rows)


def outputs_identical(batch_dir: Path) -> dict[str, bool]:
    """Per context length: are all arms' greedy outputs identical to each other?"""
    by_ctx: dict[Any, list[list[Any]]] = {}
    for run_dir in batch_runs(batch_dir):
        run = load_run(run_dir)
        by_ctx.setdefault(run["params"].get("context_len"), []).append(
            [o["output_ids"] for o in sorted(run["outputs"], key=lambda o: o["prompt_id"])]
        )
    return {str(ctx): all(o == outs[0] for o in outs) for ctx, outs in by_ctx.items()}


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


def plot_launches(table: pd.DataFrame, ax: plt.Axes) -> None:
    for i, (_, r) in enumerate(table.iterrows()):
        launches = max(int(x) for x in str(r["launches/round"]).split(",") if x) if r["launches/round"] else 0
        ax.bar(i, launches, color=ARM_COLORS.get(r["arm"], "grey"))
        ax.text(i, launches, f"exp {r['expected']}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(table)), [f"{r.arm}\n{r.context_len}" for r in table.itertuples()], fontsize=8)
    ax.set(ylabel="indexer launches / round", title="Indexer launches per draft round")


def plot_latency(table: pd.DataFrame, ax: plt.Axes, published: bool = True) -> None:
    for arm, grp in table.sort_values("context_len").groupby("arm"):
        ax.plot(
            grp["context_len"],
            grp["draft step ms (median)"],
            "o-",
            color=ARM_COLORS.get(arm),
            label=f"{arm} (measured)",
        )
    if published and PUBLISHED.exists():
        pub = yaml.safe_load(PUBLISHED.read_text())
        for p in pub["per_draft_step_ms"]:
            for arm in ("bug", "fix"):
                if p.get(arm) is not None:
                    ax.plot(
                        p["input_tokens"],
                        p[arm],
                        "*",
                        ms=12,
                        mfc="none",
                        color=ARM_COLORS[arm],
                        label=f"{arm}: PR #29654, {pub['setup']['hardware']} (published)",
                    )
    ax.set_xscale("log")
    ax.set(
        xlabel="input tokens (log)",
        ylabel="draft step, ms (median)",
        title="Per-draft-step latency vs context",
    )
    ax.legend(fontsize=7)


def plot_accept(table: pd.DataFrame, ax: plt.Axes) -> None:
    ax.bar(range(len(table)), table["accept length"], color=[ARM_COLORS.get(a, "grey") for a in table["arm"]])
    ax.set_xticks(range(len(table)), [f"{r.arm}\n{r.context_len}" for r in table.itertuples()], fontsize=8)
    ax.set(ylabel="accept length", title="Accept length per arm")


def export_html(executed: Path, out_html: Path) -> Path:
    """A self-contained page (images inlined, code hidden) a reviewer opens without Jupyter."""
    import nbformat
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(exclude_input=True, embed_images=True)
    body, _ = exporter.from_notebook_node(nbformat.read(executed, as_version=4))
    if out_html.exists():
        raise ExistsError(f"{out_html} already exists: refusing to overwrite it", path=out_html)
    out_html.write_text(body)
    return out_html


# ratios.csv written before the indexer columns existed: every such run was the mini engine's torch
# indexer with num_steps 5 (data/results/h200/README.md, provenance).
H200_DEFAULTS = {"indexer_impl": "torch", "indexer_path": "dense", "num_steps": 5}
H200_LINE_KEYS = ["mode", "preset", "indexer_impl", "indexer_path", "num_steps", "requests"]
H200_STYLE = {("torch", "dense"): "--", ("sglang", "paged"): "-", ("sglang", "ragged"): ":"}


def h200_ratios() -> pd.DataFrame | None:
    """The committed H200 evidence (data/results/h200): bug vs fix per mode, indexer, steps and batch."""
    if not H200_RATIOS.is_file():
        return None
    ratios = pd.read_csv(H200_RATIOS)
    for col, default in H200_DEFAULTS.items():
        if col not in ratios:
            ratios[col] = default
    return ratios


def h200_indexer_label(impl: str, path: str) -> str:
    """Which indexer a row measured, in words: the torch stand-in or sglang's own kernels (which path)."""
    if impl == "sglang":
        return f"sglang kernels, {path}"
    return "torch stand-in" if impl == "torch" else f"{impl} ({path})"


def h200_table(ratios: pd.DataFrame) -> pd.DataFrame:
    """The GPU-time rows (CUDA graphs) for display: which indexer ran beside each bug/fix pair."""
    graph = ratios[ratios["latency_basis"] == "gpu"].copy()
    graph.insert(
        1,
        "indexer",
        [h200_indexer_label(i, p) for i, p in zip(graph["indexer_impl"], graph["indexer_path"], strict=True)],
    )
    drop = ["latency_basis", "indexer_impl", "indexer_path"]
    return graph.drop(columns=[c for c in drop if c in graph]).reset_index(drop=True)


def plot_h200(ratios: pd.DataFrame, ax: plt.Axes) -> None:
    """bug/fix draft-step ratio vs context on the H200, one line per mode and indexer, beside the PR's
    published B300 point. Torch stand-in dashed, sglang's paged (decode) kernels solid, ragged dotted."""
    graph = ratios[ratios["latency_basis"] == "gpu"]
    for key, grp in graph.groupby(H200_LINE_KEYS):
        mode, preset, impl, path, steps, requests = key
        grp = grp.sort_values("context_len")
        ax.plot(
            grp["context_len"],
            grp["ratio_bug_over_fix"],
            marker="o",
            ls=H200_STYLE.get((impl, path), "-."),
            label=f"{mode}: {preset}, batch {requests}, {steps} steps, {h200_indexer_label(impl, path)}",
        )
    pub = yaml.safe_load(PUBLISHED.read_text())
    for p in pub["per_draft_step_ms"]:
        if p.get("speedup"):
            ax.plot(
                p["input_tokens"],
                p["speedup"],
                "*",
                ms=14,
                color="k",
                label=f"PR #29654: {pub['setup']['model']}, {pub['setup']['hardware']} (published)",
            )
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set(
        xlabel="input tokens (log)",
        ylabel="draft step time, bug / fix",
        title="What the fix buys per draft step on one H200 (mini engine, CUDA graphs, GPU time)",
    )
    ax.legend(fontsize=6, loc="upper left")


def sglang_h200_table() -> pd.DataFrame | None:
    """The real-sglang rung (data/results/h200-sglang): the 0.5.14 wheel vs the kit's patched build running
    in sglang itself on one H200, one row per result set, mode, steps and context; its README says how to
    read the outputs."""
    sets = [pd.read_csv(p).assign(checkpoint=label) for label, p in SGLANG_H200_SETS.items() if p.is_file()]
    if not sets:
        return None
    ratios = pd.concat(sets, ignore_index=True).reindex(columns=list(SGLANG_H200_COLUMNS))
    return ratios.rename(columns=SGLANG_H200_COLUMNS)
