#!/usr/bin/env bash
# Analysis speed on real GPU reports, on an H200 host: eager CUDA (kernels launched inside NVTX ranges) and
# CUDA-graph replay (replayed kernels -> capture-time NVTX ranges), three sizes each, >= 200,000 kernels:
# kit analyze (a fresh process: SQLite -> rounds.csv + verdict.json) vs `nsys stats -r nvtx_kern_sum` on the
# same export, best of 2 each. Writes OUT_DIR/bench_analysis_gpu.md and prints it.
#   bash scripts/bench_analysis_gpu.sh OUT_DIR [DEADLINE_S]   (needs what scripts/h200_evidence.sh needs)
# ~250 kernels per new token in both modes (720 tokens gave 183,523 eager: 850 -> ~210k). Stops starting
# new reports after DEADLINE_S seconds (default 150) so that the whole run stays around 3 minutes.
set -uo pipefail
out=${1:?usage: bench_analysis_gpu.sh OUT_DIR [DEADLINE_S]}
deadline=${2:-150}
start=$SECONDS
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kit-site .whl/nvtx-*.whl >/dev/null 2>&1
export PYTHONPATH="/tmp/kit-site:$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset PYTHONDONTWRITEBYTECODE  # as an installed kit after its first run: bytecode cached
if [ -z "${KIT_NSYS:-}" ]; then  # a host whose nsys needs the repair (README: Nsight versions)
  # shellcheck source=/dev/null
  source scripts/gpu-host-nsys.sh .devdeps >/dev/null || exit 1
fi
work=/tmp/kit-bench
mkdir -p "$out" "$work"
table="$out/bench_analysis_gpu.md"
log="$out/bench_analysis_gpu.log"
: > "$log"
# The baseline must run, or there is nothing to compare with: nvtx_kern_sum since nsys 2023, nvtxkernsum in
# 2022.4; whichever this nsys lists, else stop (a failed baseline must never print a ratio).
reports=$("$KIT_NSYS" stats --help-reports 2>&1)  # its exit status is not 0 on nsys 2025.3: read the list
if grep -qw nvtx_kern_sum <<<"$reports"; then report=nvtx_kern_sum
elif grep -qw nvtxkernsum <<<"$reports"; then report=nvtxkernsum
else echo "this nsys lists neither nvtx_kern_sum nor nvtxkernsum: no baseline to time" >&2; exit 1; fi
sha=$(python3 -c "from kit.provenance import git_sha; print(git_sha() or '')")
[ -n "$sha" ] || { echo "no kit git sha: set KIT_GIT_SHA (a copied tree has no .git of its own)" >&2; exit 1; }
{ echo "| mode | new tokens | kernels | rounds | .sqlite MB | nsys stats $report s | kit analyze s (process) | kit in-process s | ratio | verdict |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"; } > "$table"
best() { python3 -c "import sys; print(min(map(float, sys.argv[1:])))" "$@"; }
now() { date +%s.%N; }
python3 -c "import kit.cli, kit.analysis.analyze; kit.cli.build_parser()"  # compile the bytecode once, untimed
for tokens in 850 1275 1700; do
  for mode in eager graph; do
    if (( SECONDS - start > deadline )); then echo "deadline reached: skipping $mode $tokens" | tee -a "$log"; continue; fi
    id="bench-$mode-$tokens"
    flag=$([ "$mode" = graph ] && echo --cuda-graph || echo --no-cuda-graph)
    rm -rf "$work/b/$id"
    t0=$SECONDS
    timeout 300 python3 -m kit.cli run --arm bug --context-len 4096 --device cuda --preset tiny "$flag" \
      --num-requests 1 --max-new-tokens "$tokens" --out "$work" --batch b --run-id "$id" >/dev/null 2>>"$log" \
      || { echo "$id: kit run failed" | tee -a "$log"; continue; }
    echo "$id: profiled in $((SECONDS - t0)) s" >> "$log"
    db=$work/b/$id/profile.sqlite
    nsys_t=() kit_t=()
    for i in 1 2; do
      t0=$(now)
      "$KIT_NSYS" stats -q -r "$report" -f csv --force-overwrite true -o "$work/stats-$id" "$db" >/dev/null 2>>"$log" \
        || { echo "$id: nsys stats -r $report failed: the baseline errored, no ratio (see $log)" >&2; exit 1; }
      t1=$(now)
      rm -rf "$work/an-$id-$i"
      python3 -m kit.cli analyze "$db" --arm bug --num-steps 5 --out "$work/an-$id-$i" > "$work/v-$id.json" 2>>"$log" \
        || { echo "$id: kit analyze failed" | tee -a "$log"; continue 2; }
      t2=$(now)
      nsys_t+=("$(python3 -c "import sys; print(float(sys.argv[2]) - float(sys.argv[1]))" "$t0" "$t1")")
      kit_t+=("$(python3 -c "import sys; print(float(sys.argv[2]) - float(sys.argv[1]))" "$t1" "$t2")")
    done
    python3 - "$mode" "$tokens" "$db" "$(best "${nsys_t[@]}")" "$(best "${kit_t[@]}")" "$work/v-$id.json" >> "$table" <<'PY'
import json, os, sqlite3, sys
mode, tok, db, s, a, v = sys.argv[1:]
s, a, v = float(s), float(a), json.load(open(v))
k = sqlite3.connect(db).execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
print(f"| {mode} | {tok} | {k:,} | {v['num_rounds']} | {os.path.getsize(db) / 1e6:.1f} | {s:.2f} | {a:.2f} | "
      f"{v['analysis_s']:.3f} | {s / a:.1f}x | {v['method']} {v['status']} {sorted(set(v['launches_per_round']))} |")
PY
    tail -1 "$table"
    rm -f "$work/b/$id/profile.nsys-rep"
  done
done
{ echo; echo "Made by scripts/bench_analysis_gpu.sh in $((SECONDS - start)) s: mini engine, arm bug, tiny preset, context 4096,"
  echo "1 request; wall seconds, best of 2 each; kit in-process = verdict.json analysis_s (the last run)."
  echo "nsys: $("$KIT_NSYS" --version)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])"
  echo "cores: $(nproc)"; echo "kit git sha: $sha"; date -u; } >> "$table"
cat "$table"
