#!/usr/bin/env bash
# Regenerate the H200 evidence (data/results/h200/) on one offline H200 host: the mini backend on CUDA,
# under Nsight Systems. This script only sets the host up; the runs are `kit batch h200_mini --mode MODE
# --runner plain` (data/matrices/h200_mini.yaml holds every mode's grid), which resumes a batch, sets failed
# runs aside, runs bug/fix pair by pair, compares and gates each pair, and starts no run after the deadline.
#   bash scripts/h200_evidence.sh OUT_DIR MODE [DEADLINE_S]
# MODE: fixtures | graph | eager | batch4 | glm5: that mode of the matrix (batch h200_mini-MODE)
#       kernels: sglang's own indexer kernels in the mini engine, the matrix's kernels-* modes one after the
#         other (base b4 ragged s3 glm5 control; each bug/fix at 512k then 128k; ~6 min). It starts with
#         `python -m kit.backends.mini.kernel_check` (import, top-k vs a torch reference, CUDA-graph replay,
#         per-call timings): if that fails the runs use the torch indexer (`--set indexer_impl=torch`, batches
#         named ...-torch-fallback) and ragged is skipped. Needs deep_gemm (sgl-deep-gemm 0.1.3), sgl_kernel
#         (sglang-kernel 0.4.4) and tvm_ffi on PYTHONPATH (the caller's PYTHONPATH is kept).
# Every mode but kernels uses the torch indexer (what data/results/h200 documents); KIT_INDEXER_IMPL=auto|sglang
# changes that (`--set indexer_impl=...`).
# Needs: .whl/nvtx-0.2.10-cp312-*.whl and .devdeps/lib{dw1,elf1}_*.deb (see README "H200 evidence").
# Starts no new run after DEADLINE_S seconds (default 540; kernels: 320) so results always come back; a call
# that stopped there leaves the rest to the next call of the same mode (kit batch --resume).
# Where the tree has no .git, set KIT_GIT_SHA (e.g. `git rev-parse HEAD` where it came from) for provenance.
#
# Regenerate (data/results/h200/README.md):
#   for m in graph eager batch4 glm5; do bash scripts/h200_evidence.sh OUT $m 600; done
#   bash scripts/h200_evidence.sh OUT kernels 300
#   then here: unpack OUT/results-MODE.tgz; each batch h200_mini-MODE/ becomes data/results/h200/runs/MODE/
#   (small files only), and `kit evidence data/results/h200` writes summary.csv and ratios.csv.
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
runs=/tmp/kit-runs log="$out/log-$mode.txt"
mkdir -p "$runs" "$out"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 -c \
  "import torch,sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'python', sys.version.split()[0])"; \
  "$KIT_NSYS" --version; git -C "$repo" rev-parse HEAD 2>/dev/null || echo "git sha: see provenance.json"; date -u; } \
  > "$out/host-$mode.txt" 2>&1

pack() {  # the runs' small files (reports stay on the host, except fixtures), refreshed while a batch runs
  (cd "$runs" && tar czf "$out/results-$mode.tgz" --exclude='*.nsys-rep' --exclude='*.sqlite' \
    h200_mini-"$mode"* kernel-check.* 2>/dev/null)
}

status=0
batch() {  # MODE [kit batch args]: one mode of the matrix, resumed, within what is left of the deadline
  local m=$1 left=$((deadline - (SECONDS - start))) pid rc n=0
  shift
  ((left > 0)) || left=0
  python3 -m kit.cli batch h200_mini --mode "$m" --runner plain --out "$runs" --resume --deadline "$left" \
    --no-progress "$@" > "$out/batch-$m.txt" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do sleep 2; ((++n % 10)) || pack; done
  wait "$pid"
  rc=$?
  pack
  tee -a "$log" < "$out/batch-$m.txt"
  echo "kit batch --mode $m: exit $rc (0 done, 1 a failure, 3 runs left for the next call)" | tee -a "$log"
  ((rc == 0)) || status=$rc
}

case $mode in
  fixtures | graph | eager | batch4 | glm5)
    batch "$mode" ${KIT_INDEXER_IMPL:+--set "indexer_impl=$KIT_INDEXER_IMPL"} ;;
  kernels)
    check_s=$((deadline / 2))
    echo "kernel-check (limit ${check_s}s, DG_JIT_CACHE_DIR=$DG_JIT_CACHE_DIR)" | tee -a "$log"
    timeout "$check_s" python3 -m kit.backends.mini.kernel_check --json "$out/kernel-check.json" \
      --budget-s "$check_s" > "$out/kernel-check.txt" 2>&1
    rc=$?
    fallback=()
    if [ "$rc" != 0 ]; then
      fallback=(--set indexer_impl=torch)
      echo "kernel-check rc=$rc: the runs fall back to indexer_impl=torch (batches -torch-fallback)" \
        >> "$out/kernel-check.txt"
    fi
    grep -E "^(kernels|warm|graph|timing|indexer_impl)|Error" "$out/kernel-check.txt" | tail -25 | tee -a "$log"
    cp "$out/kernel-check.txt" "$out/kernel-check.json" "$runs/" 2>/dev/null
    for v in base b4 ragged s3 glm5 control; do
      if [ ${#fallback[@]} -gt 0 ] && [ "$v" = ragged ]; then
        echo "skip kernels-ragged: it needs sglang's kernels" | tee -a "$log"
        continue
      fi
      name=h200_mini-kernels-$v
      [ ${#fallback[@]} -gt 0 ] && [ "$v" != control ] && name=$name-torch-fallback
      batch "kernels-$v" --batch "$name" ${fallback[@]+"${fallback[@]}"}
    done
    echo "kernels mode: $((SECONDS - start))s" ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
if [ "$mode" = fixtures ]; then
  tar czf "$out/fixtures.tgz" --exclude='*.nsys-rep' -C "$runs" "h200_mini-$mode"
fi
ls -la "$out"
exit "$status"
