"""EAGLEDraftCudaGraphRunner (sglang speculative/eagle_draft_cuda_graph_runner.py): the WHOLE draft loop
(EagleDraftWorker.draft_forward, num_steps - 1 draft forwards) captured as one CUDA graph per batch size
and replayed once per round.

Design, as in sglang:
- static input buffers (seq_lens, spec_info.hidden_states, spec_info.topk_index) that each replay
  copies the round's values into; the KV / index-K caches are preallocated at max length and the
  context grows only through seq_lens (a length mask), so one graph serves every round;
- warm-up runs of draft_forward on a side stream before capture; nothing in draft_forward reads a
  tensor value on the host (no .item(), no data-dependent Python branches), so capture is legal;
- the capture runs the same Python as eager mode, so the graph holds exactly the kernels the arm
  launches: the indexer in every step (off, bug: the write-back goes to the runner's copy at capture
  time too) or in the first step only (fix, upstream);
- NVTX ranges pushed inside draft_forward (draft_step, indexer) exist only at capture time, inside
  `graph_capture`; each replay is wrapped in `draft_round` by EagleDraftWorker.draft. Replayed kernels
  are attributed to capture-time ranges through CUDA_GRAPH_NODE_EVENTS (kit.analysis.attribution).
Capture happens once, before the first round (never inside a `draft_round` range).

With `record=False` (params `static_batch`, any device) the runner keeps everything but the graph: the same
static batch, spec_info and buffers, the same warm-up runs, and each round copies its inputs in and runs
draft_forward on that batch, eagerly (its ranges and kernels inside the round). A mistake that relies on a
fresh spec_info per round meets the one object a capture reuses, on CPU too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kit.backends.mini.eagle_info import EagleDraftInput
from kit.backends.mini.forward_batch_info import ForwardBatch, ForwardMode
from kit.probe import ranges as nr


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph | None  # None: the static batch without a graph (record=False)
    forward_batch: ForwardBatch  # the static batch the graph reads
    hidden: torch.Tensor  # static spec_info.hidden_states [B, 1, H]
    topk_index: torch.Tensor  # static spec_info.topk_index [B, 1]
    output: torch.Tensor  # draft tokens [B, num_steps], written by every replay


class EAGLEDraftCudaGraphRunner:
    def __init__(self, draft_worker, warmup_runs: int = 2, record: bool = True):
        self.draft_worker = draft_worker
        self.warmup_runs = warmup_runs
        self.record = record
        self.graphs: dict[int, _Captured] = {}

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        return forward_batch.batch_size in self.graphs

    @torch.no_grad()
    def capture_one_shape(self, example: ForwardBatch) -> None:
        """Capture draft_forward for example.batch_size; example's values seed the static buffers."""
        bs = example.batch_size
        hidden = example.spec_info.hidden_states.clone()
        topk_index = example.spec_info.topk_index.clone()
        spec_info = EagleDraftInput(
            hidden_states=hidden, topk_index=topk_index, verified_id=example.spec_info.verified_id.clone()
        )
        seq_lens = example.seq_lens.clone()
        fb = ForwardBatch(
            ForwardMode.DECODE, bs, topk_index, seq_lens[:, None], seq_lens, spec_info=spec_info
        )

        def run_once() -> torch.Tensor:
            spec_info.hidden_states = hidden  # draft_forward re-points it at each step's output
            return self.draft_worker.draft_forward(fb)

        with nr.annotate(nr.GRAPH_CAPTURE):
            if not self.record:
                for _ in range(self.warmup_runs):
                    output = run_once()
                spec_info.hidden_states = hidden
                self.graphs[bs] = _Captured(None, fb, hidden, topk_index, output)
                return
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(self.warmup_runs):
                    run_once()
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                output = run_once()
            torch.cuda.synchronize()
        spec_info.hidden_states = hidden
        self.graphs[bs] = _Captured(graph, fb, hidden, topk_index, output)

    def replay(self, forward_batch: ForwardBatch) -> torch.Tensor:
        """Copy the round's inputs into the static buffers, replay, return a copy of the draft tokens."""
        captured = self.graphs.get(forward_batch.batch_size)
        if captured is None:
            raise RuntimeError(f"no CUDA graph captured for batch size {forward_batch.batch_size}")
        captured.forward_batch.seq_lens.copy_(forward_batch.seq_lens)
        captured.hidden.copy_(forward_batch.spec_info.hidden_states)
        captured.topk_index.copy_(forward_batch.spec_info.topk_index)
        if captured.graph is None:  # the static batch, run eagerly
            captured.forward_batch.spec_info.hidden_states = captured.hidden
            return self.draft_worker.draft_forward(captured.forward_batch)
        captured.graph.replay()
        return captured.output.clone()
