"""kit.task.reference on the default task checkpoint: the target answers through what its indexer selects,
the draft misses on purpose, and sharing the first draft step's top-k (the fix) costs acceptance only when
the answer moves to another group."""

from __future__ import annotations

import copy
import functools
import json
import math
from pathlib import Path

import pytest
import torch
from task_helpers import task_checkpoint, task_model

from kit import checkpoint as ck
from kit.errors import InputError, KitError
from kit.task import accuracy, task_prompt
from kit.task.forward import Attention, Numerics, read_safetensors, softmax_scale
from kit.task.reference import Session, TaskModel, generate, hop_accuracy, probe

NEW = 32
CONTEXTS = (4096, 8192)
WORKLOADS = ("same-target", "moving-target")


@functools.cache
def runs() -> dict[tuple[str, int, str], dict]:
    """Bug and fix arms (EAGLE 5/1/6) on one prompt per workload and context."""
    m, out = task_model(), {}
    for wl in WORKLOADS:
        for ctx in CONTEXTS:
            p = task_prompt(m.spec, wl, ctx, prompt_id=0, max_new_tokens=NEW)
            for arm in ("bug", "fix"):
                r = generate(m, p.ids, NEW, arm=arm, num_steps=5, num_draft_tokens=6)
                out[(wl, ctx, arm)] = {**r, "accuracy": accuracy(p.expected_ids, r["output_ids"])}
    return out


@pytest.mark.parametrize("ctx", CONTEXTS)
@pytest.mark.parametrize("wl", WORKLOADS)
def test_target_answers_the_task(wl: str, ctx: int) -> None:
    r = runs()[(wl, ctx, "bug")]
    assert r["accuracy"] >= 0.95 and r["completion_tokens"] == NEW
    assert r["output_ids"] == runs()[(wl, ctx, "fix")]["output_ids"]  # speculative decoding is lossless


@pytest.mark.parametrize("ctx", CONTEXTS)
def test_draft_misses_and_fix_costs_acceptance_only_on_moving_target(ctx: int) -> None:
    al = {(wl, arm): runs()[(wl, ctx, arm)]["accept_length"] for wl in WORKLOADS for arm in ("bug", "fix")}
    for wl in WORKLOADS:
        assert 3.0 < al[(wl, "bug")] < 5.9  # the draft is wrong for 2 keys of 16: below the maximum 6
        assert all(1 <= a <= 6 for a in runs()[(wl, ctx, "bug")]["accept_lens"])
    assert al[("same-target", "fix")] == pytest.approx(al[("same-target", "bug")], abs=0.05)
    assert al[("moving-target", "fix")] < al[("moving-target", "bug")] - 1.0
    assert max(runs()[("moving-target", ctx, "fix")]["accept_lens"]) <= 3  # d1, d2, then a miss


def test_plain_greedy_equals_speculative() -> None:
    m = task_model()
    p = task_prompt(m.spec, "moving-target", 4096, prompt_id=0, max_new_tokens=NEW)
    assert (
        generate(m, p.ids, NEW, speculative=False)["output_ids"]
        == runs()[("moving-target", 4096, "bug")]["output_ids"]
    )


@pytest.mark.parametrize("wl", WORKLOADS)
def test_wrong_target_topk_falls_to_chance(wl: str) -> None:
    """The facts are all beyond the last 2048 tokens: selecting those (or 2048 at random) loses them."""
    m = task_model()
    for ctx in CONTEXTS:
        p = task_prompt(m.spec, wl, ctx, prompt_id=0, max_new_tokens=NEW)
        last = generate(m, p.ids, NEW, speculative=False, target_topk="last")
        assert accuracy(p.expected_ids, last["output_ids"]) == 0.0
        assert set(last["output_ids"]) == {m.spec.unknown_id}
    p = task_prompt(m.spec, wl, 16384, prompt_id=0, max_new_tokens=NEW)
    rnd = generate(m, p.ids, NEW, speculative=False, target_topk="random", seed=1)
    assert accuracy(p.expected_ids, rnd["output_ids"]) <= 0.1  # one miss derails the chain
    hop = hop_accuracy(m, p.ids, p.expected_ids, "random")  # teacher-forced: ~ 2048 / 16384 per hop
    assert hop <= 0.35 and hop_accuracy(m, p.ids, p.expected_ids) == 1.0


