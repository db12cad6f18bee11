#!/usr/bin/env bash
# A real single-node Slurm cluster on this machine, for `kit batch --executor slurm` tests:
#   bash scripts/slurm-cluster.sh install          # Debian's slurm-wlm + munge (root, apt), if missing
#   bash scripts/slurm-cluster.sh start DIR         # munged, slurmctld, slurmd; state, logs, config in DIR
#   bash scripts/slurm-cluster.sh stop DIR          # stop the three daemons by their pid files
# `start` prints `SLURM_CONF=DIR/slurm.conf` on its last line; export it for sbatch/squeue/sacct.
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

start() {
  local dir host cpus mem
  dir=$(mkdir -p "$1" && cd "$1" && pwd)
  [ "$(id -u)" = 0 ] || { echo "starting slurmctld/slurmd needs root" >&2; exit 3; }
  install
  host=$(hostname -s)
  cpus=$(nproc)
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
  mkdir -p "$dir"/{state,spool,log,munge,munge-run}
  chmod 755 "$dir"
  chown munge: "$dir/munge" "$dir/munge-run" && chmod 700 "$dir/munge" && chmod 755 "$dir/munge-run"
  if [ ! -f "$dir/munge/munge.key" ]; then
    head -c 1024 /dev/urandom > "$dir/munge/munge.key"
    chown munge: "$dir/munge/munge.key" && chmod 400 "$dir/munge/munge.key"
  fi
  cat > "$dir/slurm.conf" <<EOF
ClusterName=kit
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
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
  runuser -u munge -- munged --key-file="$dir/munge/munge.key" --socket="$dir/munge-run/munge.sock" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/seed"
  # slurm talks to munge through its default socket; point it at ours
  mkdir -p /run/munge && ln -sfn "$dir/munge-run/munge.sock" /run/munge/munge.socket.2
  export SLURM_CONF=$dir/slurm.conf
  slurmctld -f "$SLURM_CONF"
  slurmd -f "$SLURM_CONF"
  for _ in $(seq 100); do
    sinfo -h -o %t 2>/dev/null | grep -qx idle && { echo "SLURM_CONF=$SLURM_CONF"; return 0; }
    sleep 0.2
  done
  echo "slurm did not become idle in 20 s; logs in $dir/log" >&2
  sinfo >&2 || true
  exit 1
}

stop() {
  local dir=$1 f
  for f in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
    [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true
  done
}

case $cmd in
  install) install ;;
  start) start "${2:?start DIR}" ;;
  stop) stop "${2:?stop DIR}" ;;
  *) echo "usage: slurm-cluster.sh install|start DIR|stop DIR" >&2; exit 2 ;;
esac
