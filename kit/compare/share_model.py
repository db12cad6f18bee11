"""What a draft loop costs on the task checkpoint, request by request, derived from the task alone: the
verify rounds each request must take when every draft step runs its own indexer (`per-step`: off, bug) and
when the later steps share the round's first top-k (`shared`: the fix).

The task fixes every draft outcome. A draft step whose query key is one of the draft's planted misses answers
wrong; any other step answers right when its indexer selection holds the fact it needs: a fresh selection
always does, and a shared one (selected for the round's first drafted key) does when the step's key is in
that key's group. The round accepts the leading right drafts plus the target's bonus token, so the expected
answer chain (`expected_ids`) and the task's groups and misses give each request's verify rounds exactly.

Where a run's rows carry each round's drafts (the mini's `draft_ids`), the model is judged round by round too:
the accepted drafts of every round must be the walk's. A wrong fix that loses a fact in one round can win the
round back later (the next round starts earlier, before a draft the walk gets wrong anyway), leaving the total
unchanged; the rounds still depart. Rows without per-round drafts (real sglang's) are judged on totals alone,
and the comparison says so.

This is stronger than comparing the fix with a control: a share that keeps one launch per round and the
same-target acceptance but hands the later steps some other top-k (an older round's, another request's)
moves the moving-target rounds away from this prediction, in either direction. The control checks the
model: its departure from its own prediction is the floor a candidate may depart by.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kit.compare import equivalence as eq
from kit.rundir import RunDir
from kit.task.slots import Lookup, draft_rounds
from kit.task.spec import TaskSpec

PER_STEP, SHARED = "per-step", "shared"
# The draft loop each arm runs on the mini and on sglang 0.5.14 (upstream on real sglang seeds its loop from
# draft_extend's top-k: not modelled here, not checked).
COMPUTATION = {"off": PER_STEP, "bug": PER_STEP, "fix": SHARED}
MINI_ONLY = {"upstream": SHARED}


def computation(arm: str | None, backend: str | None, eagle_topk: int = 1) -> str | None:
    """The draft loop `arm` runs; sglang shares the top-k only with EAGLE topk 1, so any other topk
    recomputes it every step whatever the arm."""
    if eagle_topk != 1 and arm in (*COMPUTATION, *MINI_ONLY):
        return PER_STEP
    if arm in COMPUTATION:
        return COMPUTATION[arm]
    return MINI_ONLY.get(arm or "") if backend == "mini" else None


def verify_rounds(
    spec: TaskSpec, expected_ids: list[int], num_steps: int, max_new_tokens: int, how: str
) -> int | None:
    """Verify rounds a request takes to emit max_new_tokens along `expected_ids` (None: not task nodes).

    The walk (kit.task.slots.draft_rounds): the prefill emits the first token; a round drafts num_steps tokens
    (draft j queries the key of the token before it) and emits its accepted drafts plus one."""
    rounds = draft_rounds(spec, expected_ids, num_steps, max_new_tokens, shared=how == SHARED)
    return None if rounds is None else len(rounds)


def accepted(row: dict[str, Any]) -> list[int]:
    """Accepted drafts of each round of one request, from its outputs.jsonl row (the round's drafts against
    the tokens it emitted; the prefill emitted the first)."""
    out, pos, acc = row["output_ids"], 1, []
    for drafts in row["draft_ids"]:
        a = 0
        while a < len(drafts) and pos + a < len(out) and drafts[a] == out[pos + a]:
            a += 1
        acc.append(a)
        pos += a + 1
    return acc


def rounds_off(row: dict[str, Any], walk: list[list[Lookup]] | None) -> int | None:
    """Rounds of one request whose accepted drafts differ from the walk's (`draft_rounds` of its answer;
    rounds only one of them has count too); None where the row carries no per-round drafts or its answer is
    no task chain (no walk)."""
    if row.get("draft_ids") is None or walk is None:
        return None
    mine, want = accepted(row), [sum(step.right for step in steps) for steps in walk]
    return sum(a != b for a, b in zip(mine, want, strict=False)) + abs(len(mine) - len(want))


def task_spec(run: Path, params: dict[str, Any]) -> tuple[TaskSpec | None, str]:
    """The task a run's model was built from, and where it came from (or why there is none).

    Read from the run's own copy (`task.json`, written by `kit run`), never from the checkpoint path the
    run recorded: that path is provenance of the machine it ran on, and on the machine judging it may hold
    another task or nothing. A mini run made in memory is rebuilt from its seed."""
    from kit.task.spec import read_task

    copy = RunDir(Path(run)).task
    if copy.is_file():
        return read_task(copy.parent), str(copy)
    if params.get("backend", "mini") == "mini" and params.get("model") != "task":
        return None, "not a task-checkpoint run"
    if params.get("backend", "mini") == "mini" and params.get("task_checkpoint") is None:
        return TaskSpec(seed=int(params.get("seed", 0))), f"made in memory from seed {params.get('seed', 0)}"
    where = params.get("task_checkpoint") or params.get("model_path")
    return None, f"no task.json in {run} (its checkpoint {where} is where it ran, not read here)"


def _side(rows: list[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    return eq.by_prompt(rows, "share model", eq.TOKENS_ONLY)


def check(
    runs: dict[str, tuple[str | None, list[dict[str, Any]]]],
    params: dict[str, Any],
    spec: TaskSpec | None = None,
    run_dirs: dict[str, Path] | None = None,
) -> dict[str, Any]:
    """Each run's verify rounds against the model, per workload.

    `runs`: label ("a", "b", "control") -> (arm, rows). Per request and run: predicted and observed verify
    rounds. The floor is the control's largest per-request departure from its own prediction; a run
    `departs` when one of its requests departs by more. Without a control nothing is judged ("not_run").
    The task: `spec` when given, else b's own copy (`run_dirs`: label -> run directory; see task_spec),
    which every other run that holds a copy must equal."""
    where = "given"
    if spec is None:
        dirs = run_dirs or {}
        spec, where = task_spec(dirs["b"], params) if "b" in dirs else (None, "no run to read task.json from")
        others = {k: task_spec(d, params)[0] for k, d in dirs.items() if k != "b"}
        differ = [k for k, o in others.items() if spec is not None and o is not None and o != spec]
        if differ:
            why = f"{' and '.join(differ)} ran another task than b (their task.json differ)"
            return {"checked": False, "why": why}
    if spec is None:
        return {"checked": False, "why": where}
    steps, new, backend = params.get("num_steps"), params.get("max_new_tokens"), params.get("backend")
    topk = params.get("eagle_topk") or 1
    hows = {label: computation(arm, backend, topk) for label, (arm, _) in runs.items()}
    sides = {label: _side(rows) for label, (_, rows) in runs.items()}
    by: dict[str, dict[str, Any]] = {}
    for pid, row in sides["a"].items():
        per = {"prompt_id": pid}
        for label, rs in sides.items():
            r = rs.get(pid)
            pred = off = None
            if r is not None and hows[label] is not None and r.get("expected_ids"):
                walk = draft_rounds(spec, r["expected_ids"], steps, new, shared=hows[label] == SHARED)
                pred = None if walk is None else len(walk)  # verify_rounds, from the walk made once
                off = rounds_off(r, walk)
            per[label] = {"predicted": pred, "ran": None if r is None else r.get("spec_verify_ct")}
            if off is not None:
                per[label]["rounds_off"] = off
        by.setdefault(eq.workload(row), {"requests": []})["requests"].append(per)
    for w in by.values():
        w.update(_judge(w["requests"], list(runs)))
    return {"checked": True, "task": where, "computations": hows, "by_workload": by}


def _departures(reqs: list[dict[str, Any]], label: str) -> list[int] | None:
    out = []
    for r in reqs:
        side = r.get(label) or {}
        if side.get("predicted") is None or side.get("ran") is None:
            return None
        out.append(abs(side["ran"] - side["predicted"]))
    return out


def _rounds_off(reqs: list[dict[str, Any]], label: str) -> list[int] | None:
    """Each request's rounds departing from the walk, or None where a row lacks per-round drafts."""
    out = [(r.get(label) or {}).get("rounds_off") for r in reqs]
    return None if any(x is None for x in out) else out


def departs(side: dict[str, Any], floor: float, round_floor: float | None) -> bool:
    """A request's verify rounds depart from the prediction by more than the control's floor: in total, or
    (where both carry per-round drafts) in how many rounds differ from the walk."""
    if abs(side["ran"] - side["predicted"]) > floor:
        return True
    return round_floor is not None and side.get("rounds_off") is not None and side["rounds_off"] > round_floor


def _judge(reqs: list[dict[str, Any]], labels: list[str]) -> dict[str, Any]:
    control = _departures(reqs, "control") if "control" in labels else None
    floor = max(control) if control else None
    control_rounds = _rounds_off(reqs, "control") if "control" in labels else None
    round_floor = max(control_rounds) if control_rounds else None
    status: dict[str, str] = {}
    for label in labels:
        d = _departures(reqs, label)
        if d is None:
            status[label] = "not_modelled"
        elif floor is None:
            status[label] = "not_run"
        else:
            sides = [r[label] for r in reqs]
            status[label] = "departs" if any(departs(x, floor, round_floor) for x in sides) else "matches"
    out: dict[str, Any] = {"floor": floor, "status": status}
    if round_floor is not None:  # judged round by round too (the rows carry per-round drafts)
        out["round_floor"] = round_floor
    return out
