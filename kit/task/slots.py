"""Where the facts the draft needs sit in a round's shared top-k: the deciding slots, and how they spread.

Issue 32: a wrong fix that corrupts only part of the shared top-k passes the gate when the draft never needs
that part. A lookup is DECIDING when, under the fix arm's rounds (the share model's walk), a later draft step
(step >= 3, reading the round's first top-k) answers right: its key is in the shared group, it is no planted
miss, and every earlier draft of its round was right. Its fact's slot in the shared top-k is a deciding slot:
corrupting that slot changes the round's acceptance. `spread` says whether the deciding slots of a suite's
requests cover the top-k well enough that any corrupted quarter of it is seen.

The slots are the ones the run's kernel writes (`topk_of`: on CPU kernel_topk over the reference's draft
index scores; on a GPU sglang's own top-k, scripts/topk_slots.py); the draft outcomes are the task's, fixed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kit.errors import InputError
from kit.task.spec import TaskSpec
from kit.task.topk import TOPK, kernel_topk
from kit.task.workload import TaskPrompt


@dataclass(frozen=True)
class Lookup:
    """One draft step of a verify round: step j (1-based) queries `key` (proposing the next key)."""

    round: int
    step: int
    key: int
    right: bool
    reads_shared: bool  # a later step that reuses the round's first top-k (the fix arm, j >= 3)
    shared_key: int  # the key the round's first draft forward queried (its top-k is the shared one)


def draft_rounds(
    spec: TaskSpec, expected_ids: list[int], num_steps: int, max_new_tokens: int, shared: bool
) -> list[list[Lookup]] | None:
    """The draft steps of every verify round, up to the first wrong one (None: not task nodes).

    The prefill emits the first token; a round drafts num_steps tokens (draft j queries the key of the token
    before it) and emits its accepted drafts plus one. Steps j >= 3 of a `shared` round reuse the selection
    made for keys[p + 1]: right only if their key is in its group. (kit.compare.share_model counts these.)"""
    keys = [spec.key_of_node(t) for t in expected_ids]
    if not keys or any(k is None for k in keys):
        return None
    misses, group = set(spec.draft_misses()), spec.group_of
    out, p, rounds = 1, 0, []
    while out < max_new_tokens:
        steps: list[Lookup] = []
        first = keys[p + 1] if p + 1 < len(keys) else keys[p]
        for j in range(1, num_steps + 1):
            q = p + j - 1
            key = keys[q]
            right = q + 1 < len(keys) and key not in misses
            reads = shared and j >= 3
            if reads:
                right = right and group[key] == group[first]
            steps.append(Lookup(len(rounds), j, int(key), right, reads, int(first)))
            if not right:
                break
        accepted = sum(s.right for s in steps)
        rounds.append(steps)
        out += accepted + 1
        p += accepted + 1
    return rounds


@dataclass(frozen=True)
class Deciding:
    """A deciding lookup: its round and step, its key, its fact's prompt position, and its slot."""

    round: int
    step: int
    key: int
    fact_position: int
    slot: int


TopkOf = Callable[[int, TaskPrompt], torch.Tensor]


def deciding_slots(
    spec: TaskSpec, prompt: TaskPrompt, num_steps: int, max_new_tokens: int, topk_of: TopkOf
) -> list[Deciding]:
    """Every deciding lookup of one request and its fact's slot in the round's shared top-k.

    `topk_of(query_key, prompt)`: the shared top-k's DRAFT CACHE positions in slot order for the round's
    first draft query (node of query_key); draft position i holds prompt token i + 1, so a fact at prompt
    position f sits at draft position f - 1."""
    rounds = draft_rounds(spec, prompt.expected_ids, num_steps, max_new_tokens, shared=True)
    if rounds is None:
        raise InputError(f"prompt {prompt.prompt_id}: its expected ids are not task nodes")
    rows: dict[int, list[int]] = {}
    out = []
    for steps in rounds:
        for s in steps:
            if not (s.reads_shared and s.right):
                continue
            if s.shared_key not in rows:
                rows[s.shared_key] = topk_of(s.shared_key, prompt).tolist()
            row, fact = rows[s.shared_key], prompt.fact_positions[s.key]
            if fact - 1 not in row:
                raise InputError(
                    f"prompt {prompt.prompt_id}: the fact of key {s.key} (draft position {fact - 1}) is not "
                    f"in the shared top-k of key {s.shared_key} where the task says the draft reads it"
                )
            out.append(Deciding(s.round, s.step, s.key, fact, row.index(fact - 1)))
    return out


def reference_topk_of(model: Any) -> TopkOf:
    """topk_of on CPU: kernel_topk over the float32 reference's draft index scores (kit.task.reference),
    the draft cache holding the prompt shifted by one (its index keys depend on each token alone)."""
    from kit.task.reference import Session

    m = model
    if m.draft_needs_hidden or not m.per_token_prefill:
        raise InputError(
            "the slot emulation needs a task checkpoint whose draft keys depend on the token alone"
        )
    attn, cache_of = m.draft.attn, {}

    def topk_of(query_key: int, prompt: TaskPrompt) -> torch.Tensor:
        key = (prompt.task, prompt.prompt_id, len(prompt.ids), tuple(prompt.ids[:8]))
        if key not in cache_of:
            sess = Session(m, len(prompt.ids))
            sess.draft_prompt(prompt.ids[1:], None)
            cache_of.clear()  # one prompt at a time: a 64k cache is 34 MB
            cache_of[key] = sess.dcache.index_k[: sess.dcache.n]
        keys = cache_of[key]
        x = m.token_inputs(m.draft, torch.tensor([m.spec.node(query_key)]), draft=True)
        return kernel_topk(attn.index_scores(x, attn.q_lora(x), keys)[0], attn.topk)

    return topk_of


def hypergeometric_miss(distinct: int, drawn: int, total: int = TOPK) -> float:
    """P(a random `drawn` of `total` slots misses every one of `distinct` deciding slots), exactly."""
    if distinct > total - drawn:
        return 0.0
    return math.comb(total - distinct, drawn) / math.comb(total, drawn)


def spread(slots: list[int], total: int = TOPK, parts: int = 4) -> dict[str, Any]:
    """How deciding slots cover 0..total-1: counts per quarter, the largest empty run, P(a random quarter of
    the slots misses them all) (hypergeometric over the distinct slots), and whether every contiguous
    window of a quarter's width holds one (equivalently: the largest empty run is shorter than it).

    Assumption: the slots are those the run's kernel wrote and the draft outcomes are the task's (fixed),
    so only which slots a corruption picks is random."""
    width = total // parts
    distinct = sorted(set(slots))
    if any(not 0 <= s < total for s in distinct):
        raise InputError(f"deciding slots must lie in 0..{total - 1}")
    quarters = [sum(1 for s in slots if q * width <= s < (q + 1) * width) for q in range(parts)]
    edges = [-1, *distinct, total]
    gaps = [(b - a - 1, a + 1) for a, b in zip(edges, edges[1:], strict=False)]
    gap, at = max(gaps, key=lambda g: (g[0], -g[1]))  # the first of the largest
    p_miss = hypergeometric_miss(len(distinct), width, total)
    return {
        "n": len(slots),
        "distinct": len(distinct),
        "per_quarter": quarters,
        "min_quarter_share": min(quarters) / len(slots) if slots else 0.0,
        "largest_gap": gap,
        "largest_gap_at": at,
        "p_random_quarter_misses_all": p_miss,
        "every_window_hit": gap < width,
        "holds": p_miss <= 0.01 and gap < width,
    }
