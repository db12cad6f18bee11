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
# # 02 · Count indexer launches per draft round
#
# The analysis reads the Nsight export with SQL: for every `draft_round` range it counts the `indexer`
# ranges nested inside it (one range = one indexer invocation) and the `draft_step` ranges (draft forwards).
# Expected per round: `num_steps - 1` for `off` and `bug`, exactly **1** for `fix`.
# A report in which the NVTX ranges are missing is **inconclusive**, never "0 launches".

# %% tags=["parameters"]
run_dir = ""  # empty: the newest run under runs_root not yet analysed
runs_root = "runs"
method = "auto"

# %%
from kit.pipeline.notebooks import check_parameters

check_parameters("02_analyze", In)  # papermill only warns of a name not declared above: refused here

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from kit.analysis.analyze import analyze
from kit.analysis.timeline import timeline_png
from kit.rundir import latest_run

run = Path(run_dir) if run_dir else latest_run(runs_root, analysed=False)
print("run directory:", run)
verdict = analyze(run, method=method)
verdict

# %% [markdown]
# ## Per-round table (`rounds.csv`)

# %%
rounds = pd.read_csv(run / "rounds.csv")
rounds.head(12)

# %%
fig, ax = plt.subplots(figsize=(8, 2.8), layout="constrained")
bars = ax.bar(rounds.index + 1, rounds["indexer_launches"], color="#c44e52" if verdict["arm"] != "fix" else "#55a868")
ax.bar_label(bars, fontsize=7)
ax.axhline(verdict["expected_per_round"], ls="--", color="k", lw=1, label=f"expected ({verdict['expected_per_round']})")
ax.margins(y=0.2)
ax.set(xlabel="draft round", ylabel="indexer launches", title=f"arm {verdict['arm']}: indexer launches per round")
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)  # beside the bars, never over them
fig.savefig(run / "launches_per_round.png", dpi=110)

# %% [markdown]
# ## One draft round on the timeline

# %%
png = timeline_png(run, run / "timeline.png")
from IPython.display import Image

Image(filename=str(png))
