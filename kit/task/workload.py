"""Prompts for a task checkpoint: exactly `context_len` tokens of fillers and facts, ending in a query node,
with the answer the target must generate (the chain of successors, one node per new token).

The prompt's facts define succ over keys (a permutation); the answer to n(k) is n(succ(k)), and each answer is
the next query, so the output walks succ from the query key:
- same-target: succ keeps every key in its group (one cycle per group), so consecutive draft steps need facts
  the indexer selects together: sharing the first draft step's top-k should cost nothing;
- moving-target: succ moves every key to another group, so the next fact is never in the previous step's
  top-k: sharing it should cost acceptance;
- any-slot: one cycle through `facts_per_group` (all but 2: 14) keys of a group, then as many of the next (2
  groups): hops stay in a group, then change it. Long segments matter: the rounds realign at every group
  change, so a request's deciding lookups repeat each cycle, and only a long cycle gives each request and
  draft step enough distinct deciding slots for a corrupted quarter of the top-k to meet one (half the group,
  8 keys, gave 3 to 8 per request: issue 32's fuzzer). The group's other keys are decoys: facts f(d->d)
  repeated at random positions until the group holds E entries (E ~ U[7/8 k, k - 8] per request and group, k =
  index_topk), so the indexer selects every entry of the group (they tie) and fillers fill the rest. The
  kernel's top-k writes the group's entries in position order (kit.task.topk), so a chain fact's output slot
  is its rank among ~2000 entries: the facts the draft needs spread over the whole top-k instead of its first
  16 slots, and a wrong fix that corrupts any part of a shared top-k costs acceptance. Needs context_len >=
  8192.

Facts sit at random positions, all at least `index_topk` + 2 tokens before the end (the last index_topk
positions and the query hold no fact, in the target's KV and in the draft's, which is shifted by one).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kit.errors import InputError, UsageError
from kit.prompt import Prompt
from kit.task.spec import TaskSpec, read_task

WORKLOADS = ("same-target", "moving-target", "any-slot")
ANY_SLOT = "any-slot"
ANY_SLOT_MIN_CONTEXT = 8192  # 2 groups of up to 2040 entries before the last index_topk + 1 tokens
ANY_SLOT_GROUPS = 2
ANY_SLOT_DECOY_KEYS = 2  # keys of a visited group left out of the chain: their f(d->d) facts are the decoys
MIN_CONTEXT, MAX_CONTEXT = 64, 524288
INDEX_TOPK = 2048


@dataclass(frozen=True)
class TaskPrompt:
    """One request: prompt ids, the expected output, and where the facts are (for checks and reports)."""

    task: str
    prompt_id: int
    ids: list[int]
    expected_ids: list[int]
    query_key: int
    chain: list[int]  # keys visited: query_key, succ(query_key), ...
    fact_positions: dict[int, int]  # key -> position of its fact

    def row_fields(self) -> dict[str, object]:
        """The fields an outputs.jsonl row carries for this request."""
        return {"task": self.task, "prompt_id": self.prompt_id, "expected_ids": self.expected_ids}


def workloads_at(context_len: int) -> tuple[str, ...]:
    """The workloads a prompt of `context_len` tokens can hold (any-slot needs ANY_SLOT_MIN_CONTEXT)."""
    return tuple(w for w in WORKLOADS if w != ANY_SLOT or context_len >= ANY_SLOT_MIN_CONTEXT)


def _rng(*key: object) -> np.random.Generator:
    words = [int.from_bytes(hashlib.sha256(repr(k).encode()).digest()[:8], "little") for k in key]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))


def _same_target_succ(spec: TaskSpec, groups: list[int], per_group: int, rng: np.random.Generator) -> dict:
    succ = {}
    for g in groups:
        keys = [int(x) for x in rng.permutation(spec.members(g))[:per_group]]
        for i, k in enumerate(keys):
            succ[k] = keys[(i + 1) % len(keys)]
    return succ


def _moving_target_succ(spec: TaskSpec, groups: list[int], per_group: int, rng: np.random.Generator) -> dict:
    """One cycle through every chosen key, visiting the groups round-robin in a fresh order each round, so
    no two consecutive keys (wrap-around included) share a group."""
    pools = {g: [int(x) for x in rng.permutation(spec.members(g))[:per_group]] for g in groups}
    order: list[int] = []
    for r in range(per_group):
        rnd = [int(g) for g in rng.permutation(groups)]
        if order and spec.group_of[order[-1]] == rnd[0]:
            rnd = rnd[1:] + rnd[:1]
        order += [pools[g][r] for g in rnd]
    if spec.group_of[order[-1]] == spec.group_of[order[0]]:  # wrap-around: swap the last round's first two
        i = len(order) - len(groups)
        order[i], order[i + 1] = order[i + 1], order[i]
    return {k: order[(i + 1) % len(order)] for i, k in enumerate(order)}


def _any_slot_succ(spec: TaskSpec, groups: list[int], per_group: int, rng: np.random.Generator) -> dict:
    """One cycle: per_group keys of one group, then per_group of the next, ..., back to the first."""
    order = [k for g in rng.permutation(groups) for k in rng.permutation(spec.members(int(g)))[:per_group]]
    return {int(k): int(order[(i + 1) % len(order)]) for i, k in enumerate(order)}


def any_slot_entries(index_topk: int) -> tuple[int, int]:
    """The range of a visited group's entries (chain facts + decoys): below index_topk so every one is
    selected and fillers tie for the rest; at least 7/8 of it so the entries fill the top-k."""
    return index_topk * 7 // 8, index_topk - 8


def _decoys(
    spec: TaskSpec, groups: list[int], succ: dict, index_topk: int, rng: np.random.Generator
) -> list[int]:
    """Decoy fact tokens f(d->d) of each group's keys outside the chain, filling it to E entries."""
    lo, hi = any_slot_entries(index_topk)
    out: list[int] = []
    for g in groups:
        others = [k for k in spec.members(g) if k not in succ]
        n = int(rng.integers(lo, hi + 1)) - sum(spec.group_of[k] == g for k in succ)
        out += [spec.fact(int(d), int(d)) for d in rng.choice(others, size=n)]
    return out


