#!/usr/bin/env bash
# The mutation suite on real sglang, one offline H200: each wrong fix of PR #29654 (kit/sglang_src/mutants.py)
# built, installed and run as the fix arm against the same task workload as bug, fix and off, each judged by
# the gate against bug with off as the control (data/matrices/h200_mutants.yaml, run by kit batch).
# This script only sets the host up (nvtx, nsys, the JIT caches, PYTHONPATH); the call is
# `kit host mutants OUT STEP [ARG...]` (kit/pipeline/host_mutants.py, where its steps are documented).
# The committed results (data/results/mutants/h200/) were made by this script's earlier bash version; this
# one has not run on the H200 yet.
#   bash scripts/h200_mutants.sh OUT STEP [ARG...]
# Run h200_task.sh's receive and install first (the staged 0.5.14 closure, both builds, the task checkpoint
# /tmp/kit-task). STEP:
#   build [NAME...]          each mutant's wheel (default: every one) from the staged 0.5.14 wheel (kit build
#                            --patch), installed into its own folder, kit verify'd (results/verify/)
#   base MODE                bug, fix and off; MODE graph (CUDA graphs) or eager
#   suite MODE [NAME...]     those and the mutants (default: the registry's plan for MODE), one batch
#   mutants MODE [NAME...]   the mutants (bug and off too where not yet run: their judge needs them)
#   compare                  each judgement as results/comparisons/MODE/WORKLOAD/NAME/ (refused/NAME.txt,
#                            crashed/NAME-MODE.txt: kills), then scripts/mutants.py h200 (the table)
# A refused build (kit verify not `fix`) and a server that dies starting up are kills; a mutant the gate
# passes makes the batch exit 1. Exit codes: kit.errors.EXIT (2 an error, 1 a failed check, 3 cells left).
# Env: JOBS (default 1; kit batch -j), DEADLINE_S (540: no cell starts after), MIN_RUN_S (150: a cell starts
# only while these remain), WORKLOADS (same-target,moving-target; issue 32's set adds any-slot), PIP_FLAGS
# (the build step's extra pip options), KIT_HOST_TMP (tests: the host's folders instead of /tmp), KIT_NSYS
# (that nsys, without scripts/gpu-host-nsys.sh's repair).
set -uo pipefail
out=${1:?usage: h200_mutants.sh OUT STEP [ARG...]}
step=${2:?step: build|base|suite|mutants|compare}
shift 2
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
tmp=${KIT_HOST_TMP:-/tmp}
# shellcheck source=scripts/h200_task_settings.sh
source scripts/h200_task_settings.sh  # the nvtx wheel, the JIT caches (jit_restore here; jit_pack: the kit)
case $step in base|suite|mutants)
  # shellcheck source=/dev/null
  [ -n "${KIT_NSYS:-}" ] || source scripts/gpu-host-nsys.sh .devdeps >/dev/null || exit 2 ;;
esac
python3 -m kit.cli host mutants "$out" "$step" "$@" --tmp "$tmp" -j "${JOBS:-1}" --deadline "${DEADLINE_S:-540}" \
  --min-run "${MIN_RUN_S:-150}" --workloads "${WORKLOADS:-same-target,moving-target}" --pip-args "${PIP_FLAGS:-}"
rc=$?
[ ! -d "$out" ] || ls -la "$out"
exit "$rc"
