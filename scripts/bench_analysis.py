"""How fast is the kit's analysis next to nsys's own tools, on CPU-only NVTX reports of growing size?

Builds reports with the installed nsys (tests/nsys_workload.py, bug pattern, num_steps 4: per round
1 draft_round + 3 draft_step + 3 indexer = 7 ranges) of about N ranges for three sizes, then times:
  nsys export --type sqlite            (.nsys-rep -> .sqlite)
  nsys stats -r nvtxsum / nvtxpptrace  (on the exported .sqlite)
  kit analysis                         (kit.analysis.analyze.analyze: .sqlite -> rounds.csv + verdict.json,
                                        in-process, and as a fresh `python -c` including imports)
and writes the table with provenance to data/bench_analysis_cpu.md.

    .venv/bin/python scripts/bench_analysis.py [--sizes 10000 100000 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _checkout  # noqa: F401  (this checkout's kit first on sys.path)

from kit.paths import REPO

WORKLOAD = REPO / "tests" / "nsys_workload.py"
OUT_MD = REPO / "data" / "bench_analysis_cpu.md"
RANGES_PER_ROUND = 7  # num_steps 4, bug: round + 3 steps + 3 indexer ranges
PROFILE_FLAGS = ("--trace=nvtx", "--sample=none", "--cpuctxsw=none")

ANALYZE_SNIPPET = """
import json, sys, time
t0 = time.perf_counter()
from kit.analysis.analyze import analyze
t1, c1 = time.perf_counter(), time.process_time()
v = analyze(sys.argv[1], sys.argv[2], arm="bug", num_steps=4, context_len=8192)
t2, c2 = time.perf_counter(), time.process_time()
print(json.dumps({"import_s": t1 - t0, "analyze_s": t2 - t1, "cpu_s": c2 - c1, "status": v["status"],
                  "rounds": v["num_rounds"], "observed": v["observed_counts"]}))
"""


def timed(cmd: list[str], **kw) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return dt, proc


def build_report(nsys: str, work: Path, n_ranges: int) -> tuple[Path, float, int]:
    rounds = max(1, n_ranges // RANGES_PER_ROUND)
    base = work / f"bench_{n_ranges}"
    cmd = [nsys, "profile", *PROFILE_FLAGS, "-o", str(base), sys.executable, str(WORKLOAD)]
    cmd += ["--pattern", "bug", "--num-steps", "4", "--rounds", str(rounds), "--work-us", "0"]
    dt, _ = timed(cmd, timeout=3600)
    return base.parent / f"{base.name}.nsys-rep", dt, rounds


def count_ranges(db: Path) -> int:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    n = con.execute("SELECT COUNT(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60)").fetchone()[0]
    con.close()
    return int(n)


def kit_analysis(db: Path, work: Path, repeat: int) -> dict:
    """Run the stage in fresh interpreters; each run writes into a new out dir (never overwrites)."""
    runs = []
    for i in range(repeat):
        out = work / f"{db.stem}-analysis-{i}-{time.time_ns()}"
        dt, proc = timed([sys.executable, "-c", ANALYZE_SNIPPET, str(db), str(out)], cwd=REPO, timeout=3600)
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        res["process_s"] = dt
        runs.append(res)
    return {
        "analyze_s": min(r["analyze_s"] for r in runs),
        "analyze_median_s": statistics.median(r["analyze_s"] for r in runs),
        "cpu_s": min(r["cpu_s"] for r in runs),
        "process_s": min(r["process_s"] for r in runs),
        "status": runs[0]["status"],
        "rounds": runs[0]["rounds"],
        "observed": runs[0]["observed"],
    }


def provenance(nsys: str) -> dict:
    def out(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=60).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return "?"

    cpu = "?"
    if Path("/proc/cpuinfo").exists():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    dirty = out(["git", "status", "--porcelain", "--", "kit"]) != ""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores ({cpu}), no GPU",
        "os": out(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]) + f", kernel {platform.release()}",
        "nsys": out([nsys, "--version"]),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "git": out(["git", "rev-parse", "--short", "HEAD"])
        + (" (kit/ has uncommitted changes)" if dirty else ""),
        "load_avg_at_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pptrace-min", type=int, default=0, help="run nvtxpptrace only for sizes >= this")
    ap.add_argument("--out", type=Path, default=OUT_MD)
    args = ap.parse_args()
    nsys = shutil.which("nsys")
    if not nsys:
        print("nsys not on PATH (run `make nsys`)", file=sys.stderr)
        return 3
    prov = provenance(nsys)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_analysis_") as tmp:
        work = Path(tmp)
        for n in args.sizes:
            rep, profile_s, rounds = build_report(nsys, work, n)
            db = work / f"{rep.stem}.sqlite"
            export_s, _ = timed([nsys, "export", "--type", "sqlite", "-o", str(db), str(rep)], timeout=3600)
            ranges = count_ranges(db)
            nvtxsum_s, _ = timed([nsys, "stats", "-q", "-r", "nvtxsum", str(db)], timeout=3600)
            pptrace_s = None
            if n >= args.pptrace_min:
                pptrace_s, _ = timed([nsys, "stats", "-q", "-r", "nvtxpptrace", str(db)], timeout=3600)
            kit = kit_analysis(db, work, args.repeat)
            row = {
                "ranges": ranges,
                "rounds": rounds,
                "sqlite_mb": db.stat().st_size / 1e6,
                "profile_s": profile_s,
                "export_s": export_s,
                "nvtxsum_s": nvtxsum_s,
                "pptrace_s": pptrace_s,
                **{f"kit_{k}": v for k, v in kit.items()},
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    prov["load_avg_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    text = render(rows, prov, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


def render(rows: list[dict], prov: dict, args: argparse.Namespace) -> str:
    def s(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    def ratio(a: float | None, b: float | None) -> str:
        return "-" if a is None or b is None or b == 0 else f"{a / b:.1f}x"

    lines = [
        "# Analysis speed on CPU-only NVTX reports (nsys 2022.4)",
        "",
        "Made by `scripts/bench_analysis.py`. Reports: `tests/nsys_workload.py --pattern bug "
        f"--num-steps 4` under `nsys profile {' '.join(PROFILE_FLAGS)}` (7 ranges per draft round).",
        "Times are wall seconds; kit = `kit.analysis.analyze.analyze(report.sqlite, out)` -> rounds.csv +",
        f"verdict.json (best of {args.repeat} fresh processes; `in-process` excludes interpreter start",
        "and imports, `process` includes them).",
        "The machine is shared (2 cores, other jobs running): read ratios, not absolute values.",
        "",
        "| NVTX ranges | rounds | .sqlite MB | nsys profile | nsys export | stats nvtxsum "
        "| stats nvtxpptrace | kit in-process (CPU) | kit process | export / kit | nvtxsum / kit "
        "| pptrace / kit | verdict |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        kit = r["kit_analyze_s"]
        lines.append(
            f"| {r['ranges']:,} | {r['rounds']:,} | {r['sqlite_mb']:.1f} | {s(r['profile_s'])} "
            f"| {s(r['export_s'])} "
            f"| {s(r['nvtxsum_s'])} | {s(r['pptrace_s'])} | {kit:.3f} ({r['kit_cpu_s']:.3f}) "
            f"| {s(r['kit_process_s'])} "
            f"| {ratio(r['export_s'], kit)} | {ratio(r['nvtxsum_s'], kit)} | {ratio(r['pptrace_s'], kit)} "
            f"| {r['kit_status']} {r['kit_observed']} |"
        )
    lines += ["", "Provenance:", ""]
    lines += [f"- {k}: {v}" for k, v in prov.items()]
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
