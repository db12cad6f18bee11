#!/usr/bin/env bash
# Regenerate the H200 evidence (data/results/h200/) on one offline H200 host: the mini backend on CUDA,
# under Nsight Systems, every run through the kit's own `kit run` + `kit analyze`.
#   bash scripts/h200_evidence.sh OUT_DIR MODE [DEADLINE_S]
# MODE: fixtures (tiny preset, bug/fix x eager/graph, small reports to commit as test fixtures)
#       graph | eager (dsv32 preset, arms off/bug/fix x contexts 8k..512k, CUDA graphs on | off)
#       batch4 (dsv32, 4 requests per batch) | glm5 (GLM-5 shapes: 32 index heads): 128k and 512k, graphs on
#       kernels (sglang's own indexer kernels, deep_gemm + sgl_kernel, in the mini engine; graphs on, bug/fix,
#         512k then 128k; variations one at a time from dsv32 / 1 request / 5-1-6 / paged: 4 requests,
#         3-1-4 draft tokens, GLM-5's 32 index heads, the ragged (extend) logits kernel, and the torch
#         indexer as a same-window control; ~6 min). It starts with `python -m kit.backends.mini.kernel_check`
#         (import, top-k vs a torch reference, CUDA-graph replay, per-call timings): if that fails the runs
#         use the torch indexer, marked in their run ids and engine.json, and the ragged runs are skipped.
#         Needs deep_gemm (sgl-deep-gemm 0.1.3), sgl_kernel (sglang-kernel 0.4.4) and tvm_ffi on PYTHONPATH.
# Every mode but fixtures/kernels uses the torch indexer (what data/results/h200 documents); set
# KIT_INDEXER_IMPL=auto|sglang to change that.
# Needs: .whl/nvtx-0.2.10-cp312-*.whl and .devdeps/lib{dw1,elf1}_*.deb (see README "H200 evidence").
# Stops starting new runs after DEADLINE_S seconds (default 540; kernels: 320) so results always come back.
# Where the tree has no .git, set KIT_GIT_SHA (e.g. `git rev-parse HEAD` where it came from) for provenance.
set -uo pipefail
out=${1:?usage: h200_evidence.sh OUT_DIR MODE [DEADLINE_S]}
mode=${2:?mode: fixtures|graph|eager|batch4|glm5|kernels}
deadline=${3:-$([ "$mode" = kernels ] && echo 320 || echo 540)}
start=$SECONDS
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kit-site .whl/nvtx-*.whl >/dev/null
export PYTHONPATH="/tmp/kit-site:$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# DeepGEMM JIT-compiles its kernels on first use (nvcc): one cache for the whole window.
export DG_JIT_CACHE_DIR=${DG_JIT_CACHE_DIR:-/tmp/kit-deep-gemm-cache}
# shellcheck source=/dev/null
source scripts/gpu-host-nsys.sh .devdeps || exit 1
runs=/tmp/kit-runs
mkdir -p "$runs" "$out"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 -c \
  "import torch,sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'python', sys.version.split()[0])"; \
  "$KIT_NSYS" --version; git -C "$repo" rev-parse HEAD 2>/dev/null || echo "git sha: see provenance.json"; date -u; } \
  > "$out/host-$mode.txt" 2>&1

# run_one BATCH RUN_ID TIMEOUT_S KIT_RUN_ARGS...: one `kit run` + `kit analyze`, a log line, results re-tarred.
run_one() {
  local batch=$1 id=$2 limit=$3 t0=$SECONDS
  shift 3
  timeout "$limit" python3 -m kit.cli run --device cuda "$@" --out "$runs" --batch "$batch" --run-id "$id" \
    >/dev/null 2>"$runs/$id.err" \
    && python3 -m kit.cli analyze "$runs/$batch/$id" > /dev/null 2>>"$runs/$id.err"
  echo "$id rc=$? $((SECONDS - t0))s $(python3 -c "import json,sys; d=sys.argv[1]; v=json.load(open(d+'/verdict.json')); \
e=json.load(open(d+'/engine.json')); print(v['method'], sorted(set(v['launches_per_round'])), v['status'], \
'indexer', e.get('indexer_impl'), e.get('indexer_path') or '', 'step_ms', e.get('draft_step_ms_median'))" \
"$runs/$batch/$id" 2>/dev/null)" | tee -a "$out/log-$mode.txt"
  tail -3 "$runs/$id.err" >> "$out/log-$mode.txt"
  # Small files only (reports stay on the host, except fixtures); refreshed after every run.
  (cd "$runs" && tar czf "$out/results-$mode.tgz" --exclude='*.nsys-rep' --exclude='*.sqlite' h200-"$mode"*)
}

