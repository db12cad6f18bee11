"""Did the run finish, and does its report hold the draft rounds its parameters imply?

A verdict judges launches per round; it may only say "pass" about a run that ran to its end. Two signs say
a run did not: an `error*.json` (a stage failed, or Ctrl-C stopped it), and fewer draft rounds in the report
than the run must have taken. Either makes the verdict inconclusive, with the reason.

The rounds a run implies, per backend (conservative: a count is implied only where it is certain):
- mini: every request decodes exactly max_new_tokens and all requests decode as one batch until the last
  finishes, so the engine runs exactly max(spec_verify_ct) draft rounds (outputs.jsonl). Without
  outputs.jsonl, at least ceil((max_new_tokens - 1) / (num_steps + 1)): prefill gives the first token, a
  round at most num_steps + 1 more (every draft accepted).
- sglang: the report holds a window of `profile_steps` scheduler forwards, but a forward is a draft round
  only when it decodes (a request admitted inside the window prefills in one), and sglang opens the window
  at the next forward, so no count follows from the parameters: an sglang run is judged by its own record
  (error.json when anything failed); a window with fewer rounds than profile_steps is only a warning.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kit.errors import KitError
from kit.rundir import RunDir, read_json, read_outputs


@dataclass
class Completeness:
    """Why the run's verdict cannot pass: `failed` (its record says a stage failed), `short` (its report
    holds fewer rounds than it took); None each where nothing says so."""

    failed: str | None = None
    short: str | None = None
    warnings: list[str] = field(default_factory=list)

    def reasons(self, report_reason: str | None) -> tuple[str | None, list[str]]:
        """(the reason a verdict leads with, the others as warnings), given the report's own reason (NVTX
        dropped, ...): a failed stage explains most, then the report, then the missing rounds."""
        found = [r for r in (self.failed, report_reason, self.short) if r is not None]
        return (found[0] if found else None), self.warnings + found[1:]


def rounds_per_process(pids: list[Any]) -> int:
    """The fewest rounds any process (rank) of the report holds; 0 for no rounds."""
    return min(Counter(pids).values()) if pids else 0


def failure(run: RunDir) -> str | None:
    """What the run's first error*.json says, on one line; None when no stage failed."""
    errors = run.errors()
    if not errors:
        return None
    try:
        err = read_json(errors[0])
        what = f"{err.get('stage', '?')} stage: {err.get('error', '?')}"
        message = str(err.get("message") or "").strip().splitlines()
        what += f": {message[0]}" if message else ""
    except KitError:
        what = "a stage failed (its error file is unreadable)"
    return f"the run did not finish ({what}; see {errors[0].name}): a partial run's launches prove nothing"


def implied_rounds(run: RunDir, params: dict[str, Any]) -> tuple[int | None, str]:
    """(rounds each process must hold, where that number comes from); None: the backend implies none."""
    if params.get("backend", "mini") != "mini":
        return None, ""
    if run.outputs.is_file():
        try:
            verify = [r.get("spec_verify_ct") for r in read_outputs(run.outputs)]
        except KitError as exc:
            return None, f"outputs.jsonl unreadable ({exc})"
        if verify and all(isinstance(v, int) for v in verify):
            return max(verify), f"outputs.jsonl: the longest request took {max(verify)} verify rounds"
        return None, ""
    new, steps = params.get("max_new_tokens"), params.get("num_steps")
    if isinstance(new, int) and isinstance(steps, int) and new > 1:
        least = math.ceil((new - 1) / (steps + 1))
        return least, f"max_new_tokens {new} at most {steps + 1} tokens per round, no outputs.jsonl"
    return None, ""


def ranks_in_report(params: dict[str, Any]) -> int:
    """TP ranks whose draft rounds the run's report must hold: every rank on this node under nsys (it traces
    the server's whole process tree), rank 0 alone under sglang's PyTorch profiler (the cell's trace is
    rank 0's; the others' lie beside it in torch_traces/)."""
    if params.get("backend") != "sglang" or params.get("profiler", "nsys") != "nsys":
        return 1
    tp, nodes = params.get("tp_size") or 1, params.get("nnodes") or 1
    return max(1, int(tp) // int(nodes))


def check(run: RunDir, params: dict[str, Any], pids: list[Any]) -> Completeness:
    """The run's completeness from its own record and its report's rounds (their `pid` column)."""
    out = Completeness(failed=failure(run))
    have = rounds_per_process(pids)
    need, why = implied_rounds(run, params)
    if need is not None and have < need:
        out.short = (
            f"the report holds {have} draft round(s) per process where the run took {need} ({why}): "
            "the profile is incomplete"
        )
    elif need is None and why:
        out.warnings.append(f"draft rounds not checked against the run: {why}")
    ranks = ranks_in_report(params)
    seen = len(set(pids))
    if out.short is None and ranks > 1 and pids and seen < ranks:
        out.short = (
            f"the report holds draft rounds of {seen} process(es) where the server ran {ranks} TP ranks on "
            "this node: each rank runs its own draft loop and indexer (sglang 0.5.14 replicates the indexer "
            "on every rank), so every rank must be counted"
        )
    steps = params.get("profile_steps")
    if params.get("backend") == "sglang" and isinstance(steps, int) and pids and have < steps:
        out.warnings.append(
            f"{have} draft round(s) in the profile window of {steps} forwards (prefill forwards open no "
            "round; a trimmed report holds fewer)"
        )
    return out
