"""EagerRunner (sglang model_executor/runner/eager_runner.py): runs a model forward without a CUDA graph.

`load_batch` hands the model a SHALLOW COPY of the ForwardBatch (sglang 0.5.14: `replace(forward_batch)`
under SGLANG_EAGER_INPUT_NO_COPY, else a buffer-registry copy; both shallow). Anything the model
assigns to an attribute of the batch lands on the copy and is gone when the forward returns; tensors
and `spec_info` are the same objects in both. This copy is the whole cause of the PR #29654 bug.
`copy_batch=False` is a test switch: hand over the batch itself, and the bug arm's write-back survives.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import torch

from kit.backends.mini.forward_batch_info import ForwardBatch


class _Model(Protocol):
    def forward(self, forward_batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]: ...


class EagerRunner:
    def __init__(self, model: _Model, copy_batch: bool = True):
        self.model = model
        self.copy_batch = copy_batch

    def load_batch(self, forward_batch: ForwardBatch) -> ForwardBatch:
        return dataclasses.replace(forward_batch) if self.copy_batch else forward_batch

    def forward(self, forward_batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.forward(self.load_batch(forward_batch))