def test_margins_survive_fp8_and_a_lost_yarn_mscale() -> None:
    m = task_model()
    p = task_prompt(m.spec, "same-target", 8192, prompt_id=0)
    got = probe(m, p.ids)
    assert got["attn_gap"] > 40 and got["attn_top_p"] > 0.9999 and got["logprob_margin"] > 10
    assert got["first_token"] == p.expected_ids[0]
    attn = m.layers[0].attn
    assert attn.scale == pytest.approx(192**-0.5 * (0.1 * math.log(128) + 1) ** 2)
    try:  # a config whose yarn mscale got lost: the softmax scale drops from 0.159 to 0.072
        attn.scale = 192**-0.5
        assert probe(m, p.ids)["attn_gap"] > 19  # still far above ln(2048) = 7.6
    finally:
        attn.scale = softmax_scale(m.cfg)


def test_fp8_emulation_changes_no_output() -> None:
    out, _ = task_checkpoint()
    m = TaskModel(out, Numerics(fp8_kv=False, fp8_index=False))
    for wl in WORKLOADS:
        p = task_prompt(m.spec, wl, 4096, prompt_id=0, max_new_tokens=NEW)
        r = generate(m, p.ids, NEW, arm="fix")
        assert r["output_ids"] == runs()[(wl, 4096, "fix")]["output_ids"]
        assert r["accept_lens"] == runs()[(wl, 4096, "fix")]["accept_lens"]


def test_per_token_prefill_shortcut_equals_the_full_prefill() -> None:
    """The shortcut (keys per distinct token) against every position through every layer, both caches."""
    m = copy.copy(task_model())
    p = task_prompt(m.spec, "moving-target", 2200, prompt_id=0, max_new_tokens=4)
    fast = Session(m, 2300)
    a = fast.prefill(p.ids)
    m.per_token_prefill = False
    full = Session(m, 2300)
    b = full.prefill(p.ids)
    n = len(p.ids)
    assert a[0] == b[0] == p.expected_ids[0] and a[3] == b[3]
    assert torch.equal(fast.tcache[0].latent[:n], full.tcache[0].latent[:n])
    assert torch.equal(fast.dcache.index_k[:n], full.dcache.index_k[:n])
    assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])


def test_reference_refuses_what_it_does_not_model() -> None:
    out, _ = task_checkpoint()
    w = read_safetensors(out / ck.WEIGHTS)
    cfg = json.loads((out / "config.json").read_text())
    w["model.layers.0.self_attn.q_b_proj.weight"][130, 0] = 1.0  # a query rope row: RoPE would matter
    with pytest.raises(KitError, match="RoPE"):
        Attention(w, "model.layers.0", cfg, Numerics())
    m = task_model()
    with pytest.raises(KitError, match="arm"):
        generate(m, [0, 1, 2], 4, arm="share")
    with pytest.raises(KitError, match="topk 1"):
        generate(m, [0, 1, 2], 4, num_steps=5, num_draft_tokens=8)


def test_a_checkpoint_without_task_json_is_refused_in_one_line(tmp_path: Path) -> None:
    """A checkpoint of `kit make-checkpoint DIR` without --task (config and weights, no task.json; the real
    one is the user case D115) and a missing folder: InputError naming task.json and the command that
    makes one, never FileNotFoundError."""
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text("{}")
    for path in (plain, tmp_path / "nosuch"):
        with pytest.raises(InputError, match=r"task\.json not found: .* \(kit make-checkpoint --task\)"):
            TaskModel(path)