late() { (( SECONDS - start > deadline )); }

if [ "$mode" = kernels ]; then
  impl=sglang
  check_s=$(( deadline / 2 ))
  echo "kernel-check (limit ${check_s}s, DG_JIT_CACHE_DIR=$DG_JIT_CACHE_DIR)" | tee -a "$out/log-$mode.txt"
  timeout "$check_s" python3 -m kit.backends.mini.kernel_check --json "$out/kernel-check.json" --budget-s "$check_s" \
    > "$out/kernel-check.txt" 2>&1
  rc=$?
  if [ "$rc" != 0 ]; then
    impl=torch
    echo "kernel-check rc=$rc: the runs fall back to indexer_impl=torch (marked -torch-fallback)" >> "$out/kernel-check.txt"
  fi
  grep -E "^(kernels|warm|graph|timing|indexer_impl)|Error" "$out/kernel-check.txt" | tail -25 | tee -a "$out/log-$mode.txt"
  tag=$([ "$impl" = sglang ] && echo sglang || echo torch-fallback)
  # name preset requests num_steps path impl, most informative first
  variants=(
    "base dsv32 1 5 paged $impl"
    "b4 dsv32 4 5 paged $impl"
    "ragged dsv32 1 5 ragged $impl"
    "s3 dsv32 1 3 paged $impl"
    "glm5 glm5 1 5 paged $impl"
    "control dsv32 1 5 paged torch"
  )
  # 512k first for every variant (where the question lives), then 128k: the deadline cuts 128k runs first.
  for ctx in 524288 131072; do
    for v in "${variants[@]}"; do
      read -r name preset nreq steps path vimpl <<< "$v"
      if [ "$path" = ragged ] && [ "$vimpl" != sglang ]; then echo "skip $name $ctx: ragged needs sglang's kernels" | tee -a "$out/log-$mode.txt"; continue; fi
      [ "$name" = control ] && vtag=torch || vtag=$tag
      for arm in bug fix; do
        if late; then echo "deadline reached: stopping before $name $arm $ctx" | tee -a "$out/log-$mode.txt"; break 3; fi
        run_one "h200-kernels-$name" "$preset-$arm-ctx$ctx-graph-$name-$vtag" 90 --arm "$arm" --context-len "$ctx" \
          --preset "$preset" --cuda-graph --num-requests "$nreq" --num-steps "$steps" --max-new-tokens 48 \
          --indexer-impl "$vimpl" --indexer-path "$path"
      done
    done
  done
  cp "$out/kernel-check.txt" "$out/kernel-check.json" "$runs/" 2>/dev/null
  (cd "$runs" && tar czf "$out/results-$mode.tgz" --exclude='*.nsys-rep' --exclude='*.sqlite' h200-"$mode"* kernel-check.*)
  echo "kernels mode: $((SECONDS - start))s"
  ls -la "$out"
  exit 0
fi

case $mode in
  fixtures) preset=tiny; arms="bug fix"; contexts="8192"; graphs="--cuda-graph --no-cuda-graph"; extra=(--max-new-tokens 16) ;;
  graph)    preset=dsv32; arms="bug fix off"; contexts="8192 32768 131072 262144 524288"; graphs="--cuda-graph"; extra=(--max-new-tokens 48) ;;
  eager)    preset=dsv32; arms="bug fix off"; contexts="8192 32768 131072 262144 524288"; graphs="--no-cuda-graph"; extra=(--max-new-tokens 48) ;;
  batch4)   preset=dsv32; arms="bug fix"; contexts="131072 524288"; graphs="--cuda-graph"; extra=(--max-new-tokens 48) ;;
  glm5)     preset=glm5; arms="bug fix"; contexts="131072 524288"; graphs="--cuda-graph"; extra=(--max-new-tokens 48) ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
extra+=(--indexer-impl "${KIT_INDEXER_IMPL:-torch}")

for ctx in $contexts; do
  for g in $graphs; do
    for arm in $arms; do
      if late; then echo "deadline reached: stopping before $arm $ctx $g"; break 3; fi
      tag=$([ "$g" = --cuda-graph ] && echo graph || echo eager)
      run_one "h200-$mode" "$preset-$arm-ctx$ctx-$tag" 300 --arm "$arm" --context-len "$ctx" --preset "$preset" "$g" \
        --num-requests "$([ "$mode" = batch4 ] && echo 4 || echo 1)" "${extra[@]}"
    done
  done
done
if [ "$mode" = fixtures ]; then
  tar czf "$out/fixtures.tgz" --exclude='*.nsys-rep' -C "$runs" "h200-$mode"
fi
ls -la "$out"
