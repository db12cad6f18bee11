"""The PR #29654 mechanism in the mini engine: where the draft indexer's top-k goes, and what it costs."""

from __future__ import annotations

import sqlite3

import pytest
import torch

from kit.backends.mini.__main__ import run
from kit.backends.mini.eager_runner import EagerRunner
from kit.backends.mini.engine import Engine, cpu_threads
from kit.backends.mini.forward_batch_info import ForwardBatch, ForwardMode
from kit.backends.mini.params import validate
from kit.probe import ranges as nr

NUM_STEPS = 5


class RecordingRunner(EagerRunner):
    """EagerRunner that remembers every batch it hands the model and the carrier's value at that moment."""

    def __init__(self, model, copy_batch: bool):
        super().__init__(model, copy_batch)
        self.loads: list[dict] = []

    def load_batch(self, forward_batch: ForwardBatch) -> ForwardBatch:
        batch = super().load_batch(forward_batch)
        carrier = self.model.carrier
        self.loads.append(
            {"batch": batch, "gate": carrier.gate(batch), "carrier_at_load": carrier.get(batch)}
        )
        return batch


def _draft_round(
    arm: str,
    copy_batch: bool = True,
    eagle_topk: int = 1,
    num_steps: int = NUM_STEPS,
    context: int = 512,
    spy=None,
):
    """Prefill a small batch, then run ONE draft_forward through a RecordingRunner."""
    nr.configure("off")
    params = validate(
        {
            "arm": arm,
            "context_len": context,
            "num_requests": 2,
            "max_new_tokens": 8,
            "num_steps": num_steps,
            "nvtx_sink": "off",
        }
    )
    # set past validation: kit run refuses topk != 1 for the sharing arms (kit.arms.check_eagle_topk), while
    # the engine itself follows sglang's rule (no sharing unless topk == 1), which a test here checks
    params.eagle_topk = eagle_topk
    engine = Engine(params, copy_batch=copy_batch)
    ids = torch.tensor([p.input_ids for p in engine.prompts])
    spec_info, seq_lens = engine.worker.prefill(ids, engine.preset.prefill_chunk)
    runner = RecordingRunner(engine.draft, copy_batch)
    engine.draft_worker.draft_runner = runner
    if spy is not None:
        spy(engine)
    fb = ForwardBatch(
        ForwardMode.DECODE, 2, spec_info.topk_index, seq_lens[:, None], seq_lens, spec_info=spec_info
    )
    before = engine.draft.indexer.calls
    with torch.no_grad(), cpu_threads(engine.device):
        tokens = engine.draft_worker.draft_forward(fb)
    return engine, fb, runner, engine.draft.indexer.calls - before, tokens


def test_bug_write_back_lands_on_the_runner_copy_and_is_lost():
    engine, fb, runner, calls, tokens = _draft_round("bug")
    assert tokens.shape == (2, NUM_STEPS)
    assert len(runner.loads) == NUM_STEPS - 1  # sglang's loop breaks before the last forward
    for load in runner.loads:
        assert load["batch"] is not fb  # a shallow copy per step ...
        assert load["batch"].spec_info is fb.spec_info  # ... sharing spec_info by reference
        assert load["gate"] is True  # the gate was on: reuse was requested
        assert load["carrier_at_load"] is None  # but every step found nothing to reuse
        assert load["batch"].topk_indices is not None  # because each write went to its own copy
    assert calls == NUM_STEPS - 1


def test_bug_reuses_when_load_batch_does_not_copy():
    """Same arm, same code, only load_batch changed: the write-back survives and the indexer runs once."""
    _, fb, runner, calls, _ = _draft_round("bug", copy_batch=False)
    assert all(load["batch"] is fb for load in runner.loads)
    assert runner.loads[0]["carrier_at_load"] is None
    reused = [load["carrier_at_load"] for load in runner.loads[1:]]
    assert all(r is not None and r is reused[0] for r in reused)
    assert calls == 1


@pytest.mark.parametrize("arm,attr", [("fix", "mtp_topk_indices"), ("upstream", "dsa_topk_indices")])
def test_fix_write_back_on_spec_info_survives_the_copy(arm: str, attr: str):
    engine, fb, runner, calls, _ = _draft_round(arm)
    assert all(load["batch"] is not fb for load in runner.loads)  # still copied
    assert runner.loads[0]["carrier_at_load"] is None
    reused = [load["carrier_at_load"] for load in runner.loads[1:]]
    assert all(r is not None and r is reused[0] for r in reused)  # step 0's top-k, reused as is
    assert reused[0].shape == (2, 1, min(2048, engine.max_len))  # [B, T, top-k width]
    assert calls == 1
    assert getattr(fb.spec_info, attr) is None  # cleaned up after the loop


