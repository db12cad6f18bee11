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
# # 00 · Build the patched sglang
#
# sglang PR #29654 fixed `index_share_for_mtp_iteration`: the DSA indexer's top-k was written back to a
# per-step **shallow copy** of the `ForwardBatch`, so every EAGLE/MTP draft step recomputed it. No PyPI
# release carries the PR under its own name, so the kit builds one: the **sglang 0.5.14** wheel from PyPI
# (sha256-pinned; the newest buggy release) plus the kit's own patch `kit/patches/pr29654.patch`, repacked
# as `0.5.14+pr29654`.
#
# The source-state detector (`kit verify`) then reads both wheels *without importing sglang* and says where
# the top-k is carried: on the ForwardBatch copy (**bug**) or on `spec_info`, shared by reference (**fix**).

# %% tags=["parameters"]
version = "0.5.14"
out_dir = "build/sglang-0.5.14+pr29654"

# %%
from kit.pipeline.notebooks import check_parameters

check_parameters("00_build_sglang", In)  # papermill only warns of a name not declared above: refused here

# %%
import json
from pathlib import Path

import pandas as pd

from kit.sglang_src.build import build_patched_wheel
from kit.sglang_src.verify import detect_state
from kit.sglang_src.wheels import fetch_wheel

existing = Path(out_dir) / "manifest.json"
if existing.is_file():  # builds are never overwritten: a re-run shows the build already made
    print(f"reusing the build in {out_dir} (delete it or choose another out_dir to rebuild)")
    manifest = json.loads(existing.read_text())
else:
    manifest = build_patched_wheel(version, Path(out_dir))
print(json.dumps(manifest, indent=2))

# %% [markdown]
# ## Before and after, as the detector sees them
# `evidence` points at the lines that decide the state: where the NextN model reads `prev_topk_indices`
# and where it writes the new top-k.

# %%
original = fetch_wheel(version)
patched = Path(manifest["output_path"])
states = {"sglang " + version: detect_state(original), "sglang " + version + "+pr29654": detect_state(patched)}
pd.DataFrame(
    [{"build": k, "state": v["state"], "carrier": v["carrier"], "version": v["version"]} for k, v in states.items()]
)

# %%
for name, st in states.items():
    print(f"== {name}: {st['state']}")
    for ev in st["evidence"][:4]:
        print(f"   {ev['file']}:{ev['line']}: {ev['source']}")

# %% [markdown]
# The patch itself (our own, written from the PR's description; four files):

# %%
from kit.provenance import PATCH

print(PATCH.read_text())
