#!/usr/bin/env bash
# Real sglang on one offline H200 host, through the kit's own pipeline (probes + launcher under Nsight
# Systems + analysis). This script only sets the host up (nvtx, nsys, the staged builds, the notebooks
# wheels, the checkpoint); the runs are `kit batch MATRIX` with a committed matrix, which names each arm's
# build folder (a bug cell and a fix cell each import their own sglang), starts one server per arm and
# server settings, resumes a batch, sets failed runs aside, compares and gates each pair, writes the report,
# and starts no cell after the deadline. With papermill and ipykernel importable (the notebooks stage,
# data/stage/notebooks-h200.json) the cells run through the notebooks; without, `--runner plain`.
#   bash scripts/h200_sglang.sh OUT_DIR MODE [DEADLINE_S]
# MODE: receive  keep the staged parts that travelled with this call: .stage or .stageN (sglang 0.5.14 + the
#                patched build), .stage16[_N] / .stage17[_N] (sglang 0.5.16 / 0.5.17), .stage-nb (notebooks)
#       install  join and install what has been received, smoke-test each build, check its state (kit
#                verify) and the probe targets, write the checkpoint
#       warm     set-up: the matrix's mode warm, a server per sglang build at 4k without nsys (JOBS=2: side by
#                side), so the JIT kernels compile before the grid instead of inside its first servers' starts
#       grid     data/matrices/h200_pr29654.yaml: bug, fix, off, upstream (0.5.16) at 4k/80k/256k/500k with
#                CUDA graphs, bug, fix and off eager at 4k (results: data/results/h200-pr29654/)
#       part-a | part-b   the grid and the perturbation check in two halves for two leases (the matrix's
#                modes: the 0.5.14 builds' graph cells; 0.5.16's and the eager ones), into the grid's batch
#       latest   the grid's mode latest: sglang 0.5.17 (its own stage, .stage17 parts) beside 0.5.14 and the
#                fix at 80k and 500k, batch h200_pr29654-latest
#       perturbation  the grid's arms at 4k and 500k again without nsys and the probes, into the grid's
#                batch: each cell's decode-round time with and without the instrument
#       eager | graph | steps3 | noise   the earlier grids of data/matrices/h200_sglang.yaml (results:
#                data/results/h200-sglang/); noise runs graph's 4k pair where missing, then a second bug run
# After each batch, every analysed run also gets the NVTX-free kernel classifier's count (RUN/classifier) and
# the indexer calls in each kind of range (placement.txt beside each report: draft round, draft extend,
# verify).
# CKPT_GAINS="attn_out=5.5" (env): a checkpoint with other weight gains (kit make-checkpoint --gain), in its
# own checkpoint folder and batches (suffix -attn_out-5.5; `--set model_path=...`)
# Needs: .whl/nvtx-0.2.10-cp312-*.whl, .devdeps/lib{dw1,elf1}_*.deb, the staged parts (kit stage pack).
# JOBS=N (env): N servers at once for the grid's matrix (they start side by side and take turns to measure;
# its server flags cap each KV pool: four ran on the H200, the grid's graph timings as with one alone); the
# older matrices assume one.
# Starts no new cell after DEADLINE_S seconds so results always come back (default 540; 360 for the grid's
# modes, where a server's last cells, its stop and report export and the analyses follow the last start);
# a cell that finished before is kept, so calling a mode again resumes it.
#
# Regenerate (data/results/h200-pr29654/README.md has the device-time estimate):
#   here (network):
#     kit build && kit stage pack --part-mib 17 --extra build/sglang-0.5.14+pr29654/*.whl .stage
#     kit stage pack --part-mib 17 --lock data/stage/sglang-0.5.16-h200.json --beside .stage/manifest.json .stage16
#     kit stage pack --part-mib 17 --lock data/stage/sglang-0.5.17-h200.json --beside .stage/manifest.json .stage17
#     kit stage pack --part-mib 17 --lock data/stage/notebooks-h200.json .stage-nb
#   (--beside: the wheels 0.5.14's stage carries stay out of the later one's; install takes them from it)
#   there, once per call that carries one part (with its folder's manifest.json):
#     bash scripts/h200_sglang.sh OUT receive
#   there:  export KIT_GIT_SHA=<the kit commit>
#           bash scripts/h200_sglang.sh OUT install
#           JOBS=2 bash scripts/h200_sglang.sh OUT warm       # the JIT kernels, before the grid
#           JOBS=4 bash scripts/h200_sglang.sh OUT grid 470   # again until it exits 0 (each call resumes)
#           JOBS=3 bash scripts/h200_sglang.sh OUT latest
#           bash scripts/h200_sglang.sh OUT perturbation
#   then here: unpack OUT/results-MODE.tgz; batch h200_pr29654/ becomes data/results/h200-pr29654/runs/.
set -uo pipefail
out=${1:?usage: h200_sglang.sh OUT_DIR MODE [DEADLINE_S]}
mode=${2:?mode: receive|install|warm|grid|part-a|part-b|perturbation|latest|eager|graph|steps3|noise}
case $mode in grid | part-? | perturbation | latest) deadline=${3:-360} ;; *) deadline=${3:-540} ;; esac
start=$SECONDS
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
gains=${CKPT_GAINS:-}
ctag=${gains:+-$(echo "$gains" | tr ' =' '_-')}
gain_args=(); for g in $gains; do gain_args+=(--gain "$g"); done
# target, /tmp/kit-sglNN (a later release 0.5.NN, own stage: .stageNN parts) and ckpt are the paths the
# matrices name (builds:, params.model_path)
store=/tmp/kit-stage target=/tmp/kit-sgl ckpt=/tmp/kit-ckpt$ctag runs=/tmp/kit-sgl-runs
store_nb=/tmp/kit-stage-nb target_nb=/tmp/kit-nb
bug_ver=0.5.14 fix_ver=0.5.14+pr29654 ups=(16 17)  # the later releases with stages of their own
log="$out/log-$mode$ctag.txt"
mkdir -p "$out" "$runs"
# shellcheck source=scripts/h200_task_settings.sh
source scripts/h200_task_settings.sh  # the nvtx wheel, the JIT caches, use, host_facts, pack_runs
if [ "$mode" != receive ]; then
  # shellcheck source=/dev/null
  source scripts/gpu-host-nsys.sh .devdeps >/dev/null || exit 1
