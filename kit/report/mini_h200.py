"""The mini engine on one H200 at DeepSeek-V3.2 / GLM-5 shapes: the rung, and the reader of its result set
(data/results/h200/ratios.csv, which `kit evidence` writes from its runs, kit.report.evidence): bug against
fix per mode, indexer, steps and batch, in words and as the bug/fix ratio against context.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.axes import Axes

from kit.paths import RESULTS
from kit.report.about import context_label, describe_runs
from kit.report.published import published
from kit.report.rung import CONFIRMED, NOT_CONFIRMED, Batch, Plot, Rung, Table, launch_claim, rung, span

H200_RATIOS = RESULTS / "h200" / "ratios.csv"
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


def h200_table(ratios: pd.DataFrame, basis: str = "gpu") -> pd.DataFrame:
    """The rows of one latency basis (gpu: CUDA graphs; wall: eager) for display, in words: which indexer
    ran beside each bug/fix pair, and only the columns every row has."""
    rows = ratios[ratios["latency_basis"] == basis]
    indexer = [
        h200_indexer_label(i, p) for i, p in zip(rows["indexer_impl"], rows["indexer_path"], strict=True)
    ]
    return pd.DataFrame(
        {
            "mode": rows["mode"],
            "indexer": indexer,
            "preset": rows["preset"],
            "steps": rows["num_steps"],
            "batch": rows["requests"],
            "context": [context_label(c) for c in rows["context_len"]],
            "launches/round bug → fix": [
                f"{b} → {f}" for b, f in zip(rows["launches_bug"], rows["launches_fix"], strict=True)
            ],
            "draft step ms bug": rows["step_ms_bug"],
            "draft step ms fix": rows["step_ms_fix"],
            "bug/fix": rows["ratio_bug_over_fix"],
            "accept length bug = fix": rows["accept_bug"] == rows["accept_fix"],
            "outputs identical": rows["outputs_identical"],
        }
    ).reset_index(drop=True)


def plot_h200(ratios: pd.DataFrame, ax: Axes) -> None:
    """bug/fix draft-step ratio vs context on the H200, one line per mode and indexer, beside the PR's
    published point (a ratio of GPU times on another machine and model, marked so). Torch stand-in
    dashed, sglang's paged (decode) kernels solid, ragged dotted; the legend sits beside the axes."""
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
    pub = published()
    for p in pub["per_draft_step_ms"]:
        if p.get("speedup"):
            ax.plot(
                p["input_tokens"],
                p["speedup"],
                "*",
                ms=14,
                color="k",
                label=f"the PR's figure: {pub['setup']['model']}, {pub['setup']['hardware']} (not this GPU)",
            )
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set(
        xlabel="input tokens (log scale)",
        ylabel="draft step GPU time, bug / fix (ratio)",
        title="What the fix buys per draft step on one H200 (mini engine, CUDA graphs)",
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def h200_runs() -> list[Path]:
    """The run directories behind the mini-engine H200 rung."""
    return sorted(p.parent for p in H200_RATIOS.parent.glob("runs/*/*/params.json"))


@rung(20)
def mini_engine_h200(batch: Batch) -> Rung | None:
    """The kit's mini engine on one H200 at DeepSeek-V3.2 / GLM-5 shapes, committed."""
    ratios = h200_ratios()
    if ratios is None:
        return None
    about = describe_runs(h200_runs())
    about["model"] += "; shapes of DeepSeek-V3.2 (dsv32) and GLM-5 (glm5)"
    about["files"] = "data/results/h200/ (README.md, ratios.csv, summary.csv, runs/)"
    launches_ok, launches = launch_claim(ratios["launches_bug"], ratios["launches_fix"], ratios["num_steps"])
    same = int(ratios["outputs_identical"].sum())
    graph = ratios[ratios["latency_basis"] == "gpu"]
    claim = (
        f"{launches} in all {len(ratios)} pairs (CUDA graphs and eager, torch stand-in and sglang's indexer "
        f"kernels, {context_label(ratios['context_len'].min())}-"
        f"{context_label(ratios['context_len'].max())}); greedy outputs identical in "
        f"{same}/{len(ratios)}; draft step {span(graph['ratio_bug_over_fix'])} faster with the fix "
        "(GPU time, CUDA graphs)"
    )
    return Rung(
        key="mini-engine-h200",
        title="The mini engine on one GPU: NVIDIA H200",
        scope="mini engine on one NVIDIA H200 (committed results)",
        status=CONFIRMED if launches_ok and same == len(ratios) else NOT_CONFIRMED,
        claim=claim,
        about=about,
        note=(
            "`indexer` says which lightning indexer ran: the kit's torch stand-in, or sglang's own kernels "
            "(deep_gemm's fp8 paged logits, the decode path sglang takes for draft steps; the ragged "
            "extend kernel as a counterfactual; sgl_kernel's top-k). With CUDA graphs the draft loop is "
            "replayed as one graph, as sglang does, and times are GPU spans; eager times are NVTX wall "
            "time, bound by kernel launches, so they are shown apart."
        ),
        tables=[
            Table(
                "CUDA graphs: launches per draft round and draft-step GPU time (median)",
                h200_table(ratios),
            ),
            Table(
                "Eager: launches per draft round and draft-step wall time (median)",
                h200_table(ratios, "wall"),
            ),
        ],
        plots=[
            Plot(
                "bug / fix draft-step GPU time against context length",
                "data/results/h200/ratios.csv; the PR's point: data/pr29654_published.yaml",
                draw=lambda fig: plot_h200(ratios, fig.subplots()),
                size=(12.5, 4.6),
            )
        ],
    )
