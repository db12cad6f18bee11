#!/usr/bin/env bash
# The retrieval-task checkpoint on real sglang, one offline H200: does every arm answer, do the tokens agree,
# and what does sharing the draft's top-k cost the acceptance? Results: data/results/h200-sglang-task/,
# h200-kineto/, h200-tp4/ (those were run by the earlier bash version of this script; this one has not run
# on the H200 yet). This script only sets the host up (nvtx, nsys, the JIT caches, PYTHONPATH); the call is
# `kit host task OUT STEP [DEADLINE_S]` (kit/pipeline/host_task.py): each step but receive and install is a
# mode of data/matrices/h200_task.yaml run by `kit batch` (resumed, -j servers at once, compares and gates
# per bug/fix pair with off as control, the report), into batches under /tmp/kit-task-runs.
#   bash scripts/h200_task.sh OUT STEP [DEADLINE_S]
# STEP: receive    keep the staged parts that travelled with this call (as kit host sglang's receive)
#       install    join the parts, install the builds, smoke-test and check each, write the task checkpoint
#                  (kit make-checkpoint /tmp/kit-task --task)
#       bug|fix|off    one server for the arm, 4k/64k/500k x same-target/moving-target, into batch h200_task;
#                  then the base grid compares each bug/fix pair whose arms (and off control) have run
#       arms       bug, fix and off side by side (JOBS=3: each KV pool capped, a cell at a time in turn),
#                  the same cells, batch and compares as the three steps; 2-3 calls (all but the last exit 3)
#       control    the fix arm with the TARGET indexer's top-k replaced by the last 2048 tokens, 64k, no
#                  profile (batch h200_task-control): answers must collapse
#       kineto     bug and fix, graphs and eager, 64k same-target, under sglang's own PyTorch profiler and
#                  under nsys (8 servers), each Kineto trace's classifier analysis and trimmed copy; then the
#                  long-window bug cell, whose whole trace comes back in OUT in 15 MiB pieces
#       tp4        bug and fix with 4 TP ranks (nvidia-h200-x4), 64k and 500k, both workloads; TP=1 (env):
#                  the same on one GPU (batch h200_task-tp1), the dry run of its path
#       upstream   sglang 0.5.16 at 64k and 500k (scripts/h200_upstream.sh calls this script)
# JOBS=N (env): N servers at once on the one GPU, each KV pool capped in tokens (the kit's shared_gpu_args).
# No cell starts in the last 150-300 s before DEADLINE_S (default 540); a cell that finished is kept, so a
# step called again resumes. Exit: 0 done, 1 a failed check, 2 an error, 3 cells left for the next call.
# KIT_HOST_TMP (env; tests): where the host's folders go instead of /tmp; KIT_NSYS set: that nsys, without
# scripts/gpu-host-nsys.sh's repair; KIT_RUNNER: kit batch's runner (default: notebooks where importable).
# Needs .whl/nvtx-0.2.10-cp312-*.whl and .devdeps/lib{dw1,elf1}_*.deb (see README: Running on a GPU node).
set -uo pipefail
out=${1:?usage: h200_task.sh OUT STEP [DEADLINE_S]}
step=${2:?step: receive|install|bug|fix|off|arms|control|kineto|tp4|upstream}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
tmp=${KIT_HOST_TMP:-/tmp}
# shellcheck source=scripts/h200_task_settings.sh
source scripts/h200_task_settings.sh  # the nvtx wheel, the JIT caches (jit_restore here; jit_pack: the kit)
if [ "$step" != receive ] && [ -z "${KIT_NSYS:-}" ]; then
  # shellcheck source=/dev/null
  source scripts/gpu-host-nsys.sh .devdeps >/dev/null || exit 2  # an error, not a verdict
fi
python3 -m kit.cli host task "$out" "$step" ${3:+"$3"} --tmp "$tmp" -j "${JOBS:-1}" --tp "${TP:-4}" \
  --runner "${KIT_RUNNER:-auto}"
rc=$?
[ ! -d "$out" ] || ls -la "$out"
exit "$rc"
