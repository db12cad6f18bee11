"""Builds the mini engine from validated params and runs one batch (the role of sglang's scheduler loop).

The model is params' `model`: the seeded random-weight model of a preset (kit/backends/mini/model.py) or
a kit.task retrieval checkpoint (kit/backends/mini/task_model.py); the EAGLE loop is the same for both.

Greedy decoding; every request decodes exactly max_new_tokens (no stop token). Reported like sglang's
meta_info: completion_tokens counts every generated token (the prefill's first one included),
spec_verify_ct counts the verify rounds the request took part in, accept_length = their ratio; per token,
output_logprobs and output_margins (top-1 minus top-2 logprob) as the sglang backend records them. A task
run's rows add the workload, expected_ids and their score (correct, accuracy, first_error).
"""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch

from kit.backends.mini import mistakes, presets, task_model
from kit.backends.mini.cuda_graph_runner import EAGLEDraftCudaGraphRunner
from kit.backends.mini.deepseek_nextn import DeepseekV3ForCausalLMNextN
from kit.backends.mini.dsa_indexer import Indexer, Rope
from kit.backends.mini.dsa_indexer_sglang import SglangIndexer
from kit.backends.mini.dsa_kernels import SglangKernels, resolve_indexer_impl
from kit.backends.mini.eager_runner import EagerRunner
from kit.backends.mini.eagle_worker import EagleDraftWorker, EAGLEWorkerV2
from kit.backends.mini.forward_batch_info import ForwardBatch, ForwardMode
from kit.backends.mini.index_topk_share import CARRIERS
from kit.backends.mini.model import DeepseekV32ForCausalLM, LayerCache, build_weights
from kit.backends.mini.params import MiniParams
from kit.backends.mini.workload import Prompt, make_prompts
from kit.errors import UsageError
from kit.task.spec import TaskSpec
from kit.task.workload import TaskPrompt

PREFILL_NOTE = (
    "prompt caches built by the cheap path: chunk-local dense causal attention, no indexer scoring; "
    "verify, draft steps and draft_extend use the real sparse DSA path over the whole cache"
)


@contextlib.contextmanager
def cpu_threads(device: torch.device) -> Iterator[None]:
    """Run with KIT_MINI_CPU_THREADS (default 1) intra-op threads on CPU, then restore the old setting.

    The mini's tensors are small; on 2 cores shared with nsys or other processes, OpenMP's barrier
    spinning made 2 threads up to 10x slower than 1 (measured). One thread keeps timings predictable.
    """
    if device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("KIT_MINI_CPU_THREADS", "1")))
    try:
        yield
    finally:
        torch.set_num_threads(before)


TASK_PREFILL_NOTE = (
    "model task: the prompt's caches as kit.task.reference fills them (keys per distinct token where only "
    "layer 0 attends); the last prompt token, verify, draft steps and draft_extend run the full forward"
)

INDEX_K_CACHE = {
    "task": "float32 [max_len, index_head_dim] per request and attention (kit.task.forward.KVCache), "
    "holding fp8-rounded Hadamard-rotated keys",
    "torch": "float32 [B, max_len, index_head_dim]",
    "sglang": "sglang's fp8 paged layout: uint8 [pages, 64 * 132], page = 64 x 128 fp8 values then 64 fp32 "
    "scales; per-token scale amax/448 (keys), ue8m0 per-128 scale (queries); Hadamard-rotated",
}


def max_cache_len(context_len: int, max_new_tokens: int, num_draft_tokens: int) -> int:
    need = context_len + max_new_tokens + 2 * num_draft_tokens
    return (need + 63) // 64 * 64


