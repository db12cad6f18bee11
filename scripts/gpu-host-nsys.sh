#!/usr/bin/env bash
# Source this on an offline GPU host whose image carries Nsight Systems only inside Nsight Compute
# (e.g. the NVIDIA PyTorch image: /opt/nvidia/nsight-compute/<ver>/host/target-linux-x64/nsys) and whose
# QdstrmImporter lacks libdw.so.1. Usage:  source scripts/gpu-host-nsys.sh DEB_DIR
#   DEB_DIR holds Debian 12's libdw1 and libelf1 .deb files (`apt-get download libdw1 libelf1` elsewhere).
# Sets KIT_NSYS (read by kit.trace.nsys.find_nsys) and LD_LIBRARY_PATH. See README "Nsight on GPU hosts".
deb_dir=${1:?usage: source scripts/gpu-host-nsys.sh DEB_DIR}
host=$(ls -d /opt/nvidia/nsight-compute/*/host 2>/dev/null | sort -V | tail -1)
if [ -z "$host" ] || [ ! -x "$host/target-linux-x64/nsys" ]; then
  echo "gpu-host-nsys: no nsys under /opt/nvidia/nsight-compute/*/host/target-linux-x64" >&2
  return 1 2>/dev/null || exit 1
fi
libs=/tmp/kit-nsys-libs
mkdir -p "$libs"
for deb in "$deb_dir"/libdw1_*.deb "$deb_dir"/libelf1_*.deb; do
  [ -f "$deb" ] || { echo "gpu-host-nsys: missing $deb" >&2; return 1 2>/dev/null || exit 1; }
  dpkg -x "$deb" "$libs"
done
# nsys looks for its importer in ../host-linux-x64 next to target-linux-x64.
[ -e "$host/host-linux-x64" ] || ln -sfn "$host/linux-desktop-glibc_2_11_3-x64" "$host/host-linux-x64"
export LD_LIBRARY_PATH="$libs/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KIT_NSYS="$host/target-linux-x64/nsys"
echo "KIT_NSYS=$KIT_NSYS ($("$KIT_NSYS" --version 2>/dev/null))"
