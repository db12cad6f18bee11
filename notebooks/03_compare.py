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
# # 03 · Compare two runs (bug vs fix)
#
# Speculative decoding is lossless: the target model decides every token, so the greedy outputs of `bug`
# and `fix` must be **identical**. Draft tokens may differ above `index_topk` (the reused top-k is from
# the round's first step), which can move the accept length a little; at or below `index_topk` the indexer
# keeps every token and drafts are identical too. The fix should show one indexer launch per round and a
# shorter draft step.

# %% tags=["parameters"]
run_a = ""  # empty: the newest analysed bug run under runs_root
run_b = ""  # empty: the newest analysed fix run under runs_root
control = ""  # a second run of one side's computation (the off arm): the noise floor; empty: none
runs_root = "runs"
out_dir = ""  # empty: write no comparison.json

# %%
from kit.pipeline.notebooks import check_parameters

check_parameters("03_compare", In)  # papermill only warns of a name not declared above: refused here

# %%
import json
from pathlib import Path

import pandas as pd

from kit.compare import per_request
from kit.compare.runs import comparison, save
from kit.rundir import latest_run

a = Path(run_a) if run_a else latest_run(runs_root, arm="bug", analysed=True)
b = Path(run_b) if run_b else latest_run(runs_root, arm="fix", analysed=True)
c = Path(control) if control else None
print("a:", a, "\nb:", b, "\ncontrol:", c or "none (same-target acceptance cannot be gated)")
result = comparison(a, b, c)
pd.DataFrame([result["a"], result["b"]]).set_index("arm")

# %% [markdown]
# ## Outputs

# %%
result["outputs"]

# %%
failures = result["gate_failures"]
print("GATE:", "PASS" if not failures else "FAIL")
for f in failures:
    print(" -", f)
for n in result["gate_notes"]:
    print(" note:", n)
for line in per_request.lines(result["per_request"]):  # why, request by request (a line where all passed)
    print(line)
ratio = result["draft_step_ratio_a_over_b"]
print("draft-step time ratio a/b:", ratio if ratio is not None else f"not compared: {result['draft_step_ratio_why']}")
if out_dir:  # made where missing, as kit compare --out
    print("wrote", save(result, out_dir))
