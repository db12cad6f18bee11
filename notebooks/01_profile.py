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
# None = the backend's own default (kit/backends/mini/params.py, kit/backends/sglang/params.py).
backend = "mini"
arm = "fix"
context_len = 4096
num_steps = 5
num_requests = 2
max_new_tokens = 32
device = None  # mini: cpu or cuda; sglang: always CUDA
profiler = None  # nsys (default) or torch (the PyTorch profiler, a Kineto trace; sglang: /start_profile)
cuda_graph = None
preset = None  # mini only: tiny, dsv32 or glm5
eagle_topk = None
num_draft_tokens = None
seed = None
index_topk = None  # mini only
indexer_impl = None  # mini only: auto, torch or sglang (the sglang kernels)
indexer_path = None  # mini only: paged or ragged (with the sglang kernels)
model = None  # mini only: random (default) or task (a kit.task retrieval checkpoint)
workload = None  # mini, model task: same-target or moving-target
task_checkpoint = None  # mini, model task: a task checkpoint directory (default: made from seed)
model_path = None  # sglang only: a local GLM-5.x / DeepSeek-V3.2 checkpoint
tp_size = None  # sglang only
profile_skip = None  # sglang only: decode chunks before the capture window opens
profile_steps = None  # sglang only: forwards inside the capture window
extra_args = None  # sglang only: more server flags, one list item per argument
profile = None  # sglang only: False runs without nsys and the probes (outputs and timings only)
time_decode = None  # sglang only: True streams prompt 0 without a window too (its rounds timed client-side)
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

params = dict(
    backend=backend, arm=arm, context_len=context_len, num_steps=num_steps, num_requests=num_requests,
    max_new_tokens=max_new_tokens, device=device, cuda_graph=cuda_graph, preset=preset,
    eagle_topk=eagle_topk, num_draft_tokens=num_draft_tokens, seed=seed, index_topk=index_topk,
    indexer_impl=indexer_impl, indexer_path=indexer_path, model_path=model_path, tp_size=tp_size,
    profile_skip=profile_skip, profile_steps=profile_steps, extra_args=extra_args, model=model,
    workload=workload, task_checkpoint=task_checkpoint, profiler=profiler, profile=profile,
    time_decode=time_decode,
)
params = {k: v for k, v in params.items() if v is not None}
options = {k: v for k, v in dict(cell_ids=cell_ids, start_before=start_before).items() if v is not None}
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
