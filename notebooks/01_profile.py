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
# # 01 · Profile one arm under Nsight Systems
#
# One run of the speculative-decoding workload for one **arm** (with the sglang backend, one server that
# may run several cells: a list of context lengths and workloads, each into its own run directory):
# - `off`: index sharing disabled, the indexer runs on every draft step;
# - `bug`: sglang 0.5.14 — the top-k is written to the per-step `ForwardBatch` copy and lost;
# - `fix`: PR #29654 — the top-k is written to `spec_info`, shared by reference, and reused.
#
# The `mini` backend is a miniature of sglang's EAGLE-MTP draft machinery (a model of the mechanism, not
# sglang). Every draft round, draft step and indexer call is an NVTX range in domain `pr29654`; the run is
# wrapped in `nsys profile` and exported to SQLite. With `profiler="torch"` the engine (or sglang) runs under the
# PyTorch profiler instead: the same ranges as record_function ranges in a Kineto trace
# (`profile.trace.json.gz`), no nsys needed. Everything lands in a new run directory.

# %% tags=["parameters"]
# None: the backend's own default (after the #). Written by python -m kit.pipeline.notebooks from the
# parameter models (kit/params.py, kit/backends/*/params.py): edit those, not this cell.
backend = "mini"  # mini or sglang
arm = "fix"
context_len = None  # mini 4096, sglang 81920
num_steps = 5
num_requests = None  # mini 1, sglang 4
max_new_tokens = None  # mini 32, sglang 256
eagle_topk = 1
cuda_graph = None  # mini False, sglang True
seed = 0
device = None  # cpu or cuda (sglang: cuda only) (mini cpu, sglang cuda)
workload = None  # mini model task: same-target, moving-target or any-slot; sglang: a prompt source (sglang records)
profiler = "nsys"  # nsys or torch (the PyTorch profiler, a Kineto trace; sglang: /start_profile)
num_draft_tokens = None  # None: num_steps + 1
model = None  # mini only: random or task (a kit.task retrieval checkpoint) (default random)
preset = None  # mini only: tiny, dsv32 or glm5 (default tiny)
index_topk = None  # mini only (default 2048)
indexer_impl = None  # mini only: auto, torch or sglang (the sglang kernels) (default auto)
indexer_path = None  # mini only: paged or ragged (with the sglang kernels) (default paged)
task_checkpoint = None  # mini, model task: a task checkpoint directory (default: made from seed)
model_path = None  # sglang only: a local GLM-5.x / DeepSeek-V3.2 checkpoint
tp_size = None  # sglang only (default 1)
concurrency = None  # sglang only (default 1)
profile = None  # sglang only: False: no nsys, no probes (outputs and timings only) (default True)
time_decode = None  # sglang only: True: prompt 0 streamed without a window too, timed client-side (default False)
profile_skip = None  # sglang only: decode chunks before the capture window opens (default 4)
profile_steps = None  # sglang only: forwards inside the capture window (default 24)
extra_args = None  # sglang only: more server flags, one list item per argument
runs_root = "runs"
batch = "interactive"
run_id = None  # with cell_ids: the server folder's name
cell_ids = None  # sglang, several cells on one server: their run directory names, contexts outer
start_before = None  # sglang, several cells: time.time() from which no further cell starts

# %%
from kit.pipeline.notebooks import check_parameters

check_parameters("01_profile", In)  # papermill only warns of a name not declared above: refused here

# %%
import json

from kit.backends.profile import cell_dirs, outputs_table, run_profile
from kit.pipeline.notebooks import profile_args

params, options = profile_args(globals())  # the parameters above that are set; None: the backend's default
run_dir = run_profile(params, runs_root, batch, run_id, **options)
print("run directory:", run_dir)
sorted(p.name for p in run_dir.iterdir())

# %% [markdown]
# ## Provenance
# `measured_under_nsight` must be `true` for a real measurement; otherwise the in-process recorder was used.

# %%
prov = json.loads((run_dir / "provenance.json").read_text())
{k: prov.get(k) for k in ("backend", "arm", "nsys_version", "measured_under_nsight", "git_sha", "torch", "gpu", "wall_s")}

# %% [markdown]
# ## Outputs
# One row per request (of every cell). Accept length = completion tokens / verify rounds, as sglang reports it.

# %%
# one run directory, or a server folder with a run directory per cell (those that started) beside it
outputs_table(cell_dirs(run_dir, cell_ids))
