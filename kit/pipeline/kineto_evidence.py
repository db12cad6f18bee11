"""The committed PyTorch-profiler evidence (data/results/h200-kineto): per cell (profiler, arm, graph mode)
the method and indexer launches per draft round, and whether the Kineto verdicts equal the Nsight ones
round by round: the mini engine's cells (runs/) and real sglang's /start_profile pair (sglang/); and one long
/start_profile window (long/) whose whole trace data/bench_kineto.json timed. Read by the report's rung and by
scripts/h200_kineto_figures.py."""

from __future__ import annotations

import json
from pathlib import Path

from kit.paths import DATA, RESULTS

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
