"""The committed PyTorch-profiler evidence (data/results/h200-kineto): per cell (profiler, arm, graph mode)
the method and indexer launches per draft round, and whether the Kineto verdicts equal the Nsight ones
round by round: the mini engine's cells (runs/) and real sglang's /start_profile pair (sglang/). Read by the
report's rung and by scripts/h200_kineto_figures.py."""

from __future__ import annotations

import json
from pathlib import Path

from kit.paths import RESULTS

FOLDER = RESULTS / "h200-kineto"
SGLANG = FOLDER / "sglang"  # real sglang: its own /start_profile trace beside an nsys run of the same cell


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
