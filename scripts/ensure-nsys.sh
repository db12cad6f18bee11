#!/usr/bin/env bash
# Make `nsys` usable on this machine, or say exactly why it can't be.
# Debian ships Nsight Systems 2022.4 in non-free; its importer path is broken (see README),
# so we add the missing symlink. Elsewhere we print how to install it and exit 3.
# Exit codes: 0 nsys works; 3 nsys unavailable (caller decides: demo falls back, CI fails).
set -euo pipefail

nsys_ok() {
  command -v nsys >/dev/null 2>&1 || return 1
  local real dir
  real=$(readlink -f "$(command -v nsys)")
  dir=$(dirname "$(dirname "$real")")
  # Debian's packaging bug: nsys looks for ../host-linux-x64/QdstrmImporter next to its target dir.
  if [ -d /usr/lib/nsight-systems/host-linux-x64 ] && [ ! -e "$dir/host-linux-x64" ] && [ -w "$dir" ]; then
    ln -sfn /usr/lib/nsight-systems/host-linux-x64 "$dir/host-linux-x64"
  fi
  return 0
}

if nsys_ok; then
  echo "nsys: $(nsys --version 2>/dev/null | head -1)"
  exit 0
fi

os_id=$(. /etc/os-release 2>/dev/null; echo "${ID:-unknown}")
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && { [ "$os_id" = debian ] || [ "$os_id" = ubuntu ]; }; then
  echo "nsys missing: installing nsight-systems from $os_id's archive ..."
  src=/etc/apt/sources.list.d/kit-nonfree.sources
  if [ "$os_id" = debian ] && [ ! -e "$src" ]; then
    suite=$(. /etc/os-release; echo "${VERSION_CODENAME:-bookworm}")
    cat > "$src" <<SRC
Types: deb
URIs: http://deb.debian.org/debian
Suites: $suite
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || true
  # Ubuntu carries nsight-systems in multiverse; Debian in non-free (enabled above).
  apt-get install -y -qq --no-install-recommends nsight-systems >/dev/null || true
  if nsys_ok; then
    echo "nsys: $(nsys --version 2>/dev/null | head -1)"
    exit 0
  fi
fi

cat >&2 <<'MSG'
nsys (Nsight Systems) is not available and could not be installed here.
  Debian (root):  add a 'contrib non-free' apt source, then: apt-get install nsight-systems
  Ubuntu (root):  enable multiverse, then: apt-get install nsight-systems
  Other:          install Nsight Systems from NVIDIA's developer site or the CUDA toolkit, and put nsys on PATH.
The demo still runs with the kit's in-process NVTX recorder; every artifact will say it was NOT measured under Nsight.
MSG
exit 3
