#!/usr/bin/env bash
# Regenerate the H200 evidence (data/results/h200/) on one offline H200 host: the mini backend on CUDA,
# under Nsight Systems. This script only sets the host up (nvtx, nsys, PYTHONPATH, the DeepGEMM JIT cache);
# the call is `kit host evidence OUT MODE [DEADLINE_S]` (kit/pipeline/host.py), which runs `kit batch
# h200_mini --mode MODE --runner plain --resume` (data/matrices/h200_mini.yaml holds every mode's grid: it
# resumes a batch, sets failed runs aside, runs bug/fix pair by pair, compares and gates each pair, and
# starts no run after the deadline) and packs OUT/results-MODE.tgz while the batch runs.
#   bash scripts/h200_evidence.sh OUT_DIR MODE [DEADLINE_S]
# MODE: fixtures | graph | eager | batch4 | glm5: that mode of the matrix (batch h200_mini-MODE)
#       kernels: sglang's own indexer kernels in the mini engine, the matrix's kernels-* modes one after the
#         other (base b4 ragged s3 glm5 control; each bug/fix at 512k then 128k; ~6 min). It starts with
#         `python -m kit.backends.mini.kernel_check` (import, top-k vs a torch reference, CUDA-graph replay,
#         per-call timings): if that fails the runs use the torch indexer (`--set indexer_impl=torch`, batches
#         named ...-torch-fallback) and ragged is skipped. Needs deep_gemm (sgl-deep-gemm 0.1.3), sgl_kernel
#         (sglang-kernel 0.4.4) and tvm_ffi on PYTHONPATH (the caller's PYTHONPATH is kept).
# Every mode but kernels uses the torch indexer (what data/results/h200 documents); KIT_INDEXER_IMPL=auto|sglang
# changes that (`--set indexer_impl=...`).
# Needs: .whl/nvtx-0.2.10-cp312-*.whl and .devdeps/lib{dw1,elf1}_*.deb (see README "H200 evidence").
# Starts no new run after DEADLINE_S seconds (default 540; kernels: 320) so results always come back; a call
# that stopped there leaves the rest to the next call of the same mode (kit batch --resume). Exit: the last
# batch's code that was not 0 (1 a failed check, 2 a failure, 3 runs left for the next call).
# Where the tree has no .git, set KIT_GIT_SHA (e.g. `git rev-parse HEAD` where it came from) for provenance.
#
# Regenerate (data/results/h200/README.md):
#   for m in graph eager batch4 glm5; do bash scripts/h200_evidence.sh OUT $m 600; done
#   bash scripts/h200_evidence.sh OUT kernels 300
#   then here: unpack OUT/results-MODE.tgz; each batch h200_mini-MODE/ becomes data/results/h200/runs/MODE/
#   (small files only), and `kit evidence data/results/h200` writes summary.csv and ratios.csv.
set -uo pipefail
out=${1:?usage: h200_evidence.sh OUT_DIR MODE [DEADLINE_S]}
mode=${2:?mode: fixtures|graph|eager|batch4|glm5|kernels}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kit-site .whl/nvtx-*.whl >/dev/null
export PYTHONPATH="/tmp/kit-site:$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# DeepGEMM JIT-compiles its kernels on first use (nvcc): one cache for the whole window.
export DG_JIT_CACHE_DIR=${DG_JIT_CACHE_DIR:-/tmp/kit-deep-gemm-cache}
# shellcheck source=/dev/null
[ -n "${KIT_NSYS:-}" ] || source scripts/gpu-host-nsys.sh .devdeps || exit 2  # an error, not a verdict
python3 -m kit.cli host evidence "$out" "$mode" ${3:+"$3"} --runs "${KIT_HOST_TMP:-/tmp}/kit-runs" \
  ${KIT_INDEXER_IMPL:+--indexer-impl "$KIT_INDEXER_IMPL"}
rc=$?
[ ! -d "$out" ] || ls -la "$out"
exit "$rc"
