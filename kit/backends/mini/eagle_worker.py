"""EAGLE/MTP speculative decoding (sglang speculative/eagle_worker_v2.py): draft, verify, draft_extend.

EagleDraftWorker.draft_forward mirrors 0.5.14 line by line where it matters: when
index_share_for_mtp_iteration is on it sets the reuse gate and clears the carrier before the loop; the
loop runs num_steps iterations, each recording the current draft token and breaking before the last
forward (so num_steps - 1 draft-model forwards per round); every forward goes through the
EagerRunner, which shallow-copies the ForwardBatch; after the loop the gate and carrier are reset.
The first draft token of a round comes from the previous draft_extend (spec_info.topk_index).

Greedy chain drafting (EAGLE topk 1): num_steps draft tokens; the target verifies the root (last
verified token) + the drafts in one forward; the longest prefix where draft == target argmax is
accepted, plus the target's token after it (the bonus). Output tokens are the target's argmax only,
so they cannot depend on the draft (lossless). draft_extend then runs the draft model over the
verified block with the target's hidden states, as its own forward outside the draft round.

Every target forward also scores its greedy choice the way sglang's logprobs report it (`greedy_scores`):
the chosen token's logprob and its margin over the runner-up, per output token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kit.backends.mini.deepseek_nextn import DeepseekV3ForCausalLMNextN
from kit.backends.mini.eager_runner import EagerRunner
from kit.backends.mini.eagle_info import EagleDraftInput, EagleVerifyInput
from kit.backends.mini.forward_batch_info import ForwardBatch, ForwardMode
from kit.backends.mini.index_topk_share import index_share_for_mtp_iteration
from kit.backends.mini.mistakes import FIX, Mistakes, WorkerState
from kit.backends.mini.model import DeepseekV32ForCausalLM
from kit.probe import ranges as nr

if TYPE_CHECKING:
    from kit.backends.mini.task_model import TaskNextN, TaskTarget


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class EagleDraftWorker:
    def __init__(
        self,
        draft_model: DeepseekV3ForCausalLMNextN | TaskNextN,
        draft_runner: EagerRunner,
        num_steps: int,
        eagle_topk: int,
        arm: str,
        device: torch.device,
        mistakes: Mistakes = FIX,
    ):
        self.draft_model = draft_model
        self.draft_runner = draft_runner
        self.speculative_num_steps = num_steps
        self.topk = eagle_topk
        self.carrier = draft_model.carrier
        self.state = WorkerState(mistakes, self.carrier, num_steps)
        self.index_share_for_mtp_iteration = index_share_for_mtp_iteration(arm, eagle_topk)
        self.device = device
        self.cuda_graph_runner = None  # set by the engine when cuda_graph is on
        self.round_wall_s: list[float] = []
        self.round_indexer_calls: list[int] = []

    def draft_forward(self, forward_batch: ForwardBatch) -> torch.Tensor:
        """One draft round: returns the num_steps draft tokens [B, num_steps]. Graph-capturable.

        `self.state` makes a mutant's mistakes around each step (kit.backends.mini.mistakes); for the
        arms it does nothing."""
        spec_info = forward_batch.spec_info
        share, clear = self.index_share_for_mtp_iteration, self.state.m.clear_per_round
        if share:
            self.carrier.set_gate(forward_batch, True)
            if clear:
                self.carrier.put(forward_batch, None)
        base_positions = forward_batch.seq_lens[:, None]
        token = spec_info.topk_index  # [B, 1], chosen by the previous draft_extend
        tokens = []
        for i in range(self.speculative_num_steps):
            tokens.append(token)
            if i == self.speculative_num_steps - 1:
                break
            forward_batch.input_ids = token
            forward_batch.positions = base_positions + i
            if share:
                self.state.before_step(forward_batch, i)
            with nr.annotate(nr.STEP):
                logits, hidden = self.draft_runner.forward(forward_batch)
            if share:
                self.state.after_step(forward_batch, i)
            spec_info.hidden_states = hidden
            token = torch.argmax(logits[:, -1, :], dim=-1, keepdim=True)
        if share:
            self.state.end_of_round(forward_batch)
            self.carrier.set_gate(forward_batch, False)
            if clear:
                self.carrier.put(forward_batch, None)
        return torch.cat(tokens, dim=1)

    def draft(self, forward_batch: ForwardBatch) -> torch.Tensor:
        """A timed draft round inside the `draft_round` range: eager draft_forward or one graph replay."""
        indexer = self.draft_model.indexer
        calls = indexer.calls
        _sync(self.device)
        t0 = time.perf_counter()
        with nr.annotate(nr.ROUND):
            if self.cuda_graph_runner is not None:
                out = self.cuda_graph_runner.replay(forward_batch)
            else:
                out = self.draft_forward(forward_batch)
        _sync(self.device)
        self.round_wall_s.append(time.perf_counter() - t0)
        self.round_indexer_calls.append(indexer.calls - calls)
        return out

    def draft_extend(self, forward_batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        with nr.annotate(nr.EXTEND):
            return self.draft_runner.forward(forward_batch)


def greedy_scores(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position: the argmax token's logprob, and its margin (top-1 minus top-2 logprob)."""
    logits = logits.float()
    top2 = torch.topk(logits, 2, dim=-1).values
    return top2[..., 0] - torch.logsumexp(logits, dim=-1), top2[..., 0] - top2[..., 1]


