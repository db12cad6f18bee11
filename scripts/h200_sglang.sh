#!/usr/bin/env bash
# Real sglang on one offline H200 host, through the kit's own pipeline (probes + launcher under Nsight
# Systems + analysis). This script only sets the host up (nvtx, nsys, the JIT caches, PYTHONPATH); the call
# is `kit host sglang OUT MODE [DEADLINE_S]` (kit/pipeline/host_sglang.py), which receives and installs the
# staged builds (the later releases' from the release registry), checks each, writes the checkpoint, and
# runs `kit batch MATRIX` with a committed matrix, which names each arm's build folder (a bug cell and a fix
# cell each import their own sglang), starts one server per arm and server settings, resumes a batch, sets
# failed runs aside, compares and gates each pair, writes the report, and starts no cell after the deadline.
# With papermill and ipykernel importable (the notebooks stage, data/stage/notebooks-h200.json) the cells
# run through the notebooks; without, `--runner plain`.
#   bash scripts/h200_sglang.sh OUT_DIR MODE [DEADLINE_S]
# MODE: receive  keep the staged parts that travelled with this call: .stage[-N] (sglang 0.5.14 + the
#                patched build), .stage16[_N] / .stage17[_N] (sglang 0.5.16 / 0.5.17), .stage-nb (notebooks);
#                a received per-call copy (kit stage carry: -N, _N) is removed, so no later call checks it
#                again; .stage-jit*: jit_restore's
#       install  join and install what has been received, smoke-test each build, check its state (kit
#                verify) and the probe targets, write the checkpoint
#       warm     set-up: the matrix's mode warm, a server per sglang build at 4k without nsys (JOBS=2: side by
#                side), so the JIT kernels compile before the grid instead of inside its first servers' starts
#       grid     data/matrices/h200_pr29654.yaml: bug, fix, off, upstream (0.5.16) at 4k/80k/256k/500k with
#                CUDA graphs, bug, fix and off eager at 4k (results: data/results/h200-pr29654/)
#       profiles the 4k graph cells of bug, fix and 0.5.16 for committing (kit.pipeline.host_reports): each
#                cell's trimmed SQLite export and its server's .nsys-rep if the three fit 6 MB together, else the
#                three cells again one server each (the matrix's mode profiles); OUT/profiles.tgz, sizes-*.txt
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
# a cell that finished before is kept, so calling a mode again resumes it. Each batch gets what is left.
# KIT_HOST_TMP (env; tests): where the host's folders go instead of /tmp (the matrices name /tmp's);
# KIT_NSYS set: that nsys, without scripts/gpu-host-nsys.sh's repair.
#
# Regenerate (data/results/h200-pr29654/README.md has the device-time estimate):
#   here (network):
#     P=$(kit stage fit .whl .devdeps | python3 -c 'import json,sys; print(json.load(sys.stdin)["part_mib"])')   # what one call holds beside this checkout
#     kit build && kit stage pack --part-mib $P --extra build/sglang-0.5.14+pr29654/*.whl .stage
#     kit stage pack --part-mib $P --lock data/stage/sglang-0.5.16-h200.json --beside .stage/manifest.json .stage16
#     kit stage pack --part-mib $P --lock data/stage/sglang-0.5.17-h200.json --beside .stage/manifest.json .stage17
#     kit stage pack --part-mib $P --lock data/stage/notebooks-h200.json .stage-nb
#   (--beside: the wheels 0.5.14's stage carries stay out of the later one's; install takes them from it)
#   there, once per call that carries one part (with its folder's manifest.json):
#     bash scripts/h200_sglang.sh OUT receive
#   there:  export KIT_GIT_SHA=<the kit commit>
#           bash scripts/h200_sglang.sh OUT install
#           JOBS=2 bash scripts/h200_sglang.sh OUT warm       # the JIT kernels, before the grid
#           JOBS=4 bash scripts/h200_sglang.sh OUT grid 470   # again until it exits 0 (each call resumes)
#           bash scripts/h200_sglang.sh OUT profiles           # the reports a reviewer opens
#           JOBS=3 bash scripts/h200_sglang.sh OUT latest
#           bash scripts/h200_sglang.sh OUT perturbation
#   then here: unpack OUT/results-MODE.tgz; batch h200_pr29654/ becomes data/results/h200-pr29654/runs/.
set -uo pipefail
out=${1:?usage: h200_sglang.sh OUT_DIR MODE [DEADLINE_S]}
mode=${2:?mode: receive|install|warm|grid|profiles|part-a|part-b|perturbation|latest|eager|graph|steps3|noise}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
tmp=${KIT_HOST_TMP:-/tmp}
# shellcheck source=scripts/h200_task_settings.sh
source scripts/h200_task_settings.sh  # the nvtx wheel, the JIT caches (jit_restore here; jit_pack: the kit)
if [ "$mode" != receive ] && [ -z "${KIT_NSYS:-}" ]; then
  # shellcheck source=/dev/null
  source scripts/gpu-host-nsys.sh .devdeps >/dev/null || exit 2  # an error, not a verdict
fi
python3 -m kit.cli host sglang "$out" "$mode" ${3:+"$3"} --tmp "$tmp" -j "${JOBS:-1}" \
  ${CKPT_GAINS:+--gains "$CKPT_GAINS"}
rc=$?
[ ! -d "$out" ] || ls -la "$out"
exit "$rc"
