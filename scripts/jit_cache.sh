# Sourced by scripts/h200_task_settings.sh (every H200 driver): the JIT caches sglang's kernels compile into on
# a GPU host (TVM-FFI, FlashInfer, Triton, DeepGEMM, and torch.compile's Inductor cache under /tmp: the DSA
# indexer's and the MoE top-k's @torch.compile functions compile at the first graph capture). A bare
# machine's first servers compile them: 289 s for 0.5.14 and 0.5.16 side by side on 2026-12-04
# (data/results/h200-pr29654/bare-host). They travel as a stage
# of their own, kind "tree" (kit stage pack-tree: parts with sha256, like the wheels):
#   jit_pack OUT   there, with no server running (one compiling could leave half a kernel): OUT/jit-stage/
#                  (manifest.json + parts of 15 MiB, under the 16 MiB a returned file may hold)
#   here           each part with the manifest in its own folder .stage-jit-K, carried on any calls
#   jit_restore    there, every call: keeps the parts of the .stage-jit* folders that travelled (kit stage
#                  receive), and once the store is whole unpacks it under the root (kit stage install: the
#                  payload's sha256 checked, once: it leaves a stamp in the store)
# shellcheck shell=bash
JIT_DIRS=("${HOME#/}/.cache/tvm-ffi" "${HOME#/}/.cache/flashinfer" "${HOME#/}/.cache/deep_gemm" "${HOME#/}/.triton"
  "tmp/torchinductor_$(id -un)")
JIT_STORE=${KIT_HOST_TMP:-/tmp}/kit-stage-jit  # the parts received so far, across calls
JIT_ROOT=${KIT_JIT_ROOT:-/}                   # where the caches live (tests: a folder of their own)

jit_restore() {
  local d
  for d in .stage-jit*; do
    [ -f "$d/manifest.json" ] || continue
    python3 -m kit.cli stage receive "$d" "$JIT_STORE" >/dev/null || return 1
    [[ ! $d =~ [-_][0-9]+$ ]] || rm -rf "$d"  # a per-call copy (kit stage carry), kept in the store
  done
  [ -f "$JIT_STORE/manifest.json" ] || return 0
  case $(python3 -m kit.cli stage status "$JIT_STORE") in
    *'"missing": []'*) python3 -m kit.cli stage install "$JIT_STORE" "$JIT_ROOT" >/dev/null ;;
    *) echo "JIT cache: not all parts received yet; a later call's may complete it" >&2 ;;
  esac
}

jit_pack() {  # OUT
  local out=${1:?usage: jit_pack OUT_DIR} have=() d
  for d in "${JIT_DIRS[@]}"; do [ -d "$JIT_ROOT/$d" ] && have+=("$d"); done
  [ ${#have[@]} -eq 0 ] && return
  rm -rf "$out/jit-stage"
  python3 -m kit.cli stage pack-tree "$out/jit-stage" "${have[@]}" --root "$JIT_ROOT" \
    --part-mib "${KIT_JIT_PART_MIB:-15}" >/dev/null
}
