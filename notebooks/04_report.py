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
# # sglang PR #29654: one DSA indexer launch per EAGLE/MTP draft round
#
# On DSA models (DeepSeek-V3.2, GLM-5.x) the MTP draft layer is meant to run the lightning indexer once per
# draft round and reuse its top-k on the later draft steps. In sglang 0.5.13.post1-0.5.14 the top-k was
# written to a per-step copy of the `ForwardBatch` and lost, so every draft step ran the indexer again.
# Every rung below checks the same three things: **`num_steps - 1` indexer launches per draft round without
# the fix, 1 with it, and identical greedy outputs**; then what the fix buys per draft step.
#
# The page reads top-down, strongest evidence first: real sglang on a GPU, then the kit's mini engine on
# the same GPU, then this batch's own runs. Each rung says what ran (engine, device, model, Nsight Systems
# version) and where its files are. Launches are counted from the Nsight Systems report: the kit's NVTX
# ranges nested in each `draft_round`, or, with CUDA graphs, the graph node each replayed kernel was
# captured as. Times are compared only within a rung; the PR's own figures, from another machine and
# model, close the page in a section of their own.

# %% tags=["parameters"]
batch_dir = ""  # empty: the batch of the newest analysed run under runs_root
runs_root = "runs"

# %%
from kit.pipeline.notebooks import check_parameters

check_parameters("04_report", In)  # papermill only warns of a name not declared above: refused here

# %%
from pathlib import Path

from kit.pipeline.stages import run_group
from kit.report import page
from kit.report.ladder import ladder
from kit.report.published import published_figures
from kit.rundir import latest_run

batch = Path(batch_dir) if batch_dir else latest_run(runs_root, analysed=True).parent
rungs = ladder(batch, run_group)
page.show([("html", page.overview_html(rungs))])

# %% [markdown]
# A rung is **CONFIRMED** only when every bug/fix pair in it shows both launch counts and, where the
# outputs could be compared, identical greedy tokens. The mini engine is a model of sglang 0.5.14's
# EAGLE-MTP draft machinery (the runner's per-step `dataclasses.replace` copy, the NextN layer's top-k
# carrier), not sglang: it shows the mechanism and its cost at real model shapes, while the real-sglang
# rung shows the PR's claim in sglang itself.

# %%
for number, rung in enumerate(rungs, 1):
    page.show(page.rung_parts(rung, number))

# %%
page.show(page.rung_parts(published_figures()))

# %% [markdown]
# ---
# **Regenerate.** This batch: `kit batch <matrix>` (or `make demo`). The committed GPU rungs: the commands
# in `data/results/h200-sglang/README.md` and `data/results/h200/README.md`, then `kit evidence` for their
# CSVs. Every run directory keeps `params.json`, `provenance.json` (kit version and git commit, Nsight
# version, GPU and driver), `verdict.json` and `rounds.csv`, so each figure on this page can be traced to
# the runs that made it.
