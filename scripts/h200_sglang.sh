#!/usr/bin/env bash
# Real sglang 0.5.14 vs the kit's patched build on one offline H200 host, through the kit's own pipeline
# (probes + launcher under Nsight Systems + analysis). Results: data/results/h200-sglang/ (README there).
#   bash scripts/h200_sglang.sh OUT_DIR MODE [DEADLINE_S]
# MODE: install  join the staged parts (kit stage receive, one call per part, see the README), install both
#                builds, smoke-test each, check each build's state (bug / fix) and the probe targets
#       eager    generated DSA checkpoint, EAGLE 5/1/6, CUDA graphs off: arms bug and fix at 4k
#       graph    CUDA graphs on: arms bug and fix at 4k, 16k, 64k (the draft loop replays as one graph)
#       steps3   CUDA graphs on, EAGLE 3/1/4: bug and fix at 16k
#       noise    CUDA graphs on, 4k: a second bug run; `kit noise` judges graph mode's 4k pair (run or
#                completed first where missing) against this same-build repeat
# CKPT_GAINS="attn_out=5.5" (env): a checkpoint with other weight gains (kit make-checkpoint --gain), in its
# own checkpoint folder and batch (suffix -attn_out-5.5)
# Needs: .whl/nvtx-0.2.10-cp312-*.whl, .devdeps/lib{dw1,elf1}_*.deb, the staged parts (kit stage pack).
# Stops starting new runs after DEADLINE_S seconds (default 540) so results always come back; a run that
# finished before (its verdict.json is there) is kept, so calling a mode again resumes it.
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
store=/tmp/kit-stage target=/tmp/kit-sgl ckpt=/tmp/kit-ckpt$ctag runs=/tmp/kit-sgl-runs
bug_ver=0.5.14 fix_ver=0.5.14+pr29654
mkdir -p "$out" "$runs"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kit-site .whl/nvtx-*.whl >/dev/null
# Prompts of <= 2048 tokens would take the dense MHA prefill, which is FlashAttention-3 (not staged).
export PYTHONUNBUFFERED=1 SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD=0
# shellcheck source=/dev/null
source scripts/gpu-host-nsys.sh .devdeps >/dev/null || exit 1

use() {  # one sglang build on PYTHONPATH (never both); the image's packages come after the staged ones
  export PYTHONPATH="/tmp/kit-site:$target/sglang-$1:$target/deps:$repo:$target/fallback"
}

host_info() {
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import torch,sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'python', sys.version.split()[0])"
    "$KIT_NSYS" --version; echo "kit git sha: ${KIT_GIT_SHA:-$(git -C "$repo" rev-parse HEAD 2>/dev/null)}"; date -u; } 2>&1
}

# sglang flags for the generated checkpoint on one H200. fp8 KV cache: the DSA backends are then FlashMLA
# (flashmla_kv) for prefill and decode, so FlashAttention-3 (sgl_kernel/flash_ops, 1.76 GB) is never loaded.
SGL_ARGS=(--sglang-arg=--kv-cache-dtype=fp8_e4m3 --sglang-arg=--dsa-prefill-backend=flashmla_kv
          --sglang-arg=--dsa-decode-backend=flashmla_kv --sglang-arg=--context-length=131072
          --sglang-arg=--cuda-graph-max-bs=2 --sglang-arg=--max-running-requests=2
          --sglang-arg=--mem-fraction-static=0.6 --sglang-arg=--disable-radix-cache
          --sglang-arg=--sampling-backend=pytorch --sglang-arg=--grammar-backend=none)

one_run() {  # arm ctx graphs(--cuda-graph|--no-cuda-graph) steps tag
  local arm=$1 ctx=$2 g=$3 steps=$4 run_tag=$5 ver id t0
  ver=$([ "$arm" = fix ] && echo "$fix_ver" || echo "$bug_ver")
  id="$run_tag-$arm-ctx$ctx"
  if [ -f "$runs/$batch/$id/verdict.json" ]; then echo "$id: done before, kept" | tee -a "$out/log-$mode$ctag.txt"; return 0; fi
  if [ -d "$runs/$batch/$id" ]; then  # an attempt that failed: kept aside (kit run never overwrites a run)
    mkdir -p "$runs/failed-$batch" && mv "$runs/$batch/$id" "$runs/failed-$batch/$id-$(date +%s)"
  fi
  if (( SECONDS - start > deadline )); then echo "deadline reached: not starting $id" | tee -a "$out/log-$mode$ctag.txt"; return 1; fi
  use "$ver"
  t0=$SECONDS
  timeout 420 python3 -m kit.cli run --backend sglang --arm "$arm" --model-path "$ckpt" --context-len "$ctx" \
    --num-steps "$steps" --num-draft-tokens $((steps + 1)) "$g" --num-requests 4 --max-new-tokens 96 \
    --profile-skip 2 --profile-steps 10 "${SGL_ARGS[@]}" --out "$runs" --batch "$batch" --run-id "$id" \
    >"$runs/$id.out" 2>"$runs/$id.err" \
    && python3 -m kit.cli analyze "$runs/$batch/$id" >/dev/null 2>>"$runs/$id.err" \
    && python3 -m kit.cli analyze "$runs/$batch/$id" --method classifier \
       --out "$runs/$batch/$id/classifier" >/dev/null 2>>"$runs/$id.err"
  echo "$id rc=$? $((SECONDS - t0))s $(python3 -c "import json,sys; v=json.load(open(sys.argv[1])); \
print(v['method'], sorted(set(v['launches_per_round'])), v['status'])" "$runs/$batch/$id/verdict.json" 2>/dev/null)" \
    | tee -a "$out/log-$mode$ctag.txt"
  tail -4 "$runs/$id.err" >> "$out/log-$mode$ctag.txt"
  # every run on this host so far, small files only; the SQLite exports come back separately (fixtures)
  tar czf "$out/results-$mode$ctag.tgz" -C "$runs" --exclude='*.nsys-rep' --exclude='*.sqlite' \
    --exclude='*.qdstrm' .
}

