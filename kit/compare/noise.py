"""The noise floor: how far two runs of the same computation differ, the yardstick for bug vs fix.

On real GPUs two runs of the SAME computation can differ (batch-dependent kernels, atomics, TP reductions),
so "identical" can be too strict and "close" means nothing without a reference. The control is that
reference: a second run of one of the two compared computations, either a repeat on the same build or the
`off` arm (the feature switched off, every draft step computes its own top-k: the bug's computation, run
by the patched build). Two judgements use it:

- tokens (`kit noise`): A vs B "identical", "within_noise" (no worse than the control's disagreement, with
  `tolerance`) or "beyond_noise"; a control that repeats exactly makes any A-B difference beyond noise;
- acceptance per request (`kit compare --control`): see `acceptance`.

The per-request comparison itself (tokens, match rate, logprobs) is kit.compare.equivalence's.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kit.compare import equivalence as eq
from kit.compare import params as params_mod
from kit.errors import InputError, UsageError
from kit.rundir import RunDir, read_outputs

TOLERANCE = 0.02  # absolute slack on match rates before "beyond noise"
GATED_WORKLOAD = "same-target"  # where sharing the first step's top-k must cost no acceptance
EPS = 1e-9  # float rounding: a deterministic engine's floor is exactly 0
# The computation each arm runs: off and bug both compute a fresh top-k in every draft step.
COMPUTATION = {
    "off": "per-step top-k",
    "bug": "per-step top-k",
    "fix": "shared top-k",
    "upstream": "upstream",
}
# Two-sided 95% Student t quantiles for 1..30 degrees of freedom (beyond: the Cornish-Fisher expansion).
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)  # fmt: skip
INTERVAL = (
    "95% Student-t interval of the mean per-request paired difference (b - a, same prompt): pairing cancels "
    "how hard each prompt is to draft for, and t (not normal) because a run holds a handful of requests"
)


def repeats(arm_a: str, arm_b: str, arm_control: str) -> str:
    """Which compared run ("a" or "b") the control is a second run of, by the computation its arm runs."""
    comp = COMPUTATION.get(arm_control)
    for side, arm in (("a", arm_a), ("b", arm_b)):
        if comp is not None and COMPUTATION.get(arm) == comp:
            return side
    raise UsageError(
        f"the control (arm {arm_control}) runs neither a's computation ({arm_a}) nor b's ({arm_b}): use a "
        "repeat of either arm, or the off arm (the bug's computation on the patched build)",
        param="--control",
    )


def token_match(a: Sequence[int], b: Sequence[int]) -> dict[str, Any]:
    """Positional match rate over the longer output, and the first index where they differ (None: equal)."""
    n = max(len(a), len(b))
    return {"match_rate": eq.match_rate(a, b), "first_divergence": eq.first_divergence(a, b), "length": n}


def token_summary(per: list[dict[str, Any]]) -> dict[str, Any]:
    """One side of the token judgement, over equivalence.compare_request rows."""
    firsts = [r["first_divergence"] for r in per if r["first_divergence"] is not None]
    diffs = [r["logprob_max_abs_diff"] for r in per if r.get("logprob_max_abs_diff") is not None]
    return {
        "requests": len(per),
        "identical": sum(r["identical"] for r in per),
        "mean_match_rate": statistics.fmean(r["match_rate"] for r in per),
        "min_match_rate": min(r["match_rate"] for r in per),
        "median_first_divergence": statistics.median(firsts) if firsts else None,
        "logprob_max_abs_diff": max(diffs) if diffs else None,
        "divergence_margins": [r["divergence_margin"] for r in per if r.get("divergence_margin") is not None],
    }


def token_verdict(ab: dict[str, Any], noise: dict[str, Any], tolerance: float = TOLERANCE) -> str:
    """identical / within_noise / beyond_noise, from two token_summary results."""
    if ab["identical"] == ab["requests"]:
        return "identical"
    if noise["identical"] == noise["requests"]:
        return "beyond_noise"  # the computation is deterministic here, so any A-B difference is real
    if (
        ab["mean_match_rate"] >= noise["mean_match_rate"] - tolerance
        and ab["identical"] / ab["requests"] >= noise["identical"] / noise["requests"] - tolerance
    ):
        return "within_noise"
    return "beyond_noise"


def t_interval(diffs: Sequence[float]) -> list[float] | None:
    """INTERVAL over `diffs`; None for fewer than 2 (no spread to estimate)."""
    n = len(diffs)
    if n < 2:
        return None
    df, z = n - 1, 1.959964
    t = (
        _T95[df - 1]
        if df <= len(_T95)
        else z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
    )
    mean, half = statistics.fmean(diffs), t * statistics.stdev(diffs) / math.sqrt(n)
    return [mean - half, mean + half]


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def acceptance(
    rows_a: list[dict[str, Any]],
    rows_b: list[dict[str, Any]],
    rows_control: list[dict[str, Any]] | None = None,
    repeat_of: str = "a",
) -> dict[str, Any]:
    """Accept length per request, a vs b, per workload, next to the control's noise floor.

    Per request: d = accept_b - accept_a; with a control, n = accept_control - accept_<repeat_of> (two runs
    of one computation). Per workload: the mean of d and its INTERVAL; the floor, max |n| (the largest
    per-request move between two runs of the same computation). Same-target rows are gated: the fix's
    shared top-k holds every fact the later draft steps need, so acceptance must not move: status
    "beyond_noise" when |mean d| exceeds the floor, "not_run" without a control (never a silent pass),
    else "within_noise". Other workloads (moving-target, where sharing may cost acceptance; unlabelled
    rows) are "reported" with their interval, not gated.
    """
    a = eq.by_prompt(rows_a, "run a", eq.TOKENS_ONLY)
    b = eq.by_prompt(rows_b, "run b", eq.TOKENS_ONLY)
    c = eq.by_prompt(rows_control, "control", eq.TOKENS_ONLY) if rows_control is not None else None
    x = a if repeat_of == "a" else b
    out: dict[str, Any] = {"interval": INTERVAL, "repeat_of": repeat_of if c is not None else None}
    groups: dict[str, dict[str, Any]] = {}
    for pid in (p for p in a if p in b):
        la, lb = eq.accept_length(a[pid]), eq.accept_length(b[pid])
        if la is None or lb is None:
            continue
        req = {"prompt_id": pid, "a": la, "b": lb, "b_minus_a": lb - la, "control": None, "noise": None}
        lc = eq.accept_length(c[pid]) if c is not None and pid in c else None
        lx = eq.accept_length(x[pid])
        if lc is not None and lx is not None:
            req.update(control=lc, noise=lc - lx)
        groups.setdefault(eq.workload(a[pid]), []).append(req)
    out["by_workload"] = {w: _judge(w, reqs, c is not None) for w, reqs in groups.items()}
    return out


def _judge(workload: str, reqs: list[dict[str, Any]], has_control: bool) -> dict[str, Any]:
    diffs = [r["b_minus_a"] for r in reqs]
    noise = [abs(r["noise"]) for r in reqs if r["noise"] is not None]
    mean = statistics.fmean(diffs)
    floor = max(noise) if noise else None
    gated = workload == GATED_WORKLOAD
    if not gated:
        status, why = "reported", f"not gated: {workload} acceptance may move with the fix"
    elif not has_control:
        status, why = "not_run", "no control run: no noise floor to judge acceptance against (--control)"
    elif floor is None:
        status, why = "not_run", "the control shares no request with these prompts: no noise floor"
    elif abs(mean) > floor + EPS:
        status, why = "beyond_noise", f"|mean change| {abs(mean):.4f} > noise floor {floor:.4f}"
    else:
        status, why = "within_noise", f"|mean change| {abs(mean):.4f} <= noise floor {floor:.4f}"
    interval = t_interval(diffs)
    return {
        "gated": gated,
        "status": status,
        "why": why,
        "requests": reqs,
        "n": len(reqs),
        "mean_b_minus_a": _rounded(mean),
        "interval95_b_minus_a": None if interval is None else [_rounded(v) for v in interval],
        "noise_floor": _rounded(floor),
    }


# what kit noise lists per request, for a vs b (`_ab`) and a vs its repeat (`_noise`)
_PER_REQUEST = (
    "match_rate",
    "first_divergence",
    "logprob_max_abs_diff",
    "logprob_median_abs_diff",
    "min_margin",
    "divergence_margin",
)


def _rows(run: Path | str | list[dict]) -> list[dict]:
    return read_outputs(run) if isinstance(run, (str, Path)) else run


def _params(run: Path | str | list[dict]) -> dict[str, Any] | None:
    """A run's params.json (an outputs.jsonl's: its folder's); None for rows given in memory."""
    if not isinstance(run, (str, Path)):
        return None
    path = Path(run)
    return RunDir(path if path.is_dir() else path.parent).read_params()


