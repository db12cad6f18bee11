#!/usr/bin/env bash
# A real single-node Slurm cluster on this machine, for `kit batch --executor slurm` tests:
#   bash scripts/slurm-cluster.sh install          # Debian's slurm-wlm + munge (root, apt), if missing
#   bash scripts/slurm-cluster.sh start DIR         # munged, slurmctld, slurmd; state, logs, config in DIR
#   bash scripts/slurm-cluster.sh stop DIR          # stop the three daemons by their pid files
# `start` prints `SLURM_CONF=DIR/slurm.conf` on its last line; export it for sbatch/squeue/scancel.
# The cluster has ports of its own and its own munge socket (slurm.conf's AuthInfo), so a system Slurm or
# another such cluster on this host is left alone. No accounting (no slurmdbd): sacct cannot see its jobs.
# Exit 3: Slurm cannot be installed or started here (not root, no apt); anything else is a failure.
set -euo pipefail
cmd=${1:?usage: slurm-cluster.sh install|start DIR|stop DIR}

install() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "slurm missing and cannot be installed here (needs root and apt-get)" >&2; exit 3
  fi
  echo "slurm missing: installing slurm-wlm and munge from the distribution's archive ..." >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
         --no-install-recommends slurm-wlm munge >/dev/null; }
}

free_ports() {  # two TCP ports nobody listens on now
  python3 -c 'import socket
ss = [socket.socket() for _ in range(2)]
for s in ss:
    s.bind(("", 0))
print(*(s.getsockname()[1] for s in ss))'
}

start() {
  local dir host cpus mem munge ctld_port slurmd_port
  dir=$(mkdir -p "$1" && cd "$1" && pwd)
  [ "$(id -u)" = 0 ] || { echo "starting slurmctld/slurmd needs root" >&2; exit 3; }
  install
  host=$(hostname -s)
  cpus=$(nproc)
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
  mkdir -p "$dir"/{state,spool,log}
  chmod 755 "$dir"
  # munged runs as user munge, which cannot enter a private temp folder (pytest's are 0700): its key,
  # socket and log live in a folder of their own under /tmp, named in DIR/munge.dir for `stop`
  munge=$(mktemp -d /tmp/kit-munge.XXXXXX)
  echo "$munge" > "$dir/munge.dir"
  mkdir -p "$munge/run"
  head -c 1024 /dev/urandom > "$munge/munge.key"
  chown -R munge: "$munge"
  chmod 711 "$munge" && chmod 755 "$munge/run" && chmod 400 "$munge/munge.key"
  read -r ctld_port slurmd_port <<< "$(free_ports)"
  cat > "$dir/slurm.conf" <<EOF
ClusterName=kit
SlurmctldHost=$host
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$munge/run/munge.sock
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
MpiDefault=none
KillWait=2
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  runuser -u munge -- munged --key-file="$munge/munge.key" --socket="$munge/run/munge.sock" \
    --pid-file="$munge/munged.pid" --log-file="$munge/munged.log" --seed-file="$munge/seed"
  export SLURM_CONF=$dir/slurm.conf
  slurmctld -f "$SLURM_CONF"
  slurmd -f "$SLURM_CONF"
  for _ in $(seq 100); do
    sinfo -h -o %t 2>/dev/null | grep -qx idle && { echo "SLURM_CONF=$SLURM_CONF"; return 0; }
    sleep 0.2
  done
  echo "slurm did not become idle in 20 s; logs in $dir/log and $munge" >&2
  sinfo >&2 || true
  exit 1
}

stop() {
  local dir=$1 f munge=""
  [ -f "$dir/munge.dir" ] && munge=$(cat "$dir/munge.dir")
  for f in "$dir/slurmd.pid" "$dir/slurmctld.pid" ${munge:+"$munge/munged.pid"}; do
    if [ -f "$f" ]; then kill "$(cat "$f")" 2>/dev/null || true; fi
  done
  case $munge in
    /tmp/kit-munge.*) sleep 0.5; rm -rf "$munge" ;;
  esac
}

case $cmd in
  install) install ;;
  start) start "${2:?start DIR}" ;;
  stop) stop "${2:?stop DIR}" ;;
  *) echo "usage: slurm-cluster.sh install|start DIR|stop DIR" >&2; exit 2 ;;
esac
