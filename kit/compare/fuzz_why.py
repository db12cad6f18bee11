"""Why a corruption of the shared top-k survived the gate: which lookups it changed, and whether any of
them could move a verify round.

Every changed row of every corrupted step is recorded by the engine (engine.json `corruption.lookups`,
kit.backends.mini.corrupt.Corrupter): the round, step, request, the step's input token, the fact its lookup
needs (a draft-cache position) and whether the corrupted view removed that fact or added it. Against the
run's own drafts and outputs and the task, each such lookup is one of:

- `deciding`: its drafts so far in the round were right, its key is no planted miss and lies in the group
  the shared top-k was selected for (the fix's draft is right there): losing the fact can cost the round;
- `outside`: drafts so far right, no planted miss, but the key lies in another group (the fix's draft is
  wrong there: the clean top-k lacks the fact): gaining it can lengthen the round;
- `after a wrong draft`: an earlier draft of its round was wrong: the verify cuts the round before it;
- `planted miss`: the draft's query names another key, wrong whatever it reads;
- `finished`: the request had finished and rides along.

A survivor is called equivalent only when no deciding lookup lost its fact and no outside lookup gained
it: the corrupted slots held nothing any lookup that could move a round needed.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kit.compare.share_model import accepted, rounds_off
from kit.task.slots import draft_rounds
from kit.task.spec import TaskSpec

KINDS = ("deciding", "outside", "after a wrong draft", "planted miss", "finished")


def classify(
    lookups: list[dict[str, Any]], rows: list[dict[str, Any]], spec: TaskSpec
) -> list[dict[str, Any]]:
    """Each recorded lookup with its `kind` (KINDS), `touched` (a deciding lookup lost its fact, an outside
    one gained it) and `draft_right` (the draft this lookup made was right)."""
    by_id = {int(r["prompt_id"]): r for r in rows}
    acc = {b: accepted(r) for b, r in by_id.items()}
    misses, group = set(spec.draft_misses()), spec.group_of
    out = []
    for look in lookups:
        b, r, i = look["request"], look["round"], look["step"]
        row = by_id[b]
        right = False
        if r >= len(row["draft_ids"]):
            kind = "finished"
        elif acc[b][r] < i + 1:  # the step's input is draft i + 1: drafts 1 .. i + 1 must be right
            kind = "after a wrong draft"
        else:
            right = acc[b][r] >= i + 2
            key, shared = spec.key_of_node(look["token"]), spec.key_of_node(row["draft_ids"][r][0])
            if key in misses:
                kind = "planted miss"
            elif key is not None and shared is not None and group[key] == group[shared]:
                kind = "deciding"
            else:
                kind = "outside"
        touched = (kind == "deciding" and look["removed"]) or (kind == "outside" and look["added"])
        out.append({**look, "kind": kind, "touched": touched, "draft_right": right})
    return out


def _where(look: dict[str, Any]) -> str:
    return f"round {look['round']} step {look['step']} request {look['request']}"


def departures(
    rows: list[dict[str, Any]], spec: TaskSpec, num_steps: int, max_new_tokens: int
) -> dict[int, int]:
    """Per request, the rounds whose accepted drafts differ from what sharing the round's first top-k must
    give (kit.compare.share_model.rounds_off). The uncorrupted fix departs in none (tests/test_fuzz.py)."""
    off = {
        int(r["prompt_id"]): rounds_off(
            r, draft_rounds(spec, r["expected_ids"], num_steps, max_new_tokens, shared=True)
        )
        for r in rows
    }
    return {b: n for b, n in off.items() if n}


def why(
    summary: dict[str, Any],
    rows: list[dict[str, Any]],
    spec: TaskSpec,
    fix_rows: list[dict[str, Any]],
    shape: tuple[int, int],
    share: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A survivor's why: `equivalent` (bool), the one-line `why`, and the counts it rests on. `fix_rows`: the
    uncorrupted fix's outputs (its drafts to compare with); `shape`: (num_steps, max_new_tokens) of the
    run; `share`: the comparison's share-model judgement of the workload (ran vs predicted total rounds per
    request), quoted when not equivalent."""
    looks = classify(summary["lookups"], rows, spec)
    kinds = Counter(x["kind"] for x in looks)
    counts = {k: kinds.get(k, 0) for k in KINDS}
    touched = [x for x in looks if x["touched"]]
    moved = departures(rows, spec, *shape)
    same_drafts = all(
        r["draft_ids"] == f["draft_ids"] for r, f in zip(_by_id(rows), _by_id(fix_rows), strict=False)
    )
    base = {
        "changed_rows": len(looks),
        "lookups": counts,
        "touched": len(touched),
        "rounds_departing": {str(k): v for k, v in moved.items()},
        "drafts_equal_fix": same_drafts,
    }
    where = ", ".join(f"request {b}: {n}" for b, n in moved.items()) or "none"
    if not touched and moved:
        text = (
            f"NOT shown equivalent: no deciding lookup lost its fact and no outside lookup gained it ("
            f"{len(looks)} corrupted rows checked), yet rounds depart from the share model's per-round "
            f"prediction ({where}): the corrupted rows moved a draft through entries other than the facts"
        )
        return {**base, "equivalent": False, "why": text}
    if not touched:
        drafts = (
            "its drafts equal the uncorrupted fix's in every round"
            if same_drafts
            else "its drafts differ from the fix's only after a wrong draft, where the verify discards them"
        )
        text = (
            f"equivalent: of {len(looks)} corrupted rows ({summary['changed']} of {summary['applications']} "
            f"applications changed one), {counts['deciding']} were deciding lookups and none lost its fact, "
            f"{counts['outside']} were lookups outside the shared group and none gained it; the rest "
            f"({counts['after a wrong draft']} after a wrong draft, {counts['planted miss']} planted misses, "
            f"{counts['finished']} finished requests) cannot move a round: the corrupted slots held no "
            f"deciding fact in any round, every round's acceptance is the share model's, and {drafts}"
        )
        return {**base, "equivalent": True, "why": text}
    lost = [x for x in touched if x["kind"] == "deciding"]
    gained = [x for x in touched if x["kind"] == "outside"]
    still = sum(x["draft_right"] for x in lost)
    parts = []
    if lost:
        parts.append(
            f"{len(lost)} deciding lookups lost their fact (first: {_where(lost[0])}), {still} of them "
            "still drafted the right token"
        )
    if gained:
        parts.append(
            f"{len(gained)} lookups outside the shared group gained theirs (first: {_where(gained[0])})"
        )
    total = ""
    if share:
        ran = [
            f"prompt {r['prompt_id']}: ran {r['b']['ran']}, predicted {r['b']['predicted']}"
            for r in share.get("requests", [])
        ]
        total = f"; total verify rounds {'; '.join(ran)}"
    floors = (
        f"floor {share.get('floor')}, rounds off the walk floor {share.get('round_floor')}" if share else ""
    )
    text = (
        f"NOT equivalent, a gap of the gate: {'; '.join(parts)}; rounds departing from the share model's "
        f"per-round prediction: {where}{total}: within the control's own departures ({floors})"
        if moved
        else f"NOT shown equivalent: {'; '.join(parts)}, yet every round's acceptance is the share model's"
    )
    return {**base, "equivalent": False, "why": text}


def _by_id(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: int(r["prompt_id"]))
