"""GPU-report analysis speed without a GPU: kit analyze vs `nsys stats` nvtx_kern_sum on scaled H200 reports.

The committed H200 mini-engine reports (tests/fixtures/h200_mini/tiny-bug-ctx8192-{eager,graph}, nsys
2025.3) hold 5 draft rounds each. `scale_report` turns one into a longer generation: it repeats the decode
cycles (first `draft_round` to the end of the last NVTX range: rounds, verify, draft_extend, with their
runtime calls, kernels, memcpys...) with shifted timestamps and correlation ids, as a larger
--max-new-tokens would (~830 kernels per round, like the H200 runs: 720 tokens gave 183,523 kernels).
Graph replays keep their graphNodeIds (a graph is captured once and replayed), so CUDA_GRAPH_NODE_EVENTS
stays as captured.

Then, per report: `nsys stats -r nvtxkernsum` (nvtx_kern_sum in nsys >= 2023) on the same file against
`kit analyze` as a fresh process (`python -m kit.cli analyze`: SQLite -> rounds.csv + verdict.json) and
in-process (kit.analysis.analyze.analyze), best of --repeat each, ratios side by side; with --before REV
also the kit of git revision REV. The table goes to --out with provenance. Kit processes run with
bytecode caching on (PYTHONDONTWRITEBYTECODE unset, one warm-up run), as any install after its first run.

    .venv/bin/python scripts/bench_analysis_gpu_local.py [--kernels 200000 400000 800000] [--before HEAD]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _checkout  # noqa: F401  (this checkout's kit first on sys.path)
import bench_analysis  # scripts/ is on sys.path: the CPU benchmark's provenance

from kit.paths import REPO
from kit.trace.sqlite import unpack

FIXTURES = REPO / "tests" / "fixtures" / "h200_mini"
OUT_MD = REPO / "data" / "bench_analysis_gpu_local.md"
NUM_STEPS = 5  # the fixtures' draft steps (arm bug: 4 indexer launches per round)
IN_PROCESS = f"""
import json, sys, time
from kit.analysis.analyze import analyze
t0 = time.perf_counter()
analyze(sys.argv[1], sys.argv[2], arm="bug", num_steps={NUM_STEPS})
print(json.dumps({{"analyze_s": time.perf_counter() - t0}}))
"""
# Tables whose rows are events in time: NVTX and runtime rows belong to a decode cycle by their start,
# GPU activities by the runtime call that launched them (correlationId).
CPU_TABLES = ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME")
GPU_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
)


def _columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in con.execute(f"PRAGMA table_info('{table}')")]


def scale_report(src: Path, dst: Path, copies: int) -> dict:
    """Copy `src` to `dst` with its decode cycles repeated `copies` more times; returns what it did.

    Window: [first draft_round start, last NVTX range end]. Rows before it stay, rows in it are repeated
    (each copy shifted by the window length in time and by max correlationId in ids), rows after it
    (the session's teardown) move past the last copy, and the session end (ANALYSIS_DETAILS) with them,
    so no range looks closed by the profiler at exit.
    """
    shutil.copyfile(src, dst)
    con = sqlite3.connect(dst)
    (t0,) = con.execute(
        "SELECT MIN(e.start) FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId "
        "WHERE s.value = 'draft_round'"
    ).fetchone()
    (t1,) = con.execute(
        "SELECT MAX(end) FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND start >= ?", (t0,)
    ).fetchone()
    shift = t1 - t0 + 1000  # the window plus 1 us
    (cmax,) = con.execute("SELECT MAX(correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()
    params = {"t0": t0, "t1": t1, "shift": shift, "cstep": int(cmax) + 1, "n": copies}
    # class of a runtime call: 0 before the window, 1 in it (repeated), 2 after it (moved)
    con.execute("CREATE TEMP TABLE cls (cid INTEGER PRIMARY KEY, c INTEGER) WITHOUT ROWID")
    con.execute(
        "INSERT OR IGNORE INTO temp.cls SELECT correlationId, "
        "CASE WHEN start < :t0 THEN 0 WHEN start <= :t1 THEN 1 ELSE 2 END FROM CUPTI_ACTIVITY_KIND_RUNTIME",
        params,
    )
    con.execute("CREATE TEMP TABLE k (i INTEGER PRIMARY KEY)")
    con.executemany("INSERT INTO temp.k VALUES (?)", [(i,) for i in range(1, copies + 1)])
    tables = {r[0]: r[1] for r in con.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'")}
    for table in (*CPU_TABLES, *GPU_TABLES):
        if table not in tables:
            continue
        cols = _columns(con, table)
        if table in CPU_TABLES:
            cls = "CASE WHEN start < :t0 THEN 0 WHEN start <= :t1 THEN 1 ELSE 2 END"
        else:
            cls = "COALESCE((SELECT c FROM temp.cls WHERE cls.cid = correlationId), 0)"

        def shifted(copy: str, cols: list[str] = cols) -> str:
            out = []
            for c in cols:
                if c in ("start", "end"):
                    out.append(f'"{c}" + {copy} * :shift')
                elif c == "correlationId":
                    out.append(f"CASE WHEN correlationId > 0 THEN correlationId + {copy} * :cstep END")
                else:
                    out.append(f'"{c}"')
            return ", ".join(out)

        names = ", ".join(f'"{c}"' for c in cols)
        con.execute(f"ALTER TABLE {table} RENAME TO kit_old")
        con.execute(tables[table])
        con.execute(f"CREATE TEMP TABLE src AS SELECT *, {cls} AS kit_c FROM kit_old", params)
        con.execute(
            f"INSERT INTO {table} ({names}) SELECT * FROM ("
            f"SELECT {names} FROM temp.src WHERE kit_c < 2 "
            f"UNION ALL SELECT {shifted('k.i')} FROM temp.src, temp.k WHERE kit_c = 1 "
            f"UNION ALL SELECT {shifted(':n')} FROM temp.src WHERE kit_c = 2"
            ") ORDER BY start",
            params,
        )
        con.execute("DROP TABLE kit_old")
        con.execute("DROP TABLE temp.src")
    con.execute(
        "UPDATE ANALYSIS_DETAILS SET duration = duration + :d, stopTime = stopTime + :d",
        {"d": copies * shift},
    )
    con.commit()
    con.execute("VACUUM")
    con.close()
    return {"window_ns": shift, "copies": copies}


def count_kernels(db: Path) -> int:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(con.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0])
    finally:
        con.close()


def build_report(mode: str, kernels: int, work: Path) -> Path:
    """A report of at least `kernels` kernels, scaled from the fixture of `mode` (eager | graph)."""
    src = unpack(FIXTURES / f"tiny-bug-ctx8192-{mode}" / "profile.sqlite.xz", work / f"{mode}-fixture.sqlite")
    probe = work / f"{mode}-probe.sqlite"
    scale_report(src, probe, 1)
    base, per_copy = count_kernels(src), count_kernels(probe) - count_kernels(src)
    probe.unlink()
    copies = max(0, -(-(kernels - base) // per_copy))
    db = work / f"{mode}-{kernels}.sqlite"
    scale_report(src, db, copies)
    return db


def run(cmd: list[str], cwd: Path = REPO, env: dict | None = None) -> tuple[float, float, str]:
    """(wall s, CPU s of the process and its children, stdout). CPU time is the steadier figure on a
    shared machine; for the kit it also counts the scan threads, so the CPU ratio is the conservative one."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, proc.stdout


def nsys_report_name(nsys: str) -> str:
    """nvtx_kern_sum (nsys >= 2023) or nvtxkernsum (2022.4)."""
    help_text = subprocess.run([nsys, "stats", "--help-reports"], capture_output=True, text=True).stdout
    return "nvtx_kern_sum" if "nvtx_kern_sum" in help_text else "nvtxkernsum"


def kit_env(tree: Path) -> dict[str, str]:
    """Bytecode caching on (this VM sets PYTHONDONTWRITEBYTECODE); the kit imported from `tree`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if tree != REPO:
        env["PYTHONPATH"] = str(tree)
    return env


def measure(db: Path, work: Path, nsys: list[str], trees: dict[str, Path], repeat: int) -> dict:
    """Best of `repeat` (wall s, CPU s) for nsys stats and, per kit tree, `kit analyze` as a process and
    analyze() in-process; interleaved, so a busy spell of the machine hits every tool alike."""
    analyze = ["kit.cli", "analyze", str(db), "--arm", "bug", "--num-steps", str(NUM_STEPS), "--out"]
    tools: dict[str, tuple[list[str], Path]] = {"nsys": (nsys, REPO)}
    for name, tree in trees.items():
        tools[f"{name}_process"] = ([sys.executable, "-m", *analyze], tree)
        tools[f"{name}_in"] = ([sys.executable, "-c", IN_PROCESS, str(db)], tree)
    best: dict = {}
    for i in range(repeat + 1):  # round 0 warms caches (bytecode, page cache): not counted
        for name, (cmd, cwd) in tools.items():
            if name == "nsys":
                wall, cpu, _ = run(cmd)
            else:
                wall, cpu, stdout = run([*cmd, str(work / f"{db.stem}-{name}-{i}")], cwd, kit_env(cwd))
                if name.endswith("_in"):
                    wall = json.loads(stdout)["analyze_s"]
                elif name == "kit_process":
                    best["verdict"] = json.loads(stdout)
            if i:
                old = best.get(name, (float("inf"), float("inf")))
                best[name] = (min(old[0], wall), min(old[1], cpu))
    return best


def provenance(nsys: str, before: str | None) -> dict:
    """The CPU benchmark's provenance, plus the revision the "before" columns ran."""
    prov = bench_analysis.provenance(nsys)
    if before:
        cmd = ["git", "rev-parse", "--short", before]
        rev = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
        prov["before"] = f"kit/ of git {rev.stdout.strip() or '?'} ({before})"
    return prov


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", type=int, nargs="+", default=[200_000, 400_000, 800_000])
    ap.add_argument("--modes", nargs="+", default=["eager", "graph"], choices=["eager", "graph"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--before", help="also time the kit of this git revision (e.g. HEAD) as a process")
    ap.add_argument("--out", type=Path, default=OUT_MD)
    args = ap.parse_args()
    nsys = shutil.which("nsys")
    if not nsys:
        print("nsys not on PATH (run `make nsys`)", file=sys.stderr)
        return 3
    report = nsys_report_name(nsys)
    prov = provenance(nsys, args.before)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_gpu_local_") as tmp:
        work = Path(tmp)
        before_tree = None
        if args.before:
            before_tree = work / "before"
            before_tree.mkdir()
            archive = subprocess.run(["git", "archive", args.before, "kit"], cwd=REPO, capture_output=True)
            subprocess.run(["tar", "-x", "-C", str(before_tree)], input=archive.stdout, check=True)
        trees = {"kit": REPO, **({"before": before_tree} if before_tree else {})}
        for mode in args.modes:
            for n in args.kernels:
                db = build_report(mode, n, work)
                stats = [nsys, "stats", "-q", "-r", report, "-f", "csv", "--force-overwrite", "true"]
                best = measure(db, work, [*stats, "-o", str(work / "stats"), str(db)], trees, args.repeat)
                verdict = best.pop("verdict")
                row = {
                    "mode": mode,
                    "kernels": count_kernels(db),
                    "rounds": verdict["num_rounds"],
                    "sqlite_mb": db.stat().st_size / 1e6,
                    **best,
                    "verdict": f"{verdict['method']} {verdict['status']} "
                    f"{sorted(set(verdict['launches_per_round']))}",
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
                db.unlink()
        prov["imports"] = import_times(args.repeat)
    prov["load_avg_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    text = render(rows, prov, report, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


def import_times(repeat: int) -> str:
    """Wall s of a bare interpreter, of importing kit.analysis.analyze, and of kit.cli with its parser: what a
    process pays before analysing (the CLI parser imports the engine/sglang/batch modules)."""
    env = kit_env(REPO)
    snippets = {
        "python": "pass",
        "import kit.analysis.analyze": "import kit.analysis.analyze",
        "kit.cli + parser + kit.analysis.analyze": (
            "import kit.cli, kit.analysis.analyze; kit.cli.build_parser()"
        ),
    }
    best = {
        k: min(run([sys.executable, "-c", c], REPO, env)[0] for _ in range(repeat + 1))
        for k, c in snippets.items()
    }
    return ", ".join(f"{k} {v:.3f} s" for k, v in best.items())


def render(rows: list[dict], prov: dict, report: str, args: argparse.Namespace) -> str:
    def ratio(a: float | None, b: float | None) -> str:
        return "-" if a is None or not b else f"{a / b:.1f}x"

    before = args.before is not None
    head = f"| mode | kernels | rounds | .sqlite MB | nsys stats {report} s (CPU s) | kit analyze process s "
    head += "(CPU s) | kit in-process s | nsys / kit process: wall (CPU) | nsys / kit in-process "
    head += "| before: process s | before: in-process s | before: nsys / kit process |" if before else "|"
    lines = [
        "# Analysis speed on GPU reports without a GPU (scaled H200 reports, local nsys)",
        "",
        "Made by `scripts/bench_analysis_gpu_local.py`. Reports: the committed H200 mini-engine",
        "fixtures (`tests/fixtures/h200_mini/tiny-bug-ctx8192-{eager,graph}`, nsys 2025.3 exports, arm",
        "bug) with their decode cycles repeated (shifted timestamps and correlation ids) up to the kernel",
        f"count shown. `nsys stats -q -r {report} -f csv` and `kit analyze` (`python -m kit.cli analyze",
        f"REPORT --arm bug --num-steps {NUM_STEPS}`: SQLite -> rounds.csv + verdict.json, a fresh process)",
        f"on the same file, interleaved; best of {args.repeat} after one untimed warm-up round.",
        "`in-process` = `kit.analysis.analyze.analyze()` alone (no interpreter start, no imports).",
        "CPU = user + system s of the process and its children (the kit's scan threads included):",
        "steadier than wall on a shared machine.",
        "",
        head,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|---:|" if before else ""),
    ]
    for r in rows:
        (nw, nc), (kw, kc), ki = r["nsys"], r["kit_process"], r["kit_in"][0]
        line = (
            f"| {r['mode']} | {r['kernels']:,} | {r['rounds']:,} | {r['sqlite_mb']:.1f} "
            f"| {nw:.2f} ({nc:.2f}) | {kw:.2f} ({kc:.2f}) | {ki:.3f} "
            f"| {ratio(nw, kw)} ({ratio(nc, kc)}) | {ratio(nw, ki)} |"
        )
        if before:
            bw, bi = r["before_process"][0], r["before_in"][0]
            line += f" {bw:.2f} | {bi:.3f} | {ratio(nw, bw)} |"
        lines.append(line)
    lines += ["", f"Verdicts: {sorted({(r['mode'], r['verdict']) for r in rows})}", "", "Provenance:", ""]
    lines += [f"- {k}: {v}" for k, v in prov.items()]
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
