"""The gate: what a comparison of bug and fix must show before anyone calls the fix good.

It fails when
- the runs' parameters differ (compared with --allow-mismatch: nothing about the fix follows);
- a fix arm does not show its expected indexer launches in every draft round (or could not be judged);
- the greedy tokens differ (speculative decoding is lossless: the fix must not change one);
- answer accuracy differs (the same requests must be right in both runs, per workload);
- same-target acceptance moves beyond the control's noise floor, or could not be checked for want of a
  control (kit.compare.noise.acceptance: never a silent pass);
- on the task checkpoint, a fix arm's verify rounds depart from what sharing one top-k per round must cost
  (kit.compare.share_model), by more than the control departs from its own prediction: this is what
  catches a share that hands the later steps the wrong top-k while launches and same-target acceptance
  look right.
Everything it did not gate (moving-target acceptance and its interval, a missing control where nothing
needed one, unscored outputs, runs the share model cannot predict) is said in `gate_notes`.
"""

from __future__ import annotations

from typing import Any

from kit.arms import FIX_ARMS
from kit.compare import params as params_mod
from kit.compare import share_model

# The gate's checks, in the order gate_failures lists them (kit.compare.mutation names what kills a mutant).
CHECKS = ("params", "launches", "tokens", "accuracy", "acceptance", "share_model")
# comparison.json records the noise floor to 6 decimals: a request that moved by the floor is not beyond it
RECORDED = 1e-6


def gate_failures(result: dict[str, Any]) -> list[str]:
    """Why the gate fails, one line each; [] when it passes."""
    checks = gate_checks(result)
    return [line for check in CHECKS for line in checks[check]]


def gate_checks(result: dict[str, Any]) -> dict[str, list[str]]:
    """gate_failures by check (CHECKS): which of the gate's rules each failure breaks."""
    return {
        "params": _params(result),
        "launches": _launches(result),
        "tokens": _tokens(result["outputs"]),
        "accuracy": _accuracy(result),
        "acceptance": _acceptance(result),
        "share_model": _share_model(result),
    }


def _params(result: dict[str, Any]) -> list[str]:
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
    return failures


def _accuracy(result: dict[str, Any]) -> list[str]:
    failures = []
    for w, acc in ((result.get("accuracy") or {}).get("by_workload") or {}).items():
        if acc["same"] is False:
            failures.append(
                f"answer accuracy differs on {w}: a {acc['a']} vs b {acc['b']} (not the same requests right)"
            )
    return failures


def _acceptance(result: dict[str, Any]) -> list[str]:
    failures = []
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


def _share_model(result: dict[str, Any]) -> list[str]:
    model = result.get("share_model") or {}
    failures = []
    for w, judged in (model.get("by_workload") or {}).items():
        for side in ("a", "b"):
            if result[side]["arm"] not in FIX_ARMS or judged["status"].get(side) != "departs":
                continue
            rf = judged.get("round_floor")
            off = [
                f"prompt {r['prompt_id']}: {r[side]['ran']} vs {r[side]['predicted']}"
                + (f", {r[side]['rounds_off']} rounds off the walk" if rf is not None else "")
                for r in judged["requests"]
                if _departs(r[side], judged)
            ]
            also = f" (rounds off the walk: {rf})" if rf is not None else ""
            failures.append(
                f"{w}: {side} ({result[side]['arm']}) takes other verify rounds than sharing one top-k per "
                f"draft round must ({model['computations'][side]} model of the task; ran vs predicted: "
                f"{'; '.join(off)}), beyond the control's own departure {judged['floor']}{also}"
            )
    return failures


def _departs(side: dict[str, Any], judged: dict[str, Any]) -> bool:
    """A request departs from the share model by more than the control's floors (kit.compare.share_model)."""
    return share_model.departs(side, judged["floor"], judged.get("round_floor"))


def failing_cells(result: dict[str, Any]) -> dict[Any, dict[str, list[str]]]:
    """prompt_id -> the per-request checks that fail the gate there -> the sides ("a", "b") whose cell shows
    it, by the same rules as gate_failures: `share_model`, a fix arm departing from its prediction by more
    than the floor where the workload departs; `acceptance`, b's accept length moved from a's by more than
    the noise floor where the workload's mean moved beyond it (at least one request does, as |mean| <= max);
    `accuracy`, the side not right where the two runs' right requests differ; `tokens`, b's output not
    identical to a's. The per-request table (kit.compare.per_request) marks these cells."""
    out: dict[Any, dict[str, list[str]]] = {}

    def mark(pid: Any, check: str, side: str) -> None:
        sides = out.setdefault(pid, {}).setdefault(check, [])
        if side not in sides:
            sides.append(side)

    model = result.get("share_model") or {}
    for judged in (model.get("by_workload") or {}).values():
        for side in ("a", "b"):
            if result[side]["arm"] in FIX_ARMS and judged["status"].get(side) == "departs":
                for r in judged["requests"]:
                    if _departs(r[side], judged):
                        mark(r["prompt_id"], "share_model", side)
    for acc in ((result.get("acceptance") or {}).get("by_workload") or {}).values():
        if acc["status"] == "beyond_noise":
            for r in acc["requests"]:
                if abs(r["b_minus_a"]) > acc["noise_floor"] + RECORDED:
                    mark(r["prompt_id"], "acceptance", "b")
    for w, acc in ((result.get("accuracy") or {}).get("by_workload") or {}).items():
        if acc["same"] is False:
            right = {s: set(result[s]["accuracy"][w].get("correct_ids") or ()) for s in ("a", "b")}
            for pid in right["a"] ^ right["b"]:
                mark(pid, "accuracy", "b" if pid in right["a"] else "a")
    for r in (result.get("outputs") or {}).get("requests") or []:
        if not r["identical"]:
            mark(r["prompt_id"], "tokens", "b")
    return out


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
    notes += _share_model_notes(result)
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


def _share_model_notes(result: dict[str, Any]) -> list[str]:
    model = result.get("share_model")
    if not model:
        return []
    if not model.get("checked"):
        return [f"share model not checked: {model.get('why')}"]
    notes = []
    for w, judged in model["by_workload"].items():
        if judged.get("floor") is not None and judged.get("round_floor") is None:
            notes.append(
                f"share model on {w}: total verify rounds judged, not each round (the rows carry no "
                "per-round drafts)"
            )
        for side in ("a", "b"):
            st = judged["status"].get(side)
            if st == "not_run":
                notes.append(f"share model on {w}: {side} not judged (no control run: no floor)")
            elif st == "not_modelled":
                notes.append(f"share model on {w}: {side} ({result[side]['arm']}) not modelled")
    return notes
