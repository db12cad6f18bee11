#!/usr/bin/env bash
# Real sglang 0.5.14 vs the kit's patched build on one offline H200 host, through the kit's own pipeline
# (probes + launcher under Nsight Systems + analysis). Results: data/results/h200-sglang/ (README there).
# This script only sets the host up (nvtx, nsys, the staged builds, the checkpoint); the runs are
# `kit batch h200_sglang --mode MODE --runner plain` (data/matrices/h200_sglang.yaml: the grids, the server
# flags, and each arm's build folder, so a bug cell and a fix cell each import their own sglang), which
# resumes a batch, sets failed runs aside, runs bug/fix pair by pair, compares and gates each pair, and
# starts no run after the deadline.
#   bash scripts/h200_sglang.sh OUT_DIR MODE [DEADLINE_S]
# MODE: install  join the staged parts (kit stage receive, one call per part, see the README), install both
#                builds, smoke-test each, check each build's state (bug / fix) and the probe targets
#       eager    generated DSA checkpoint, EAGLE 5/1/6, CUDA graphs off: arms bug and fix at 4k
#       graph    CUDA graphs on: arms bug and fix at 4k, 64k, 16k (the draft loop replays as one graph)
#       steps3   CUDA graphs on, EAGLE 3/1/4: bug and fix at 16k
#       noise    CUDA graphs on, 4k: graph's 4k pair (run first where missing, into graph's batch), then a
#                second bug run (batch ...-noise); `kit noise` judges the pair against this same-build repeat
# After each batch, every analysed run also gets the NVTX-free kernel classifier's count (RUN/classifier).
# CKPT_GAINS="attn_out=5.5" (env): a checkpoint with other weight gains (kit make-checkpoint --gain), in its
# own checkpoint folder and batches (suffix -attn_out-5.5; `--set model_path=...`)
# Needs: .whl/nvtx-0.2.10-cp312-*.whl, .devdeps/lib{dw1,elf1}_*.deb, the staged parts (kit stage pack).
# Starts no new run after DEADLINE_S seconds (default 540) so results always come back; a run that finished
# before (its verdict.json is there) is kept, so calling a mode again resumes it.
#
# Regenerate (data/results/h200-sglang/README.md):
#   here (network):  kit build && kit stage pack --extra build/sglang-0.5.14+pr29654/sglang-0.5.14+pr29654-*.whl .stage
#   there, once per part:  python3 -m kit.cli stage receive .stage /tmp/kit-stage
#   there:  export KIT_GIT_SHA=<the kit commit>
#           for m in install graph steps3 noise eager; do bash scripts/h200_sglang.sh OUT $m; done
#           CKPT_GAINS=attn_out=5.5 bash scripts/h200_sglang.sh OUT noise
#   then here: unpack OUT/results-MODE.tgz; each batch h200_sglang-MODE/ becomes
#   data/results/h200-sglang/runs/MODE/, and `kit evidence data/results/h200-sglang` writes the CSVs.
set -uo pipefail
out=${1:?usage: h200_sglang.sh OUT_DIR MODE [DEADLINE_S]}
mode=${2:?mode: install|eager|graph|steps3|noise}
deadline=${3:-540}
start=$SECONDS
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
gains=${CKPT_GAINS:-}
ctag=${gains:+-$(echo "$gains" | tr ' =' '_-')}
gain_args=(); for g in $gains; do gain_args+=(--gain "$g"); done
# target and ckpt are the paths data/matrices/h200_sglang.yaml names (builds:, params.model_path)
store=/tmp/kit-stage target=/tmp/kit-sgl ckpt=/tmp/kit-ckpt$ctag runs=/tmp/kit-sgl-runs
bug_ver=0.5.14 fix_ver=0.5.14+pr29654
log="$out/log-$mode$ctag.txt"
mkdir -p "$out" "$runs"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kit-site .whl/nvtx-*.whl >/dev/null
# Prompts of <= 2048 tokens would take the dense MHA prefill, which is FlashAttention-3 (not staged).
export PYTHONUNBUFFERED=1 SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD=0
# shellcheck source=/dev/null
source scripts/gpu-host-nsys.sh .devdeps >/dev/null || exit 1
# The kit's own processes see what both builds share; a batch's cells add their arm's build (the matrix).
export PYTHONPATH="/tmp/kit-site:$target/deps:$repo:$target/fallback"

use() {  # one sglang build on PYTHONPATH, for the install steps that import it (never both)
  export PYTHONPATH="/tmp/kit-site:$target/sglang-$1:$target/deps:$repo:$target/fallback"
}

