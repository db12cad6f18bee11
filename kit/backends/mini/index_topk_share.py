"""Where each arm carries the draft indexer's top-k between draft steps: the ONLY thing the arms change.

Named after sglang's later layers/attention/index_topk_share.py. The gate, its setting and clearing in
draft_forward, the read-before / write-after in the NextN forward and the indexer skip are the same
code for every arm; an arm only names the attribute that holds the indices and the gate's name:

| arm       | sglang                          | gate on ForwardBatch       | carrier                      |
|-----------|---------------------------------|----------------------------|------------------------------|
| off       | fix, config flag false          | (never set)                | spec_info.mtp_topk_indices   |
| bug       | 0.5.14 as released              | reuse_mtp_topk_indices     | forward_batch.topk_indices   |
| fix       | 0.5.14 + PR #29654              | reuse_mtp_topk_indices     | spec_info.mtp_topk_indices   |
| upstream  | 0.5.15 naming                   | reuse_dsa_topk_indices     | spec_info.dsa_topk_indices   |

The bug arm's carrier lives on the ForwardBatch, which EagerRunner.load_batch shallow-copies for every
draft step: the write-back lands on the copy and the next step reads None.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kit.backends.mini.forward_batch_info import ForwardBatch


@dataclass(frozen=True)
class TopkCarrier:
    arm: str
    gate_attr: str  # the ForwardBatch flag draft_forward sets
    on_spec_info: bool  # False: the indices live on the ForwardBatch itself (the bug)
    attr: str

    def _holder(self, forward_batch: ForwardBatch) -> object:
        return forward_batch.spec_info if self.on_spec_info else forward_batch

    def gate(self, forward_batch: ForwardBatch) -> bool:
        return bool(getattr(forward_batch, self.gate_attr))

    def set_gate(self, forward_batch: ForwardBatch, on: bool) -> None:
        setattr(forward_batch, self.gate_attr, on)

    def get(self, forward_batch: ForwardBatch) -> torch.Tensor | None:
        return getattr(self._holder(forward_batch), self.attr)

    def put(self, forward_batch: ForwardBatch, value: torch.Tensor | None) -> None:
        setattr(self._holder(forward_batch), self.attr, value)


CARRIERS: dict[str, TopkCarrier] = {
    "off": TopkCarrier("off", "reuse_mtp_topk_indices", True, "mtp_topk_indices"),
    "bug": TopkCarrier("bug", "reuse_mtp_topk_indices", False, "topk_indices"),
    "fix": TopkCarrier("fix", "reuse_mtp_topk_indices", True, "mtp_topk_indices"),
    "upstream": TopkCarrier("upstream", "reuse_dsa_topk_indices", True, "dsa_topk_indices"),
}


def index_share_for_mtp_iteration(arm: str, eagle_topk: int) -> bool:
    """sglang: getattr(hf_config, "index_share_for_mtp_iteration", False) and topk == 1; off: flag false."""
    return arm != "off" and eagle_topk == 1
