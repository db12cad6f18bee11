"""The tensor-parallel result set (data/results/h200-tp4): the cells of the tp4 step of scripts/h200_task.sh,
bug and fix at 64k and 500k on both task workloads, with how each ended, its answers, and per rank (one
process each) the launches per draft round and the median draft-step GPU time; the tokens against the bug
arm's and against the same cell run at TP 1 alone (../h200-sglang-task). Until a 4-GPU node runs the step
its TP 1 dry run is what is here. Read-only over committed run directories: scripts/h200_tp_figures.py
prints it and the report shows it.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from kit.paths import RESULTS
from kit.pipeline import task_evidence as te

TP_RESULTS = RESULTS / "h200-tp4"
DRY_RUN = TP_RESULTS / "tp1-dry-run"


def ended(cell: Path) -> str:
    """done, cut short (error.json: a deadline's Ctrl-C during it) or not started (after it)."""
    err = cell / "error.json"
    if not err.is_file():
        return "done"
    return "not started" if "did not run" in json.loads(err.read_text())["message"] else "cut short"


def rank_step_ms(cell: Path) -> dict[int, float]:
    """pid -> median draft-step GPU time (ms) over that process's analysed rounds (rounds.csv)."""
    steps: dict[int, list[float]] = defaultdict(list)
    if (cell / "rounds.csv").is_file():
        with open(cell / "rounds.csv") as f:
            for r in csv.DictReader(f):
                if r.get("step_gpu_ns"):
                    steps[int(r["pid"])].append(float(r["step_gpu_ns"]))
    return {pid: statistics.median(v) / 1e6 for pid, v in steps.items()}


def _summary(cell: Path) -> dict[str, Any] | None:
    """te.arm_summary of a cell that answered (outputs.jsonl), else None."""
    return te.arm_summary(cell) if (cell / "outputs.jsonl").is_file() else None


def _agree(mine: dict | None, theirs: dict | None) -> bool | None:
    """Every prompt `mine` answered has `theirs`'s tokens for it (a cut-short cell answered fewer); None when
    either side has no answers. Both: arm_summary's `outputs` (prompt id -> output token ids)."""
    if not mine or theirs is None:
        return None
    return all(theirs.get(k) == v for k, v in mine.items())


def cells(results: Path = DRY_RUN) -> list[dict[str, Any]]:
    """One row per cell (tp<N>-<arm>-ctx<C>-<workload>), sorted by name; each cell's outputs read once."""
    task = Path(results) / "task"
    found = sorted(p for p in task.glob("tp*-ctx*") if p.is_dir())
    summaries = {cell.name: _summary(cell) for cell in found}
    rows = []
    for cell in found:
        tp, arm, rest = cell.name.split("-", 2)
        ctx, workload = rest.removeprefix("ctx").split("-", 1)
        s = summaries[cell.name]
        v = json.loads((cell / "verdict.json").read_text()) if (cell / "verdict.json").is_file() else None
        steps = rank_step_ms(cell)
        ranks = [{**r, "step_ms": steps.get(r["pid"])} for r in (v or {}).get("ranks") or []]
        alone = _summary(te.TASK_RESULTS / "runs" / "task" / f"{arm}-{rest}")
        bug = summaries.get(cell.name.replace("-fix-", "-bug-", 1))
        mine = s["outputs"] if s else None
        rows.append(
            {
                "name": cell.name,
                "tp_size": int(tp.removeprefix("tp")),
                "arm": arm,
                "context_len": int(ctx),
                "workload": workload,
                "ended": ended(cell),
                "summary": s,
                "verdict": v["status"] if v else None,
                "ranks": ranks,
                "tokens_equal_bug": None if arm == "bug" else _agree(mine, bug and bug["outputs"]),
                "tokens_equal_tp1_alone": _agree(mine, alone and alone["outputs"]),
                "tp1_alone_step_ms": alone and alone["step_ms"],
            }
        )
    return rows


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per context and workload: bug / fix draft-step GPU time per rank (ranks paired in report order), and
    the same ratio of the TP 1 cells run alone."""
    by = {(r["context_len"], r["workload"], r["arm"]): r for r in rows}
    out = []
    for (ctx, wl, arm), bug in sorted(by.items()):
        fix = by.get((ctx, wl, "fix"))
        if arm != "bug" or fix is None:
            continue
        per_rank = [
            b["step_ms"] / f["step_ms"]
            for b, f in zip(bug["ranks"], fix["ranks"], strict=False)
            if b["step_ms"] and f["step_ms"]
        ]
        alone = bug["tp1_alone_step_ms"], fix["tp1_alone_step_ms"]
        out.append(
            {
                "context_len": ctx,
                "workload": wl,
                "per_rank": per_rank,
                "tp1_alone": alone[0] / alone[1] if all(alone) else None,
            }
        )
    return out


def run_facts(results: Path = DRY_RUN) -> dict[str, Any]:
    """What ran: the bug server's provenance and the cells' parameters, and the device calls' log."""
    task = Path(results) / "task"
    server = next(iter(sorted(task.glob("tp*-bug-server"))), None)
    cell = next(iter(sorted(task.glob("tp*-ctx*"))), None)
    calls = json.loads((Path(results) / "device_calls.json").read_text())
    plan = json.loads((cell / "plan.json").read_text()) if cell else {}
    return {
        "provenance": json.loads((server / "provenance.json").read_text()) if server else None,
        "params": json.loads((cell / "params.json").read_text()) if cell else None,
        # JOBS > 1 caps each server's KV pool in tokens (shared_gpu_flags): servers shared the GPU
        "shared_gpu": any("--max-total-tokens" in a for a in plan.get("server_cmd", [])),
        "calls": calls,
    }