def check_repeat(
    run_a: Path | list[dict], run_b: Path | list[dict], repeat_a: Path | list[dict], allow_mismatch: bool
) -> dict[str, dict[str, list[Any]]]:
    """kit noise's runs, checked as kit compare checks its pair and control (params.check_runs): A and B one
    workload, the repeat a second run of A's computation on that workload; refused in one line naming the
    field unless `allow_mismatch`. Returns the differences allowed; {} for rows given in memory."""
    pa, pb, pr = _params(run_a), _params(run_b), _params(repeat_a)
    if pa is None or pb is None or pr is None:
        return {}
    arm_a, arm_r = pa.get("arm"), pr.get("arm")
    if COMPUTATION.get(arm_r) is None or COMPUTATION.get(arm_r) != COMPUTATION.get(arm_a):
        raise UsageError(
            f"the repeat (arm {arm_r}) is not a second run of A's computation (arm {arm_a}): the noise floor "
            "is A against a repeat of A (the same arm, or off for bug: both compute the top-k every step)",
            param="repeat_a",
        )
    diff, diff_r = params_mod.check_runs(pa, pb, pr, "a", allow_mismatch, ("A", "B", "repeat"))
    return {k: d for k, d in (("a_vs_b", diff), ("a_vs_repeat", diff_r)) if d}


