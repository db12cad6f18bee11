"""Are two runs' outputs equivalent? Pure functions over `outputs.jsonl` rows (any backend).

Speculative decoding is lossless: with greedy sampling the fix must not change a single output token.
Accept length (completion_tokens / spec_verify_ct, as sglang reports it) may move within noise; draft
tokens may legitimately differ once context > index_topk (reused vs recomputed top-k), and must not
below it. Rows are paired by prompt_id; a prompt both runs hold must have the same input ids.
The same comparison against a control run (the noise floor): kit.compare.noise.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from kit.backends.sglang.workload import matches_expected
from kit.errors import InputError
from kit.rundir import read_outputs

REQUIRED = ("prompt_id", "output_ids", "completion_tokens", "spec_verify_ct")
TOKENS_ONLY = ("prompt_id", "output_ids")  # rows of a run compared for their tokens alone
UNLABELLED = "unlabelled"  # the workload of rows that name none (the mini engine's)

__all__ = ["read_outputs"]  # the reader lives with the run directory; imported from here by scripts


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (or where the shorter one ends); None when identical."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def match_rate(a: Sequence[int], b: Sequence[int]) -> float:
    """Fraction of positions (over the longer sequence) holding the same token; 1.0 for two empties."""
    n = max(len(a), len(b))
    if n == 0:
        return 1.0
    return sum(x == y for x, y in zip(a, b, strict=False)) / n


def accept_length(row: dict[str, Any]) -> float | None:
    """completion_tokens / spec_verify_ct (the row's own accept_length where it carries only that); None
    when the request had no verify round."""
    if "spec_verify_ct" not in row or "completion_tokens" not in row:
        return row.get("accept_length")
    ct = row["spec_verify_ct"]
    return row["completion_tokens"] / ct if ct else None


def correct(row: dict[str, Any]) -> bool | None:
    """Whether the row's answer is right: its `correct`, else judged from its `expected_ids` the way the
    rows that carry `correct` were; None for a row with no known answer."""
    if row.get("correct") is not None:
        return bool(row["correct"])
    expected = row.get("expected_ids")
    return None if expected is None else matches_expected(row["output_ids"], expected)


def workload(row: dict[str, Any]) -> str:
    return row.get("workload") or UNLABELLED


def check_same_prompts(a: dict[Any, dict], b: dict[Any, dict], la: str, lb: str) -> None:
    """Rows two runs share must have been sent the same input ids (where both recorded their sha256)."""
    for pid in a.keys() & b.keys():
        sa, sb = a[pid].get("prompt_sha256"), b[pid].get("prompt_sha256")
        if sa and sb and sa != sb:
            raise InputError(
                f"prompt {pid}: {la} and {lb} sent different input ids (sha256 differs); "
                "same model, tokenizer, workload, context_len and seed are required"
            )


def by_prompt(
    rows: Iterable[dict[str, Any]], label: str, required: Sequence[str] = REQUIRED
) -> dict[Any, dict[str, Any]]:
    """A run's rows keyed by prompt_id; a row without `required` keys or a prompt_id seen twice is refused."""
    out: dict[Any, dict[str, Any]] = {}
    for row in rows:
        missing = [k for k in required if k not in row]
        if missing:
            raise InputError(
                f"{label}: an outputs row lacks {', '.join(missing)}: is it an outputs.jsonl row?"
            )
        if row["prompt_id"] in out:
            raise InputError(f"{label}: prompt_id {row['prompt_id']!r} appears twice")
        out[row["prompt_id"]] = row
    return out


def _agreed_prefix(a: dict[str, Any], b: dict[str, Any]) -> tuple[int | None, int]:
    """The first divergence of two rows' outputs and how many tokens precede it."""
    first = first_divergence(a["output_ids"], b["output_ids"])
    return first, min(len(a["output_ids"]), len(b["output_ids"])) if first is None else first


def logprob_diffs(a: dict[str, Any], b: dict[str, Any]) -> list[float]:
    """|logprob_a - logprob_b| of each token before the first divergence; [] where a run has no logprobs."""
    la, lb = a.get("output_logprobs"), b.get("output_logprobs")
    _, n = _agreed_prefix(a, b)
    return [abs(x - y) for x, y in zip(la[:n], lb[:n], strict=True)] if la and lb else []


def logprob_agreement(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float | None]:
    """Where two runs' tokens agree, how closely their target logits agree, and how near a tie they came.

    From the per-token `output_logprobs` / `output_margins` (top-1 minus top-2 logprob) a real server
    returns; the logprobs depend on everything the target attends to, so they compare its computation
    where greedy tokens cannot (a random-weight model's tokens may follow a fixed cycle). Over the tokens
    before the first divergence: the largest and the median |logprob_a - logprob_b|, and `min_margin`, the
    smallest margin either run had; `divergence_margin`: the smaller of the two runs' margins at the first
    differing token (near 0: rounding decided a near-tie). None where a run has no logprobs.
    """
    ma, mb = a.get("output_margins"), b.get("output_margins")
    first, n = _agreed_prefix(a, b)
    keys = ("logprob_max_abs_diff", "logprob_median_abs_diff", "min_margin", "divergence_margin")
    out: dict[str, float | None] = dict.fromkeys(keys)
    diffs = logprob_diffs(a, b)
    if diffs:
        out["logprob_max_abs_diff"], out["logprob_median_abs_diff"] = max(diffs), statistics.median(diffs)
    if ma and mb:
        if n:
            out["min_margin"] = min(min(ma[:n]), min(mb[:n]))
        if first is not None and first < min(len(ma), len(mb)):
            out["divergence_margin"] = min(ma[first], mb[first])
    return out


def compare_request(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """One request in two runs: token identity, match rate, first divergence, accept lengths, drafts, and
    the logprob agreement where the server returned logprobs."""
    la, lb = accept_length(a), accept_length(b)
    drafts_a, drafts_b = a.get("draft_ids"), b.get("draft_ids")
    return {
        "prompt_id": a["prompt_id"],
        "identical": list(a["output_ids"]) == list(b["output_ids"]),
        "match_rate": match_rate(a["output_ids"], b["output_ids"]),
        "first_divergence": first_divergence(a["output_ids"], b["output_ids"]),
        "accept_length_a": la,
        "accept_length_b": lb,
        "accept_length_diff": None if la is None or lb is None else lb - la,
        "draft_identical": None if drafts_a is None or drafts_b is None else drafts_a == drafts_b,
        **logprob_agreement(a, b),
    }


def _extreme(per: list[dict[str, Any]], key: str, pick: Any) -> float | None:
    vals = [r[key] for r in per if r.get(key) is not None]
    return pick(vals) if vals else None


def pooled_accept(rows: Iterable[dict[str, Any]]) -> float | None:
    """Accept length over a run's requests: total tokens / total verify rounds (as the engine reports it),
    not the mean of per-request ratios, which weighs a short request like a long one; None without rounds."""
    rows = [r for r in rows if "spec_verify_ct" in r and "completion_tokens" in r]
    verify = sum(r["spec_verify_ct"] or 0 for r in rows)
    return sum(r["completion_tokens"] for r in rows) / verify if verify else None


def compare_runs(
    rows_a: Iterable[dict[str, Any]],
    rows_b: Iterable[dict[str, Any]],
    required: Sequence[str] = REQUIRED,
    labels: tuple[str, str] = ("run a", "run b"),
) -> dict[str, Any]:
    """Summary over all requests; accept lengths pooled per run (total tokens / total verify rounds)."""
    a, b = by_prompt(rows_a, labels[0], required), by_prompt(rows_b, labels[1], required)
    check_same_prompts(a, b, *labels)
    common = [pid for pid in a if pid in b]
    per = [compare_request(a[pid], b[pid]) for pid in common]
    tokens = sum(max(len(a[p]["output_ids"]), len(b[p]["output_ids"])) for p in common)
    matched = sum(
        r["match_rate"] * max(len(a[r["prompt_id"]]["output_ids"]), len(b[r["prompt_id"]]["output_ids"]))
        for r in per
    )
    la, lb = pooled_accept(a[p] for p in common), pooled_accept(b[p] for p in common)
    drafts = [r["draft_identical"] for r in per if r["draft_identical"] is not None]
    divergences = [r["first_divergence"] for r in per if r["first_divergence"] is not None]
    pooled = [d for p in common for d in logprob_diffs(a[p], b[p])]
    missing_in_a = [pid for pid in b if pid not in a]
    missing_in_b = [pid for pid in a if pid not in b]
    return {
        "n_requests": len(per),
        "n_identical": sum(r["identical"] for r in per),
        "all_identical": bool(per)
        and all(r["identical"] for r in per)
        and not missing_in_a
        and not missing_in_b,
        "match_rate": matched / tokens if tokens else 1.0,
        "first_divergence": min(divergences) if divergences else None,
        "accept_length_a": la,
        "accept_length_b": lb,
        "accept_length_diff": None if la is None or lb is None else lb - la,
        "accept_length_rel_diff": None if not la or lb is None else (lb - la) / la,
        "draft_identical": (all(drafts) if drafts else None),
        "n_draft_identical": sum(drafts),
        "logprob_max_abs_diff": _extreme(per, "logprob_max_abs_diff", max),
        "logprob_median_abs_diff": statistics.median(pooled) if pooled else None,
        "min_margin": _extreme(per, "min_margin", min),
        "divergence_margins": [r["divergence_margin"] for r in per if r["divergence_margin"] is not None],
        "missing_in_a": missing_in_a,
        "missing_in_b": missing_in_b,
        "requests": per,
    }
