#!/usr/bin/env bash
# Regenerate the H200 evidence (data/results/h200/) on one offline H200 host: the mini backend on CUDA,
# under Nsight Systems, every run through the kit's own `kit run` + `kit analyze`.
#   bash scripts/h200_evidence.sh OUT_DIR MODE [DEADLINE_S]
# MODE: fixtures (tiny preset, bug/fix x eager/graph, small reports to commit as test fixtures)
#       graph | eager (dsv32 preset, arms off/bug/fix x contexts 8k..512k, CUDA graphs on | off)
#       batch4 (dsv32, 4 requests per batch) | glm5 (GLM-5 shapes: 32 index heads): 128k and 512k, graphs on
# Needs: .whl/nvtx-0.2.10-cp312-*.whl and .devdeps/lib{dw1,elf1}_*.deb (see README "H200 evidence").
# Stops starting new runs after DEADLINE_S seconds (default 540) so results always come back.
# Where the tree has no .git, set KIT_GIT_SHA (e.g. `git rev-parse HEAD` where it came from) for provenance.
set -uo pipefail
out=${1:?usage: h200_evidence.sh OUT_DIR MODE [DEADLINE_S]}
mode=${2:?mode: fixtures|graph|eager}
deadline=${3:-540}
start=$SECONDS
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kit-site .whl/nvtx-*.whl >/dev/null
export PYTHONPATH="/tmp/kit-site:$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# shellcheck source=/dev/null
source scripts/gpu-host-nsys.sh .devdeps || exit 1
runs=/tmp/kit-runs
mkdir -p "$runs" "$out"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 -c \
  "import torch,sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'python', sys.version.split()[0])"; \
  "$KIT_NSYS" --version; git -C "$repo" rev-parse HEAD 2>/dev/null || echo "git sha: see provenance.json"; date -u; } \
  > "$out/host-$mode.txt" 2>&1

case $mode in
  fixtures) preset=tiny; arms="bug fix"; contexts="8192"; graphs="--cuda-graph --no-cuda-graph"; extra=(--max-new-tokens 16) ;;
  graph)    preset=dsv32; arms="bug fix off"; contexts="8192 32768 131072 262144 524288"; graphs="--cuda-graph"; extra=(--max-new-tokens 48) ;;
  eager)    preset=dsv32; arms="bug fix off"; contexts="8192 32768 131072 262144 524288"; graphs="--no-cuda-graph"; extra=(--max-new-tokens 48) ;;
  batch4)   preset=dsv32; arms="bug fix"; contexts="131072 524288"; graphs="--cuda-graph"; extra=(--max-new-tokens 48) ;;
  glm5)     preset=glm5; arms="bug fix"; contexts="131072 524288"; graphs="--cuda-graph"; extra=(--max-new-tokens 48) ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac

for ctx in $contexts; do
  for g in $graphs; do
    for arm in $arms; do
      if (( SECONDS - start > deadline )); then echo "deadline reached: stopping before $arm $ctx $g"; break 3; fi
      tag=$([ "$g" = --cuda-graph ] && echo graph || echo eager)
      id="$preset-$arm-ctx$ctx-$tag"
      t0=$SECONDS
      timeout 300 python3 -m kit.cli run --arm "$arm" --context-len "$ctx" --device cuda --preset "$preset" "$g" \
        --num-requests "$([ "$mode" = batch4 ] && echo 4 || echo 1)" "${extra[@]}" --out "$runs" --batch "h200-$mode" --run-id "$id" >/dev/null 2>"$runs/$id.err" \
        && python3 -m kit.cli analyze "$runs/h200-$mode/$id" > /dev/null 2>>"$runs/$id.err"
      echo "$id rc=$? $((SECONDS - t0))s $(python3 -c "import json,sys; v=json.load(open(sys.argv[1])); \
print(v['method'], sorted(set(v['launches_per_round'])), v['status'])" "$runs/h200-$mode/$id/verdict.json" 2>/dev/null)" \
        | tee -a "$out/log-$mode.txt"
      tail -3 "$runs/$id.err" >> "$out/log-$mode.txt"
      # Small files only (reports stay on the host, except fixtures); refreshed after every run.
      tar czf "$out/results-$mode.tgz" -C "$runs" --exclude='*.nsys-rep' --exclude='*.sqlite' "h200-$mode"
    done
  done
done
if [ "$mode" = fixtures ]; then
  tar czf "$out/fixtures.tgz" --exclude='*.nsys-rep' -C "$runs" "h200-$mode"
fi
ls -la "$out"
