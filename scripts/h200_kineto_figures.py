"""Print the figures of data/results/h200-kineto from its committed files: real sglang's /start_profile
trace beside nsys on the same cell, then the mini engine's cells: per cell (profiler, arm, graph mode) the
method and the indexer launches per draft round; whether the PyTorch-profiler verdicts equal the Nsight
ones; the trimmed traces in tests/fixtures/kineto analysed again here; and the long window whose whole trace
data/bench_kineto.json timed.

    python scripts/h200_kineto_figures.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import _checkout  # noqa: F401  (this checkout's kit first on sys.path)

from kit.analysis.analyze import analyze
from kit.paths import REPO
from kit.report import sglang_task as te
from kit.report.kineto import FOLDER as HERE
from kit.report.kineto import LONG, SGLANG, agreement, cells, long_window

FIXTURES = REPO / "tests" / "fixtures" / "kineto"


def fixtures(pattern: str = "h200_mini_*.trace.json.gz", method: str = "auto") -> list[tuple[str, dict]]:
    """Each trimmed H200 trace analysed now (kit analyze TRACE --arm ARM --num-steps 5 --method METHOD)."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for f in sorted(FIXTURES.glob(pattern)):
            arm = f.name.split("_")[2]
            out.append((f.name, analyze(f, Path(tmp) / f.name, arm=arm, num_steps=5, method=method)))
    return out


def _table(rows: list[dict]) -> None:
    print(f"{'cell':<17} {'indexer':<21} {'method':<8} {'status':<7} launches/round  classifier")
    for r in rows:
        c = r["classifier"]
        cls = "-" if c is None else f"{c['status']} {sorted(set(c['launches_per_round']))}"
        print(
            f"{r['name']:<17} {r['indexer']:<21} {r['method']:<8} {r['status']:<7} "
            f"{str(sorted(set(r['launches']))):<6} x {len(r['launches']):<5} {cls}"
        )
    for (arm, mode), same in sorted(agreement(rows).items()):
        print(f"torch profiler vs nsys, {arm} {mode}: {'equal' if same else 'DIFFERENT'} round by round")


def real_sglang() -> None:
    """The real sglang pair: the cell's settings, the two verdicts, the trimmed trace analysed now."""
    rows = cells(SGLANG)
    if not rows:
        return
    params = json.loads((SGLANG / rows[0]["name"] / "params.json").read_text())
    runs = sorted(
        {
            f"{r['provenance']['gpu']['uuid'][:12]} kit {r['provenance']['git_sha'][:7]} "
            f"{r['provenance']['start'][:10]}"
            for r in rows
        }
    )
    prov = rows[0]["provenance"]
    print(
        f"real sglang on an H200 ({'; '.join(runs)}), torch {prov['torch']['version']}: the task checkpoint, "
        f"{params['context_len']} tokens {params['workload']}, {params['num_requests']} requests, "
        "CUDA graphs and eager; the torch cells under sglang's /start_profile (CPU + GPU), the nsys cells "
        "under Nsight"
    )
    _table(rows)
    for method, pattern in (("auto", "h200_sglang_*"), ("classifier", "h200_sglang_*_graph")):
        for name, v in fixtures(f"{pattern}.trace.json.gz", method):
            print(
                f"  {name} analysed now ({method}): {v['method']} {v['status']} "
                f"{sorted(set(v['launches_per_round']))} x {v['num_rounds']}"
            )