fi
# The kit's own processes see what every build shares (and the notebooks wheels, when installed); a
# batch's cells add their arm's build (the matrix).
base="/tmp/kit-site:$target/deps:$repo:$target/fallback"
[ -d "$target_nb/deps" ] && base="/tmp/kit-site:$target_nb/deps:$target/deps:$repo:$target/fallback"
export PYTHONPATH=$base

use_build() {  # one sglang build on PYTHONPATH, for the install steps that import it (never two)
  case $1 in 0.5.1[6-9]) use "$1" "/tmp/kit-sgl${1#0.5.}" ;; *) use "$1" ;; esac
}

runner=plain
python3 -c "import papermill, ipykernel, nbconvert" 2>/dev/null && runner=notebooks

pack() { pack_runs "$out/results-$mode$ctag.tgz" "$runs"; }  # small files only; refreshed while a batch runs

classify() {  # BATCH: the NVTX-free kernel classifier beside each analysed graph run, as a cross-check
  local run
  for run in "$runs/$1"/*-cuda; do
    [ -f "$run/verdict.json" ] || continue
    case $run in  # eager: no graph launches delimit the rounds, the classifier cannot count them
      *-graph-cuda) [ -e "$run/classifier" ] || python3 -m kit.cli analyze "$run" --method classifier \
        --out "$run/classifier" >/dev/null 2>>"$log" || echo "classifier ${run##*/}: failed, see $log" | tee -a "$log" ;;
    esac
    # where in the round the indexer ran: once per report, beside it (a shared server's cells link to one)
    report=$(readlink -f "$run/profile.sqlite") || continue
    [ -e "${report%/*}/placement.txt" ] || python3 scripts/indexer_placement.py "$report" \
      > "${report%/*}/placement.txt" 2>>"$log"
  done
}

status=0
batch() {  # MATRIX MODE BATCH: one grid of a matrix into BATCH, resumed, within what is left of the deadline
  local matrix=$1 m=$2 name=$3 left=$((deadline - (SECONDS - start))) pid rc n=0 how=()
  ((left > 0)) || left=0
  [ "$m" = - ] || how=(--mode "$m")
  python3 -m kit.cli batch "$matrix" "${how[@]}" --batch "$name" --runner "$runner" --out "$runs" --resume \
    -j "${JOBS:-1}" \
    --deadline "$left" --no-progress ${gains:+--set "model_path=$ckpt"} > "$out/batch-$m$ctag.txt" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do sleep 2; ((++n % 10)) || pack; done
  wait "$pid"
  rc=$?
  classify "$name"
  pack; jit_pack "$out"  # the batch is over: no server compiling
  tee -a "$log" < "$out/batch-$m$ctag.txt"
  echo "kit batch $matrix ${how[*]} ($runner): exit $rc (0 done, 1 a failed check, 2 a failure, 3 cells left" \
    "for the next call)" | tee -a "$log"
  ((rc == 0)) || status=$rc
}

checkpoint() {
  [ -f "$ckpt/kit-checkpoint.json" ] && return 0
  (use_build "$bug_ver" && python3 -m kit.cli make-checkpoint "$ckpt" ${gain_args[@]+"${gain_args[@]}"}) \
    > "$out/checkpoint$ctag.json" 2>&1 || { cat "$out/checkpoint$ctag.json"; return 1; }
}

