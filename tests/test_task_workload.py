"""kit.task.workload: prompts of an exact length whose facts sit beyond the last index_topk tokens, the chain
the target must generate, the two workloads' group structure, and the one-line refusals."""

from __future__ import annotations

import pytest

from kit.errors import KitError
from kit.task import TaskSpec, accuracy, score_row, task_prompt

SPEC = TaskSpec()


@pytest.mark.parametrize("workload", ["same-target", "moving-target"])
@pytest.mark.parametrize("context_len", [4096, 8192, 65536])
def test_prompt_layout(workload: str, context_len: int) -> None:
    p = task_prompt(SPEC, workload, context_len, prompt_id=1, seed=0, max_new_tokens=40)
    ids = p.ids
    assert len(ids) == context_len and ids[0] == 0 and ids[-1] == SPEC.node(p.query_key)
    facts = {i: t for i, t in enumerate(ids) if SPEC.first_fact_id <= t < SPEC.first_fact_id + 128 * 128}
    assert sorted(facts) == sorted(p.fact_positions.values()) and len(facts) == 128  # one fact per key
    assert max(facts) <= context_len - 2048 - 2  # beyond the last index_topk tokens, for target and draft
    succ = {}
    for t in facts.values():
        k, v = divmod(t - SPEC.first_fact_id, 128)
        succ[k] = v
    assert sorted(succ.values()) == list(range(128))  # a permutation of the keys
    assert all(t in SPEC.filler_ids() for i, t in enumerate(ids[1:-1], 1) if i not in facts)
    chain = [p.query_key]
    for _ in range(40):
        chain.append(succ[chain[-1]])
    assert p.chain == chain and p.expected_ids == [SPEC.node(k) for k in chain[1:]]
    hops = [(SPEC.group_of[a], SPEC.group_of[b]) for a, b in zip(chain, chain[1:], strict=False)]
    if workload == "same-target":
        assert all(a == b for a, b in hops)
    else:
        assert all(a != b for a, b in hops)
        assert len({SPEC.group_of[k] for k in chain}) == 8
    assert p.row_fields() == {"task": workload, "prompt_id": 1, "expected_ids": p.expected_ids}


def test_prompts_are_seeded() -> None:
    a = task_prompt(SPEC, "moving-target", 4096, 0, seed=0)
    assert a == task_prompt(SPEC, "moving-target", 4096, 0, seed=0)
    assert a.ids != task_prompt(SPEC, "moving-target", 4096, 1, seed=0).ids
    assert a.ids != task_prompt(SPEC, "moving-target", 4096, 0, seed=1).ids
    assert a.ids != task_prompt(SPEC, "same-target", 4096, 0, seed=0).ids