def task_prompt(
    spec: TaskSpec | Path | str,
    workload: str,
    context_len: int,
    prompt_id: int,
    seed: int = 0,
    *,
    max_new_tokens: int = 96,
    groups: int | None = None,
    facts_per_group: int | None = None,
    index_topk: int = INDEX_TOPK,
    bos_id: int = 0,
) -> TaskPrompt:
    """Exactly `context_len` ids: BOS, fillers with one fact per chosen key scattered before the last
    index_topk + 1 positions, then the query node; expected output: max_new_tokens nodes along succ.

    `spec`: the TaskSpec, or a task checkpoint directory. `groups` (default all; any-slot 2) groups take
    part, each with `facts_per_group` (default all; any-slot all but ANY_SLOT_DECOY_KEYS) of its keys.
    """
    if not isinstance(spec, TaskSpec):
        spec = read_task(Path(spec))
    if workload not in WORKLOADS:
        raise UsageError(f"unknown task workload {workload!r}; one of {', '.join(WORKLOADS)}")
    if not MIN_CONTEXT <= context_len <= MAX_CONTEXT:
        raise UsageError(f"context_len {context_len} is outside {MIN_CONTEXT}..{MAX_CONTEXT} tokens")
    if max_new_tokens < 1:
        raise UsageError(f"max_new_tokens {max_new_tokens} must be >= 1")
    any_slot = workload == ANY_SLOT
    n_groups = (ANY_SLOT_GROUPS if any_slot else spec.n_groups) if groups is None else groups
    per_default = spec.group_size - ANY_SLOT_DECOY_KEYS if any_slot else spec.group_size
    per_group = per_default if facts_per_group is None else facts_per_group
    if not 1 <= n_groups <= spec.n_groups or not 1 <= per_group <= spec.group_size:
        raise UsageError(
            f"groups {n_groups} / facts_per_group {per_group}: the task has {spec.n_groups} groups of "
            f"{spec.group_size} keys; pick within those"
        )
    if workload == "moving-target" and n_groups < 2:
        raise UsageError(
            f"moving-target needs facts in at least 2 groups (every hop changes group), got {n_groups}; "
            "raise groups"
        )
    if workload == "same-target" and per_group < 2:
        raise UsageError(f"same-target needs at least 2 facts per group (a cycle), got {per_group}")
    if any_slot and not 2 <= per_group < spec.group_size:
        raise UsageError(
            f"any-slot needs 2..{spec.group_size - 1} chain keys per group (the rest are decoys), "
            f"got {per_group}"
        )
    if any_slot and context_len < ANY_SLOT_MIN_CONTEXT:
        raise UsageError(
            f"context_len {context_len}: any-slot needs context_len >= {ANY_SLOT_MIN_CONTEXT} (each visited "
            f"group holds up to {any_slot_entries(index_topk)[1]} entries before the last {index_topk + 1} "
            "tokens); raise it or use same-target/moving-target"
        )
    n_facts = n_groups * (any_slot_entries(index_topk)[1] if any_slot else per_group)
    slots = context_len - index_topk - 2  # positions 1 .. context_len - index_topk - 2
    if n_facts > slots:
        need = n_facts + index_topk + 2
        raise UsageError(
            f"context_len {context_len}: {n_facts} facts do not fit before the last {index_topk + 1} tokens "
            f"(fact depth beyond the context); use context_len >= {need} or fewer facts"
        )
    rng = _rng("task-prompt", spec.seed, seed, workload, context_len, prompt_id, n_groups, per_group)
    chosen = sorted(int(g) for g in rng.permutation(spec.n_groups)[:n_groups])
    make = {"same-target": _same_target_succ, "moving-target": _moving_target_succ, ANY_SLOT: _any_slot_succ}
    succ = make[workload](spec, chosen, per_group, rng)
    decoys = _decoys(spec, chosen, succ, index_topk, rng) if any_slot else []
    fillers = spec.filler_ids()
    ids = [fillers[int(i)] for i in rng.integers(0, len(fillers), context_len)]
    ids[0] = bos_id
    keys = sorted(succ)
    positions = rng.choice(np.arange(1, slots + 1), size=len(keys) + len(decoys), replace=False)
    fact_positions = {}
    for k, pos in zip(rng.permutation(keys), positions[: len(keys)], strict=True):
        ids[int(pos)] = spec.fact(int(k), succ[int(k)])
        fact_positions[int(k)] = int(pos)
    for token, pos in zip(decoys, positions[len(keys) :], strict=True):
        ids[int(pos)] = token
    query = int(keys[int(rng.integers(len(keys)))])
    ids[-1] = spec.node(query)
    chain = [query]
    for _ in range(max_new_tokens):
        chain.append(succ[chain[-1]])
    return TaskPrompt(
        task=workload,
        prompt_id=prompt_id,
        ids=ids,
        expected_ids=[spec.node(k) for k in chain[1:]],
        query_key=query,
        chain=chain,
        fact_positions=fact_positions,
    )


