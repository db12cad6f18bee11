#!/usr/bin/env bash
# Analysis speed on GPU reports (eager CUDA kernels inside NVTX ranges), three sizes, on an H200 host:
# kit analyze (SQLite -> rounds.csv + verdict) vs `nsys stats -r nvtx_kern_sum` on the same export.
#   bash scripts/bench_analysis_gpu.sh OUT_DIR        (needs what scripts/h200_evidence.sh needs)
set -uo pipefail
out=${1:?usage: bench_analysis_gpu.sh OUT_DIR}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kit-site .whl/nvtx-*.whl >/dev/null 2>&1
export PYTHONPATH="/tmp/kit-site:$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# shellcheck source=/dev/null
source scripts/gpu-host-nsys.sh .devdeps >/dev/null || exit 1
now() { date +%s.%N; }
mkdir -p "$out"
table="$out/bench_analysis_gpu.md"
{ echo "| new tokens | kernels | rounds | .sqlite MB | nsys stats nvtx_kern_sum s | kit analyze s | ratio | verdict |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---|"; } > "$table"
for tokens in 160 320 720; do
  id="bench-$tokens"
  python3 -m kit.cli run --arm bug --context-len 4096 --device cuda --preset tiny --no-cuda-graph \
    --num-requests 1 --max-new-tokens "$tokens" --out /tmp/kit-bench --batch b --run-id "$id" >/dev/null || continue
  db=/tmp/kit-bench/b/$id/profile.sqlite
  kernels=$(python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('select count(*) from CUPTI_ACTIVITY_KIND_KERNEL').fetchone()[0])" "$db")
  t0=$(now); "$KIT_NSYS" stats -q -r nvtx_kern_sum -f csv -o /tmp/kit-bench/stats-$tokens "$db" >/dev/null 2>&1; t1=$(now)
  python3 -m kit.cli analyze "$db" --arm bug --num-steps 5 --out "/tmp/kit-bench/an-$tokens" > "/tmp/kit-bench/v-$tokens.json"; t2=$(now)
  python3 - "$tokens" "$kernels" "$db" "$t0" "$t1" "$t2" "/tmp/kit-bench/v-$tokens.json" >> "$table" <<'PY'
import json, os, sys
tok, k, db, t0, t1, t2, v = sys.argv[1:]
s, a = float(t1) - float(t0), float(t2) - float(t1)
v = json.load(open(v))
print(f"| {tok} | {int(k):,} | {v['num_rounds']} | {os.path.getsize(db) / 1e6:.1f} | {s:.2f} | {a:.2f} | "
      f"{s / a:.1f}x | {v['method']} {v['status']} {sorted(set(v['launches_per_round']))} |")
PY
  cat "$table" | tail -1
done
{ echo; echo "nsys: $("$KIT_NSYS" --version)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])"; nproc; date -u; } >> "$table"
