#!/usr/bin/env bash
# The retrieval-task checkpoint on real sglang, one offline H200: does every arm answer, do the tokens agree,
# and what does sharing the draft's top-k cost the acceptance? Results: data/results/h200-sglang-task/.
#   bash scripts/h200_task.sh OUT STEP [DEADLINE_S]
# STEP: receive    keep the staged part(s) that travelled with this call (kit stage receive)
#       install    join the parts, install both builds, smoke-test them, write the task checkpoint
#       bug|fix|off    one server for the arm (off: the patched build with index sharing switched off, a
#                  same-computation control of 0.5.14), cells 4k/64k/500k x same-target/moving-target,
#                  8 requests each, 2 in flight, EAGLE 5/1/6, CUDA graphs, one nsys report with a window
#                  per cell; each cell analysed (launches per draft round)
#       control    the patched build with the TARGET indexer's top-k replaced by the last 2048 tokens
#                  (kit run --target-topk last), 64k, both workloads, no profile: answers must collapse
#       kineto     bug and fix, CUDA graphs and eager, 64k same-target, each under sglang's own PyTorch profiler
#                  (/start_profile, CPU + GPU: a Kineto trace per cell) and under nsys: 8 servers, the pairs
#                  data/results/h200-kineto compares; a call starts none within 150 s of DEADLINE_S and
#                  skips those already run (call it again until all eight ran). JOBS=N (env): N servers
#                  at once on the one GPU, each with its KV pool capped in tokens (shared_gpu_flags; the
#                  verdicts read launch counts, which sharing the GPU leaves alone); then one bug cell with a
#                  long window whose whole trace (over 200 MB) comes back in pieces, for bench_kineto.py
#       tp4        on a 4-GPU node: bug and fix with --tp-size 4, 64k and 500k, both workloads; one nsys report
#                  per server holds every rank (nsys traces the whole process tree) and each cell's verdict
#                  holds every rank to the arm's count (data/results/h200-tp4/README.md); call it again
#                  until both arms ran. TP=1 (env) runs it on one GPU (cells tp1-*), the dry run of its path
# Each step stops starting work at DEADLINE_S (default 540) and leaves a tarball of what it has in OUT.
# Needs .whl/nvtx-0.2.10-cp312-*.whl and .devdeps/lib{dw1,elf1}_*.deb (see README: Running on a GPU node).
set -uo pipefail
out=${1:?usage: h200_task.sh OUT STEP [DEADLINE_S]}
step=${2:?step: receive|install|bug|fix|off|control|kineto|tp4}
deadline=${3:-540} jobs=${JOBS:-1}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
host=${KIT_HOST_TMP:-/tmp}  # where the host's folders go (tests/test_h200_drivers.py: a temporary one)
store=$host/kit-stage target=$host/kit-sgl ckpt=$host/kit-task runs=$host/kit-task-runs
bug_ver=0.5.14 fix_ver=0.5.14+pr29654
mkdir -p "$out" "$runs/logs"
t0=$(date +%s) phase=$step  # the step asked for; `kineto` runs several arms, each under its own $step
log="$out/log-$phase.txt"
# shellcheck source=scripts/h200_task_settings.sh
source scripts/h200_task_settings.sh  # SGL, TASK, use, host_facts, pack_runs: shared by the H200 drivers
TASK+=(--batch task)
use "$bug_ver"
host_facts "$out/host-$step.txt"

pack() { pack_runs "$out/runs-$phase.tgz" "$runs"; jit_pack "$out"; }  # no server running

arm() {  # ARM BUILD [extra kit run args...]
  local a=$1 ver=$2; shift 2
  use "$ver"
  # shellcheck source=/dev/null
  [ -n "${KIT_NSYS:-}" ] || source scripts/gpu-host-nsys.sh .devdeps >/dev/null || return 2
  # the step's deadline counts from its start (t0), not from this arm's: a second arm gets what is left
  local left=$(( deadline - ($(date +%s) - t0) ))
  [ "$left" -gt 0 ] || left=1
  echo "kit run $step: $left s to the deadline" >> "$log"
  until_deadline "$left" python3 -m kit.cli run "${TASK[@]}" "${SGL[@]}" --arm "$a" --run-id "$step" "$@" \
    > "$runs/logs/run-$step.out" 2>> "$log"; echo "kit run $step rc=$?" | tee -a "$log"
  for cell in "$runs/task/$step" "$runs/task/$step"-ctx*; do  # one cell: the run id alone; several: -ctx...
    [ -f "$cell/outputs.jsonl" ] || continue
    python3 - "$cell" <<'PY' | tee -a "$log"
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/outputs.jsonl")]
acc = sum(r.get("correct") is True for r in rows) / len(rows)
al = [r["accept_length"] for r in rows]
print(f"{sys.argv[1].rsplit('/', 1)[1]}: {len(rows)} rows, correct {acc:.2f}, accept {min(al):.2f}-{max(al):.2f}")
PY
    # a cell that finished before a cut-short run has only the server's .nsys-rep (nothing exported it):
    # kit analyze exports it (a cell cut short holds error.json: never a pass)
    if { [ -e "$cell/profile.sqlite" ] || [ -e "$cell/profile.nsys-rep" ] || [ -e "$cell/profile.trace.json.gz" ]; } \
      && [ ! -f "$cell/verdict.json" ]; then
      python3 -m kit.cli analyze "$cell" > /dev/null 2>> "$log"; echo "analyze ${cell##*/} rc=$?" | tee -a "$log"
    fi
    if [ -e "$cell/profile.trace.json.gz" ] && [ ! -d "$cell/trimmed" ]; then  # a Kineto trace: the no-range
      python3 -m kit.cli analyze "$cell" --method classifier --out "$cell/classifier" > /dev/null 2>> "$log"
      mkdir -p "$cell/trimmed" && python3 tests/fixtures/kineto/make_fixtures.py --trim \
        "$cell/profile.trace.json.gz" "$cell/trimmed/trace.json.gz" >> "$log" 2>&1  # classifier; what comes back
      ls -la "$cell/profile.trace.json.gz" >> "$log"
    fi
  done
  [ "$jobs" -gt 1 ] || pack  # with JOBS > 1 the step packs once its servers are done
}

