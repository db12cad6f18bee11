"""Output equivalence on real GPUs, judged against the noise floor of a repeat of the same build.

Speculative decoding is lossless, so with greedy sampling the fix must not change the tokens. On real
GPUs two runs of the SAME build can still differ (batch-dependent kernels, atomics, TP reductions), so
"identical" is too strict and "close" is meaningless without a reference: the repeat run is that
reference. Exact comparison of deterministic runs lives in kit.compare.equivalence.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kit.compare.equivalence import by_prompt, first_divergence, logprob_agreement, match_rate, read_outputs
from kit.errors import InputError

TOLERANCE = 0.02  # absolute slack on match rates before "beyond noise"


def token_match(a: Sequence[int], b: Sequence[int]) -> dict[str, Any]:
    """Positional match rate over the longer output, and the first index where they differ (None: equal)."""
    n = max(len(a), len(b))
    return {"match_rate": match_rate(a, b), "first_divergence": first_divergence(a, b), "length": n}


def _pair(x: dict[int, dict], y: dict[int, dict], lx: str, ly: str) -> list[tuple[int, dict, dict]]:
    common = sorted(set(x) & set(y))
    if not common:
        raise InputError(f"{lx} and {ly} share no prompt_id: not the same workload")
    for pid in common:
        sx, sy = x[pid].get("prompt_sha256"), y[pid].get("prompt_sha256")
        if sx and sy and sx != sy:
            raise InputError(
                f"prompt {pid}: {lx} and {ly} sent different input ids (sha256 differs); "
                "same model, tokenizer, context_len and seed are required"
            )
    return [(pid, x[pid], y[pid]) for pid in common]


def _summary(per: list[dict], suffix: str) -> dict[str, Any]:
    def present(key: str) -> list:
        return [r[f"{key}_{suffix}"] for r in per if r[f"{key}_{suffix}"] is not None]

    rates = present("match_rate")
    firsts = present("first_divergence")
    diffs = present("logprob_max_abs_diff")
    return {
        "requests": len(per),
        "identical": sum(r[f"first_divergence_{suffix}"] is None for r in per),
        "mean_match_rate": statistics.fmean(rates),
        "min_match_rate": min(rates),
        "median_first_divergence": statistics.median(firsts) if firsts else None,
        "logprob_max_abs_diff": max(diffs) if diffs else None,
        "divergence_margins": present("divergence_margin"),
    }


def _accept(rows: list[dict]) -> float | None:
    vals = [r["accept_length"] for r in rows if r.get("accept_length") is not None]
    return statistics.fmean(vals) if vals else None


def compare_with_noise(
    run_a: Path | list[dict],
    run_b: Path | list[dict],
    repeat_a: Path | list[dict],
    tolerance: float = TOLERANCE,
) -> dict[str, Any]:
    """Compare arm A vs arm B per request, next to A vs its repeat (the noise floor).

    Each argument is a run directory / outputs.jsonl path or the rows themselves. Verdict:
    "identical" (A == B token for token), "within_noise" (A-B disagreement no worse than A-A' within
    `tolerance`), or "beyond_noise". A deterministic repeat (A == A') makes any A-B difference beyond noise.
    """
    rows_a = read_outputs(run_a) if isinstance(run_a, (str, Path)) else run_a
    rows_b = read_outputs(run_b) if isinstance(run_b, (str, Path)) else run_b
    rows_r = read_outputs(repeat_a) if isinstance(repeat_a, (str, Path)) else repeat_a
    a, b, r = (
        by_prompt(rows, label, ("prompt_id", "output_ids"))
        for rows, label in ((rows_a, "run A"), (rows_b, "run B"), (rows_r, "repeat"))
    )
    ab = _pair(a, b, "run A", "run B")
    ar = {pid: (x, y) for pid, x, y in _pair(a, r, "run A", "repeat")}
    per = []
    for pid, x, y in ab:
        row = {
            "prompt_id": pid,
            **{f"{k}_ab": v for k, v in token_match(x["output_ids"], y["output_ids"]).items()},
            **{f"{k}_ab": v for k, v in logprob_agreement(x, y).items()},
        }
        if pid in ar:
            m = token_match(*(q["output_ids"] for q in ar[pid]))
            row.update({f"{k}_noise": v for k, v in m.items() if k != "length"})
            row.update({f"{k}_noise": v for k, v in logprob_agreement(*ar[pid]).items()})
        per.append(row)
    s_ab = _summary(per, "ab")
    noise_rows = [p for p in per if "match_rate_noise" in p]
    if not noise_rows:
        raise InputError(
            "the repeat run shares no prompt with runs A and B: no noise floor to compare against"
        )
    s_noise = _summary(noise_rows, "noise")
    if s_ab["identical"] == s_ab["requests"]:
        verdict = "identical"
    elif s_noise["identical"] == s_noise["requests"]:
        verdict = "beyond_noise"  # the build is deterministic here, so any A-B difference is real
    elif (
        s_ab["mean_match_rate"] >= s_noise["mean_match_rate"] - tolerance
        and s_ab["identical"] / s_ab["requests"] >= s_noise["identical"] / s_noise["requests"] - tolerance
    ):
        verdict = "within_noise"
    else:
        verdict = "beyond_noise"
    acc_a, acc_b, acc_r = _accept(rows_a), _accept(rows_b), _accept(rows_r)
    return {
        "verdict": verdict,
        "tolerance": tolerance,
        "a_vs_b": s_ab,
        "noise_floor": s_noise,
        "accept_length": {
            "a": acc_a,
            "b": acc_b,
            "repeat": acc_r,
            "a_minus_b": None if acc_a is None or acc_b is None else acc_a - acc_b,
            "noise": None if acc_a is None or acc_r is None else abs(acc_a - acc_r),
        },
        "per_request": per,
    }
