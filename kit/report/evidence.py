"""Tables over committed result sets (data/results/<machine>/runs/<mode>/<run>): launches, latency, costs.

Run directories are the input, exactly as `kit run` + `kit analyze` wrote them; this module only reads.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pandas as pd

from kit.arms import FIX_ARMS
from kit.compare.equivalence import logprob_diffs
from kit.compare.runs import load_run, summarize
from kit.errors import InputError
from kit.rundir import RunDir, check_folder

LAYOUT = "RESULTS/runs/<mode>/<run>/ with each run analysed, e.g. data/results/h200"


def collect(results_dir: Path) -> pd.DataFrame:
    """One row per run: mode (its folder), shapes, arm, context, launches, indexer time, step latency."""
    rows = []
    for run_dir in sorted(Path(results_dir).glob("runs/*/*/verdict.json")):
        run = load_run(run_dir.parent)
        s, p, eng = summarize(run), run["params"], load_engine(run_dir.parent)
        impl = indexer_impl(eng, p)
        rows.append(
            {
                "mode": run_dir.parent.parent.name,
                "preset": p.get("preset"),
                "index_heads": (eng.get("preset") or {}).get("index_n_heads"),
                "indexer_impl": impl,
                "indexer_path": indexer_path(impl, eng, p),
                "num_steps": p.get("num_steps", eng.get("num_steps")),
                "requests": p.get("num_requests"),
                "cuda_graph": p.get("cuda_graph"),
                "arm": s["arm"],
                "context_len": s["context_len"],
                "status": s["status"],
                "launches_per_round": max(s["launches_per_round"]) if s["launches_per_round"] else None,
                "expected": s["expected_per_round"],
                "rounds": s["num_rounds"],
                "method": s["method"],
                "indexer_gpu_ms_per_round": s["indexer_gpu_ms_per_round"],
                "draft_step_ms": s["draft_step_ms"]["median"],
                "draft_step_p10": s["draft_step_ms"]["p10"],
                "draft_step_p90": s["draft_step_ms"]["p90"],
                "latency_basis": s["draft_step_basis"],
                # the engine's own clock (host wall time around each round, syncs and graph launch included):
                # the step_ms its log lines print; kept beside the Nsight GPU span, never instead of it
                "engine_step_ms": eng.get("draft_step_ms_median"),
                "accept_length": s["accept_length"],
                "output_ids": [o["output_ids"] for o in sorted(run["outputs"], key=lambda o: o["prompt_id"])],
                "outputs": run["outputs"],
                "run": run_dir.parent.name,
            }
        )
    return pd.DataFrame(rows)


def load_engine(run_dir: Path) -> dict:
    """The mini engine's engine.json; {} for other backends (they write none)."""
    path = RunDir(Path(run_dir)).engine
    return json.loads(path.read_text()) if path.is_file() else {}


def indexer_impl(eng: dict, params: dict) -> str:
    """Which indexer actually ran: engine.json's resolved value (params may say `auto`).

    Mini runs from before the sglang-kernel indexer record none; they could only run the torch one.
    Other backends run whatever their own model code does: "native".
    """
    if eng.get("indexer_impl"):
        return eng["indexer_impl"]
    if params.get("indexer_impl") in ("torch", "sglang"):
        return params["indexer_impl"]
    return "torch" if params.get("backend", eng.get("backend")) == "mini" else "native"


def indexer_path(impl: str, eng: dict, params: dict) -> str:
    """sglang kernels: `paged` (decode logits) or `ragged` (extend logits); the torch indexer has one
    dense fp32 path ("dense"); a native backend picks its own ("native"). Never empty: rows keyed on it
    must not fall out of a grouping."""
    if impl in ("torch", "native"):
        return {"torch": "dense", "native": "native"}[impl]
    return eng.get("indexer_path") or params.get("indexer_path") or "paged"


# A bug/fix pair must share every one of these: never mix indexer implementations, paths or step counts.
KEYS = ["mode", "preset", "indexer_impl", "indexer_path", "num_steps", "requests", "context_len"]


def _logprob_abs_diffs(rows_a: list[dict], rows_b: list[dict]) -> list[float]:
    """|logprob| differences of the two arms' common tokens, pooled over prompts (real servers only)."""
    b_by_id = {r["prompt_id"]: r for r in rows_b}
    return [d for r in rows_a if r["prompt_id"] in b_by_id for d in logprob_diffs(r, b_by_id[r["prompt_id"]])]