pair() {  # ctx graphs steps tag: bug then fix, then the kit's own comparison gate
  one_run bug "$1" "$2" "$3" "$4" && one_run fix "$1" "$2" "$3" "$4" || return 1
  python3 -m kit.cli compare "$runs/$batch/$4-bug-ctx$1" "$runs/$batch/$4-fix-ctx$1" --gate \
    >> "$out/log-$mode$ctag.txt" 2>&1; echo "compare $4 ctx$1 gate rc=$?" | tee -a "$out/log-$mode$ctag.txt"
}

checkpoint() {
  [ -f "$ckpt/kit-checkpoint.json" ] && return 0
  use "$bug_ver"
  python3 -m kit.cli make-checkpoint "$ckpt" ${gain_args[@]+"${gain_args[@]}"} > "$out/checkpoint$ctag.json" 2>&1 \
    || { cat "$out/checkpoint$ctag.json"; return 1; }
}

batch="h200-sglang-$mode$ctag"
host_info > "$out/host-$mode$ctag.txt"
case $mode in
  install)
    python3 -m kit.cli stage status "$store" || exit 1
    python3 -m kit.cli stage install "$store" "$target" > "$out/install.json" 2>&1 || { cat "$out/install.json"; exit 1; }
    du -sh "$target"/* | tee "$out/install-sizes.txt"
    for ver in "$bug_ver" "$fix_ver"; do
      use "$ver"
      timeout 300 python3 -m kit.sglang_src.stage_smoke > "$out/smoke-$ver.json" 2>"$out/smoke-$ver.err"; echo "smoke $ver rc=$?"
      python3 -m kit.cli verify "$target/sglang-$ver/sglang" > "$out/verify-$ver.json" 2>&1
      python3 -m kit.cli probe-check "$target/sglang-$ver/sglang" > "$out/probe-check-$ver.json" 2>&1
      python3 -c "import json,sys; v=json.load(open(sys.argv[1])); print('$ver state', v.get('state'), v.get('carrier'))" \
        "$out/verify-$ver.json"
    done
    checkpoint && echo "checkpoint ok" ;;
  eager)  checkpoint || exit 1; pair 4096 --no-cuda-graph 5 eager ;;
  graph)  checkpoint || exit 1; for ctx in 4096 65536 16384; do pair "$ctx" --cuda-graph 5 graph || break; done ;;
  steps3) checkpoint || exit 1; pair 16384 --cuda-graph 3 steps3 ;;
  noise)  checkpoint || exit 1
          gb="$runs/h200-sglang-graph$ctag"
          batch="h200-sglang-graph$ctag"; pair 4096 --cuda-graph 5 graph  # finished runs are kept
          batch="h200-sglang-noise$ctag"
          one_run bug 4096 --cuda-graph 5 repeat && python3 -m kit.cli noise "$gb/graph-bug-ctx4096" \
            "$gb/graph-fix-ctx4096" "$runs/$batch/repeat-bug-ctx4096" > "$out/noise$ctag.json" 2>&1
          echo "kit noise rc=$? $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['verdict'])" \
            "$out/noise$ctag.json" 2>&1)" | tee -a "$out/log-$mode$ctag.txt" ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
# The smallest pair's SQLite exports, as analysis fixtures (only if they fit what comes back).
if [ "$mode" != install ] && [ "$mode" != noise ]; then
  (cd "$runs" && tar czf "$out/sqlite-$mode$ctag.tgz" $(ls "$batch"/*-ctx4096/profile.sqlite \
    "$batch"/*-ctx16384/profile.sqlite 2>/dev/null | head -2)) 2>/dev/null
  find "$out" -name 'sqlite-*.tgz' -size +15M -delete
fi
ls -la "$out"
