"""The committed PyTorch-profiler evidence (data/results/h200-kineto): per cell (profiler, arm, graph mode)
the method and indexer launches per draft round, and whether the Kineto verdicts equal the Nsight ones
round by round: the mini engine's cells (runs/) and real sglang's /start_profile pair (sglang/); and one long
/start_profile window (long/) whose whole trace data/bench_kineto.json timed. Read by the rung below and by
scripts/h200_kineto_figures.py."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from kit.paths import DATA, RESULTS
from kit.report.about import describe_runs
from kit.report.rung import CONFIRMED, NOT_CONFIRMED, Batch, Rung, Table, rung

FOLDER = RESULTS / "h200-kineto"
SGLANG = FOLDER / "sglang"  # real sglang: its own /start_profile trace beside an nsys run of the same cell
LONG = FOLDER / "long"  # one long window: its whole trace too big to commit, named by sha256 (trace.json)
BENCH = DATA / "bench_kineto.json"  # scripts/bench_kineto.py's rows


def _cell(run: Path) -> dict:
    params = json.loads((run / "params.json").read_text())
    verdict = json.loads((run / "verdict.json").read_text())
    prov = json.loads((run / "provenance.json").read_text())
    engine = run / "engine.json"  # the mini engine's; a real sglang cell names its build instead
    if engine.is_file():
        indexer = json.loads(engine.read_text())["indexer_impl"]
    else:
        indexer = "sglang " + str((prov.get("sglang") or {}).get("sglang_version"))
    classifier = run / "classifier" / "verdict.json"
    return {
        "name": run.name,
        "profiler": params["profiler"],
        "arm": params["arm"],
        "mode": "graph" if params["cuda_graph"] else "eager",
        "indexer": indexer,
        "method": verdict["method"],
        "status": verdict["status"],
        "launches": verdict["launches_per_round"],
        "classifier": json.loads(classifier.read_text()) if classifier.is_file() else None,
        "provenance": prov,
    }


def cells(folder: Path = FOLDER / "runs") -> list[dict]:
    """Every committed cell under `folder`, by name; [] when there are none."""
    if not folder.is_dir():
        return []
    return [_cell(r) for r in sorted(folder.iterdir()) if (r / "verdict.json").is_file()]


def agreement(rows: list[dict]) -> dict[tuple[str, str], bool]:
    """(arm, mode) -> the torch-profiler cell's launches per round equal the nsys cell's, round by round."""
    by = {(r["profiler"], r["arm"], r["mode"]): r["launches"] for r in rows}
    return {(a, m): by[("torch", a, m)] == by[("nsys", a, m)] for _, a, m in by if ("nsys", a, m) in by}


def long_window() -> dict | None:
    """The long window's cell with its whole trace's sizes and sha256 (`trace`) and the benchmark's row
    for the file of that sha256 (`bench`: None when the benchmark did not time it)."""
    rows = cells(LONG)
    if not rows:
        return None
    cell = rows[0]
    cell["trace"] = json.loads((LONG / cell["name"] / "trace.json").read_text())
    bench = json.loads(BENCH.read_text()) if BENCH.is_file() else {"rows": [], "sglang_traces": []}
    timed = {o["trace"] for o in bench["sglang_traces"] if o["sha256"] == cell["trace"]["sha256"]}
    cell["bench"] = next((r for r in bench["rows"] if r["trace"] in timed), None)
    cell["bench_provenance"] = bench.get("provenance")
    return cell


@rung(25)
def kineto_h200(batch: Batch) -> Rung | None:
    """The same verdict from PyTorch-profiler (Kineto) traces as from Nsight, on one H200, committed."""
    rows = cells()
    if not rows:
        return None
    same = agreement(rows)
    real = cells(SGLANG)  # real sglang's /start_profile trace beside nsys on one cell
    real_same = agreement(real)
    long = long_window()  # the benchmark's whole trace: a verdict of its own, timed on CPU
    about = describe_runs([FOLDER / "runs" / r["name"] for r in rows] + [SGLANG / r["name"] for r in real])
    about["model"] += "; the mini engine with sglang's indexer kernels, DeepSeek-V3.2 shapes, 8k context"
    about["files"] = (
        "data/results/h200-kineto/ (README.md, runs/, sglang/, long/); trimmed traces in "
        "tests/fixtures/kineto/; data/bench_kineto.md"
    )
    torch_run = next(r for r in rows if r["profiler"] == "torch")["provenance"]
    about["Nsight"] = (
        f"Nsight Systems for the nsys cells; the torch cells under torch.profiler (CPU + CUDA), torch "
        f"{torch_run['torch']['version']}"
    )
    pairs = ", ".join(f"{a} {m}" for (a, m), ok in sorted(same.items()) if ok)
    claim = (
        f"on the mini engine the torch-profiler verdicts equal the Nsight ones round by round in "
        f"{sum(same.values())} of {len(same)} pairs ({pairs}); under CUDA graphs the replayed kernels are "
        "counted by name inside each draft_round range, and the no-range classifier agrees"
    )
    if real:
        versions = sorted({r["provenance"]["sglang"]["sglang_version"] for r in real})
        torch_launches = {(r["arm"], r["mode"]): r["launches"] for r in real if r["profiler"] == "torch"}
        got = "; ".join(
            f"{a} {m} {'equal' if ok else 'DIFFERENT'} ({sorted(set(torch_launches[a, m]))} per round)"
            for (a, m), ok in sorted(real_same.items())
        )
        claim = (
            f"real sglang ({', '.join(versions)}) under its own /start_profile against nsys on the same "
            f"cell, round by round in {sum(real_same.values())} of {len(real_same)} pairs: {got}; {claim}"
        )
    table = pd.DataFrame(
        [
            {
                "cell": f"{where}{r['name']}",
                "engine": r["indexer"] if where else f"mini ({r['indexer']} indexer)",
                "profiler": r["profiler"],
                "arm": r["arm"],
                "graphs": r["mode"],
                "method": r["method"],
                "launches / round": ", ".join(map(str, sorted(set(r["launches"])))),
                "rounds": len(r["launches"]),
                "verdict": r["status"],
            }
            for where, group in (("sglang/", real), ("long/", [long] if long else []), ("", rows))
            for r in group
        ]
    )
    agree = {**same, **{("sglang " + a, m): ok for (a, m), ok in real_same.items()}}
    speed = ""
    if long and long["bench"]:
        b, mb = long["bench"], long["trace"]["bytes_uncompressed"] / 1e6
        hta = "failed" if b["hta_error"] else f"took {b['hta_s']:.1f} s"
        speed = (
            f" A whole trace sglang wrote ({mb:.0f} MB, a {len(long['launches'])}-round window, "
            f"{b['status']}) became a verdict in {b['kit_s']:.1f} s on 2 CPU cores; HolisticTraceAnalysis's "
            f"load of it {hta} (data/bench_kineto.md)."
        )
    return Rung(
        key="kineto-h200",
        title="Without Nsight: PyTorch-profiler (Kineto) traces on one H200",
        scope="real sglang and the mini engine on one NVIDIA H200 under torch.profiler and under nsys "
        "(committed results)",
        status=CONFIRMED if agree and all(agree.values()) else NOT_CONFIRMED,
        claim=claim,
        about=about,
        note=(
            "For users who cannot run nsys: the probe's ranges become record_function ranges, kernels join "
            "their launch by correlation id (eager), and a CUDA-graph replay is counted inside the "
            "draft_round range enclosing its cudaGraphLaunch, since torch 2.11's Kineto writes no graph "
            "node ids. A trace whose kernels match none of the indexer's names is inconclusive, not 0."
            + speed
        ),
        tables=[Table("Per cell: method and indexer launches per draft round", table)],
    )