def compare_with_noise(
    run_a: Path | list[dict],
    run_b: Path | list[dict],
    repeat_a: Path | list[dict],
    tolerance: float = TOLERANCE,
    *,
    allow_mismatch: bool = False,
) -> dict[str, Any]:
    """`kit noise`: arm A vs arm B per request, next to A vs its repeat (the noise floor), on outputs alone.

    Each argument is a run directory / outputs.jsonl path or the rows themselves. `verdict`: token_verdict;
    `acceptance`: as kit compare --control reports it (the repeat is a second run of A). Runs whose
    parameters differ are refused (check_repeat) unless `allow_mismatch`: then `params_differ` says how.
    """
    rows_a, rows_b, rows_r = _rows(run_a), _rows(run_b), _rows(repeat_a)
    differ = check_repeat(run_a, run_b, repeat_a, allow_mismatch)
    ab = eq.compare_runs(rows_a, rows_b, eq.TOKENS_ONLY, ("run A", "run B"))
    ar = eq.compare_runs(rows_a, rows_r, eq.TOKENS_ONLY, ("run A", "repeat"))
    if not ab["requests"]:
        raise InputError("run A and run B share no prompt_id: not the same workload")
    noise_of = {r["prompt_id"]: r for r in ar["requests"]}
    if not noise_of.keys() & {r["prompt_id"] for r in ab["requests"]}:
        raise InputError(
            "the repeat run shares no prompt with runs A and B: no noise floor to compare against"
        )
    outputs = {
        k: {r["prompt_id"]: r["output_ids"] for r in rows} for k, rows in (("a", rows_a), ("b", rows_b))
    }
    per = []
    for r in ab["requests"]:
        pid = r["prompt_id"]
        row = {"prompt_id": pid, **{f"{k}_ab": r[k] for k in _PER_REQUEST}}
        row["length_ab"] = max(len(outputs["a"][pid]), len(outputs["b"][pid]))
        if pid in noise_of:
            row.update({f"{k}_noise": noise_of[pid][k] for k in _PER_REQUEST})
        per.append(row)
    s_ab = token_summary(ab["requests"])
    s_noise = token_summary([noise_of[r["prompt_id"]] for r in ab["requests"] if r["prompt_id"] in noise_of])
    acc = acceptance(rows_a, rows_b, rows_r, "a")
    pooled = {k: _mean_accept(rows) for k, rows in (("a", rows_a), ("b", rows_b), ("repeat", rows_r))}
    labels = {"a_vs_b": ("A", "B"), "a_vs_repeat": ("A", "repeat")}
    return {
        "verdict": token_verdict(s_ab, s_noise, tolerance),
        "tolerance": tolerance,
        "params_differ": differ,
        "warnings": [
            f"PARAMETERS DIFFER: {params_mod.describe(d, *labels[k])} (compared with --allow-mismatch: the "
            "verdict says nothing about the fix)"
            for k, d in differ.items()
        ],
        "a_vs_b": s_ab,
        "noise_floor": s_noise,
        "accept_length": {
            **pooled,
            "a_minus_b": None if None in (pooled["a"], pooled["b"]) else pooled["a"] - pooled["b"],
            "noise": None if None in (pooled["a"], pooled["repeat"]) else abs(pooled["a"] - pooled["repeat"]),
        },
        "acceptance": acc,
        "per_request": per,
    }


def _mean_accept(rows: list[dict]) -> float | None:
    vals = [v for v in (eq.accept_length(r) for r in rows) if v is not None]
    return statistics.fmean(vals) if vals else None
