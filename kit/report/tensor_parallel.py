"""The tensor-parallel result set (data/results/h200-tp4): the cells of the tp4 step of scripts/h200_task.sh,
bug and fix at 64k and 500k on both task workloads, with how each ended, its answers, and per rank (one
process each) the launches per draft round and the median draft-step GPU time; the tokens against the bug
arm's and against the same cell run at TP 1 alone (../h200-sglang-task). Until a 4-GPU node runs the step
its TP 1 dry run is what is here. Read-only over committed run directories: scripts/h200_tp_figures.py
prints it and the rung below shows it.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import pandas as pd

from kit.paths import RESULTS
from kit.report.about import context_label, describe_runs
from kit.report.rung import CONFIRMED, NOT_CONFIRMED, Batch, Rung, Table, rung
from kit.report.sglang_task import TASK_RESULTS, arm_summary

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
    """arm_summary of a cell that answered (outputs.jsonl), else None."""
    return arm_summary(cell) if (cell / "outputs.jsonl").is_file() else None


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
        alone = _summary(TASK_RESULTS / "runs" / "task" / f"{arm}-{rest}")
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
        # JOBS > 1 caps each server's KV pool in tokens (kit.pipeline.host_task.shared_gpu_args): a shared GPU
        "shared_gpu": any("--max-total-tokens" in a for a in plan.get("server_cmd", [])),
        "calls": calls,
    }


@rung(15)
def tensor_parallel_h200(batch: Batch) -> Rung | None:
    """The TP 4 step (every rank counted, a rank that disagrees fails the cell), so far only as its TP 1 dry
    run on one H200: no 4-GPU machine has been lent."""
    rows = cells(DRY_RUN)
    if not rows:
        return None
    facts = run_facts(DRY_RUN)
    tp = sorted({r["tp_size"] for r in rows})
    about = describe_runs(DRY_RUN / "task" / r["name"] for r in rows)
    about["model"] += ": the task checkpoint, as in the task rung"
    about["files"] = "data/results/h200-tp4/ (README.md, tp1-dry-run/)"
    passed = sum(r["verdict"] == "pass" for r in rows)
    right = sum(bool(r["summary"]) and r["summary"]["accuracy"] == 1.0 for r in rows)
    same = all(r["tokens_equal_bug"] for r in rows if r["arm"] != "bug")  # the claim: equal across arms
    # beside the task rung's TP 1 cells: told, not gated (TP > 1 may round differently and still be right)
    alone = sum(bool(r["tokens_equal_tp1_alone"]) for r in rows)
    speed = ", ".join(
        f"{'/'.join(f'{v:.2f}x' for v in x['per_rank'])} at {context_label(x['context_len'])} {x['workload']}"
        for x in ratios(rows)
    )
    claim = (
        f"{passed}/{len(rows)} cells pass with every rank holding the arm's count, answers right in "
        f"{right}/{len(rows)}, tokens {'equal' if same else 'NOT equal'} across arms (and to the task rung's "
        f"TP 1 cells in {alone}/{len(rows)}), draft step faster with the fix by {speed}; "
        "TP 4 NOT RUN: no 4-GPU machine has been lent"
    )
    table = pd.DataFrame(
        [
            {
                "cell": r["name"],
                "ended": r["ended"],
                "answers right": (
                    f"{round(r['summary']['accuracy'] * r['summary']['n'])}/{r['summary']['n']}"
                    if r["summary"]
                    else "-"
                ),
                "verdict": r["verdict"] or "-",
                "ranks (pid: launches x rounds)": "; ".join(
                    f"{k['pid']}: {'/'.join(sorted(k['observed_counts']))} x {k['rounds']}"
                    for k in r["ranks"]
                ),
                "draft step GPU ms per rank": ", ".join(f"{k['step_ms']:.3f}" for k in r["ranks"]),
                "tokens = bug": "-" if r["tokens_equal_bug"] is None else r["tokens_equal_bug"],
                "tokens = task rung (TP 1 alone)": r["tokens_equal_tp1_alone"],
            }
            for r in rows
        ]
    )
    shared = "both servers shared the GPU" if facts["shared_gpu"] else "each server had the GPU to itself"
    return Rung(
        key="tensor-parallel-h200",
        title="Tensor parallel: the TP 4 step, run so far only at TP 1 on one H200",
        scope=f"real sglang 0.5.14 vs patched, the TP 4 step at TP {', '.join(map(str, tp))} on one NVIDIA "
        "H200 (committed results)",
        status=CONFIRMED if passed == len(rows) and right == len(rows) and same else NOT_CONFIRMED,
        claim=claim,
        about=about,
        note=(
            "sglang 0.5.14 replicates the DSA indexer on every TP rank, so each rank runs its own draft loop "
            "and its own indexer launches; one nsys report per server holds every rank's process and each "
            f"cell's verdict holds every rank to the arm's count. Only the TP 1 path has run ({shared}): "
            "the per-rank accounting with one rank, not yet with four. Printed by scripts/h200_tp_figures.py."
        ),
        tables=[Table("Per cell: every rank's launches per draft round and draft-step time", table)],
    )