host_info() {
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import torch,sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'python', sys.version.split()[0])"
    "$KIT_NSYS" --version; echo "kit git sha: ${KIT_GIT_SHA:-$(git -C "$repo" rev-parse HEAD 2>/dev/null)}"; date -u; } 2>&1
}

pack() {  # every run on this host so far, small files only; refreshed while a batch runs
  tar czf "$out/results-$mode$ctag.tgz" -C "$runs" --exclude='*.nsys-rep' --exclude='*.sqlite' \
    --exclude='*.qdstrm' . 2>/dev/null
}

classify() {  # BATCH: the NVTX-free kernel classifier beside each analysed run, as a cross-check
  local run
  for run in "$runs/$1"/*-cuda; do
    [ -f "$run/verdict.json" ] && [ ! -e "$run/classifier" ] || continue
    python3 -m kit.cli analyze "$run" --method classifier --out "$run/classifier" >/dev/null 2>>"$log" \
      || echo "classifier $(basename "$run"): failed, see $log" | tee -a "$log"
  done
}

status=0
batch() {  # MODE BATCH: one mode of the matrix into BATCH, resumed, within what is left of the deadline
  local m=$1 name=$2 left=$((deadline - (SECONDS - start))) pid rc n=0
  ((left > 0)) || left=0
  python3 -m kit.cli batch h200_sglang --mode "$m" --batch "$name" --runner plain --out "$runs" --resume \
    --deadline "$left" --no-progress ${gains:+--set "model_path=$ckpt"} > "$out/batch-$m$ctag.txt" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do sleep 2; ((++n % 10)) || pack; done
  wait "$pid"
  rc=$?
  classify "$name"
  pack
  tee -a "$log" < "$out/batch-$m$ctag.txt"
  echo "kit batch --mode $m: exit $rc (0 done, 1 a failure, 3 runs left for the next call)" | tee -a "$log"
  ((rc == 0)) || status=$rc
}

checkpoint() {
  [ -f "$ckpt/kit-checkpoint.json" ] && return 0
  (use "$bug_ver" && python3 -m kit.cli make-checkpoint "$ckpt" ${gain_args[@]+"${gain_args[@]}"}) \
    > "$out/checkpoint$ctag.json" 2>&1 || { cat "$out/checkpoint$ctag.json"; return 1; }
}

host_info > "$out/host-$mode$ctag.txt"
case $mode in
  install)
    python3 -m kit.cli stage status "$store" || exit 1
    python3 -m kit.cli stage install "$store" "$target" > "$out/install.json" 2>&1 || { cat "$out/install.json"; exit 1; }
    du -sh "$target"/* | tee "$out/install-sizes.txt"
    for ver in "$bug_ver" "$fix_ver"; do
      (use "$ver" && timeout 300 python3 -m kit.sglang_src.stage_smoke) > "$out/smoke-$ver.json" \
        2>"$out/smoke-$ver.err"; echo "smoke $ver rc=$?"
      python3 -m kit.cli verify "$target/sglang-$ver/sglang" > "$out/verify-$ver.json" 2>&1
      python3 -m kit.cli probe-check "$target/sglang-$ver/sglang" > "$out/probe-check-$ver.json" 2>&1
      echo "$ver: $(grep -m1 '"state"' "$out/verify-$ver.json")"
    done
    checkpoint && echo "checkpoint ok" ;;
  eager | graph | steps3)
    checkpoint || exit 1
    batch "$mode" "h200_sglang-$mode$ctag" ;;
  noise)
    checkpoint || exit 1
    pair=h200_sglang-graph$ctag repeat=h200_sglang-noise$ctag id=ctx4096-s5-graph-cuda
    batch graph-4k "$pair"  # graph's 4k pair, where missing (finished runs are kept)
    batch noise "$repeat"
    python3 -m kit.cli noise "$runs/$pair/sglang-bug-$id" "$runs/$pair/sglang-fix-$id" \
      "$runs/$repeat/sglang-bug-$id" > "$out/noise$ctag.json" 2>&1
    echo "kit noise rc=$? (verdict in $out/noise$ctag.json)" | tee -a "$log" ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
# The smallest pair's SQLite exports, as analysis fixtures (only if they fit what comes back).
if [ "$mode" != install ] && [ "$mode" != noise ]; then
  b=h200_sglang-$mode$ctag
  (cd "$runs" && tar czf "$out/sqlite-$mode$ctag.tgz" $(ls "$b"/*-ctx4096-*-cuda/profile.sqlite \
    "$b"/*-ctx16384-*-cuda/profile.sqlite 2>/dev/null | head -2)) 2>/dev/null
  find "$out" -name 'sqlite-*.tgz' -size +15M -delete
fi
ls -la "$out"
exit "$status"