def choose_indexer(
    params: MiniParams, p: presets.Preset, kernels: SglangKernels | None = None
) -> tuple[str, str, SglangKernels | None]:
    """(indexer_impl that runs, why, its kernels): params' indexer_impl resolved on this machine.

    `kernels` injects a kernel set (tests: the torch ReferenceKernels) unless torch was asked for.
    """
    requested = params.indexer_impl
    if kernels is not None and requested != "torch":
        impl, reason = "sglang", f"{requested}: injected kernels ({kernels.name})"
    else:
        impl, reason, kernels = resolve_indexer_impl(
            requested, params.device, p.index_n_heads, p.index_head_dim, params.index_topk
        )
    if params.indexer_path == "ragged" and impl != "sglang":
        raise UsageError(
            f"invalid mini parameter indexer_path='ragged': it needs sglang's kernels ({reason})"
        )
    return impl, reason, kernels


class Engine:
    def __init__(self, params: MiniParams, copy_batch: bool = True, kernels: SglangKernels | None = None):
        self.params = params
        self.device = torch.device(params.device)
        self.max_len = max_cache_len(params.context_len, params.max_new_tokens, params.num_draft_tokens)
        self.task_prompts: list[TaskPrompt] | None = None
        self.task_info: dict[str, Any] | None = None
        self.task_spec: TaskSpec | None = None  # model task: the task its answers come from
        t0 = time.perf_counter()
        if params.model == "task":
            if kernels is not None:
                raise UsageError("model task runs the task reference's own indexer: it takes no kernels")
            self._build_task(params)
        else:
            self._build_random(params, kernels)
        self.draft_runner = EagerRunner(self.draft, copy_batch=copy_batch)
        self.draft_worker = EagleDraftWorker(
            self.draft,
            self.draft_runner,
            params.num_steps,
            params.eagle_topk,
            params.arm,
            self.device,
            mistakes.mistakes(params.mutant, params.corrupt),
        )
        self.worker = EAGLEWorkerV2(self.target, self.draft_worker, self.device)
        corrupter = self.draft_worker.state.corrupter
        if corrupter is not None and self.task_prompts is not None:
            corrupter.needs = task_model.fact_lookup(self.task_spec, self.task_prompts)
        self.build_s = time.perf_counter() - t0

    def _build_task(self, params: MiniParams) -> None:
        """The task checkpoint's target and NextN (kit/backends/mini/task_model.py), float32 on CPU."""
        model, self.task_info = task_model.load_model(params.seed, params.task_checkpoint)
        self.task_spec = model.spec
        self.preset, self.dtype = None, torch.float32
        self.indexer_impl, self.kernels, self.indexer_path = "task", None, None
        self.indexer_reason = (
            "model task: kit.task's float32 reference indexer (fp8 keys and queries emulated)"
        )
        B, ctx = params.num_requests, params.context_len
        self.task_prompts = task_model.prompts(
            model, params.workload, ctx, B, params.seed, params.max_new_tokens
        )
        self.prompts = [Prompt(tp.prompt_id, tp.ids) for tp in self.task_prompts]
        self.prefill_chunk = ctx  # one piece: the reference fills a prompt's caches at once
        batch = task_model.TaskBatch(model, B, self.max_len)
        self.target = task_model.TaskTarget(batch)
        m = mistakes.mistakes(params.mutant, params.corrupt)
        self.draft = task_model.TaskNextN(batch, mistakes.carrier(CARRIERS[params.arm], m), m)

    def _build_random(self, params: MiniParams, kernels: SglangKernels | None) -> None:
        """The seeded random-weight model of a preset (kit/backends/mini/model.py)."""
        self.preset = presets.get(params.preset)
        self.dtype = self.preset.torch_dtype(params.device)
        p, B = self.preset, params.num_requests
        self.prefill_chunk = p.prefill_chunk
        self.indexer_impl, self.indexer_reason, self.kernels = choose_indexer(params, p, kernels)
        self.indexer_path = params.indexer_path if self.kernels is not None else None
        make_indexer = (
            functools.partial(SglangIndexer, kernels=self.kernels, path=self.indexer_path)
            if self.kernels is not None
            else Indexer
        )
        self.prompts = make_prompts(B, params.context_len, p.vocab_size, params.seed)
        rope = Rope(p.index_head_dim // 2, self.max_len, self.device)
        weights = build_weights(p, params.seed, self.device, self.dtype)
        self.target = DeepseekV32ForCausalLM(weights, p, params.index_topk, rope, make_indexer)
        self.target.attach_caches(
            [
                LayerCache.allocate(p, B, self.max_len, self.device, self.dtype, self.indexer_impl)
                for _ in range(p.num_target_layers)
            ]
        )
        self.draft = DeepseekV3ForCausalLMNextN(
            weights,
            p,
            params.index_topk,
            rope,
            window=params.num_draft_tokens,
            carrier=CARRIERS[params.arm],
            make_indexer=make_indexer,
        )
        self.draft.attach_cache(
            LayerCache.allocate(p, B, self.max_len, self.device, self.dtype, self.indexer_impl)
        )

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def run(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        with cpu_threads(self.device):
            return self._run()

    @torch.no_grad()
    def _run(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        prm, B = self.params, self.params.num_requests
        max_new = prm.max_new_tokens
        ids = torch.tensor([pr.input_ids for pr in self.prompts], dtype=torch.long, device=self.device)
        self._sync()
        t0 = time.perf_counter()
        spec_info, seq_lens = self.worker.prefill(ids, self.prefill_chunk)
        self._sync()
        prefill_s = time.perf_counter() - t0

        capture_s = None
        if prm.cuda_graph or prm.static_batch:
            runner = EAGLEDraftCudaGraphRunner(self.draft_worker, record=prm.cuda_graph)
            t0 = time.perf_counter()
            runner.capture_one_shape(
                ForwardBatch(
                    ForwardMode.DECODE, B, spec_info.topk_index, seq_lens[:, None], seq_lens, spec_info
                )
            )
            capture_s = time.perf_counter() - t0
            self.draft_worker.cuda_graph_runner = runner

        outputs = [[t] for t in spec_info.verified_id.tolist()]
        first_lp, first_margin = self.worker.first_scores
        logprobs = [[x] for x in first_lp.tolist()]
        margins = [[x] for x in first_margin.tolist()]
        draft_ids: list[list[list[int]]] = [[] for _ in range(B)]
        verify_ct = [0] * B
        finished = [len(o) >= max_new for o in outputs]
        accepts: list[int] = []
        t0 = time.perf_counter()
        target_indexer_calls = sum(layer.indexer.calls for layer in self.target.layers)
        extend_calls = self.draft.indexer.calls
        while not all(finished):
            done = torch.tensor(finished, device=self.device)
            result, seq_lens, spec_info = self.worker.forward_batch_generation(spec_info, seq_lens, done)
            accept = result.accept.tolist()
            target_ids = result.target_ids.tolist()
            drafts = result.draft_tokens.tolist()
            round_lp, round_margin = result.logprobs.tolist(), result.margins.tolist()
            for b in range(B):
                if finished[b]:
                    continue
                verify_ct[b] += 1
                accepts.append(accept[b])
                draft_ids[b].append(drafts[b])
                outputs[b].extend(target_ids[b][: accept[b] + 1])
                logprobs[b].extend(round_lp[b][: accept[b] + 1])
                margins[b].extend(round_margin[b][: accept[b] + 1])
                finished[b] = len(outputs[b]) >= max_new
        self._sync()
        decode_s = time.perf_counter() - t0

        rows = []
        for b, prompt in enumerate(self.prompts):
            out = outputs[b][:max_new]
            row = {
                "prompt_id": prompt.prompt_id,
                "input_len": len(prompt.input_ids),
                "output_ids": out,
                "completion_tokens": len(out),
                "spec_verify_ct": verify_ct[b],
                "accept_length": (len(out) / verify_ct[b]) if verify_ct[b] else None,
                "draft_ids": draft_ids[b],
                "output_logprobs": logprobs[b][:max_new],
                "output_margins": margins[b][:max_new],
            }
            if self.task_prompts is not None:
                row.update(task_model.row_fields(self.task_prompts[b], row))
            rows.append(row)
        dw = self.draft_worker
        rounds = len(dw.round_wall_s)
        draft_forwards = prm.num_steps - 1
        per_round_ms = [s * 1e3 for s in dw.round_wall_s]
        holder = "spec_info" if dw.carrier.on_spec_info else "forward_batch"
        info: dict[str, Any] = {
            "backend": "mini",
            "arm": prm.arm,
            "mutant": prm.mutant,
            "topk_carrier": f"{holder}.{dw.carrier.attr}",
            "reuse_gate": f"forward_batch.{dw.carrier.gate_attr}",
            "index_share_for_mtp_iteration": dw.index_share_for_mtp_iteration,
            "model": prm.model,
            "workload": prm.workload,
            "task": self.task_info,
            "preset": None if self.preset is None else self.preset.to_dict(),
            "index_topk": prm.index_topk,
            # Which lightning indexer ran: "torch" (kit/mini/dsa_indexer.py, fp32 cache) or "sglang"
            # (deep_gemm + sgl_kernel on sglang's fp8 paged cache, kit/mini/dsa_indexer_sglang.py).
            "indexer_impl": self.indexer_impl,
            "indexer_impl_requested": prm.indexer_impl,
            "indexer_impl_reason": self.indexer_reason,
            "indexer_path": self.indexer_path,
            "indexer_kernels": self.kernels.describe() if self.kernels is not None else None,
            "index_k_cache": INDEX_K_CACHE[self.indexer_impl],
            "num_steps": prm.num_steps,
            "num_draft_tokens": prm.num_draft_tokens,
            "eagle_topk": prm.eagle_topk,
            "num_requests": B,
            "context_len": prm.context_len,
            "max_new_tokens": max_new,
            "max_cache_len": self.max_len,
            "device": str(self.device),
            "device_name": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu",
            "dtype": str(self.dtype).replace("torch.", ""),
            "torch_version": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "cuda_graph": prm.cuda_graph,
            "static_batch": prm.static_batch,
            "prefill_method": PREFILL_NOTE if self.task_prompts is None else TASK_PREFILL_NOTE,
            "build_s": round(self.build_s, 4),
            "prefill_s": round(prefill_s, 4),
            "graph_capture_s": None if capture_s is None else round(capture_s, 4),
            "decode_s": round(decode_s, 4),
            "draft_rounds": rounds,
            "draft_forwards_per_round": draft_forwards,
            "draft_round_ms_mean": round(statistics.fmean(per_round_ms), 4) if rounds else None,
            "draft_round_ms_median": round(statistics.median(per_round_ms), 4) if rounds else None,
            "draft_step_ms_median": round(statistics.median(per_round_ms) / draft_forwards, 4)
            if rounds
            else None,
            "draft_round_ms": [round(x, 4) for x in per_round_ms],
            # Python-level counter: exact in eager mode; with a CUDA graph, replays launch without Python.
            "draft_indexer_calls_per_round": None if prm.cuda_graph else dw.round_indexer_calls,
            "draft_indexer_calls_draft_extend": self.draft.indexer.calls
            - extend_calls
            - (0 if prm.cuda_graph else sum(dw.round_indexer_calls)),
            "target_indexer_calls": sum(layer.indexer.calls for layer in self.target.layers)
            - target_indexer_calls,
            "accept_length_mean": (
                round(sum(r["completion_tokens"] for r in rows) / sum(verify_ct), 4)
                if sum(verify_ct)
                else None
            ),
            "accepted_drafts_histogram": {str(k): accepts.count(k) for k in range(prm.num_steps + 1)},
        }
        if dw.state.corrupter is not None:
            info["corruption"] = dw.state.corrupter.summary()
        return rows, info
