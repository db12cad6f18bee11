#!/usr/bin/env bash
# The newest stageable sglang release (0.5.16, data/stage/README.md) as the `upstream` arm on one offline
# H200: the task checkpoint, EAGLE 5/1/6, CUDA graphs, 64k and 500k x same-target/moving-target, 8 requests
# 2 in flight, one nsys report with a window per cell, each cell analysed. The settings are those of
# scripts/h200_task.sh, so the results sit next to 0.5.14 (bug) and 0.5.14+pr29654 (fix) in
# data/results/h200-sglang-task/.
#   bash scripts/h200_upstream.sh OUT STEP [DEADLINE_S]
# STEP: receive   keep the staged part that travelled with this call (.stage16/manifest.json + one part)
#       install   join the parts, install 0.5.16, smoke-test it, check its state and probe targets, write
#                 the task checkpoint (kit make-checkpoint --task, the same bytes as the task runs')
#       upstream  one server, the four cells; launches per draft round expected 0 (0.5.16 seeds the draft
#                 loop with the top-k its draft extend computed), each cell's rounds.csv and verdict.json
# Each step stops starting work at DEADLINE_S (default 540) and leaves what it has in OUT.
# Needs .whl/nvtx-0.2.10-cp312-*.whl and .devdeps/lib{dw1,elf1}_*.deb (see README: Running on a GPU node).
set -uo pipefail
out=${1:?usage: h200_upstream.sh OUT STEP [DEADLINE_S]}
step=${2:?step: receive|install|upstream}
deadline=${3:-540}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
# Apart from the 0.5.14 pack's folders: a store holds the parts of one pack only.
store=/tmp/kit-stage16 target=/tmp/kit-sgl16 ckpt=/tmp/kit-task runs=/tmp/kit-upstream-runs ver=0.5.16
mkdir -p "$out" "$runs"
log="$out/log-$step.txt"
# shellcheck source=scripts/h200_task_settings.sh
source scripts/h200_task_settings.sh  # SGL, TASK, use, host_facts, pack_runs: shared by the H200 drivers
TASK+=(--batch upstream)
use "$ver"
host_facts "$out/host-$step.txt"

pack() { pack_runs "$out/runs-$step.tgz" "$runs"; jit_pack "$out"; }  # no server running

case $step in
  receive) python3 -m kit.cli stage receive .stage16 "$store" | tail -3 ;;
  install)
    # a stage packed --beside 0.5.14's takes the shared wheels from its install (h200_task.sh install first)
    python3 -m kit.cli stage install "$store" "$target" --beside /tmp/kit-sgl > "$out/install.json" 2>&1 || { tail -5 "$out/install.json"; exit 2; }
    timeout 300 python3 -m kit.sglang_src.stage_smoke > "$out/smoke-$ver.json" 2>&1; echo "smoke $ver rc=$?"
    python3 -m kit.cli verify "$target/sglang-$ver/sglang" > "$out/verify-$ver.json"
    python3 -c "import json; v=json.load(open('$out/verify-$ver.json')); print('$ver', v['state'], v['carrier'])"
    python3 -m kit.cli probe-check "$target/sglang-$ver/sglang" > "$out/probe-check-$ver.json" 2> "$out/probe-check-$ver.err"
    echo "probe-check $ver rc=$? $(cat "$out/probe-check-$ver.err")"
    [ -f "$ckpt/kit-checkpoint.json" ] || python3 -m kit.cli make-checkpoint "$ckpt" --task > "$out/checkpoint.json" 2>&1
    python3 -c "import json; m=json.load(open('$ckpt/kit-checkpoint.json')); print('task', m['task_checkpoint'], 'reference_match', m['reference_match'])" ;;
  upstream)
    # shellcheck source=/dev/null
    [ -n "${KIT_NSYS:-}" ] || source scripts/gpu-host-nsys.sh .devdeps >/dev/null || exit 2
    until_deadline "$deadline" python3 -m kit.cli run "${TASK[@]}" "${SGL[@]}" --arm upstream --run-id upstream \
      --context-len 65536,500000 --workload same-target,moving-target > "$out/run-$step.out" 2>> "$log"
    echo "kit run $step rc=$?" | tee -a "$log"
    for cell in "$runs/upstream/upstream"-ctx*; do
      [ -f "$cell/outputs.jsonl" ] || continue
      if [ -e "$cell/profile.sqlite" ] && [ ! -f "$cell/verdict.json" ]; then
        python3 -m kit.cli analyze "$cell" > /dev/null 2>> "$log"; echo "analyze ${cell##*/} rc=$?" | tee -a "$log"
        python3 -m kit.cli analyze "$cell" --method classifier --out "$cell/classifier" > /dev/null 2>> "$log"
      fi
    done
    pack ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
ls -la "$out"
