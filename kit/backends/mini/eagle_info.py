"""EagleDraftInput: the `spec_info` carried from round to round (sglang speculative/eagle_info.py).

It is one object shared BY REFERENCE by the draft loop's ForwardBatch and by every shallow copy that
EagerRunner.load_batch makes of it: that is why PR #29654 moves the top-k carrier here
(`mtp_topk_indices`); 0.5.15 calls the same field `dsa_topk_indices`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class EagleDraftInput:
    hidden_states: torch.Tensor  # [B, 1, H] draft hidden state feeding the next draft step
    topk_index: torch.Tensor  # [B, 1] the first draft token of the next round (from draft_extend)
    verified_id: torch.Tensor  # [B] the last verified (bonus) token: the root of the next round
    mtp_topk_indices: torch.Tensor | None = None  # PR #29654's carrier
    dsa_topk_indices: torch.Tensor | None = None  # sglang 0.5.15's name for it (`upstream` arm)


@dataclass
class EagleVerifyInput:
    """The target verify's `spec_info`. sglang's carries the draft tree; the mini's exists for one mutant,
    which hands the draft round's shared top-k on to the target (kit.backends.mini.mistakes)."""

    draft_token: torch.Tensor  # [B, num_steps]
    draft_topk_indices: torch.Tensor | None = None