@dataclass
class RoundResult:
    draft_tokens: torch.Tensor  # [B, num_steps]
    target_ids: torch.Tensor  # [B, num_steps + 1] the target's argmax at each block position
    accept: torch.Tensor  # [B] accepted draft tokens (0..num_steps); the round emits accept + 1 tokens
    logprobs: torch.Tensor | None = None  # [B, num_steps + 1] logprob of each target_ids token
    margins: torch.Tensor | None = None  # [B, num_steps + 1] its top-1 minus top-2 logprob


@dataclass
class Verified:
    target_ids: torch.Tensor  # [B, n + 1]
    accept: torch.Tensor  # [B]
    hidden: torch.Tensor  # [B, n + 1, H]
    logprobs: torch.Tensor  # [B, n + 1]
    margins: torch.Tensor  # [B, n + 1]


class EAGLEWorkerV2:
    """Drives one batch: prefill, then rounds of draft -> verify -> draft_extend."""

    def __init__(
        self,
        target: DeepseekV32ForCausalLM | TaskTarget,
        draft_worker: EagleDraftWorker,
        device: torch.device,
    ):
        self.target = target
        self.draft_worker = draft_worker
        self.num_steps = draft_worker.speculative_num_steps
        self.device = device
        self.first_scores: tuple[torch.Tensor, torch.Tensor] | None = None  # prefill's: greedy_scores [B]

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, chunk: int) -> tuple[EagleDraftInput, torch.Tensor]:
        """Build both models' caches for the prompts [B, P]; returns spec_info and seq_lens (= P).

        Slots 0..P-2 by the cheap path (kit/mini/model.py), chunked; the last prompt token by the real
        target forward (-> first output token, the root of round 1) and the real MTP forward (-> the
        first draft token of round 1 and the draft hidden state).
        """
        B, P = input_ids.shape
        draft = self.draft_worker.draft_model
        with nr.annotate(nr.PREFILL):
            for s in range(0, P - 1, chunk):
                e = min(P - 1, s + chunk)
                pos = torch.arange(s, e, device=self.device).expand(B, -1)
                h = self.target.fill_prefill_cache(input_ids[:, s:e], pos)
                draft.fill_prefill_cache(input_ids[:, s + 1 : e + 1], h, pos)
            last = torch.full((B, 1), P - 1, dtype=torch.long, device=self.device)
            committed = last[:, 0]
            fb = ForwardBatch(ForwardMode.EXTEND, B, input_ids[:, P - 1 :], last, committed)
            logits, hidden = self.target.forward(fb)
            first = torch.argmax(logits[:, -1], dim=-1)  # [B]
            self.first_scores = greedy_scores(logits[:, -1])
            spec_info = EagleDraftInput(hidden_states=hidden, topk_index=first[:, None], verified_id=first)
            fb = ForwardBatch(
                ForwardMode.DRAFT_EXTEND, B, first[:, None], last, committed, spec_info=spec_info
            )
            logits, hidden = self.draft_worker.draft_extend(fb)
            spec_info.hidden_states = hidden
            spec_info.topk_index = torch.argmax(logits[:, -1], dim=-1, keepdim=True)
        return spec_info, torch.full((B,), P, dtype=torch.long, device=self.device)

    @torch.no_grad()
    def verify(
        self, spec_info: EagleDraftInput, draft_tokens: torch.Tensor, seq_lens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Target forward over [root, drafts]: returns (target argmax [B, n+1], accept [B], hidden)."""
        v = self.verify_scored(spec_info, draft_tokens, seq_lens)
        return v.target_ids, v.accept, v.hidden

    @torch.no_grad()
    def verify_scored(
        self, spec_info: EagleDraftInput, draft_tokens: torch.Tensor, seq_lens: torch.Tensor
    ) -> Verified:
        """`verify`, plus each target token's logprob and margin."""
        with nr.annotate(nr.VERIFY):
            ids = torch.cat([spec_info.verified_id[:, None], draft_tokens], dim=1)
            positions = seq_lens[:, None] + torch.arange(ids.shape[1], device=self.device)
            fb = ForwardBatch(ForwardMode.TARGET_VERIFY, ids.shape[0], ids, positions, seq_lens)
            leaked = self.draft_worker.state.round_topk
            if leaked is not None:  # a mutant's mistake: the draft's top-k handed to the target
                fb.spec_info = EagleVerifyInput(draft_token=draft_tokens, draft_topk_indices=leaked)
            logits, hidden = self.target.forward(fb)
            target_ids = torch.argmax(logits, dim=-1)
            match = (draft_tokens == target_ids[:, :-1]).to(torch.long)
            accept = torch.cumprod(match, dim=1).sum(dim=1)
            logprobs, margins = greedy_scores(logits)
        return Verified(target_ids, accept, hidden, logprobs, margins)

    @torch.no_grad()
    def forward_batch_generation(
        self, spec_info: EagleDraftInput, seq_lens: torch.Tensor, done: torch.Tensor
    ) -> tuple[RoundResult, torch.Tensor, EagleDraftInput]:
        """One round: the result, the new seq_lens, and the next round's spec_info.

        Like sglang 0.5.14 (verify builds a new EagleDraftInput every round, draft_extend runs on its own
        EagleDraftExtendInput), the next round's spec_info is a fresh object: nothing a round leaves on
        its spec_info reaches the next round. Finished requests ride along (fixed batch shape, one CUDA
        graph) but commit nothing.
        """
        B = seq_lens.shape[0]
        draft_fb = ForwardBatch(
            ForwardMode.DECODE, B, spec_info.topk_index, seq_lens[:, None], seq_lens, spec_info=spec_info
        )
        draft_fb.req_pool_indices = self.req_pool_indices(B)
        hidden_before = spec_info.hidden_states
        draft_tokens = self.draft_worker.draft(draft_fb)
        v = self.verify_scored(spec_info, draft_tokens, seq_lens)
        target_ids, accept, target_hidden = v.target_ids, v.accept, v.hidden

        # draft_extend over the whole block (fixed shape); the slot at `accept` continues the chain.
        positions = seq_lens[:, None] + torch.arange(self.num_steps + 1, device=self.device)
        extend_info = EagleDraftInput(
            hidden_states=target_hidden, topk_index=spec_info.topk_index, verified_id=spec_info.verified_id
        )
        ext_fb = ForwardBatch(
            ForwardMode.DRAFT_EXTEND, B, target_ids, positions, seq_lens, spec_info=extend_info
        )
        logits, hidden = self.draft_worker.draft_extend(ext_fb)
        rows = torch.arange(B, device=self.device)
        keep = done[:, None]
        next_info = EagleDraftInput(
            hidden_states=torch.where(keep[:, :, None], hidden_before, hidden[rows, accept][:, None]),
            topk_index=torch.where(
                keep, spec_info.topk_index, torch.argmax(logits[rows, accept], -1)[:, None]
            ),
            verified_id=torch.where(done, spec_info.verified_id, target_ids[rows, accept]),
        )
        new_seq_lens = torch.where(done, seq_lens, seq_lens + accept + 1)
        return RoundResult(draft_tokens, target_ids, accept, v.logprobs, v.margins), new_seq_lens, next_info

    def req_pool_indices(self, batch_size: int) -> torch.Tensor:
        """Each request's slot in sglang's request pool: 1.. in batch order (ReqToTokenPool hands out slots
        from 1; slot 0 is the padding row CUDA-graph batches point at)."""
        return torch.arange(1, batch_size + 1, device=self.device)
