"""Print the figures data/results/h200-pr29654/README.md quotes, from the committed batch folder.

    python scripts/h200_pr29654_figures.py [RESULTS_DIR]      # default data/results/h200-pr29654

Where and with what it ran (each run's provenance.json), then per mode and context each arm's indexer
launches per draft round (expected in brackets), median draft-step GPU time, accept length and whether its
tokens equal 0.5.14's, with the batch's gate (bug vs fix, off as the control); the instrument's overhead
per profiled cell; each batch call's own closing line. (kit.pipeline.grid_evidence reads it.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kit.pipeline import grid_evidence as ge  # noqa: E402


def _provenance(batch: Path) -> str:
    provs = [json.loads(p.read_text()) for p in sorted(batch.glob("sglang-*-cuda/provenance.json"))]
    gpus = sorted({f"{q['gpu']['name']} {q['gpu']['uuid'][:12]}, driver {q['gpu']['driver']}" for q in provs})
    soft = sorted({f"torch {q['torch']['version']}, nsys {q.get('nsys_version')}" for q in provs})
    kits = sorted({q["git_sha"][:7] for q in provs})
    days = sorted({q["start"][:10] for q in provs})
    where = "; ".join(gpus + soft)
    return f"{where}; kit {', '.join(kits)}; {', '.join(days)}; {len(provs)} runs"


def main(argv: list[str]) -> int:
    results = Path(argv[0]) if argv else ge.GRID_RESULTS
    batch = ge.batch_dir(results)
    if not batch.is_dir():
        print(f"no runs/{ge.BATCH} under {results}", file=sys.stderr)
        return 2
    print(_provenance(batch))
    print(
        "mode   context  arm       launches/round  step GPU ms  indexer GPU us/round  accept  tokens = 0.5.14"
        "   gate   bug/fix"
    )
    for row in ge.cells(results):
        gate = "-" if row["gate_failures"] is None else ("PASS" if not row["gate_failures"] else "FAIL")
        ratio = f"{row['bug_over_fix']:.2f}x" if row["bug_over_fix"] else "-"
        for i, (arm, s) in enumerate(row["arms"].items()):
            same = "-" if s["tokens_equal_bug"] is None else str(s["tokens_equal_bug"])
            print(
                f"{row['mode']:<6} {row['context_len']:>7}  {arm:<9} "
                f"{str(s['launches']):>6} ({s['expected']}) x{s['rounds']:<3}  {s['step_ms']:>9.4f}  "
                f"{'-' if s['indexer_us'] is None else format(s['indexer_us'], '.1f'):>20}  "
                f"{s['accept']:>6.2f}  {same:<16} "
                + (f"{gate:<6} {ratio}" if i == 0 else "")
            )
    print("overhead: ms per decode round, prompt 0 from the client, with nsys + probes / without (ratio)")
    for o in ge.overheads(results):
        (wp, wu), (dp, du) = o["window_ms"], o["decode_ms"]
        print(
            f"  {o['arm']:<5} {o['context_len']:>7}  window {wp:7.3f} / {wu:7.3f} ({o['window_ratio']:.2f}x, "
            f"{o['rounds'][0]} rounds)  decode {dp:7.3f} / {du:7.3f} ({o['decode_ratio']:.2f}x, "
            f"{o['rounds'][1]} rounds)"
        )
    print("server starts in order: start-up / wall / the cells' own seconds; gap since the last on that GPU")
    for v in ge.servers(results):
        gap = "- (new machine)" if v["gap_s"] is None else f"{v['gap_s']:.0f} s"
        print(
            f"  {v['server']:<50} {v['startup_s']:>6.1f} / {v['wall_s']:>6.1f} / {v['cells_s']:>5.1f} s"
            f"  gap {gap}"
        )
    for line in ge.batch_seconds(results):
        print(line)
    logs = Path(results) / "logs"
    for v in sorted(logs.glob("classifier-*/verdict.json")):  # re-analysed here from a returned report
        d = json.loads(v.read_text())
        print(
            f"{v.parent.name} (re-run here, the returned report): {d['status']} "
            f"{sorted(set(d['launches_per_round']))} x {d['num_rounds']} rounds"
        )
    for p in sorted(logs.glob("placement-*.txt")):  # where in the round the indexer ran
        lines = [ln for ln in p.read_text().splitlines() if not ln.startswith("#")]
        print(f"{p.name}:", *lines[1:], sep="\n")
    print("device time per lease (logs/device_calls.json): held seconds by kind of call (calls)")
    for lease, kinds in ge.device_time(results).items():
        print(f"  lease {lease}: " + ", ".join(f"{k} {s:.0f} s ({n})" for k, (s, n) in kinds.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
