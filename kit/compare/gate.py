"""The gate: what a comparison of bug and fix must show before anyone calls the fix good.

It fails when
- the runs' parameters differ (compared with --allow-mismatch: nothing about the fix follows);
- a fix arm does not show its expected indexer launches in every draft round (or could not be judged);
- the greedy tokens differ (speculative decoding is lossless: the fix must not change one);
- answer accuracy differs (the same requests must be right in both runs, per workload);
- same-target acceptance moves beyond the control's noise floor, or could not be checked for want of a
  control (kit.compare.noise.acceptance: never a silent pass).
Everything it did not gate (moving-target acceptance and its interval, a missing control where nothing
needed one, unscored outputs) is said in `gate_notes`.
"""

from __future__ import annotations

from typing import Any

from kit.arms import FIX_ARMS
from kit.compare import params as params_mod


def gate_failures(result: dict[str, Any]) -> list[str]:
    """Why the gate fails, one line each; [] when it passes."""
    failures = []
    if result.get("params_differ"):
        failures.append(
            f"the runs' parameters differ: {params_mod.describe(result['params_differ'])} (compared with "
            "--allow-mismatch; a comparison across parameters says nothing about the fix)"
        )
    if (result.get("control") or {}).get("params_differ"):
        c = result["control"]
        failures.append(
            f"the control's parameters differ from {c['repeat_of']}'s: "
            f"{params_mod.describe(c['params_differ'], c['repeat_of'], 'control')}"
        )
    failures += _launches(result)
    failures += _tokens(result["outputs"])
    for w, acc in ((result.get("accuracy") or {}).get("by_workload") or {}).items():
        if acc["same"] is False:
            failures.append(
                f"answer accuracy differs on {w}: a {acc['a']} vs b {acc['b']} (not the same requests right)"
            )
    for w, acc in ((result.get("acceptance") or {}).get("by_workload") or {}).items():
        if acc["status"] == "beyond_noise":
            failures.append(
                f"{w} acceptance moved beyond the noise floor: mean change per request (b - a) "
                f"{acc['mean_b_minus_a']:+.4f}, floor {acc['noise_floor']:.4f} (the largest per-request move "
                f"between two runs of one computation), over {acc['n']} requests"
            )
        elif acc["status"] == "not_run":
            failures.append(f"{w} acceptance could not be checked: {acc['why']}")
    return failures


def _launches(result: dict[str, Any]) -> list[str]:
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
    return failures


def _tokens(o: dict[str, Any]) -> list[str]:
    failures = []
    missing = [(side, ids) for side, ids in (("b", o["missing_in_a"]), ("a", o["missing_in_b"])) if ids]
    if missing:
        where = "; ".join(f"prompt_id {ids} only in {side}" for side, ids in missing)
        failures.append(f"the runs hold different requests: {where}")
    if not o["n_requests"]:
        if not missing:
            failures.append("no requests to compare: both runs' outputs are empty")
    elif o["n_identical"] < o["n_requests"]:
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


def gate_notes(result: dict[str, Any]) -> list[str]:
    """What the gate did not check, and why, one line each (printed beside its verdict)."""
    notes = []
    if not (result.get("accuracy") or {}).get("scored"):
        notes.append("accuracy not checked: no request carries an expected answer (expected_ids/correct)")
    by = (result.get("acceptance") or {}).get("by_workload") or {}
    if not any(acc["gated"] for acc in by.values()):
        notes.append("acceptance not gated: no same-target requests")
    for w, acc in by.items():
        if acc["gated"]:
            continue
        interval = acc["interval95_b_minus_a"]
        span = f", 95% t interval [{interval[0]:+.4f}, {interval[1]:+.4f}]" if interval else ""
        floor = (
            f"noise floor {acc['noise_floor']:.4f}"
            if acc["noise_floor"] is not None
            else "no noise floor (no control run)"
        )
        notes.append(
            f"{w} acceptance reported, not gated: mean change per request (b - a) "
            f"{acc['mean_b_minus_a']:+.4f}{span} over {acc['n']} requests; {floor}"
        )
    return notes
