"""The task checkpoint (kit.task) behind the mini's model interfaces: its target verifies, its NextN layer
drafts, driven by the mini's own EAGLE loop (EagleDraftWorker, EagerRunner's per-step ForwardBatch copy,
spec_info, the arm's top-k carrier, the NVTX ranges).

Every number comes from kit.task's float32 reference (kit.task.reference.target_forward / draft_forward
over kit.task.forward's layers): one implementation of the task model, the same one `kit task-reference`
runs. Each request has its own Session (the reference's caches: target position i holds token i, draft
position i token i+1) and is computed on its own, except that each attention's indexer runs for the whole
batch inside one scope; the mini's seq_lens is the reference's committed length minus one (the last
committed token is the next verify's root, not yet in the target cache).

The NextN forward does what DeepseekV3ForCausalLMNextN does with the carrier: read it when the reuse gate
is on, hand it to the attention (which then skips its indexer), write the selection back. The carrier
holds the selections as [B, T, K] int64, each row one query's selected positions in the indexer's order,
padded with -1 (while the prefix fits index_topk a selection is the whole prefix, shorter than K);
unpacking restores each selection exactly, so a shared top-k attends as the reference's does.

Each indexer run of a live attention, for the whole batch, is one NVTX `indexer` range (TaskIndexer,
through kit.task.forward.Attention.indexer_scope), nested where the mini's own indexer puts it: inside the
forward that runs it, none where a shared top-k is handed in.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kit.backends.mini.forward_batch_info import ForwardBatch
from kit.backends.mini.index_topk_share import TopkCarrier
from kit.backends.mini.mistakes import FIX, Mistakes, despite_reuse
from kit.checkpoint import MANIFEST
from kit.probe import ranges as nr
from kit.task.forward import rms_norm
from kit.task.reference import Session, TaskModel, draft_forward, target_forward
from kit.task.spec import TaskSpec
from kit.task.workload import TaskPrompt, task_prompt

# The checkpoint made on the fly: the task of make_task_checkpoint's defaults (128 keys in 8 groups, 2
# draft misses per group) at the smallest widths sglang 0.5.14 would still load (hidden >= 4 * keys + 3,
# multiples of 64): a fraction of the default checkpoint's build time, and the same answers.
ON_THE_FLY_OVERRIDES: dict[str, Any] = {
    "hidden_size": 576,
    "q_lora_rank": 128,
    "intermediate_size": 64,
    "moe_intermediate_size": 64,
}


@functools.lru_cache(maxsize=2)
def _made(seed: int) -> TaskModel:
    """The on-the-fly model of a seed, built once per process (several cells of one process share it; every
    engine re-points its indexer scopes, the only state an engine sets on it)."""
    return TaskModel.made(seed, overrides=ON_THE_FLY_OVERRIDES)


def load_model(seed: int, checkpoint: str | None) -> tuple[TaskModel, dict[str, Any]]:
    """The task model (a directory's, or made in memory from `seed`) and what engine.json says of it."""
    if checkpoint is not None:
        path = Path(checkpoint)
        model = TaskModel(path)
        manifest = path / MANIFEST
        labelled = json.loads(manifest.read_text()).get("task_checkpoint") if manifest.is_file() else None
        source: dict[str, Any] = {"source": str(path), "labelled_task_checkpoint": labelled}
    else:
        model = _made(seed)
        source = {
            "source": "made in memory (kit.task.weights.task_tensors)",
            "overrides": ON_THE_FLY_OVERRIDES,
        }
    cfg, spec = model.cfg, model.spec
    return model, {
        **source,
        "seed": spec.seed,
        "n_keys": spec.n_keys,
        "n_groups": spec.n_groups,
        "draft_misses": len(spec.draft_misses()),
        "hidden_size": cfg["hidden_size"],
        "index_topk": cfg["index_topk"],
        "vocab_size": cfg["vocab_size"],
    }


def prompts(model: TaskModel, workload: str, context_len: int, num_requests: int, seed: int, max_new: int):
    """One task prompt per request, prompt ids 0..num_requests-1."""
    return [
        task_prompt(
            model.spec,
            workload,
            context_len,
            b,
            seed,
            max_new_tokens=max_new,
            index_topk=model.cfg["index_topk"],
        )
        for b in range(num_requests)
    ]


class TaskIndexer:
    """One attention's indexer as the mini sees it: `calls`, and every run inside an NVTX `indexer` range."""

    def __init__(self) -> None:
        self.calls = 0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with nr.annotate(nr.INDEXER):
            self.calls += 1
            yield


@dataclass
class LayerView:
    """What the engine reads of a target layer: its indexer counter."""

    indexer: TaskIndexer


def _starts(positions: torch.Tensor) -> list[int]:
    """Each request's first position; the reference writes a contiguous run of positions per forward."""
    starts = positions[:, 0]
    steps = torch.arange(positions.shape[1], device=positions.device)
    if not torch.equal(positions, starts[:, None] + steps):
        raise AssertionError("task model: a forward's positions must be contiguous per request")
    return starts.tolist()


def pack(selections: list[list[torch.Tensor]]) -> torch.Tensor:
    """Per request, per query, the selected positions -> [B, T, K] int64 padded with -1."""
    width = max(len(s) for per in selections for s in per)
    out = torch.full((len(selections), len(selections[0]), width), -1, dtype=torch.long)
    for b, per in enumerate(selections):
        for t, s in enumerate(per):
            out[b, t, : len(s)] = s
    return out


def unpack(row: torch.Tensor) -> list[torch.Tensor]:
    """[T, K] of one request -> its T selections (padding dropped, order kept)."""
    return [r[r >= 0] for r in row]


class TaskBatch:
    """The task model and one reference Session (both caches) per request."""

    def __init__(self, model: TaskModel, batch: int, capacity: int) -> None:
        self.model = model
        self.sessions = [Session(model, capacity) for _ in range(batch)]


class TaskTarget:
    """The target (DeepseekV32ForCausalLM's interface): forward of a batch, and the prompt's caches."""

    def __init__(self, batch: TaskBatch) -> None:
        self.batch = batch
        self.layers = []
        for layer in batch.model.layers:
            view = LayerView(TaskIndexer())
            layer.attn.indexer_scope = view.indexer
            self.layers.append(view)

    def forward(self, forward_batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [B, T, vocab], final-norm hidden [B, T, hidden]: what the reference hands the draft)."""
        sessions = self.batch.sessions
        ids, starts = forward_batch.input_ids.tolist(), _starts(forward_batch.positions)
        leaked = getattr(forward_batch.spec_info, "draft_topk_indices", None)
        out = target_forward(sessions, ids, starts) if leaked is None else self._reusing(ids, starts, leaked)
        return torch.stack([o[0] for o in out]), torch.stack([o[1] for o in out])

    def _reusing(
        self, ids: list[list[int]], starts: list[int], leaked: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A mutant's verify: every live attention takes the draft's shared selection (each request's,
        for each of its verify tokens) instead of running its indexer; otherwise target_forward's layers."""
        m, sessions = self.batch.model, self.batch.sessions
        topks = [[unpack(row)[0]] * len(t) for row, t in zip(leaked, ids, strict=True)]
        rs = [m.embed[torch.tensor(t)] for t in ids]
        for i, layer in enumerate(m.layers):
            rs, _ = layer.forward_batch(rs, [s.tcache[i] for s in sessions], starts, topks=topks)
        hids = [rms_norm(r, m.norm, m.eps) for r in rs]
        return [(m.lm_head(h), h) for h in hids]

    def fill_prefill_cache(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor | None:
        """The whole prompt but its last token, in one piece (the engine passes one chunk)."""
        if _starts(positions) != [0] * len(self.batch.sessions):
            raise AssertionError("task model: the prompt's caches are filled in one chunk from position 0")
        hids = [s.target_prompt(ids) for s, ids in zip(self.batch.sessions, input_ids.tolist(), strict=True)]
        return None if hids[0] is None else torch.stack(hids)


class TaskNextN:
    """The MTP draft (DeepseekV3ForCausalLMNextN's interface): reads and writes the arm's top-k carrier."""

    def __init__(self, batch: TaskBatch, carrier: TopkCarrier, mistakes: Mistakes = FIX) -> None:
        self.batch = batch
        self.carrier = carrier
        self.mistakes = mistakes
        self.indexer = TaskIndexer()
        batch.model.draft.attn.indexer_scope = self.indexer

    def forward(self, forward_batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [B, T, vocab], hidden [B, T, hidden]); with the reuse gate on, the selections used go to
        the carrier (sglang writes them back only then)."""
        gate = self.carrier.gate(forward_batch)
        prev = self.carrier.get(forward_batch) if gate else None
        args = (
            self.batch.sessions,
            forward_batch.input_ids.tolist(),
            list(forward_batch.spec_info.hidden_states),
            _starts(forward_batch.positions),
        )
        if prev is not None and despite_reuse(self.mistakes, torch.device("cpu")):
            draft_forward(*args)  # a mutant's indexer run whose selection is thrown away
        out = draft_forward(*args, None if prev is None else [unpack(row) for row in prev])
        if gate:
            self.carrier.put(forward_batch, pack([o[2] for o in out]))
        return torch.stack([o[0] for o in out]), torch.stack([o[1] for o in out])

    def fill_prefill_cache(
        self, next_ids: torch.Tensor, target_hidden: torch.Tensor | None, positions: torch.Tensor
    ) -> None:
        """Draft cache of the prompt shifted by one (slot j: token j+1 with the target's hidden j)."""
        if _starts(positions) != [0] * len(self.batch.sessions):
            raise AssertionError("task model: the prompt's caches are filled in one chunk from position 0")
        for b, (s, ids) in enumerate(zip(self.batch.sessions, next_ids.tolist(), strict=True)):
            s.draft_prompt(ids, None if target_hidden is None else target_hidden[b])


def fact_lookup(spec: TaskSpec, prompts: list[TaskPrompt]) -> Callable[[int, int], int | None]:
    """(batch row, a draft step's input token) -> the draft-cache position of the fact its lookup needs (the
    fact of the token's key; the draft cache is the prompt shifted by one), or None: not a node with a fact.
    What kit.backends.mini.corrupt records a corruption against."""

    def need(row: int, token: int) -> int | None:
        key = spec.key_of_node(token)
        pos = None if key is None else prompts[row].fact_positions.get(key)
        return None if pos is None else pos - 1

    return need


def row_fields(prompt: TaskPrompt, row: dict[str, Any]) -> dict[str, Any]:
    """What an outputs.jsonl row of a task run adds: the workload, the expected answer and its score."""
    from kit.task.workload import score_row

    fields = {"workload": prompt.task, "expected_ids": prompt.expected_ids}  # as the sglang backend's rows
    return {**fields, **score_row({**row, **fields})}
