"""The report's strongest rung, real sglang on the task checkpoint, and the reader of its result set
(data/results/h200-sglang-task): per cell and arm, answer accuracy, accept length, launches per round and
draft-step time; the comparisons' gates and acceptance intervals; the wrong-top-k control. Read-only over
committed run directories: scripts/h200_task_figures.py prints it and the rung shows it.
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path
from typing import Any

import pandas as pd

from kit.compare.equivalence import pooled_accept
from kit.compare.runs import request_table
from kit.paths import RESULTS
from kit.report.about import context_label, describe_runs
from kit.report.rung import CONFIRMED, NOT_CONFIRMED, Batch, Rung, Table, per_request_table, rung
from kit.rundir import read_outputs

TASK_RESULTS = RESULTS / "h200-sglang-task"
ARMS = ("bug", "fix", "off")
CONTEXTS = (4096, 65536, 500000)
WORKLOADS = ("same-target", "moving-target")  # what the committed result set ran (not any-slot)
BATCH = "h200_task"  # kit host task's batch (data/matrices/h200_task.yaml); its control step's: BATCH-control


def converted(results: Path) -> bool:
    """Whether a result set was run by `kit host task` (kit batch's run ids) rather than the earlier bash
    driver (runs/task/<arm>-ctx<N>-<workload>)."""
    return (Path(results) / "runs" / BATCH).is_dir()


def _params(run: Path) -> dict[str, Any]:
    path = run / "params.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def cell_dir(results: Path, arm: str, ctx: int, workload: str) -> Path:
    """One cell's run folder in either layout; `arm` "control" is the wrong-top-k control's fix cell. In
    kit batch's layout the cell is the run whose own params.json names it (kit batch's run ids are the
    pipeline's to make); where none does, a path that does not exist."""
    if not converted(results):
        return Path(results) / "runs" / "task" / f"{arm}-ctx{ctx}-{workload}"
    batch, arm = (f"{BATCH}-control", "fix") if arm == "control" else (BATCH, arm)
    want = {"arm": arm, "context_len": ctx, "workload": workload}
    for run in sorted((Path(results) / "runs" / batch).glob("sglang-*")):
        p = _params(run)
        if {k: p.get(k) for k in want} == want:
            return run
    return Path(results) / "runs" / batch / f"(no {arm} cell at {ctx} {workload})"


def has_runs(results: Path) -> bool:
    return converted(results) or (Path(results) / "runs" / "task").is_dir()


def arm_summary(cell: Path) -> dict[str, Any]:
    """One cell of one arm: accuracy, pooled accept length and its per-request range, launches, step time."""
    rows = read_outputs(cell / "outputs.jsonl")
    verdict = json.loads((cell / "verdict.json").read_text()) if (cell / "verdict.json").is_file() else None
    steps = []
    if (cell / "rounds.csv").is_file():
        with open(cell / "rounds.csv") as f:
            steps = [float(r["step_gpu_ns"]) for r in csv.DictReader(f) if r.get("step_gpu_ns")]
    accepts = [r["accept_length"] for r in rows]
    return {
        "n": len(rows),
        "accuracy": sum(r.get("correct") is True for r in rows) / len(rows),
        "accept": pooled_accept(rows),
        "accept_min": min(accepts),
        "accept_max": max(accepts),
        "launches": sorted(set(verdict["launches_per_round"])) if verdict else None,
        "rounds": verdict["num_rounds"] if verdict else None,
        "step_ms": statistics.median(steps) / 1e6 if steps else None,
        "outputs": {r["prompt_id"]: r["output_ids"] for r in rows},
    }


def cells(results: Path = TASK_RESULTS) -> list[dict[str, Any]]:
    """One row per context x workload x arm, with `tokens_equal_bug` (None for the bug arm itself)."""
    out = []
    for ctx in CONTEXTS:
        for wl in WORKLOADS:
            arms = {a: arm_summary(cell_dir(results, a, ctx, wl)) for a in ARMS}
            for a, s in arms.items():
                same = None if a == "bug" else s["outputs"] == arms["bug"]["outputs"]
                out.append({"context_len": ctx, "workload": wl, "arm": a, **s, "tokens_equal_bug": same})
    return out


def servers(results: Path = TASK_RESULTS) -> list[dict[str, Any]]:
    """Each server of a converted set, from its provenance.json: its start-up, its wait for the GPU and
    its cells' status, with each finished cell's answers, accept range and launches. A set cut by a
    deadline or a lost machine says here what ran and what did not (`cells` needs every arm)."""
    out = []
    for prov_path in sorted((Path(results) / "runs").glob(f"{BATCH}*/sglang-*-server/provenance.json")):
        prov = json.loads(prov_path.read_text())
        rows = []
        for c in prov.get("cells", []):
            cell = prov_path.parent.parent / Path(c["run_dir"]).name
            done = (cell / "outputs.jsonl").is_file() and (cell / "verdict.json").is_file()
            status = c["status"]
            if status == "done" and not done:  # measured, but the call ended before its analysis
                status = "measured, not analysed (no verdict.json)"
            rows.append({"run": cell.name, "status": status, "cell_s": c.get("cell_s")})
            if done:
                rows[-1].update({k: v for k, v in arm_summary(cell).items() if k != "outputs"})
        run = prov.get("run", {})
        out.append(
            {
                "server": prov_path.parent.name,
                "arm": prov.get("arm"),
                "gpu": f"{prov.get('gpu', {}).get('name')} {prov.get('gpu', {}).get('uuid')}",
                "startup_s": run.get("startup_s"),
                "gpu_wait_s": run.get("gpu_wait_s", 0.0),
                "cells": rows,
            }
        )
    return out


def comparison_file(ctx: int, workload: str, results: Path = TASK_RESULTS) -> Path:
    """The committed `kit compare bug fix --control off --gate` of one cell (kit batch's, once converted)."""
    if converted(results):  # the compare whose bug run is that cell (its `run`: relative to the compare)
        bug = cell_dir(results, "bug", ctx, workload).resolve()
        for cmp in sorted((Path(results) / "runs" / BATCH).glob("compare-*/comparison.json")):
            if (cmp.parent / json.loads(cmp.read_text())["a"]["run"]).resolve() == bug:
                return cmp
        return Path(results) / "runs" / BATCH / f"(no compare at {ctx} {workload})" / "comparison.json"
    return Path(results) / "comparisons" / f"ctx{ctx}-{workload}" / "comparison.json"


def gate_row(path: Path, ctx: int, wl: str) -> dict[str, Any]:
    """One `kit compare bug fix --control off --gate`: failures, the acceptance change (fix - bug), the
    draft-step ratio (bug over fix)."""
    cmp = json.loads(path.read_text())
    acc = cmp["acceptance"]["by_workload"][wl]
    return {
        "context_len": ctx,
        "workload": wl,
        "gate_failures": cmp["gate_failures"],
        "mean": acc["mean_b_minus_a"],
        "interval": acc.get("interval95_b_minus_a"),
        "noise_floor": acc["noise_floor"],
        "status": acc["status"],
        "logprob_max_abs_diff": cmp["outputs"]["logprob_max_abs_diff"],
        "draft_step_ratio": cmp.get("draft_step_ratio_a_over_b"),
    }


def gates(results: Path = TASK_RESULTS) -> list[dict[str, Any]]:
    """`kit compare bug fix --control off --gate` per cell of a whole set."""
    return [gate_row(comparison_file(ctx, wl, results), ctx, wl) for ctx in CONTEXTS for wl in WORKLOADS]


def compared_here(results: Path) -> list[dict[str, Any]]:
    """A partial set's comparisons made off the host (`compared-here/ctxN-WORKLOAD/`, the same `kit compare`
    on the committed runs) where the host's call ended before its batch compared them."""
    out = []
    for ctx in CONTEXTS:
        for wl in WORKLOADS:
            path = Path(results) / "compared-here" / f"ctx{ctx}-{wl}" / "comparison.json"
            if path.is_file():
                out.append(gate_row(path, ctx, wl))
    return out


def controls(results: Path = TASK_RESULTS) -> list[dict[str, Any]]:
    """The wrong-top-k control cells (the target's selection replaced by the last index_topk tokens)."""
    return [
        {"workload": wl, **arm_summary(cell_dir(results, "control", 65536, wl))}
        for wl in WORKLOADS
        if cell_dir(results, "control", 65536, wl).is_dir()
    ]


def checkpoint(results: Path = TASK_RESULTS) -> dict[str, Any]:
    return json.loads((Path(results) / "install" / "checkpoint.json").read_text())


@rung(5)
def real_sglang_task_h200(batch: Batch) -> Rung | None:
    """sglang 0.5.14, the patched build and the off control on the retrieval-task checkpoint (answers that
    depend on the indexer's selection, a draft that misses): the strongest evidence of equivalence."""
    if not (TASK_RESULTS / "runs" / "task").is_dir():
        return None
    task_cells, task_gates, task_controls = cells(), gates(), controls()
    task = TASK_RESULTS / "runs" / "task"
    about = describe_runs(sorted(p for a in ARMS for p in task.glob(f"{a}-ctx*")))
    ck = checkpoint()
    about["model"] = (
        f"{about['model']}: the task checkpoint (`kit make-checkpoint --task`, {ck['task']['n_keys']} keys, "
        "DeepSeek-V3.2 layout): it answers a lookup through its sparse attention, and its draft misses on "
        "purpose"
    )
    about["files"] = "data/results/h200-sglang-task/ (README.md, runs/task/, comparisons/)"
    right = sum(c["accuracy"] == 1.0 for c in task_cells)
    same = all(c["tokens_equal_bug"] for c in task_cells if c["arm"] != "bug")
    passed = all(not g["gate_failures"] for g in task_gates)
    launches_ok = all(c["launches"] == ([1] if c["arm"] == "fix" else [4]) for c in task_cells)
    moving = [g["mean"] for g in task_gates if g["workload"] == "moving-target"]
    claim = (
        f"all answers right in {right}/{len(task_cells)} cells (3 arms x 4k, 64k, 500k x 2 workloads, 8 "
        "requests, 2 in flight), tokens identical to 0.5.14 for the fix and the off control, the gate passes "
        f"every cell; sharing the top-k costs the draft nothing on same-target and {-max(moving):.2f} to "
        f"{-min(moving):.2f} accepted tokens per verify round on moving-target; a wrong target top-k answers "
        f"{max((c['accuracy'] for c in task_controls), default=0):.0%}"
    )
    by = {(c["context_len"], c["workload"], c["arm"]): c for c in task_cells}
    rows = []
    for g in task_gates:
        key = (g["context_len"], g["workload"])
        bug, fix, off = (by[(*key, a)] for a in ARMS)
        ci = g["interval"]
        rows.append(
            {
                "context": context_label(g["context_len"]),
                "workload": g["workload"],
                "accuracy bug / fix / off": " / ".join(f"{c['accuracy']:.2f}" for c in (bug, fix, off)),
                "tokens = 0.5.14 (fix, off)": f"{fix['tokens_equal_bug']}, {off['tokens_equal_bug']}",
                "accept bug / fix / off": f"{bug['accept']:.2f} / {fix['accept']:.2f} / {off['accept']:.2f}",
                "fix - bug per request, 95% t": f"{g['mean']:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}]"
                if ci
                else "-",
                "noise floor (off)": g["noise_floor"],
                "launches/round bug, fix, off": f"{bug['launches']}, {fix['launches']}, {off['launches']}",
                "draft step GPU ms bug / fix": f"{bug['step_ms']:.3f} / {fix['step_ms']:.3f}",
                "gate": "PASS" if not g["gate_failures"] else "FAIL",
            }
        )
    return Rung(
        key="real-sglang-task-h200",
        title="Real sglang on a task whose answers depend on the indexer: 0.5.14, patched, off on one H200",
        scope="real sglang 0.5.14 vs patched on the task checkpoint, one NVIDIA H200 (committed results)",
        status=CONFIRMED if right == len(task_cells) and same and passed and launches_ok else NOT_CONFIRMED,
        claim=claim,
        about=about,
        note=(
            "Same-target: consecutive draft steps need facts the indexer selects together, so sharing step "
            "0's top-k should cost nothing, and the gate checks it against the off control (the patched "
            "build recomputing every step, as 0.5.14 does). Moving-target: every hop needs another group of "
            "facts, so a shared top-k misses the next one; that cost is reported with its interval, not "
            "gated. The control run replaces the target indexer's selection by the last 2,048 tokens. "
            "Printed by scripts/h200_task_figures.py from the same files."
        ),
        tables=[
            Table("Per context and workload (8 requests each)", pd.DataFrame(rows)),
            per_request_table(
                "Why each gate passed, request by request: bug (0.5.14), fix (patched), off (the control)",
                [
                    ({"context": context_label(ctx), "workload": wl}, request_table(comparison_file(ctx, wl)))
                    for ctx in CONTEXTS
                    for wl in WORKLOADS
                ],
            ),
        ],
    )
