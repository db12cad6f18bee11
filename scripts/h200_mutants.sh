#!/usr/bin/env bash
# The mutation suite on real sglang, one offline H200: each wrong fix of PR #29654 (kit/sglang_src/mutants.py)
# built, installed and run against the same task workload as bug, fix and off, then judged by the gate.
# Results: data/results/mutants/h200/ (README there: the recipe and the device time).
#   bash scripts/h200_mutants.sh OUT STEP [ARG...]
# Run h200_task.sh's `receive` and `install` first (the staged 0.5.14 closure, both builds, the task
# checkpoint). STEP:
#   build [NAME...]  build each mutant wheel (default: every one) here from the staged 0.5.14 wheel (kit build
#                    --patch), install each into its own folder, kit verify each (results/verify/); a build
#                    staged with `kit stage pack --extra` is already installed and is only verified
#   base MODE        bug, fix and off: one server each, MODE graph (CUDA graphs) or eager
#   suite MODE [NAME...]  base and the mutants (default: every one) in one queue (JOBS > 1 fills the GPU)
#   mutants MODE [NAME...]   one server per mutant (default: every mutant the plan runs in MODE), skipping
#                    those already run; a build the kit refuses as a fix (kit verify is not `fix`) is recorded
#                    in results/refused/NAME.txt, a server that dies starting up (graph capture included) in
#                    results/crashed/NAME-MODE.txt (sglang's last error line): both are kills
#   compare          every mutant cell vs bug with off as the control (kit compare --gate) into
#                    results/comparisons/MODE/WORKLOAD/NAME/ (all in OUT/results.tgz), then scripts/mutants.py h200 (the table)
# The workload: the task checkpoint, 64k context, WORKLOADS (env, default same-target,moving-target; issue 32's
# set adds any-slot), 8 requests, 2 in flight,
# 96 new tokens, EAGLE 5/1/6, profiled (launches per round), as data/results/h200-sglang-task ran it.
# Each step starts a server only while MIN_RUN_S (env, default 150) remain before DEADLINE_S (env, default
# 540), gives it what remains, and packs OUT/results.tgz and OUT/runs.tgz; a run the deadline cut short is set
# aside (runs/cut/) so the next call runs it again. JOBS (env, default 1) servers run at once on the one GPU,
# each with its KV pool capped in tokens (h200_task_settings.sh: shared_gpu_flags); the gate reads launches,
# tokens, answers and acceptance, which sharing the GPU leaves alone (draft-step times are not reported).
# The JIT caches sglang's first server fills go to OUT/jit-cache.tgz.NN (scripts/jit_cache.sh: jit_pack).
set -uo pipefail
out=${1:?usage: h200_mutants.sh OUT STEP [ARG...]}
step=${2:?step: build|base|mutants|suite|compare}
shift 2
deadline=${DEADLINE_S:-540} min_run=${MIN_RUN_S:-150} jobs=${JOBS:-1}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
target=/tmp/kit-sgl ckpt=/tmp/kit-task builds=/tmp/kit-mutant-builds
base=0.5.14 ctx=65536
res=/tmp/kit-mutant-results  # packed into OUT/results.tgz: OUT brings back 8 files at most
# The runs live inside the results folder, as data/results/mutants/h200/ commits them: a comparison records
# its runs relative to itself, so the same relative path holds here and in the unpacked results.
runs=$res/runs
mkdir -p "$out" "$runs" "$res/verify" "$res/refused" "$res/crashed" "$res/logs"
log="$out/log-$step.txt"
start=$(date +%s)
label() { python3 -c "from kit.sglang_src.build import local_label; print(local_label('$1'))"; }

# shellcheck source=scripts/h200_task_settings.sh
source scripts/h200_task_settings.sh  # SGL, TASK, use, host_facts, pack_runs: shared by the H200 drivers
workloads=${WORKLOADS:-same-target,moving-target}
TASK+=(--context-len "$ctx" --workload "$workloads" --batch mutants)
host_facts "$out/host-$step.txt" "jobs: $jobs"
[ "$jobs" -gt 1 ] && shared_gpu_flags $((2 * ctx))

elapsed() { echo $(( $(date +%s) - start )); }
pack() { tar czf "$out/results.tgz" -C "$res" --exclude=./runs . ; pack_runs "$out/runs.tgz" "$runs"; jit_pack "$out"; }

