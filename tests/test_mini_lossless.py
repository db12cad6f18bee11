"""Speculative decoding in the mini engine is lossless in every arm, and the draft is useful.

Greedy output tokens must be identical across arms (the target decides every token) and identical to
plain greedy decoding with the target alone; draft tokens must be identical across arms while the
committed context stays <= index_topk (the indexer keeps every token, so reuse == recompute).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kit.backends.mini.engine import Engine, cpu_threads
from kit.backends.mini.params import MiniParams, validate
from kit.compare.equivalence import compare_runs
from kit.probe import ranges as nr

ARMS = ("off", "bug", "fix", "upstream")
CASES = {
    # context: (arms, num_requests, max_new_tokens); 32k kept short for CPU time
    512: (ARMS, 2, 24),
    4096: (("off", "bug", "fix"), 2, 24),
    32768: (("off", "bug", "fix"), 1, 12),
}


def _params(arm: str, context: int, num_requests: int, max_new: int) -> MiniParams:
    return validate(
        {
            "arm": arm,
            "context_len": context,
            "num_requests": num_requests,
            "max_new_tokens": max_new,
            "nvtx_sink": "off",
        }
    )


def greedy_reference(params: MiniParams) -> list[list[int]]:
    """Plain greedy decoding with the target alone: one new token per target forward (no drafts used).

    Uses the verify forward with dummy drafts (same shapes as in speculative runs) and keeps only the
    root's prediction, so every token is the target's argmax given the true prefix.
    """
    engine = Engine(params)
    with cpu_threads(engine.device):
        return _greedy(engine, params)


@torch.no_grad()
def _greedy(engine: Engine, params: MiniParams) -> list[list[int]]:
    B, n = params.num_requests, params.num_steps
    ids = torch.tensor([p.input_ids for p in engine.prompts])
    spec_info, seq_lens = engine.worker.prefill(ids, engine.preset.prefill_chunk)
    last = spec_info.verified_id
    out = [[t] for t in last.tolist()]
    dummy = torch.zeros(B, n, dtype=torch.long)
    while len(out[0]) < params.max_new_tokens:
        target_ids, _, _ = engine.worker.verify(SimpleNamespace(verified_id=last), dummy, seq_lens)
        last = target_ids[:, 0]
        for b, t in enumerate(last.tolist()):
            out[b].append(t)
        seq_lens = seq_lens + 1
    return out


@pytest.fixture(scope="module")
def runs() -> dict[int, dict[str, list[dict]]]:
    nr.configure("off")
    result: dict[int, dict[str, list[dict]]] = {}
    for context, (arms, num_requests, max_new) in CASES.items():
        result[context] = {}
        for arm in arms:
            rows, info = Engine(_params(arm, context, num_requests, max_new)).run()
            result[context][arm] = rows
        result[context]["reference"] = greedy_reference(_params("off", context, num_requests, max_new))
    return result


@pytest.mark.parametrize("context", sorted(CASES))
def test_outputs_identical_across_arms(runs, context: int):
    arms = CASES[context][0]
    for arm in arms[1:]:
        summary = compare_runs(runs[context][arms[0]], runs[context][arm])
        assert summary["all_identical"], (arm, summary["first_divergence"])
        assert summary["match_rate"] == 1.0


@pytest.mark.parametrize("context", sorted(CASES))
def test_outputs_equal_plain_greedy_decoding_of_the_target(runs, context: int):
    for arm in CASES[context][0]:
        assert [r["output_ids"] for r in runs[context][arm]] == runs[context]["reference"], arm


@pytest.mark.parametrize("context", sorted(CASES))
def test_every_request_decodes_max_new_tokens(runs, context: int):
    _, num_requests, max_new = CASES[context]
    for arm in CASES[context][0]:
        rows = runs[context][arm]
        assert len(rows) == num_requests
        for row in rows:
            assert row["completion_tokens"] == len(row["output_ids"]) == max_new
            assert len(row["draft_ids"]) == row["spec_verify_ct"]
            assert all(len(d) == 5 for d in row["draft_ids"])


def test_draft_tokens_identical_when_context_fits_index_topk(runs):
    """512 + 24 new tokens stays under index_topk 2048: the indexer keeps every token in every step."""
    for arm in ARMS[1:]:
        summary = compare_runs(runs[512]["off"], runs[512][arm])
        assert summary["draft_identical"] is True, arm
        assert summary["accept_length_diff"] == 0


@pytest.mark.parametrize("context", sorted(CASES))
def test_accept_length_is_reported_and_useful(runs, context: int):
    for arm in CASES[context][0]:
        rows = runs[context][arm]
        for row in rows:
            assert row["accept_length"] == pytest.approx(row["completion_tokens"] / row["spec_verify_ct"])
        pooled = sum(r["completion_tokens"] for r in rows) / sum(r["spec_verify_ct"] for r in rows)
        assert 1.5 < pooled <= 6, (arm, pooled)
