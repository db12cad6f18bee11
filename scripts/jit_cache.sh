# Sourced by scripts/h200_task_settings.sh (every H200 driver): the JIT caches sglang's kernels compile into on
# a GPU host (TVM-FFI, FlashInfer, Triton, DeepGEMM). A fresh machine's first server of a build compiles them:
# 170-324 s of its start on the H200 (data/results/h200-sglang-task, ../h200-pr29654). jit_pack OUT writes
# the caches as pieces of 15 MiB (a file over 16 MiB does not come back from the device); carried back in
# .jit/ (any pieces on any calls: a call holds the repository and a few pieces at most), jit_restore keeps
# them on the host and unpacks the cache once they make a whole archive.
# shellcheck shell=bash
JIT_DIRS=("${HOME#/}/.cache/tvm-ffi" "${HOME#/}/.cache/flashinfer" "${HOME#/}/.cache/deep_gemm" "${HOME#/}/.triton")
JIT_STORE=${KIT_HOST_TMP:-/tmp}/kit-jit  # the pieces received so far, across calls
JIT_ROOT=${KIT_JIT_ROOT:-/}              # where the caches live (tests: a folder of their own)

jit_restore() {  # keep the pieces this call carried; once they form a whole gzip tar, unpack it (once)
  mkdir -p "$JIT_STORE"
  if compgen -G ".jit/jit-cache.tgz*" >/dev/null; then cp .jit/jit-cache.tgz* "$JIT_STORE/"; fi
  [ -e "$JIT_STORE/restored" ] && return 0
  compgen -G "$JIT_STORE/jit-cache.tgz*" >/dev/null || return 0
  local pieces
  pieces=$(ls "$JIT_STORE"/jit-cache.tgz* | sort)
  # shellcheck disable=SC2086  # the pieces' names are ours: no spaces
  if cat $pieces | tar tzf - >/dev/null 2>&1; then  # all there: a missing piece fails the archive's check
    cat $pieces | tar xzf - -C "$JIT_ROOT" && touch "$JIT_STORE/restored"
  else
    echo "JIT cache: $(echo "$pieces" | wc -l) piece(s) received, not yet whole; the next call's may complete it" >&2
  fi
}

jit_pack() {  # OUT: the caches now, in pieces (call it with no server running: one compiling could leave half
  # a kernel)
  local out=${1:?usage: jit_pack OUT_DIR} have=() d
  for d in "${JIT_DIRS[@]}"; do [ -d "$JIT_ROOT/$d" ] && have+=("$d"); done
  [ ${#have[@]} -eq 0 ] && return
  rm -f "$out"/jit-cache.tgz*
  tar czf - -C "$JIT_ROOT" "${have[@]}" | split -b "${KIT_JIT_PIECE:-15M}" -d - "$out/jit-cache.tgz."
}