serve() {  # RUN_ID BUILD ARM MODE: one server, both workloads, each cell analysed
  local id=$1 ver=$2 arm=$3 mode=$4 graph=--cuda-graph
  [ "$mode" = eager ] && graph=--no-cuda-graph
  ls -d "$runs/mutants/$id"-ctx* >/dev/null 2>&1 && { echo "$id: already run" | tee -a "$log"; return 0; }
  local budget=$(( deadline - $(elapsed) ))
  [ "$budget" -ge "$min_run" ] || { echo "$id: ${budget}s left, not started" | tee -a "$log"; return 0; }
  use "$ver"
  echo "$id: start at $(elapsed)s" | tee -a "$log"
  until_deadline "$budget" python3 -m kit.cli run "${TASK[@]}" "${SGL[@]}" "$graph" --arm "$arm" \
    --run-id "$id" > "$res/logs/run-$id.out" 2> "$res/logs/run-$id.err"
  local rc=$?
  echo "kit run $id rc=$rc at $(elapsed)s" | tee -a "$log"
  if [ $rc -ne 0 ] && grep -q "cannot run on the installed sglang\|cannot tell whether" "$res/logs/run-$id.err"; then
    tail -1 "$res/logs/run-$id.err" > "$res/refused/${id%-*}.txt"   # the kit refused it as a fix: a kill
  fi
  if [ $rc -ne 0 ] && grep -q "exited during start-up" "$res/logs/run-$id.err"; then  # sglang died starting: a kill
    grep -h "Error" "$runs/mutants/$id-server/server.log" | grep -v "Ignore import" | tail -1 > "$res/crashed/$id.txt"
  fi
  if [ $rc -eq 124 ] || [ $rc -eq 130 ]; then  # cut short by the deadline: set aside, run again next call
    mkdir -p "$runs/cut" && mv "$runs/mutants/$id"-* "$runs/cut/" 2>/dev/null
    echo "$id: cut short, set aside" | tee -a "$log"; return 0
  fi
  for cell in "$runs/mutants/$id"-ctx*; do
    [ -e "$cell/profile.sqlite" ] && [ ! -f "$cell/verdict.json" ] && \
      { python3 -m kit.cli analyze "$cell" > /dev/null 2>> "$log"; echo "analyze ${cell##*/} rc=$?" | tee -a "$log"; }
  done
}

spawn() {  # serve in the background, at most JOBS at once, their starts a few seconds apart
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  serve "$@" &
  sleep "${STAGGER_S:-5}"
}
base_cells() {  # MODE: bug, fix and off
  spawn "bug-$1" "$base" bug "$1"; spawn "fix-$1" "$base+pr29654" fix "$1"; spawn "off-$1" "$base+pr29654" off "$1"
}
mutant_cells() {  # MODE [NAME...]: the named mutants, or every one the plan runs in MODE
  local mode=$1 names; shift; names=("$@")
  [ ${#names[@]} -gt 0 ] || mapfile -t names < <(python3 -m kit.sglang_src.mutants | awk -v m="$mode" '$2==m || ($2=="preflight" && m=="graph") {print $1}')
  for name in "${names[@]}"; do spawn "$name-$mode" "$base+$(label "$name.patch")" fix "$mode"; done
}
case $step in base|mutants|suite)
  # shellcheck source=/dev/null
  [ -n "${KIT_NSYS:-}" ] || source scripts/gpu-host-nsys.sh .devdeps >/dev/null || exit 2 ;;
esac

case $step in
  build)
    base_whl=$(ls "$target"/wheels/sglang-$base-cp312-*.whl) || { echo "no staged 0.5.14 wheel: run h200_task.sh install" >&2; exit 2; }
    names=("$@"); [ ${#names[@]} -gt 0 ] || mapfile -t names < <(basename -s .patch kit/sglang_src/patches/mutants/*.patch)
    for name in "${names[@]}"; do p=kit/sglang_src/patches/mutants/$name.patch
      ver="$base+$(label "$p")"
      if [ ! -d "$target/sglang-$ver/sglang-$ver.dist-info" ]; then
        [ -f "$builds/$name/manifest.json" ] || KIT_CACHE=$(dirname "$base_whl") python3 -m kit.cli build \
          --patch "$p" --out "$builds/$name" > "$res/verify/$name.build.json" 2>> "$log" \
          || { echo "build $name failed" | tee -a "$log"; continue; }
        # shellcheck disable=SC2086  # PIP_FLAGS: extra pip options (off the host: --platform, --python-version)
        python3 -m pip install -q --no-deps --no-index --no-compile ${PIP_FLAGS:-} --target "$target/sglang-$ver" \
          "$builds/$name"/*.whl 2>> "$log" || { echo "install $name failed" | tee -a "$log"; continue; }
      fi
      python3 -m kit.cli verify "$target/sglang-$ver/sglang" > "$res/verify/$name.json" 2>> "$log" \
        && python3 -c "import json; v=json.load(open('$res/verify/$name.json')); print('$name', v['version'], v['state'], v['carrier'])" | tee -a "$log"
    done ;;
  base) base_cells "${1:?base MODE: graph|eager}"; wait ;;
  mutants) mode=${1:?mutants MODE [NAME...]: graph|eager}; shift; mutant_cells "$mode" "$@"; wait ;;
  suite) mode=${1:?suite MODE [NAME...]: graph|eager}; shift; base_cells "$mode"; mutant_cells "$mode" "$@"; wait ;;
  compare)
    for mode in graph eager; do
      for w in ${workloads//,/ }; do
        b="$runs/mutants/bug-$mode-ctx$ctx-$w" o="$runs/mutants/off-$mode-ctx$ctx-$w"
        [ -f "$b/verdict.json" ] && [ -f "$o/verdict.json" ] || continue
        for cell in "$runs/mutants/"*-"$mode-ctx$ctx-$w"; do
          name=$(basename "$cell"); name=${name%-"$mode-ctx$ctx-$w"}
          case $name in bug|off) continue ;; esac
          [ -f "$cell/verdict.json" ] || continue
          use "$base"
          python3 -m kit.cli compare "$b" "$cell" --control "$o" --gate --out "$res/comparisons/$mode/$w/$name" \
            > /dev/null 2>> "$log"; echo "compare $mode $w $name rc=$?" | tee -a "$log"
        done
      done
    done
    python3 scripts/mutants.py h200 "$res" | tee -a "$log" ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
pack
ls -la "$out"
