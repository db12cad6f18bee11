"""A/B of two analysed runs: launches/round, indexer GPU time, draft-step latency, accept length, outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from kit.arms import FIX_ARMS
from kit.compare import equivalence
from kit.errors import InputError
from kit.rundir import RunDir, read_json


def load_run(run_dir: Path) -> dict[str, Any]:
    """An analysed run's parameters, verdict, per-round table and outputs."""
    run = RunDir(Path(run_dir))
    if not run.path.is_dir():
        raise InputError(f"run directory {run.path} not found", path=run.path)
    if not run.verdict.is_file():
        raise InputError(f"{run.path} has no verdict.json: run `kit analyze {run.path}` first", path=run.path)
    return {
        "run_dir": run.path,
        "params": run.read_params(),
        "verdict": read_json(run.verdict),
        "rounds": pd.read_csv(run.rounds),
        "outputs": equivalence.read_outputs(run.outputs),
    }


def _quantiles_ms(series: pd.Series) -> dict[str, float | None]:
    s = pd.to_numeric(series, errors="coerce").dropna() / 1e6
    if s.empty:
        return {"median": None, "p10": None, "p90": None}
    return {k: round(float(s.quantile(q)), 4) for k, q in (("median", 0.5), ("p10", 0.1), ("p90", 0.9))}


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    v, rounds, outputs = run["verdict"], run["rounds"], run["outputs"]
    accept = [o["accept_length"] for o in outputs if o.get("accept_length") is not None]
    gpu = rounds["indexer_gpu_ns"] if "indexer_gpu_ns" in rounds else pd.Series(dtype=float)
    has_gpu = "step_gpu_ns" in rounds and rounds["step_gpu_ns"].notna().any()
    basis = "step_gpu_ns" if has_gpu else "step_ns"
    return {
        "run_dir": str(run["run_dir"]),
        "arm": v["arm"],
        "context_len": run["params"].get("context_len"),
        "status": v["status"],
        "expected_per_round": v["expected_per_round"],
        "launches_per_round": sorted(set(v["launches_per_round"])),
        "num_rounds": v.get("num_rounds", len(v["launches_per_round"])),
        "source": v["source"],
        "method": v["method"],
        "indexer_gpu_ms_per_round": _quantiles_ms(gpu)["median"],
        "draft_step_ms": _quantiles_ms(rounds[basis]),
        # GPU span of the round's kernels when the report has them (CUDA graphs make NVTX wall time
        # measure only the launch); NVTX wall time on CPU-only reports.
        "draft_step_basis": "gpu" if basis == "step_gpu_ns" else "wall",
        "accept_length": round(sum(accept) / len(accept), 4) if accept else None,
    }


def compare_runs(run_a: Path, run_b: Path) -> dict[str, Any]:
    a, b = load_run(run_a), load_run(run_b)
    sa, sb = summarize(a), summarize(b)
    step_a, step_b = sa["draft_step_ms"]["median"], sb["draft_step_ms"]["median"]
    return {
        "a": sa,
        "b": sb,
        "draft_step_ratio_a_over_b": round(step_a / step_b, 4) if step_a and step_b else None,
        "accept_length_diff_b_minus_a": round(sb["accept_length"] - sa["accept_length"], 4)
        if sa["accept_length"] is not None and sb["accept_length"] is not None
        else None,
        "outputs": equivalence.compare_runs(a["outputs"], b["outputs"]),
    }


def gate_failures(result: dict[str, Any]) -> list[str]:
    """What a CI job on a GPU node must refuse: a fix arm that does not share, or outputs that differ."""
    failures = []
    fixes = [s for s in (result["a"], result["b"]) if s["arm"] in FIX_ARMS]
    if not fixes:
        failures.append("neither run is a fix arm (fix/upstream): nothing to gate on")
    for s in fixes:
        if s["status"] == "inconclusive" or s["launches_per_round"] != [s["expected_per_round"]]:
            failures.append(
                f"{s['arm']} run {s['run_dir']}: indexer launches per round "
                f"{s['launches_per_round']} (status {s['status']}), "
                f"expected exactly {s['expected_per_round']}"
            )
    if not result["outputs"]["all_identical"]:
        o = result["outputs"]
        failures.append(
            f"greedy outputs differ: {o['n_identical']}/{o['n_requests']} requests identical, "
            f"first divergence at token {o['first_divergence']}"
            + (
                f" (top-2 logprob margins there: {', '.join(f'{m:.3f}' for m in o['divergence_margins'])})"
                if o["divergence_margins"]
                else ""
            )
        )
    return failures