check_build() {  # VERSION FOLDER: smoke test, kit verify, kit probe-check of one installed build
  local ver=$1 dir=$2 f=${1//+/-}  # f: no '+' in what comes back (the device tool refuses such names)
  (use_build "$ver" && timeout 300 python3 -m kit.sglang_src.stage_smoke) > "$out/smoke-$f.json" \
    2>"$out/smoke-$f.err"; echo "smoke $ver rc=$?"
  python3 -m kit.cli verify "$dir/sglang" > "$out/verify-$f.json" 2>&1
  python3 -m kit.cli probe-check "$dir/sglang" > "$out/probe-check-$f.json" 2>&1
  echo "$ver: $(grep -m1 '"state"' "$out/verify-$f.json")"
}

host_facts "$out/host-$mode$ctag.txt" "$("${KIT_NSYS:-nsys}" --version 2>&1)" "kit batch runner: $runner"
case $mode in
  receive)  # every staged folder that travelled: .stage[N] (0.5.14), .stage1[6-9][_N] (0.5.1x), .stage-nb
    # (.stage-jit*: jit_restore, above); a received folder is removed, so no later call checks it again
    for d in .stage*; do
      [ -f "$d/manifest.json" ] || continue
      case $d in .stage1[6-9]*) n=${d#.stage}; to=/tmp/kit-stage${n%%_*} ;; .stage-nb*) to=$store_nb ;;
        .stage-jit*) continue ;; *) to=$store ;; esac
      got=$(python3 -m kit.cli stage receive "$d" "$to") && rm -rf "$d"
      echo "$d -> $to: $(echo "$got" | grep -m1 '"have"')"
    done ;;
  install)
    python3 -m kit.cli stage status "$store" || exit 1
    python3 -m kit.cli stage install "$store" "$target" > "$out/install.json" 2>&1 || { cat "$out/install.json"; exit 1; }
    for ver in "$bug_ver" "$fix_ver"; do check_build "$ver" "$target/sglang-$ver"; done
    for n in "${ups[@]}"; do
      [ -f "/tmp/kit-stage$n/manifest.json" ] || continue
      python3 -m kit.cli stage install "/tmp/kit-stage$n" "/tmp/kit-sgl$n" --beside "$target" > "$out/install$n.json" 2>&1 \
        || { cat "$out/install$n.json"; exit 1; }
      check_build "0.5.$n" "/tmp/kit-sgl$n/sglang-0.5.$n"
    done
    if [ -f "$store_nb/manifest.json" ]; then
      python3 -m kit.cli stage install "$store_nb" "$target_nb" > "$out/install-nb.json" 2>&1 \
        || { cat "$out/install-nb.json"; exit 1; }
      PYTHONPATH="/tmp/kit-site:$target_nb/deps:$target/deps:$repo:$target/fallback" python3 -c \
        "import papermill, ipykernel, nbconvert; print('notebooks runner ready: papermill', papermill.__version__)"
    fi
    du -sh "$target"/* /tmp/kit-sgl1[6-9]/* "$target_nb"/* 2>/dev/null | tee "$out/install-sizes.txt"
    checkpoint && echo "checkpoint ok" ;;
  warm)  # set-up, not evidence: its own batch
    checkpoint || exit 1
    batch h200_pr29654 warm "h200_pr29654-warm$ctag" ;;
  grid)
    checkpoint || exit 1
    batch h200_pr29654 - "h200_pr29654$ctag" ;;
  part-a | part-b | perturbation)
    checkpoint || exit 1
    batch h200_pr29654 "$mode" "h200_pr29654$ctag" ;;
  latest)  # sglang 0.5.17 beside 0.5.14 and the fix (its stage: .stage17 parts)
    checkpoint || exit 1
    batch h200_pr29654 latest "h200_pr29654-latest$ctag" ;;
  eager | graph | steps3)
    checkpoint || exit 1
    batch h200_sglang "$mode" "h200_sglang-$mode$ctag" ;;
  noise)
    checkpoint || exit 1
    pair=h200_sglang-graph$ctag repeat=h200_sglang-noise$ctag id=ctx4096-s5-graph-cuda
    batch h200_sglang graph-4k "$pair"  # graph's 4k pair, where missing (finished runs are kept)
    batch h200_sglang noise "$repeat"
    python3 -m kit.cli noise "$runs/$pair/sglang-bug-$id" "$runs/$pair/sglang-fix-$id" \
      "$runs/$repeat/sglang-bug-$id" > "$out/noise$ctag.json" 2>&1
    echo "kit noise rc=$? (verdict in $out/noise$ctag.json)" | tee -a "$log" ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
# The smallest cells' SQLite exports, as analysis fixtures (only if they fit what comes back).
case $mode in
  eager | graph | steps3 | grid | part-? | latest)
    b=h200_sglang-$mode$ctag
    case $mode in grid | part-?) b=h200_pr29654$ctag ;; latest) b=h200_pr29654-latest$ctag ;; esac
    (cd "$runs" && tar czhf "$out/sqlite-$mode$ctag.tgz" $(ls "$b"/*-ctx4096-*-cuda/profile.sqlite \
      "$b"/*-ctx16384-*-cuda/profile.sqlite 2>/dev/null | head -2)) 2>/dev/null
    find "$out" -name 'sqlite-*.tgz' -size +15M -delete ;;
esac
ls -la "$out"
exit "$status"
