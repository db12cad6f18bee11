"""Print the figures data/results/h200-pr29654/README.md quotes, from the committed batch folders.

    python scripts/h200_pr29654_figures.py [RESULTS_DIR]      # default data/results/h200-pr29654

The grid (one call, servers sharing the GPU): where and with what it ran, then per mode and context each
arm's indexer launches per draft round (expected in brackets), median draft-step and indexer GPU time,
accept length and whether its tokens equal 0.5.14's, with the batch's gate; the batch's own wall; each
server start; the timings beside the same cells run one server at a time (parts/); the NVTX-free
classifier's counts and where in the round the indexer ran. Then mode `latest` (sglang 0.5.17), the
instrument's overhead (parts/) and the device time per lease. (kit.report.pr_grid reads it.)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import _checkout  # noqa: F401  (this checkout's kit first on sys.path)

from kit.pipeline.host_reports import ARMS, cells_of
from kit.report import pr_grid as ge


def _provenance(batch: Path, cells: str = "sglang-*-cuda") -> str:
    provs = [json.loads(p.read_text()) for p in sorted(batch.glob(f"{cells}/provenance.json"))]
    gpus = sorted({f"{q['gpu']['name']} {q['gpu']['uuid'][:12]}, driver {q['gpu']['driver']}" for q in provs})
    soft = sorted({f"torch {q['torch']['version']}, nsys {q.get('nsys_version')}" for q in provs})
    kits = sorted({q["git_sha"][:7] for q in provs})
    days = sorted({q["start"][:10] for q in provs})
    where = "; ".join(gpus + soft)
    return f"{where}; kit {', '.join(kits)}; {', '.join(days)}; {len(provs)} runs"


def _table(results: Path, batch: str) -> None:
    print(
        "mode   context  arm       build         launches/round  step GPU ms  indexer GPU us/round  accept"
        "  tokens = 0.5.14   gate   bug/fix"
    )
    for row in ge.cells(results, batch):
        gate = "-" if row["gate_failures"] is None else ("PASS" if not row["gate_failures"] else "FAIL")
        ratio = f"{row['bug_over_fix']:.2f}x" if row["bug_over_fix"] else "-"
        for i, (arm, s) in enumerate(row["arms"].items()):
            same = "-" if s["tokens_equal_bug"] is None else str(s["tokens_equal_bug"])
            print(
                f"{row['mode']:<6} {row['context_len']:>7}  {arm:<9} {s['build']:<14}"
                f"{str(s['launches']):>6} ({s['expected']}) x{s['rounds']:<3}  {s['step_ms']:>9.4f}  "
                f"{'-' if s['indexer_us'] is None else format(s['indexer_us'], '.1f'):>20}  "
                f"{s['accept']:>6.2f}  {same:<16} " + (f"{gate:<6} {ratio}" if i == 0 else "")
            )


def _servers(results: Path, batch: str) -> None:
    print("server starts in order: start-up / wall / the cells' own seconds, waited for its turn;")
    print("gap since the last on that GPU (negative: side by side)")
    for v in ge.servers(results, batch):
        gap = "- (new machine)" if v["gap_s"] is None else f"{v['gap_s']:.0f} s"
        wait = "" if v["gpu_wait_s"] is None else f", waited {v['gpu_wait_s']:.0f} s"
        print(
            f"  {v['server']:<42} {v['startup_s']:>6.1f} / {v['wall_s']:>6.1f} / {v['cells_s']:>5.1f} s{wait}"
            f"  gap {gap}"
        )


def _checks(results: Path, batch: str) -> None:
    checks = ge.classifier_checks(results, batch)
    agree = sum(c["classifier"] == c["nvtx"] and c["status"] == "pass" for c in checks)
    n = len(checks)
    print(f"NVTX-free classifier on the same reports: agrees with NVTX in {agree} of {n} graph cells")
    for c in checks:
        if c["classifier"] != c["nvtx"] or c["status"] != "pass":
            print(f"  {c['cell']}: classifier {c['status']} {c['classifier']}, NVTX {c['nvtx']}")
    print("indexer calls per range (placement.txt beside each report: calls in N ranges)")
    for server, lines in ge.placements(results, batch).items():
        print(f"  {server:<38} " + "; ".join(" ".join(ln.split()) for ln in lines))


def _bare_host(folder: Path) -> None:
    """Issue 33's path on a bare host: the device seconds per step from the first transfer, the warm-up's
    batch line, and the JIT caches it compiled (logs/warm/jit-du.txt: bytes per cache, then the pieces)."""
    if not (folder / "logs" / "device_calls.json").is_file():
        return
    print()
    print("== bare-host/: the grid's path on a bare H200 from its first transfer (issue 33) ==")
    print(_provenance(folder / "runs" / "h200_pr29654-warm", "sglang-*"))
    [(lease, kinds)] = ge.device_time(folder).items()
    steps = [k for k in kinds if k != "failed"]
    done = [k for k in steps if k != "grid"]
    print(
        f"lease {lease}, device seconds from the first transfer: "
        + ", ".join(f"{k} {kinds[k][0]:.0f} s ({kinds[k][1]})" for k in steps)
    )
    print(f"first transfer to the end of warm: {sum(kinds[k][0] for k in done):.0f} s")
    calls = json.loads((folder / "logs" / "device_calls.json").read_text())["calls"]
    print(f"grid: {calls[-1]['step'].split('; ', 1)[1]}")
    text = (folder / "logs" / "warm" / "batch-warm.txt").read_text().splitlines()
    print("warm: " + next(ln for ln in text if ln.startswith("Batch ")).split(": ", 1)[1])
    print("warm: " + next(ln.strip() for ln in text if "retries" in ln))
    for log in sorted((folder / "runs" / "h200_pr29654-warm").glob("sglang-*/server.log")):
        took = re.search(r"Capture target verify CUDA graph end\. elapsed=([\d.]+) s", log.read_text())
        print(f"warm: {log.parent.name}: target-verify graph capture {took[1]} s (JIT compiles included)")
    du = (folder / "logs" / "warm" / "jit-du.txt").read_text().split("\n")
    caches = [ln.split("\t") for ln in du if "\t" in ln]
    pieces = [int(ln.split()[4]) for ln in du if "jit-cache.tgz" in ln]
    print(
        "JIT caches after warm: "
        + ", ".join(f"{Path(d).name} {int(b) / 1e6:.1f} MB" for b, d in caches)
        + f"; packed {sum(pieces) / 1e6:.1f} MB in {len(pieces)} pieces (scripts/jit_cache.sh)"
    )


def _bare_host_day(day: Path) -> None:
    """One dated attempt from a bare host (bare-host/YYYY-MM-DD): its JIT state, the device seconds of each
    call after the first transfer (logs/device_calls.json: held_s from the lease's start), the grid's batch
    lines (logs/grid/batch-grid.txt) and its cells and gates from the committed batch."""
    log = json.loads((day / "logs" / "device_calls.json").read_text())
    print()
    print(f"== bare-host/{day.name}: the grid from a bare H200, its first call (issue 33) ==")
    print(_provenance(day / "runs" / ge.BATCH))
    print(f"JIT state: {log['jit']}")
    start = log["path_from_call"]  # the first call of the path: on the machine that ran the grid
    before, calls = log["calls"][:start], log["calls"][start:]
    first = before[-1]["held_s"] if before else 0.0
    for c in before:
        print(f"before the path, held {c['held_s']:6.1f} s after: {c['step']}")
    receive = [c for c in calls if c["step"].startswith("receive")]
    walls = [c["wall_s"] for c in receive]
    print(
        f"  held {receive[-1]['held_s'] - first:6.1f} s: {len(receive)} receive calls of one part each, the"
        f" machine's start included (commands {min(walls):.1f}-{max(walls):.1f} s)"
    )
    last = receive[-1]["held_s"]
    for c in calls[calls.index(receive[-1]) + 1 :]:
        print(f"  held {c['held_s'] - last:6.1f} s, command {c['wall_s']:5.1f} s: {c['step']}")
        last = c["held_s"]
    grid = next(c for c in calls if c["step"].startswith("grid"))
    print(f"first transfer to the grid's report.html: {grid['held_s'] - first:.0f} device seconds (goal 600)")
    text = (day / "logs" / "grid" / "batch-grid.txt").read_text().splitlines()
    print("grid: " + next(ln for ln in text if ln.startswith("Batch ")).split(": ", 1)[1])
    print("grid: " + next(ln.strip() for ln in text if "retries" in ln))
    gates = [ln.split()[-2] for ln in text if ln.strip().startswith("compare ")]
    print(f"grid: {len(gates)} compares, gate " + ", ".join(sorted(set(gates))))
    starts = [v["startup_s"] for v in ge.servers(day, ge.BATCH) if v["server"].endswith("-server")]
    print(f"grid: the four graph servers' start-ups {min(starts):.0f}-{max(starts):.0f} s (side by side)")
    _table(day, ge.BATCH)


def _profiles(folder: Path) -> None:
    """The reports a reviewer opens (issue 33 item 6): each profiles run's cells (verdict, start-up, wait for
    the GPU, report size) and, where measured, what fills the reports (composition.json)."""
    for got in sorted(folder.rglob("profiles.json")):
        run = got.parent
        sizes = json.loads(got.read_text())
        print(f"{run.relative_to(folder.parent)}: {_provenance(run, 'sglang-*')}")
        print(
            f"  reports {sizes['total_bytes']:,} bytes together, limit {sizes['limit']:,}: "
            f"included {sizes['included']}"
        )
        for arm, cell in cells_of(run, ARMS, sizes["cell"]).items():
            verdict = json.loads((cell / "verdict.json").read_text())
            prov = json.loads((cell / "provenance.json").read_text()).get("run", {})
            print(
                f"  {arm:<8} {verdict['status']} {verdict['launches_per_round']} per round, report "
                f"{sizes[arm]['report_bytes']:,} bytes, up after {prov.get('startup_s')} s, waited "
                f"{prov.get('gpu_wait_s')} s for the GPU"
            )
        comp = run / "composition.json"
        for arm, c in json.loads(comp.read_text()).items() if comp.is_file() else ():
            share = c["outside_probe_ranges"] / c["runtime_calls"]
            print(
                f"  {arm:<8} {c['runtime_calls']:,} runtime calls over {c['span_s']} s, {share:.1%} outside "
                f"the probe's ranges, longest gap {c['longest_gap_s']} s"
            )


def main(argv: list[str]) -> int:
    results = Path(argv[0]) if argv else ge.GRID_RESULTS
    parts = results / "parts"
    for folder in (ge.batch_dir(results), ge.batch_dir(results, ge.LATEST), ge.batch_dir(parts)):
        if not folder.is_dir():
            print(f"no {folder.relative_to(results)} under {results}", file=sys.stderr)
            return 2
    print("== the grid: one kit batch call, four servers sharing the GPU (kit batch -j 4) ==")
    print(_provenance(ge.batch_dir(results)))
    _table(results, ge.BATCH)
    for line in ge.batch_seconds(results):
        print(line)
    _servers(results, ge.BATCH)
    print("step GPU ms with four servers on the GPU / one server at a time (parts/), per cell")
    for s in ge.sharing(results, parts):
        (a, b), (ia, ib) = s["step_ms"], s["indexer_us"]
        print(
            f"  {s['mode']:<6} {s['context_len']:>7}  {s['arm']:<9} {a:.4f} / {b:.4f} "
            f"({s['step_ratio']:.2f}x)"
            f"  indexer us {ia or 0:.1f} / {ib or 0:.1f}"
        )
    _checks(results, ge.BATCH)
    print()
    print("== mode latest: sglang 0.5.17 (upstream) beside 0.5.14 and the fix (kit batch -j 3) ==")
    print(_provenance(ge.batch_dir(results, ge.LATEST)))
    _table(results, ge.LATEST)
    _servers(results, ge.LATEST)
    _checks(results, ge.LATEST)
    print()
    print("== parts/: the grid one server at a time on two earlier leases, with unprofiled twins ==")
    print(_provenance(ge.batch_dir(parts)))
    for line in ge.batch_seconds(parts):
        print(line)
    print("overhead: ms per decode round, prompt 0 from the client, with nsys + probes / without (ratio)")
    for o in ge.overheads(parts):
        (wp, wu), (dp, du) = o["window_ms"], o["decode_ms"]
        print(
            f"  {o['arm']:<8} {o['context_len']:>7}  window {wp:7.3f} / {wu:7.3f} ({o['window_ratio']:.2f}x, "
            f"{o['rounds'][0]} rounds)  decode {dp:7.3f} / {du:7.3f} ({o['decode_ratio']:.2f}x, "
            f"{o['rounds'][1]} rounds)"
        )
    print()
    print("== profiles/: the 4k graph cells a reviewer opens, one server each ==")
    _profiles(results / "profiles")
    _bare_host(results / "bare-host")
    for day in sorted((results / "bare-host").glob("20??-??-??*")):
        _bare_host_day(day)
    print()
    print("device time per lease (logs/device_calls.json): held seconds by kind of call (calls)")
    for where in (parts, results):
        for lease, kinds in ge.device_time(where).items():
            total = sum(s for s, _ in kinds.values())
            print(
                f"  lease {lease} ({total:.0f} s): "
                + ", ".join(f"{k} {s:.0f} s ({n})" for k, (s, n) in kinds.items())
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
