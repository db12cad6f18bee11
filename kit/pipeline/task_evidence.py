"""The task-checkpoint result set (data/results/h200-sglang-task): per cell and arm, answer accuracy,
accept length, launches per round and draft-step time; the comparisons' gates and acceptance intervals; the
wrong-top-k control. Read-only over committed run directories: scripts/h200_task_figures.py prints it and
the report shows it.
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path
from typing import Any

from kit.paths import RESULTS
from kit.rundir import read_outputs

TASK_RESULTS = RESULTS / "h200-sglang-task"
ARMS = ("bug", "fix", "off")
CONTEXTS = (4096, 65536, 500000)
WORKLOADS = ("same-target", "moving-target")


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
        "accept": sum(r["completion_tokens"] for r in rows) / sum(r["spec_verify_ct"] for r in rows),
        "accept_min": min(accepts),
        "accept_max": max(accepts),
        "launches": sorted(set(verdict["launches_per_round"])) if verdict else None,
        "rounds": verdict["num_rounds"] if verdict else None,
        "step_ms": statistics.median(steps) / 1e6 if steps else None,
        "outputs": {r["prompt_id"]: r["output_ids"] for r in rows},
    }


def cells(results: Path = TASK_RESULTS) -> list[dict[str, Any]]:
    """One row per context x workload x arm, with `tokens_equal_bug` (None for the bug arm itself)."""
    task = Path(results) / "runs" / "task"
    out = []
    for ctx in CONTEXTS:
        for wl in WORKLOADS:
            arms = {a: arm_summary(task / f"{a}-ctx{ctx}-{wl}") for a in ARMS}
            for a, s in arms.items():
                same = None if a == "bug" else s["outputs"] == arms["bug"]["outputs"]
                out.append({"context_len": ctx, "workload": wl, "arm": a, **s, "tokens_equal_bug": same})
    return out


def gates(results: Path = TASK_RESULTS) -> list[dict[str, Any]]:
    """`kit compare bug fix --control off --gate` per cell: failures and the acceptance change (fix - bug)."""
    out = []
    for ctx in CONTEXTS:
        for wl in WORKLOADS:
            cmp = json.loads(
                (Path(results) / "comparisons" / f"ctx{ctx}-{wl}" / "comparison.json").read_text()
            )
            acc = cmp["acceptance"]["by_workload"][wl]
            out.append(
                {
                    "context_len": ctx,
                    "workload": wl,
                    "gate_failures": cmp["gate_failures"],
                    "mean": acc["mean_b_minus_a"],
                    "interval": acc.get("interval95_b_minus_a"),
                    "noise_floor": acc["noise_floor"],
                    "status": acc["status"],
                    "logprob_max_abs_diff": cmp["outputs"]["logprob_max_abs_diff"],
                }
            )
    return out


def controls(results: Path = TASK_RESULTS) -> list[dict[str, Any]]:
    """The wrong-top-k control cells (the target's selection replaced by the last index_topk tokens)."""
    task = Path(results) / "runs" / "task"
    return [
        {"workload": wl, **arm_summary(task / f"control-ctx65536-{wl}")}
        for wl in WORKLOADS
        if (task / f"control-ctx65536-{wl}").is_dir()
    ]


def checkpoint(results: Path = TASK_RESULTS) -> dict[str, Any]:
    return json.loads((Path(results) / "install" / "checkpoint.json").read_text())
