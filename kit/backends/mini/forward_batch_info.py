"""ForwardBatch: the per-forward bag of tensors, as in sglang's model_executor/forward_batch_info.py.

Mirrors the fields that matter to PR #29654. sglang 0.5.14 has `topk_indices` (where the NextN model
writes the indexer's top-k, the bug's carrier) and the gate `reuse_mtp_topk_indices`; the fix removes
`topk_indices`; 0.5.15 renames the gate `reuse_dsa_topk_indices`. The mini keeps all three so one class
serves every arm (the arm decides which is used: kit/mini/index_topk_share.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, auto
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from kit.backends.mini.eagle_info import EagleDraftInput, EagleVerifyInput


class ForwardMode(IntEnum):
    EXTEND = auto()  # prefill of the prompt
    TARGET_VERIFY = auto()  # the target model over the root + draft tokens
    DRAFT_EXTEND = auto()  # the draft model over the verified block, after verification
    DECODE = auto()  # one draft step inside draft_forward


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor  # [B, T]
    positions: torch.Tensor  # [B, T] absolute positions (cache slots) of the input tokens
    seq_lens: torch.Tensor  # [B] committed length of the cache this forward reads
    spec_info: EagleDraftInput | EagleVerifyInput | None = None
    # sglang 0.5.14 (removed by the fix): the NextN model's write-back of the draft indexer's top-k.
    topk_indices: torch.Tensor | None = None
    # The gate set by EagleDraftWorker.draft_forward when index_share_for_mtp_iteration is on.
    reuse_mtp_topk_indices: bool = False
    # sglang 0.5.15's name of the same gate (the `upstream` arm).
    reuse_dsa_topk_indices: bool = False
    # [B] each request's slot in the request pool (draft rounds only; a mutant keys a buffer by it)
    req_pool_indices: torch.Tensor | None = None