def long() -> None:
    """The long window: its verdicts, answers, whole trace and the benchmark's row for that trace."""
    c = long_window()
    if c is None:
        return
    p = json.loads((LONG / c["name"] / "params.json").read_text())
    prov, t, b = c["provenance"], c["trace"], c["bench"]
    s = te.arm_summary(LONG / c["name"])  # answers and accept lengths, as the task figures read them
    print(
        f"long window, for the benchmark ({prov['gpu']['uuid'][:12]} kit {prov['git_sha'][:7]} "
        f"{prov['start'][:10]}): {c['indexer']} {c['arm']}, {c['mode']}, {p['context_len']} tokens "
        f"{p['workload']}, {p['num_requests']} requests x {p['max_new_tokens']} new tokens, a "
        f"{p['profile_steps']}-forward /start_profile window"
    )
    cls = c["classifier"]
    print(
        f"  {c['method']} {c['status']} {sorted(set(c['launches']))} x {len(c['launches'])}; classifier "
        f"{cls['status']} {sorted(set(cls['launches_per_round']))} x {len(cls['launches_per_round'])}; "
        f"answers right {round(s['accuracy'] * s['n'])} of {s['n']}, accept length "
        f"{s['accept_min']:.2f}-{s['accept_max']:.2f}"
    )
    print(
        f"  whole trace {t['bytes_uncompressed'] / 1e6:.0f} MB ({t['bytes_gzip'] / 1e6:.1f} MB gzip), sha256 "
        f"{t['sha256'][:16]}..., not committed"
    )
    if b is None:
        print("  data/bench_kineto.json: this trace not timed")
    else:
        bp = c["bench_provenance"]
        hta = f"failed after {b['hta_s']:.2f} s" if b["hta_error"] else f"{b['hta_s']:.2f} s"
        ratio = "" if b["hta_error"] else f" ({b['hta_s'] / b['kit_s']:.1f}x the kit's)"
        print(
            f"  data/bench_kineto.json ({bp['machine']}, CPUs {bp['cpus']}, kit {bp['git']}, "
            f"{bp['date'][:10]}): to a verdict in {b['kit_s']:.2f} s ({b['status']} {b['method']} "
            f"{b['observed']}), HTA's load {hta}{ratio}"
        )
    calls = json.loads((LONG / "device_calls.json").read_text())["calls"]
    machines = sorted({x["machine"] for x in calls})
    by = {}
    for x in calls:
        kind = x["step"].split(" ", 1)[0].rstrip(":,")
        n, w = by.get(kind, (0, 0.0))
        by[kind] = (n + 1, w + x["wall_s"])
    kinds = "; ".join(f"{k} {n} call(s) {w:.0f} s" for k, (n, w) in by.items() if w)
    print(
        f"  H200 time: {calls[-1]['held_s']:,.0f} s held on {len(machines)} machines "
        f"({', '.join(machines)}); the commands' own seconds: {kinds}"
    )


def graph_ids() -> list[tuple[str, int, int]]:
    """What torch's Kineto writes on replayed kernels: (trace, kernels sharing a cudaGraphLaunch's correlation
    id, those that also carry `graph node id`)."""
    from kit.trace.registry import open_trace

    out = []
    for f in sorted(FIXTURES.glob("h200_mini_*_graph.trace.json.gz")):
        with open_trace(f) as t:
            glk = t.graph_launch_kernels()
            k = t.parsed.kernels
            out.append((f.name, 0 if glk is None else len(glk.cid), int((k.node >= 0).sum())))
    return out


def main() -> int:
    real_sglang()
    long()
    rows = cells()
    prov = json.loads((HERE / "runs" / rows[0]["name"] / "provenance.json").read_text())
    print(
        f"H200 ({prov['gpu']['uuid'][:12]}), torch {prov['torch']['version']}, the mini engine with sglang's "
        f"indexer kernels, dsv32 preset, 8k context, 32 new tokens, num_steps 5, {prov['start'][:10]}"
    )
    _table(rows)
    first = cells(HERE / "first-try")
    for r in first:
        print(
            f"first try {r['name']} (indexer {r['indexer']}): recorded then as {r['status']}, "
            f"{sorted(set(r['launches']))} per round"
        )
    print("trimmed traces (tests/fixtures/kineto), analysed now:")
    for name, v in fixtures():
        why = f": {v['meaning'].split(':', 1)[1].strip()[:48]}..." if v["status"] == "inconclusive" else ""
        print(
            f"  {name:<48} {v['method']:<7} {v['status']:<12} {sorted(set(v['launches_per_round']))} "
            f"x {v['num_rounds']}{why}"
        )
    for name, replayed, with_ids in graph_ids():
        print(f"  {name}: {replayed} kernels replayed by cudaGraphLaunch, {with_ids} with a graph node id")
    calls = json.loads((HERE / "device_calls.json").read_text())["calls"]
    print(
        "H200 time of the calls (the device tool's figures): "
        + "; ".join(f"{c['wall_s']:.0f} s {c['step']}" for c in calls)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
