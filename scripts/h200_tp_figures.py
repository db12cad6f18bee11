"""Print the figures data/results/h200-tp4/README.md quotes, from the committed runs (through
kit.report.tensor_parallel): the TP 1 dry run of the TP 4 step (`TP=1 bash scripts/h200_task.sh OUT tp4`), per
cell how it ended, its answers and accept lengths, per rank the launches per draft round and the median
draft-step GPU time, and whether its tokens equal the bug arm's and the same cell's in ../h200-sglang-task
(TP 1 run alone); then the bug / fix ratio per rank beside that run's and the PR's.

    python scripts/h200_tp_figures.py
"""

from __future__ import annotations

import sys

import _checkout  # noqa: F401  (this checkout's kit first on sys.path)

from kit.report import tensor_parallel
from kit.report.published import published


def _yes(value: bool | None) -> str:
    return "-" if value is None else str(value)


def main() -> int:
    rows = tensor_parallel.cells()
    if not rows:
        print(f"no cells under {tensor_parallel.DRY_RUN / 'task'}", file=sys.stderr)
        return 2
    facts = tensor_parallel.run_facts()
    p, prov = facts["params"], facts["provenance"]
    together = "at once on the one GPU" if facts["shared_gpu"] else "in turn, each with the GPU to itself"
    print(
        f"TP {p['tp_size']} dry run of the TP 4 step on an H200 ({prov['gpu']['uuid'][:12]}, kit "
        f"{prov['git_sha'][:7]}, {prov['start'][:10]}): sglang 0.5.14 (bug) and 0.5.14+pr29654 (fix) "
        f"{together}, the task checkpoint, {p['num_requests']} requests {p['concurrency']} in flight, EAGLE "
        f"{p['num_steps']}/{p['eagle_topk']}/{p['num_draft_tokens']}, CUDA graphs"
    )
    print(
        f"{'cell':<33} {'ended':<12} {'answers':<9} {'accept':<10} {'verdict':<8} "
        f"{'per rank: launches x rounds, step GPU ms':<41} tokens = bug  = TP 1 alone"
    )
    for r in rows:
        s = r["summary"]
        answers = accept = "-"
        if s:
            answers = f"{round(s['accuracy'] * s['n'])}/{s['n']}" + (
                f" of {p['num_requests']}" if s["n"] < p["num_requests"] else ""
            )
            accept = f"{s['accept_min']:.2f}-{s['accept_max']:.2f}"
        ranks = (
            "; ".join(
                f"pid {k['pid']}: {'/'.join(sorted(k['observed_counts']))} x {k['rounds']}, "
                f"{k['step_ms']:.3f}"
                for k in r["ranks"]
            )
            or "-"
        )
        print(
            f"{r['name']:<33} {r['ended']:<12} {answers:<9} {accept:<10} {r['verdict'] or '-':<8} "
            f"{ranks:<41} {_yes(r['tokens_equal_bug']):<13} {_yes(r['tokens_equal_tp1_alone'])}"
        )
    print("bug / fix draft-step GPU time, per rank (and the same cells at TP 1 alone, ../h200-sglang-task):")
    for x in tensor_parallel.ratios(rows):
        per_rank = ", ".join(f"rank {i} {v:.2f}x" for i, v in enumerate(x["per_rank"])) or "-"
        alone = f"{x['tp1_alone']:.2f}x" if x["tp1_alone"] else "-"
        print(f"  ctx {x['context_len']:<7} {x['workload']:<14} {per_rank}  (TP 1 alone {alone})")
    pub = published()
    point = next(q for q in pub["per_draft_step_ms"] if q.get("speedup"))
    print(
        f"  the PR's ({pub['setup']['model']}, {pub['setup']['hardware']}, another machine and model): "
        f"{point['speedup']:.2f}x at {'~' if point.get('approx') else ''}{point['input_tokens'] // 1000}k"
    )
    calls = facts["calls"]["calls"]
    held = calls[-1]["held_s"] - facts["calls"]["held_before_s"]
    tp = [c["wall_s"] for c in calls if c["step"].startswith("tp:")]
    ran = [c for c in calls if c["held_s"] is not None and not c["step"].startswith("given back")]
    refused = ", a refused start before them" if len(ran) < len(calls) - 1 else ""
    print(
        f"H200 time: {held:,.0f} s held on {calls[-1]['machine']} ({len(ran)} calls, machine start "
        f"included{refused}), of which the tp calls {sum(tp):.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