def ratios(df: pd.DataFrame) -> pd.DataFrame:
    """bug vs fix side by side per KEYS (mode, preset, indexer, num_steps, batch, context), with the
    simplest cost model.

    Per round, bug runs the indexer (num_steps-1) times and fix once, so per draft step
    bug - fix = call * (n-2)/(n-1) with n-1 draft forwards; hence the indexer call cost and the floor
    (a draft step with no indexer at all) = fix - call/(n-1).
    """
    out = []
    for key, grp in df.groupby(KEYS, dropna=False):
        arms = {r.arm: r for r in grp.itertuples()}
        if "bug" not in arms or not any(a in arms for a in FIX_ARMS):
            continue
        bug, fix = arms["bug"], next(arms[a] for a in FIX_ARMS if a in arms)
        forwards = bug.launches_per_round  # bug: one indexer launch per draft forward
        gpu_ms = bug.indexer_gpu_ms_per_round
        call_ms = gpu_ms / bug.launches_per_round if gpu_ms else None
        diffs = _logprob_abs_diffs(bug.outputs, fix.outputs)
        out.append(
            {
                **dict(zip(KEYS, key, strict=True)),
                "launches_bug": bug.launches_per_round,
                "launches_fix": fix.launches_per_round,
                "outputs_identical": bug.output_ids == fix.output_ids
                and all(r.output_ids == bug.output_ids for r in grp.itertuples()),
                "logprob_median_abs_diff": round(statistics.median(diffs), 4) if diffs else float("nan"),
                "logprob_max_abs_diff": round(max(diffs), 4) if diffs else float("nan"),
                "accept_bug": bug.accept_length,
                "accept_fix": fix.accept_length,
                "step_ms_bug": bug.draft_step_ms,
                "step_ms_fix": fix.draft_step_ms,
                "ratio_bug_over_fix": round(bug.draft_step_ms / fix.draft_step_ms, 3),
                "latency_basis": bug.latency_basis,
                "ratio_engine_wall": round(bug.engine_step_ms / fix.engine_step_ms, 3)
                if pd.notna(bug.engine_step_ms) and pd.notna(fix.engine_step_ms) and fix.engine_step_ms
                else None,
                "indexer_call_ms": round(call_ms, 4) if call_ms else None,
                "indexer_share_of_bug_step": round(call_ms / bug.draft_step_ms, 3) if call_ms else None,
                "floor_step_ms": round(fix.draft_step_ms - call_ms / forwards, 4) if call_ms else None,
            }
        )
    if not out:  # no bug/fix pair: an empty table with the keys, not a KeyError from sort_values
        return pd.DataFrame(columns=KEYS)
    return pd.DataFrame(out).sort_values(KEYS).reset_index(drop=True)


def check_result_set(results: Path) -> Path:
    """`results` is a result set (RESULTS/runs/<mode>/<run>/ analysed): refused in one line when it is
    missing, empty, or laid out as a batch or a runs root instead, saying what it is."""
    results = Path(results)
    if not results.is_dir():
        what = "is a file" if results.exists() else "does not exist"
        raise InputError(f"{results} {what}: kit evidence reads a result set folder ({LAYOUT})", path=results)
    if any(results.glob("runs/*/*/verdict.json")):
        return results
    if any(results.glob("*/verdict.json")):
        hint = "a batch folder (its runs analysed directly inside it); its summary is the batch's report.html"
    elif any(results.glob("*/*/verdict.json")):
        hint = "a runs root (<batch>/<run>/): " + (
            f"pass the folder above it, {results.resolve().parent}"
            if results.resolve().name == "runs"
            else "a result set keeps its batches under runs/"
        )
    else:
        hint = "no analysed run in it"
    raise InputError(f"{results} is not a result set: {hint}; kit evidence reads {LAYOUT}", path=results)


def write_tables(results: Path) -> str:
    """summary.csv + ratios.csv beside the runs of a result set; returns the ratios table as text."""
    results = check_result_set(results)
    df = collect(results)
    table = ratios(df)
    if table.empty:
        raise InputError(
            f"{results}: {len(df)} analysed runs but no bug and fix run that share {', '.join(KEYS)}: "
            "nothing to compare",
            path=results,
        )
    check_folder(results, "the tables summary.csv and ratios.csv", "RESULTS")
    df.drop(columns=["output_ids", "outputs"]).to_csv(results / "summary.csv", index=False)
    table.to_csv(results / "ratios.csv", index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        return table.to_string(index=False)