def accuracy(expected_ids: list[int], output_ids: list[int]) -> float:
    """Share of expected positions the output got right (a missing token counts as wrong)."""
    if not expected_ids:
        raise InputError("no expected tokens to score against")
    return sum(int(a == b) for a, b in zip(expected_ids, output_ids, strict=False)) / len(expected_ids)


def score_row(row: dict) -> dict[str, object]:
    """`correct` (every token right), `accuracy` and the first wrong position of an outputs.jsonl row that
    carries `expected_ids` (task_prompt(...).row_fields()) and `output_ids`."""
    exp, out = row.get("expected_ids"), row.get("output_ids")
    if exp is None or out is None:
        raise InputError(
            f"prompt {row.get('prompt_id')}: scoring needs the row's expected_ids and output_ids"
        )
    wrong = [i for i, e in enumerate(exp) if i >= len(out) or out[i] != e]
    return {"correct": not wrong, "accuracy": accuracy(exp, out), "first_error": wrong[0] if wrong else None}


@dataclass(frozen=True)
class SglangTaskWorkload:
    """A task workload as the sglang backend's prompt source (kit.backends.sglang.workload.Workload): the
    prompt comes from the task checkpoint the server loads (its task.json), the tokenizer is not needed."""

    name: str
    version: str = "kit.task.workload/v1"

    def prompt(
        self,
        tok: Any,
        context_len: int,
        prompt_id: int,
        seed: int,
        model: dict[str, Any],
        max_new_tokens: int,
    ) -> Prompt:
        tp = task_prompt(
            Path(model["path"]),
            self.name,
            context_len,
            prompt_id,
            seed,
            max_new_tokens=max_new_tokens,
            index_topk=int(model.get("index_topk", INDEX_TOPK)),
        )
        return Prompt(list(tp.ids), list(tp.expected_ids))


SAME_TARGET = SglangTaskWorkload("same-target")
MOVING_TARGET = SglangTaskWorkload("moving-target")
ANY_SLOT_WORKLOAD = SglangTaskWorkload(ANY_SLOT)