due() {  # NAME NEEDS_S: a run of several servers starts NAME unless it ran or fewer than NEEDS_S are left
  if [ -d "$runs/task/$1" ] || ls -d "$runs/task/$1"-ctx* >/dev/null 2>&1; then echo "$1: already run"; return 1; fi
  if [ $(( $(date +%s) - t0 )) -gt $(( deadline - $2 )) ]; then echo "$1: not started (deadline)"; return 1; fi
}

case $step in
  receive) python3 -m kit.cli stage receive .stage "$store" | tail -3 ;;
  install)
    python3 -m kit.cli stage install "$store" "$target" > "$out/install.json" 2>&1 || { tail -5 "$out/install.json"; exit 2; }
    for ver in "$bug_ver" "$fix_ver"; do
      use "$ver"; timeout 300 python3 -m kit.sglang_src.stage_smoke > "$out/smoke-${ver//+/-}.json" 2>&1; echo "smoke $ver rc=$?"
      python3 -m kit.cli verify "$target/sglang-$ver/sglang" | python3 -c "import json,sys; v=json.load(sys.stdin); print('$ver', v['state'], v['carrier'])"
    done
    [ -f "$ckpt/kit-checkpoint.json" ] || python3 -m kit.cli make-checkpoint "$ckpt" --task > "$out/checkpoint.json" 2>&1
    python3 -c "import json; m=json.load(open('$ckpt/kit-checkpoint.json')); print('task', m['task_checkpoint'], 'reference_match', m['reference_match'], {k: v for k, v in m['self_check'].items() if 'target' in k})" ;;
  bug) arm bug "$bug_ver" --context-len 4096,65536,500000 --workload same-target,moving-target ;;
  fix) arm fix "$fix_ver" --context-len 4096,65536,500000 --workload same-target,moving-target ;;
  off) arm off "$fix_ver" --context-len 4096,65536,500000 --workload same-target,moving-target ;;
  control) arm fix "$fix_ver" --context-len 65536 --workload same-target,moving-target --target-topk last --no-profile ;;
  tp4)  # TP 4 on a 4-GPU node (nvidia-h200-x4): bug and fix, 64k and 500k, both workloads, every rank counted.
    # TP=1 (env): the same step on one GPU, the dry run of its path (cells tp1-*); JOBS=2: both arms at once
    tp=${TP:-4}
    [ "$jobs" -gt 1 ] && shared_gpu_flags 524288
    for a in bug fix; do
      ver=$bug_ver; [ "$a" = fix ] && ver=$fix_ver
      name=tp$tp-$a
      while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
      due "$name" 300 || continue
      (step=$name arm "$a" "$ver" --tp-size "$tp" --context-len 65536,500000 \
        --workload same-target,moving-target) &
      [ "$jobs" -gt 1 ] && sleep "${STAGGER_S:-5}"
    done
    wait
    [ "$jobs" -gt 1 ] && pack ;;
  kineto)  # sglang's own PyTorch profiler (kit run --profiler torch) beside nsys: bug and fix, graphs and eager
    [ "$jobs" -gt 1 ] && shared_gpu_flags $((2 * 65536))  # JOBS servers at once: launch counts, no timings
    for a in bug fix; do
      for mode in graph eager; do
        ver=$bug_ver; [ "$a" = fix ] && ver=$fix_ver
        g=--cuda-graph; [ "$mode" = eager ] && g=--no-cuda-graph
        for prof in torch nsys; do
          name=kineto-$prof-$a-$mode
          while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
          due "$name" 150 || continue
          (step=$name arm "$a" "$ver" --context-len 65536 --workload same-target $g --profiler $prof) &
          [ "$jobs" -gt 1 ] && sleep "${STAGGER_S:-5}"
        done
      done
    done
    # One long window for scripts/bench_kineto.py: a real trace over 200 MB uncompressed (100 forwards; 10
    # gave 2.2 MB of gzip, JSON compresses 10-15x); 720 tokens (ignore_eos) are at least 120 rounds
    name=kineto-torch-bug-graph-long
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    if due "$name" 150; then
      (step=$name arm bug "$bug_ver" --context-len 65536 --workload same-target --cuda-graph --profiler torch \
        --profile-steps 100 --max-new-tokens 720 --num-requests 2) &
    fi
    wait
    t="$runs/task/$name/profile.trace.json.gz"  # back in 15 MiB pieces (16 MiB a file comes back)
    [ -f "$t" ] && echo "$name: $(gzip -dc "$t" | wc -c) bytes uncompressed" | tee -a "$log" \
      && split -b 15M -d "$t" "$out/$name.trace.json.gz."
    pack ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
ls -la "$out"