@pytest.mark.parametrize("context,equal", [(512, True), (4096, False)])
def test_reused_top_k_equals_recomputed_only_when_everything_fits(context: int, equal: bool):
    """Recompute (off) every step; compare each step's top-k with the first step's (what reuse keeps)."""
    seen: list[torch.Tensor] = []

    def spy(engine):
        indexer = engine.draft.indexer
        forward = indexer.forward

        def recording_forward(*args, **kwargs):
            out = forward(*args, **kwargs)
            seen.append(out)
            return out

        indexer.forward = recording_forward

    _draft_round("off", context=context, spy=spy)
    assert len(seen) == NUM_STEPS - 1
    assert all(torch.equal(s, seen[0]) for s in seen) is equal


def test_off_never_sets_the_gate_and_recomputes():
    _, _, runner, calls, _ = _draft_round("off")
    assert not any(load["gate"] for load in runner.loads)
    assert calls == NUM_STEPS - 1


@pytest.mark.parametrize("arm", ["bug", "fix", "upstream"])
def test_gate_and_carrier_are_reset_after_the_loop(arm: str):
    _, fb, _, _, _ = _draft_round(arm)
    assert not fb.reuse_mtp_topk_indices and not fb.reuse_dsa_topk_indices
    assert (
        fb.topk_indices is None
        and fb.spec_info.mtp_topk_indices is None
        and fb.spec_info.dsa_topk_indices is None
    )


def test_eagle_topk_other_than_one_disables_sharing():
    engine, _, runner, calls, _ = _draft_round("fix", eagle_topk=2)
    assert not engine.draft_worker.index_share_for_mtp_iteration
    assert not any(load["gate"] for load in runner.loads)
    assert calls == NUM_STEPS - 1


@pytest.mark.parametrize("num_steps", [2, 3, 7])
def test_draft_forwards_per_round_is_num_steps_minus_one(num_steps: int):
    _, _, runner, calls, tokens = _draft_round("fix", num_steps=num_steps)
    assert len(runner.loads) == num_steps - 1 and tokens.shape[1] == num_steps
    assert calls == 1


def _ranges(db) -> list[tuple[int, int, int, str]]:
    con = sqlite3.connect(db)
    try:
        return con.execute(f"SELECT start, end, tid, name FROM {nr.RECORDER_TABLE} ORDER BY start").fetchall()
    finally:
        con.close()


@pytest.fixture
def recorder_reset():
    yield
    nr.configure("off")


@pytest.mark.parametrize(
    "arm,per_round", [("off", NUM_STEPS - 1), ("bug", NUM_STEPS - 1), ("fix", 1), ("upstream", 1)]
)
def test_recorder_counts_indexer_ranges_inside_each_draft_round(
    tmp_path, recorder_reset, arm: str, per_round: int
):
    """What the nsys analysis will count, through the recorder sink: indexer ranges nested in draft_round."""
    rows = run(
        {"arm": arm, "context_len": 3072, "num_requests": 2, "max_new_tokens": 12, "nvtx_sink": "recorder"},
        tmp_path,
    )
    ranges = _ranges(tmp_path / "recorder.sqlite")
    rounds = [r for r in ranges if r[3] == nr.ROUND]
    assert len(rounds) == max(r["spec_verify_ct"] for r in rows)

    def inside(name: str, rnd) -> int:
        return sum(1 for s, e, t, n in ranges if n == name and t == rnd[2] and rnd[0] <= s and e <= rnd[1])

    assert [inside(nr.INDEXER, r) for r in rounds] == [per_round] * len(rounds)
    assert [inside(nr.STEP, r) for r in rounds] == [NUM_STEPS - 1] * len(rounds)
    # verify (2 target layers) and draft_extend run the indexer too, outside the rounds
    names = [r[3] for r in ranges]
    assert names.count(nr.VERIFY) == len(rounds) and names.count(nr.EXTEND) == len(rounds) + 1  # + prefill's
    assert names.count(nr.INDEXER) == len(rounds) * (per_round + 2 + 1) + 2 + 1
    assert names.count(nr.PREFILL) == 1