def test_512k_prompt_and_fewer_groups() -> None:
    p = task_prompt(SPEC, "moving-target", 524288, 0, max_new_tokens=8)
    assert len(p.ids) == 524288 and max(p.fact_positions.values()) <= 524288 - 2050
    q = task_prompt(SPEC, "moving-target", 4096, 0, groups=2, facts_per_group=3, max_new_tokens=12)
    assert len(q.fact_positions) == 6 and len({SPEC.group_of[k] for k in q.chain}) == 2
    assert all(SPEC.group_of[a] != SPEC.group_of[b] for a, b in zip(q.chain, q.chain[1:], strict=False))
    s = task_prompt(SPEC, "same-target", 4096, 0, groups=1, facts_per_group=2, max_new_tokens=5)
    assert len(set(s.chain)) == 2


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"workload": "same-target", "context_len": 2100}, "fact depth beyond the context"),
        ({"workload": "moving-target", "context_len": 2177}, "use context_len >= 2178"),
        ({"workload": "moving-target", "context_len": 4096, "groups": 1}, "at least 2 groups"),
        (
            {"workload": "same-target", "context_len": 4096, "facts_per_group": 1},
            "at least 2 facts per group",
        ),
        ({"workload": "same-target", "context_len": 4096, "groups": 9}, "8 groups of 16 keys"),
        ({"workload": "random", "context_len": 4096}, "unknown task workload"),
        ({"workload": "same-target", "context_len": 600000}, "outside"),
        ({"workload": "same-target", "context_len": 4096, "max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_refusals_name_cause_and_fix(kwargs: dict, needle: str) -> None:
    kw = {"prompt_id": 0, **kwargs}
    with pytest.raises(KitError) as e:
        task_prompt(SPEC, **kw)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_small_context_fits_when_facts_are_few() -> None:
    p = task_prompt(SPEC, "moving-target", 2178, 0)  # 128 facts in positions 1..128: exactly fits
    assert sorted(p.fact_positions.values()) == list(range(1, 129))


def test_scoring() -> None:
    assert accuracy([1, 2, 3, 4], [1, 2, 9, 4]) == 0.75
    assert accuracy([1, 2, 3, 4], [1, 2]) == 0.5
    row = {"prompt_id": 0, "expected_ids": [1, 2, 3], "output_ids": [1, 5, 3]}
    assert score_row(row) == {"correct": False, "accuracy": 2 / 3, "first_error": 1}
    assert score_row({**row, "output_ids": [1, 2, 3]}) == {
        "correct": True,
        "accuracy": 1.0,
        "first_error": None,
    }
    with pytest.raises(KitError, match="expected_ids"):
        score_row({"prompt_id": 3, "output_ids": [1]})


@pytest.mark.parametrize("workload", ["same-target", "moving-target", "any-slot"])
def test_the_sglang_backend_sends_the_task_prompts(workload: str) -> None:
    """`kit run --backend sglang --workload same-target|moving-target|any-slot` sends exactly these prompts
    and judges the rows against their chains (the model directory's task.json is the spec)."""
    from task_helpers import task_checkpoint

    from kit.backends.sglang.workload import get_workload, workload_names

    assert {"same-target", "moving-target", "any-slot"} <= set(workload_names())
    ckpt, _ = task_checkpoint()
    got = get_workload(workload).prompt(None, 8192, 3, 7, {"path": str(ckpt), "index_topk": 2048}, 24)
    want = task_prompt(ckpt, workload, 8192, 3, 7, max_new_tokens=24)
    assert got.input_ids == list(want.ids) and got.expected_ids == list(want.expected_ids)
    assert len(got.expected_ids) == 24


# Prompts of the two older workloads are committed (H200 result sets): any change to how they are drawn would
# make those results unreproducible. sha256 (first 16 hex) of [ids, expected_ids, query_key, fact positions].
PINNED = {
    ("same-target", 4096, 0, 0): "f6cb3d4fb6280ffa",
    ("same-target", 65536, 7, 0): "00fa8d89d41d3ecc",
    ("same-target", 8192, 2, 1): "d7b4b952126592c4",
    ("moving-target", 4096, 0, 0): "e5289945306001f0",
    ("moving-target", 65536, 7, 0): "d4f1d07b3111c771",
    ("moving-target", 8192, 2, 1): "1214bb628eb01a1f",
}


@pytest.mark.parametrize("key", list(PINNED))
def test_older_workloads_prompts_are_unchanged(key: tuple[str, int, int, int]) -> None:
    import hashlib
    import json

    wl, ctx, pid, seed = key
    p = task_prompt(SPEC, wl, ctx, pid, seed, max_new_tokens=96)
    blob = json.dumps([p.ids, p.expected_ids, p.query_key, sorted(p.fact_positions.items())]).encode()
    assert hashlib.sha256(blob).hexdigest()[:16] == PINNED[key]


@pytest.mark.parametrize("context_len, prompt_id", [(8192, 0), (8192, 5), (65536, 3)])
def test_any_slot_layout(context_len: int, prompt_id: int) -> None:
    """Two groups of 14 chain keys, one cycle (13 hops inside a group, then a change); the group's other 2
    keys are decoys f(d->d); each visited group holds 1792..2040 entries, all before the last 2049 tokens."""
    p = task_prompt(SPEC, "any-slot", context_len, prompt_id, max_new_tokens=70)
    assert len(p.ids) == context_len and p.ids[-1] == SPEC.node(p.query_key)
    chain = p.chain
    groups = [SPEC.group_of[k] for k in chain]
    assert len(set(chain[:28])) == 28 and chain[28] == chain[0] and len(set(groups)) == 2
    changes = [i for i in range(70) if groups[i] != groups[i + 1]]
    assert len(changes) == 5 and all(b - a == 14 for a, b in zip(changes, changes[1:], strict=False))
    entries: dict[int, list[int]] = {}
    for pos, t in enumerate(p.ids):
        if SPEC.first_fact_id <= t < SPEC.first_fact_id + 128 * 128:
            k, v = divmod(t - SPEC.first_fact_id, 128)
            entries.setdefault(SPEC.group_of[k], []).append(pos)
            if k in p.fact_positions:
                assert p.fact_positions[k] == pos and SPEC.node(v) == p.expected_ids[chain.index(k)]
            else:  # a decoy: its own key, in a visited group, never in the chain
                assert v == k and k not in chain and SPEC.group_of[k] in groups
    assert set(entries) == set(groups)
    assert all(1792 <= len(e) <= 2040 and max(e) <= context_len - 2050 for e in entries.values())
    assert sorted(p.fact_positions) == sorted(set(chain))


def test_any_slot_needs_8192() -> None:
    with pytest.raises(KitError) as e:
        task_prompt(SPEC, "any-slot", 8191, 0)
    assert "any-slot needs context_len >= 8192" in str(e.value) and "\n" not in str(e.value)
    assert task_prompt(SPEC, "any-slot", 8192, 0).ids != task_prompt(SPEC, "any-slot", 8192, 1).ids
