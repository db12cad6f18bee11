"""Expected vs observed indexer launches per draft round, with every caveat spelled out.

A verdict never reads "0 launches, passed": no rounds, or NVTX that nsys silently dropped, give
status "inconclusive" with passed false.

When a 0 is evidence (kit.analysis.attribution decides; this module is handed the reason): a draft round
whose indexer launches are counted from indexer ranges reads 0 both when the indexer did not run and when
its ranges were never recorded (a report trimmed of them, a probe that missed them, an --indexer-range that
names none). So rounds that all count 0 are judged only when the report holds an indexer range somewhere
else -- draft_extend, verify, prefill, graph capture: the target model runs the indexer on every verify,
and sglang 0.5.15+ (`upstream`, 0 per round expected) runs it in draft_extend -- which proves the ranges
were recorded; otherwise the verdict is inconclusive and names the ranges the report does hold. Rounds
counted by kernel name (CUDA-graph replays of a Kineto trace, the classifier) need no range: their
evidence is that the trace has kernels named like the indexer's at all. The probe's census
(probe_census.jsonl) is not taken as that evidence: it is counted in Python inside sglang and says nothing
of what the report recorded. Every trace source is held to the same rule and gives the same codes: a run
that did not finish (error.json) is inconclusive (exit 3) whether or not it left a readable report, and so
is a report without the kit's ranges, nsys or Kineto alike.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from kit.arms import expected_per_round
from kit.errors import UsageError
from kit.trace.registry import source_names


def make_verdict(
    rows: Sequence[dict],
    arm: str,
    num_steps: int,
    context_len: int | None = None,
    index_topk: int = 2048,
    source: str = "nsys",
    method: str = "nvtx",
    extra_warnings: list[str] | None = None,
    *,
    inconclusive_reason: str | None = None,
    backend: str = "mini",
) -> dict:
    """The verdict dict written to verdict.json. `passed` means every round matched the arm's expectation
    (for `bug` that is: the bug reproduced)."""
    expected = expected_per_round(arm, num_steps, backend)
    sources = source_names()
    if source not in sources:
        raise UsageError(f"unknown source {source!r}: use one of {', '.join(sources)}")
    launches = [int(n) for n in _column(rows, "indexer_launches")]
    warnings: list[str] = []
    if source == "recorder":
        warnings.append("source recorder: in-process timestamps, NOT measured under Nsight Systems")
    if context_len is not None and context_len <= index_topk:
        warnings.append(
            f"context_len {context_len} <= index_topk {index_topk}: top-k keeps every token, so this run "
            "cannot show the bug's cost (launch counts are still valid)"
        )
    if num_steps == 2:
        warnings.append(
            "num_steps 2: bug and fix both expect 1 launch per round; use num_steps >= 3 to tell them apart"
        )
    pids = sorted(set(_column(rows, "pid")), key=str)
    if len(pids) > 1:
        warnings.append(f"multiple ranks: {len(pids)} processes, each round counted per process (pid)")
    for w in extra_warnings or []:
        if w not in warnings:
            warnings.append(w)

    if inconclusive_reason is None and not rows:
        inconclusive_reason = "no draft rounds found in the report"
    if inconclusive_reason is not None:
        status, passed = "inconclusive", False
        warnings.insert(0, inconclusive_reason)
    else:
        passed = all(n == expected for n in launches)
        status = "pass" if passed else "fail"
    observed = Counter(launches)
    ranks = _ranks(_column(rows, "pid"), launches, expected)
    meaning = _meaning(arm, status, expected, observed, inconclusive_reason)
    off = [r for r in ranks or [] if not r["matches"]]
    if status == "fail" and off:
        counts = [", ".join(f"{k} x {v}" for k, v in r["observed_counts"].items()) for r in off]
        seen = [f"pid {r['pid']} ({c})" for r, c in zip(off, counts, strict=True)]
        meaning += "; ranks that disagree: " + ", ".join(seen)
    return {
        "arm": arm,
        "num_steps": num_steps,
        "expected_per_round": expected,
        "launches_per_round": launches,
        "observed_counts": {str(k): v for k, v in sorted(observed.items())},
        "passed": passed,
        "status": status,
        "meaning": meaning,
        "method": method,
        "source": source,
        "num_rounds": len(rows),
        "num_processes": len(pids),
        "ranks": ranks,
        "context_len": context_len,
        "index_topk": index_topk,
        "warnings": warnings,
    }


def _ranks(pids: list, launches: list[int], expected: int) -> list[dict]:
    """Per process (TP rank) of the report: its rounds, launches x rounds, and whether every round matched."""
    by: dict = {}
    for pid, n in zip(pids, launches, strict=True):
        by.setdefault(pid, Counter())[n] += 1
    return [
        {
            "pid": pid,
            "rounds": sum(c.values()),
            "observed_counts": {str(k): v for k, v in sorted(c.items())},
            "matches": set(c) == {expected},
        }
        for pid, c in sorted(by.items(), key=lambda kv: str(kv[0]))
    ]


def _column(rows: Sequence[dict], name: str) -> list:
    """One column of the rows; a kit.analysis.rounds.RoundTable hands it over without building row dicts."""
    column = getattr(rows, "column", None)
    return column(name) if column is not None else [r.get(name) for r in rows]


def _meaning(arm: str, status: str, expected: int, observed: Counter, reason: str | None) -> str:
    """One sentence a reviewer can read without knowing the arms' conventions."""
    if status == "inconclusive":
        return f"inconclusive: {reason}"
    seen = ", ".join(f"{k} launches x {v} rounds" for k, v in sorted(observed.items()))
    if arm == "bug":
        verb = "bug reproduced" if status == "pass" else "bug NOT reproduced"
    elif arm == "off":
        verb = (
            "feature off behaves as expected"
            if status == "pass"
            else "feature-off run differs from expectation"
        )
    else:
        verb = "fix confirmed: one indexer launch per round" if status == "pass" else f"{arm} arm FAILED"
    return f"{verb} (expected {expected} per round; observed {seen})"
