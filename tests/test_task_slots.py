"""kit.task.slots: the deciding lookups of the fix arm's rounds, their slots in the shared top-k (CPU
emulation: kernel_topk over the reference's draft index scores), and whether they spread over the top-k.

The check that matters for issue 32: on any-slot the deciding slots cover every quarter of the top-k (a
wrong fix corrupting any part of it changes acceptance); on same-target they sit in the first 16 slots."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from kit.backends.mini.task_model import _made
from kit.compare.share_model import PER_STEP, SHARED, verify_rounds
from kit.errors import KitError
from kit.task import task_prompt
from kit.task.reference import Session
from kit.task.slots import (
    deciding_slots,
    draft_rounds,
    hypergeometric_miss,
    reference_topk_of,
    spread,
)

# The CPU fuzzer's setting (mutation.CPU at any-slot's smallest context): 3 requests x 64 tokens.
CPU_SUITE = {"context_len": 8192, "requests": 3, "new": 64, "steps": 5}


@functools.cache
def _suite_slots(workload: str, context_len: int, requests: int, new: int) -> list[int]:
    m = _made(0)
    topk_of = reference_topk_of(m)
    out = []
    for pid in range(requests):
        p = task_prompt(m.spec, workload, context_len, pid, 0, max_new_tokens=new)
        out += [d.slot for d in deciding_slots(m.spec, p, 5, new, topk_of)]
    return out


def test_any_slot_deciding_slots_spread_over_every_quarter() -> None:
    """Over the CPU suite's prompts: every quarter of the slots holds >= 10% of the deciding slots, a random
    quarter of the slots misses all of them with P <= 1%, and every window of 512 slots holds one."""
    s = spread(_suite_slots("any-slot", CPU_SUITE["context_len"], CPU_SUITE["requests"], CPU_SUITE["new"]))
    assert s["min_quarter_share"] >= 0.10, s
    assert s["p_random_quarter_misses_all"] <= 0.01 and s["every_window_hit"] and s["holds"], s


def test_same_target_deciding_slots_cluster_in_the_first_16() -> None:
    """Today's same-target workload: the check above fails on it (the deciding facts are the group's 16, in
    slots 0..15), which is why a wrong fix corrupting slots >= 16 passed."""
    slots = _suite_slots("same-target", CPU_SUITE["context_len"], CPU_SUITE["requests"], CPU_SUITE["new"])
    assert slots and max(slots) < 16
    s = spread(slots)
    assert s["min_quarter_share"] == 0 and not s["every_window_hit"] and not s["holds"]


def test_reference_topk_of_is_the_draft_forwards_own_selection() -> None:
    """topk_of equals what the reference's draft forward selects for the round's first draft query."""
    m = _made(0)
    p = task_prompt(m.spec, "any-slot", 8192, 1, 0, max_new_tokens=8)
    sess = Session(m, len(p.ids) + 4)
    sess.prefill(p.ids)
    k = p.chain[1]
    _, _, used = sess.draft([m.spec.node(k)], torch.zeros(1, m.cfg["hidden_size"]), len(p.ids))
    row = reference_topk_of(m)(k, p)
    assert torch.equal(used[0], row)
    group = sorted(pos - 1 for pos, t in enumerate(p.ids) if _fact_group(m.spec, t) == m.spec.group_of[k])
    assert row[: len(group)].tolist() == group  # the group's entries first, in position order


def _fact_group(spec, token: int) -> int | None:
    k = token - spec.first_fact_id
    return spec.group_of[k // spec.n_keys] if 0 <= k < spec.n_keys**2 else None


def test_draft_rounds_walk_is_the_share_models() -> None:
    """verify_rounds counts draft_rounds; deciding lookups are the right steps >= 3 of shared rounds."""
    m = _made(0)
    p = task_prompt(m.spec, "any-slot", 8192, 2, 0, max_new_tokens=64)
    for shared, how in ((False, PER_STEP), (True, SHARED)):
        rounds = draft_rounds(m.spec, p.expected_ids, 5, 64, shared)
        assert rounds is not None and len(rounds) == verify_rounds(m.spec, p.expected_ids, 5, 64, how)
        assert sum(sum(s.right for s in r) + 1 for r in rounds) + 1 >= 64
        for r in rounds:
            assert all(s.right for s in r[:-1]) and [s.step for s in r] == list(range(1, len(r) + 1))
    dec = deciding_slots(m.spec, p, 5, 64, reference_topk_of(m))
    shared_rounds = draft_rounds(m.spec, p.expected_ids, 5, 64, True)
    assert [(d.round, d.step) for d in dec] == [
        (s.round, s.step) for r in shared_rounds for s in r if s.step >= 3 and s.right
    ]
    assert all(m.spec.group_of[d.key] == m.spec.group_of[shared_rounds[d.round][0].shared_key] for d in dec)


def test_spread_arithmetic() -> None:
    assert hypergeometric_miss(1, 512) == pytest.approx(1536 / 2048)
    assert hypergeometric_miss(3, 512) == pytest.approx(math.comb(2045, 512) / math.comb(2048, 512))
    assert hypergeometric_miss(1537, 512) == 0.0
    s = spread([0, 511, 1023, 1535, 2047, 2047])
    assert s["per_quarter"] == [2, 1, 1, 2] and s["distinct"] == 5 and s["largest_gap"] == 511
    assert s["every_window_hit"] and s["largest_gap_at"] == 512
    t = spread([100, 200])
    assert t["largest_gap"] == 1847 and t["largest_gap_at"] == 201 and not t["every_window_hit"]
    with pytest.raises(KitError):
        spread([2048])


def test_the_h200_script_runs_end_to_end_on_the_torch_stand_in(tmp_path) -> None:
    """scripts/topk_slots.py through ReferenceKernels (the code path the H200 runs with sglang's kernels):
    a complete JSON with provenance, rows compared, deciding slots; an existing output is refused in one
    line (exit 2), as is --kernels sglang where no GPU is."""
    import json
    import subprocess
    import sys

    from task_helpers import task_checkpoint

    from kit.paths import REPO

    ckpt, _ = task_checkpoint()
    out = tmp_path / "slots.json"
    cmd = [sys.executable, str(REPO / "scripts" / "topk_slots.py"), str(out), "--checkpoint", str(ckpt)]
    small = ["--context-len", "8192", "--prompts", "2", "--max-new-tokens", "64"]
    res = subprocess.run([*cmd, "--kernels", "torch", *small], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    assert doc["complete"] and {"kit_git_sha", "torch", "gpu", "kernels", "date"} <= set(doc["provenance"])
    s = doc["summary"]
    assert s["rows"] > 0 and s["rows_equal_emulation"] == s["rows"] == s["rows_equal_cpu_reference"]
    assert [len(p["deciding"]) for p in doc["prompts"]] == [23, 27] and s["deciding_slots_equal_emulation"]
    assert len(doc["prompts"][0]["full_row"]["kernel"]) == 2048 and "holds from" in res.stdout
    again = subprocess.run([*cmd, "--kernels", "torch", *small], capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "exists" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    if not torch.cuda.is_available():
        gpu_cmd = [*cmd[:2], str(tmp_path / "gpu.json"), *cmd[3:], *small]
        gpu = subprocess.run(gpu_cmd, capture_output=True, text=True, timeout=60)
        assert gpu.returncode == 2 and "--kernels sglang" in gpu.stderr and "Traceback" not in gpu.stderr
