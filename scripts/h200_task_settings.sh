# Sourced by scripts/h200_mutants.sh, h200_sglang.sh, h200_task.sh and h200_upstream.sh. SGL and TASK are
# how h200_mutants.sh serves and drives its task runs (`kit run`); the task drivers' steps run the same
# settings as data/matrices/h200_task.yaml's modes (tests/test_h200_task_matrix.py holds the two equal), and
# use only the host set-up below: the nvtx wheel, the JIT caches, the environment.
# Needs $ckpt (the task checkpoint) and $runs (the runs root); the script appends its --batch (and its own
# --context-len/--workload where it picks them).
# fp8 KV cache: both DSA backends are FlashMLA (FlashAttention-3 is not staged); 2 requests in flight.
# shellcheck shell=bash disable=SC2034
SGL=(--sglang-arg=--kv-cache-dtype=fp8_e4m3 --sglang-arg=--dsa-prefill-backend=flashmla_kv
     --sglang-arg=--dsa-decode-backend=flashmla_kv --sglang-arg=--context-length=524288
     --sglang-arg=--cuda-graph-max-bs=2 --sglang-arg=--max-running-requests=2
     --sglang-arg=--mem-fraction-static=0.6 --sglang-arg=--disable-radix-cache
     --sglang-arg=--sampling-backend=pytorch --sglang-arg=--grammar-backend=none)
TASK=(--backend sglang --model-path "$ckpt" --num-steps 5 --eagle-topk 1 --num-draft-tokens 6 --cuda-graph
      --num-requests 8 --concurrency 2 --max-new-tokens 96 --profile-skip 2 --profile-steps 10
      --out "$runs")
# Prompts of <= 2048 tokens would take the dense MHA prefill, which is FlashAttention-3 (not staged).
export PYTHONUNBUFFERED=1 SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD=0

# Drivers that run several servers on the one GPU at once (h200_mutants.sh with JOBS > 1) call this: the
# same flags with the KV pool capped in tokens (4 x CONTEXT_LENGTH) instead of 60% of the memory, which a
# second server starting beside the first would not find. Prompts, decoding and the graphs are unchanged.
shared_gpu_flags() {  # CONTEXT_LENGTH
  SGL=("${SGL[@]/--context-length=524288/--context-length=$1}")
  SGL=("${SGL[@]/--mem-fraction-static=0.6/--mem-fraction-static=0.9}")
  SGL+=("--sglang-arg=--max-total-tokens=$((4 * $1))")
}

# A kit run cut short at its deadline gets one SIGINT, as from one Ctrl-C: it stops its server so that nsys
# writes the report, and marks the cell in progress incomplete. Plain `timeout` signals the run and then its
# whole process group, the run again: a second SIGINT that lands apart reads as a second Ctrl-C, which stops
# nsys before it writes (the cells that had finished lose their report). --foreground: the run alone, once.
until_deadline() {  # SECONDS CMD...
  timeout --foreground -s INT "$@"
}

# shellcheck source=scripts/jit_cache.sh
source scripts/jit_cache.sh  # jit_restore (here, every call: the .stage-jit* parts that travelled) and jit_pack OUT
jit_restore

# What every driver does on the host (needs $repo and $target): the nvtx wheel for the probe, one build's
# folders on PYTHONPATH, the host's facts, and the runs packed for the trip back (nsys reports and Kineto
# traces stay on the host: 16 MiB a file comes back) with the JIT caches.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kit-site .whl/nvtx-*.whl >/dev/null
use() {  # VERSION [TARGET]: that build's folders (under $target unless named) on PYTHONPATH
  local t=${2:-$target}
  export PYTHONPATH="/tmp/kit-site:$t/sglang-$1:$t/deps:$repo:$t/fallback"
}
host_facts() {  # FILE [LINE...]: GPU, torch, python, the kit's sha, the date (and LINEs): kit host facts
  python3 -m kit.cli host facts "$1" -- "${@:2}" >/dev/null
}
pack_runs() {  # TGZ RUNS_DIR: the runs only, no reports or traces (kit host pack); a driver adds jit_pack once
  # no server is running (a cache taken while a server compiles could hold a half-written kernel)
  python3 -m kit.cli host pack "$1" "$2" >/dev/null
}
