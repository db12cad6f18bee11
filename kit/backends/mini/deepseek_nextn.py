"""The MTP draft model (sglang models/deepseek_nextn.py, DeepseekV3ForCausalLMNextN).

x = eh_proj([enorm(embed(token)); hnorm(hidden)]), one DSA decoder layer, shared_head norm + head.
`hidden` comes from forward_batch.spec_info.hidden_states: the target's hidden states in draft_extend,
the previous draft step's output inside the draft loop.

The forward is where PR #29654 lives. Like sglang 0.5.14 it reads `prev_topk_indices` from the carrier
when the reuse gate is on (else None), hands it to the decoder layer (whose attention runs the indexer
only when it is None, like forward_mla's forward_absorb_prepare), and, with the gate on, writes the
layer's top-k back to the same carrier. Which attribute is "the carrier" is the arm's only difference
(kit/mini/index_topk_share.py): forward_batch.topk_indices (0.5.14, lost on the runner's copy) or
forward_batch.spec_info.mtp_topk_indices (the fix; spec_info is shared by reference).
"""

from __future__ import annotations

import torch

from kit.backends.mini.dsa_indexer import Indexer, Rope
from kit.backends.mini.forward_batch_info import ForwardBatch
from kit.backends.mini.index_topk_share import TopkCarrier
from kit.backends.mini.model import DecoderLayer, IndexerFactory, LayerCache, ModelWeights, rms_norm
from kit.backends.mini.presets import Preset


class DeepseekV3ForCausalLMNextN:
    def __init__(
        self,
        w: ModelWeights,
        p: Preset,
        index_topk: int,
        rope: Rope,
        window: int,
        carrier: TopkCarrier,
        make_indexer: IndexerFactory = Indexer,
    ):
        self.w = w
        self.p = p
        self.carrier = carrier
        # The decoder block is derived from the target's layer 0 (same tensors, own indexer counter).
        self.decoder = DecoderLayer(w.layers[0], p, index_topk, rope, window, make_indexer)

    @property
    def indexer(self):
        return self.decoder.indexer

    def attach_cache(self, cache: LayerCache) -> None:
        self.decoder.cache = cache

    def _input(self, input_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        eps = self.p.rms_norm_eps
        e = rms_norm(self.w.embed[input_ids], self.w.enorm, eps)
        hh = rms_norm(hidden, self.w.hnorm, eps)
        return torch.cat([e, hh], dim=-1) @ self.w.eh_proj.T

    def forward(self, forward_batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (logits [B, T, vocab], hidden [B, T, hidden]); with the reuse gate on, reads and writes
        the top-k carrier (as sglang: no write-back with the gate off)."""
        x = self._input(forward_batch.input_ids, forward_batch.spec_info.hidden_states)
        gate = self.carrier.gate(forward_batch)
        prev_topk_indices = self.carrier.get(forward_batch) if gate else None
        hidden, topk_indices = self.decoder.forward(
            x, forward_batch.positions, forward_batch, prev_topk_indices
        )
        if gate:
            self.carrier.put(forward_batch, topk_indices)
        return self.logits(hidden), hidden

    def fill_prefill_cache(
        self, next_ids: torch.Tensor, target_hidden: torch.Tensor, positions: torch.Tensor
    ):
        """Cheap prefill of the draft cache: slot j takes token j+1 and the target's hidden state at j."""
        self.decoder.fill_prefill_cache(self._input(next_ids, target_hidden), positions)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden, self.w.shared_head_norm, self.p.rms_norm_eps) @ self.w.lm_head.T
