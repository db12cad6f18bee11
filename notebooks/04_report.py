# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · Report: does PR #29654 give one indexer launch per draft round, with the same outputs?
#
# One row per run of the batch. `launches/round` comes from the Nsight report (NVTX ranges nested in each
# `draft_round`); `expected` is `num_steps - 1` for `bug`/`off` and 1 for `fix`. Latencies are medians
# over draft rounds (p10/p90 beside them). Figures from the PR itself are drawn as open stars and labelled
# *published*: they come from a different machine (4x B300) and model (GLM-5.2-FP8), not from this kit.

# %% tags=["parameters"]
batch_dir = ""  # empty: the batch of the newest analysed run under runs_root
runs_root = "runs"

# %%
from pathlib import Path

import matplotlib.pyplot as plt
from IPython.display import Image, Markdown, display

from kit.pipeline import report
from kit.rundir import latest_run

batch = Path(batch_dir) if batch_dir else latest_run(runs_root, analysed=True).parent
print("batch:", batch)
table = report.summary_table(batch)
identical = report.outputs_identical(batch)
display(Markdown(f"## {report.verdict_line(table, identical)}"))
table

# %% [markdown]
# Greedy outputs identical across arms, per context length:

# %%
identical

# %%
fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
report.plot_launches(table, axes[0])
report.plot_latency(table, axes[1])
report.plot_accept(table, axes[2])
fig.tight_layout()
fig.savefig(batch / "report_plots.png", dpi=110)

# %% [markdown]
# ## One draft round per arm on the timeline
# Each row is an NVTX range: the round, its draft steps, the indexer calls inside them. With the fix the
# indexer appears only in the first draft step.

# %%
for run_dir in report.batch_runs(batch):
    png = run_dir / "timeline.png"
    if png.is_file():
        display(Markdown(f"**{run_dir.name}**"), Image(filename=str(png)))

# %% [markdown]
# ## The GPU rung: one H200, committed evidence
# Measured by this kit on one H200 under Nsight Systems 2025.3.1 (`data/results/h200/`, provenance in its
# README): the mini engine at DeepSeek-V3.2 / GLM-5 shapes, the draft loop replayed as one CUDA graph.
# `indexer` says which lightning indexer ran: the kit's torch stand-in (modes `graph`, `batch4`, `glm5` and
# the same-window `kernels-control`) or sglang's own kernels (modes `kernels-*`: deep_gemm's fp8 paged
# logits, the decode path sglang takes for draft steps, or its ragged extend kernel as a counterfactual, and
# sgl_kernel's top-k). `floor_step_ms` is the cost model's draft step with no indexer at all. The PR's own
# figure is drawn as a black star: a different machine (4x B300, TP4) and model (GLM-5.2-FP8), not
# measured here.

# %%
h200 = report.h200_ratios()
if h200 is None:
    print("no committed H200 results (data/results/h200/ratios.csv)")
else:
    fig, ax = plt.subplots(figsize=(10, 4.8))
    report.plot_h200(h200, ax)
    fig.tight_layout()
    display(report.h200_table(h200))

# %% [markdown]
# ## The real-sglang rung: sglang 0.5.14 itself on one H200
# sglang's own server (`data/results/h200-sglang/`, provenance and regeneration in its README): the PyPI
# 0.5.14 wheel vs the kit's patched build, a DSA + MTP checkpoint made by `kit make-checkpoint` (random
# weights: no model can be downloaded there), EAGLE 5/1/6 and 3/1/4, the kit's probes and launcher under
# Nsight Systems 2025.3.1; eager rows by NVTX attribution, graph rows by graph-node attribution. Draft-step
# times are GPU time per draft forward. With the current checkpoint (attn_out 3.5) the two builds' greedy
# outputs are identical and their per-token logprobs agree within the column's bound, below what the same
# build shows between two verify shapes; the first runs' checkpoint (attn_out 5.5) let attention pick 7%
# of tokens at near-ties, where the outputs split, so its rows count launches and time only.

# %%
real = report.sglang_h200_table()
display(real if real is not None else Markdown("no committed real-sglang results"))
