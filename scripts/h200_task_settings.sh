# Sourced by scripts/h200_sglang.sh, h200_task.sh (h200_upstream.sh's steps) and h200_mutants.sh: the host
# set-up every real-sglang driver shares before it calls `kit host ...`. What the servers and runs are (flags,
# checkpoint, workloads) is each step's committed matrix: data/matrices/h200_pr29654.yaml, h200_sglang.yaml,
# h200_task.yaml, h200_mutants.yaml.
# The caller sets repo (the checkout) and tmp (the host's folders: /tmp, or KIT_HOST_TMP in the tests).
# shellcheck shell=bash
# Prompts of <= 2048 tokens would take the dense MHA prefill, which is FlashAttention-3 (not staged).
export PYTHONUNBUFFERED=1 SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD=0

# shellcheck source=scripts/jit_cache.sh
source scripts/jit_cache.sh  # jit_restore (here, every call: the .stage-jit* parts that travelled); jit_pack: the kit
jit_restore

# The python nvtx package for the probe (the host image has none): its cp312 wheel, which travels in .whl/.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kit-site .whl/nvtx-*.whl >/dev/null

# The kit's own processes see what every build shares, and the notebooks wheels once installed (kit batch's
# runner "auto" is notebooks only where papermill imports; without them here the task and mutants steps ran
# plain and wrote no report.html on the H100 on 2026-12-05); each cell adds its arm's build (the matrix).
target=$tmp/kit-sgl
nb=""
[ -d "$tmp/kit-nb/deps" ] && nb="$tmp/kit-nb/deps:"
export PYTHONPATH="/tmp/kit-site:$nb$target/deps:$repo:$target/fallback"
