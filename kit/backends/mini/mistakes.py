"""The mutants' mistakes as the mini makes them: each plausible wrong fix of PR #29654 that
kit/sglang_src/patches/mutants/<name>.patch writes into sglang 0.5.14, made here on the mini's copy of the
same code path (the draft loop, the NextN forward, the target's verify), so the gate can be shown to kill it.

A mutant runs on the `fix` arm (it is a wrong fix): every field below off is the fix itself. Where sglang's
mistake lives in a branch the mini does not have (forward_mla's CUDA-graph capture branch), the mini makes
the eager branch's behaviour, which is the only one a CPU run takes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from kit.backends.mini.corrupt import Corrupter, Corruption, resolve
from kit.backends.mini.forward_batch_info import ForwardBatch
from kit.backends.mini.index_topk_share import TopkCarrier
from kit.sglang_src.mutants import MUTANTS


@dataclass(frozen=True)
class Mistakes:
    """How a wrong fix departs from the fix arm, one field per kind of mistake."""

    clear_each_step: bool = False  # the carrier is cleared after every draft step
    clear_per_round: bool = True  # draft_forward clears the carrier before and after its loop
    # the NextN's indexer runs though a shared top-k is handed in: "always", or "eager" (not in a capture)
    indexer_despite_reuse: str | None = None
    # the draft worker keeps the top-k itself: "every" (updated after each step, handed to every step) or
    # "first" (the first one it ever sees, handed to the later steps; step 0 computes its own)
    worker_keeps: str | None = None
    slot_buffer: bool = False  # per-slot buffer written at rows req_pool_indices, read back as rows [:bs]
    topk_to_verify: bool = False  # the round's shared top-k is reused by the target's verify
    replace_spec_info: bool = False  # the top-k is written on a new spec_info set on the per-step copy
    # part of the shared top-k is corrupted for the later steps (kit.backends.mini.corrupt: a Corruption, or
    # the name of one of its NAMED ones, as the registry's rows say it)
    corrupt: Corruption | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "corrupt", resolve(self.corrupt))


FIX = Mistakes()
# Each mutant's mistake as the mini makes it, from its row of the one registry (kit.sglang_src.mutants: the
# H200 patch, what must kill it, and these fields).
MISTAKES: dict[str, Mistakes] = {name: Mistakes(**m.mini) for name, m in MUTANTS.items()}


def mistakes(name: str | None, corrupt: dict | None = None) -> Mistakes:
    """A run's mistakes: its mutant's (none: the fix), with params' `corrupt` (a Corruption's json) on top."""
    m = FIX if name is None else MISTAKES[name]
    return m if corrupt is None else dataclasses.replace(m, corrupt=Corruption.from_json(corrupt))


class ReplacedSpecInfoCarrier(TopkCarrier):
    """Writes the top-k into a NEW spec_info (dataclasses.replace) set on the ForwardBatch it is handed:
    inside a draft step that is the runner's per-step copy, so the write never reaches the loop's batch."""

    def put(self, forward_batch: ForwardBatch, value: torch.Tensor | None) -> None:
        forward_batch.spec_info = dataclasses.replace(forward_batch.spec_info, **{self.attr: value})


def carrier(base: TopkCarrier, m: Mistakes) -> TopkCarrier:
    """The carrier a mutant's NextN reads and writes (the fix arm's unless the mistake is where it writes)."""
    if m.replace_spec_info:
        return ReplacedSpecInfoCarrier(base.arm, base.gate_attr, base.on_spec_info, base.attr)
    return base


def despite_reuse(m: Mistakes, device: torch.device) -> bool:
    """Does the NextN run its indexer although a shared top-k was handed in?"""
    if m.indexer_despite_reuse == "always":
        return True
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    return m.indexer_despite_reuse == "eager" and not capturing


class WorkerState:
    """What a mutant's draft worker keeps between steps and rounds (sglang: attributes of
    EagleDraftWorker), and the hand-over around each draft step. For the fix: nothing."""

    def __init__(self, m: Mistakes, carrier: TopkCarrier, num_steps: int) -> None:
        self.m, self.carrier = m, carrier
        self.kept: torch.Tensor | None = None  # worker_keeps
        self.buffer: torch.Tensor | None = None  # slot_buffer: [slots, T, K], -1 = no index
        self.round_topk: torch.Tensor | None = None  # topk_to_verify: the last round's shared top-k
        self.corrupter = None if m.corrupt is None else Corrupter(m.corrupt, num_steps)

    def before_step(self, forward_batch: ForwardBatch, i: int) -> None:
        m = self.m
        if m.worker_keeps == "every":
            self.carrier.put(forward_batch, self.kept)
        elif m.worker_keeps == "first":
            self.carrier.put(forward_batch, None if i == 0 else self.kept)
        elif m.slot_buffer and i > 0:
            self.carrier.put(forward_batch, self.buffer[: forward_batch.batch_size])  # rows by batch position
        if self.corrupter is not None:
            self.corrupter.before_step(forward_batch, i, self.carrier)

    def after_step(self, forward_batch: ForwardBatch, i: int) -> None:
        m = self.m
        if m.worker_keeps == "every" or (m.worker_keeps == "first" and self.kept is None):
            self.kept = self.carrier.get(forward_batch)
        elif m.slot_buffer and i == 0:
            topk = self.carrier.get(forward_batch)
            slots = forward_batch.req_pool_indices
            if self.buffer is None:
                rows = int(slots.max()) + 1
                self.buffer = topk.new_full((rows, *topk.shape[1:]), -1)
            self.buffer[slots] = topk  # rows by pool slot
        if self.corrupter is not None:
            self.corrupter.after_step(forward_batch, i, self.carrier)
        if m.clear_each_step:
            self.carrier.put(forward_batch, None)

    def end_of_round(self, forward_batch: ForwardBatch) -> None:
        if self.m.topk_to_verify:
            self.round_topk = self.carrier.get(forward_batch)
        if self.corrupter is not None:
            self.corrupter.end_of_round()
