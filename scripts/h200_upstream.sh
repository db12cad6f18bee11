#!/usr/bin/env bash
# The newest stageable sglang release (0.5.16, data/stage/README.md) as the `upstream` arm on one offline
# H200: the task checkpoint, EAGLE 5/1/6, CUDA graphs, 64k and 500k x same-target/moving-target, 8 requests
# 2 in flight, one nsys report with a window per cell, each cell analysed and its NVTX-free classifier count
# beside it: data/matrices/h200_task.yaml's mode upstream, the settings of the task runs, so its cells sit
# next to 0.5.14 (bug) and 0.5.14+pr29654 (fix) in data/results/h200-sglang-task/ (the committed upstream
# cells were run by the earlier bash version of this script; this one has not run on the H200 yet).
#   bash scripts/h200_upstream.sh OUT STEP [DEADLINE_S]
# STEP: receive   keep the staged parts that travelled with this call (.stage16/manifest.json + a part)
#       install   join the parts, install every received build (0.5.16 beside 0.5.14's, which comes first),
#                 smoke-test and check each, write the task checkpoint
#       upstream  one server, the four cells (batch h200_task-upstream under /tmp/kit-task-runs); launches
#                 per draft round expected 0 (0.5.16 seeds the draft loop with its draft extend's top-k)
# It is scripts/h200_task.sh with these steps (`kit host task OUT STEP`): the same host set-up and options.
set -uo pipefail
step=${2:?usage: h200_upstream.sh OUT receive|install|upstream [DEADLINE_S]}
case $step in
  receive | install | upstream) exec bash "$(dirname "$0")/h200_task.sh" "$@" ;;
  *) echo "h200_upstream.sh: unknown step $step; use receive, install or upstream" >&2; exit 2 ;;
esac
