"""sglang's own DSA indexer kernels for the mini engine: loading, the auto/torch/sglang choice, a stand-in.

The kernels (the ones sglang 0.5.14's `Indexer.forward_cuda` calls on decode, target_verify and draft_extend,
layers/attention/dsa/dsa_indexer.py `_get_topk_paged`, and on extend, `_get_topk_ragged`):
- `deep_gemm.get_paged_mqa_logits_metadata(context_lens [R, 1] int32, 64, num_sms)` (sgl-deep-gemm 0.1.3);
- `deep_gemm.fp8_paged_mqa_logits(q [R, 1, H, 128] fp8, kv_cache [pages, 64, 1, 132] uint8,
  weights [R, H] f32, context_lens, block_table [R, blocks] int32, schedule_meta, max_context_len,
  clean_logits=False)`;
- `deep_gemm.fp8_mqa_logits(q [R, H, 128] fp8, (k fp8 [N, 128], k_scale f32 [N]), weights, ks, ke,
  clean_logits=False)`;
- `sgl_kernel.fast_topk_transform_fused(score, lengths, page_table_size_1, cu_seqlens_q, topk=2048,
  row_starts)` (sglang-kernel 0.4.4): the top-k sglang runs with SGLANG_DSA_FUSE_TOPK on (the default) and
  the sgl-kernel top-k backend (the default), dsa_topk_backend.py `topk_transform`; it launches
  `topk_transform_decode_kernel` (decode: no row_starts, one row per request) or
  `topk_transform_prefill_kernel` (several rows per request, or row_starts). `fast_topk_v2` (`topk_kernel`)
  is only the SGLANG_DSA_FUSE_TOPK=0 path.
They exist for sm90 and sm100 only (DeepGEMM dispatches on arch_major 9 or 10) and need index_head_dim 128,
index_n_heads 16/32/64 and index_topk 2048 (the top-k kernels assert it).

`ReferenceKernels` implements the same four calls in plain torch, with the host-side checks the real ones
make (dtypes, shapes, contiguity): the CPU tests run the whole kernel indexer through it, and on a GPU it is
the reference the real kernels are compared with (same fp8 inputs, fp32 math).
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any

import torch

from kit.backends.mini.index_buf_accessor import FP8
from kit.errors import KitError, ToolMissing, UsageError
from kit.task.topk import TOPK as KERNEL_TOPK
from kit.task.topk import kernel_topk

TOPK = KERNEL_TOPK  # the top-k kernels are built for 2048
INDEX_HEADS = (16, 32, 64)
MODULES = ("deep_gemm", "sgl_kernel")
INSTALL_HINT = (
    "put sgl-deep-gemm 0.1.3, sglang-kernel 0.4.4 and apache-tvm-ffi 0.1.9 (unpacked wheels) on PYTHONPATH"
)


@dataclass
class SglangKernels:
    """The kernel entry points the mini's sglang indexer calls, and where they came from."""

    name: str
    get_paged_mqa_logits_metadata: Any
    fp8_paged_mqa_logits: Any
    fp8_mqa_logits: Any
    fast_topk_transform_fused: Any
    num_sms: int
    versions: dict[str, str]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "num_sms": self.num_sms, **self.versions}


def shape_problem(index_n_heads: int, index_head_dim: int, index_topk: int) -> str | None:
    """Why sglang's kernels cannot run these indexer shapes, or None."""
    if index_head_dim != 128:
        return f"index_head_dim {index_head_dim} (sglang's fp8 index-K cache holds 128)"
    if index_n_heads not in INDEX_HEADS:
        return f"index_n_heads {index_n_heads} (DeepGEMM's logits kernels take 16, 32 or 64)"
    if index_topk != TOPK:
        return f"index_topk {index_topk} (sgl_kernel's fast top-k is built for 2048)"
    return None


def device_problem(device: str) -> str | None:
    """Why this device cannot run the kernels, or None (CUDA with compute capability 9.x or 10.x)."""
    if device != "cuda":
        return f"device {device} (the kernels are CUDA-only)"
    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU"
    major, minor = torch.cuda.get_device_capability()
    if major not in (9, 10):
        return f"compute capability {major}.{minor} (DeepGEMM's indexer kernels are sm90/sm100 only)"
    return None


def missing_modules() -> list[str]:
    """The kernel packages that are not even findable on sys.path (cheap: no import)."""
    return [m for m in MODULES if importlib.util.find_spec(m) is None]


def load_kernels() -> SglangKernels:
    """Import deep_gemm and sgl_kernel; KitError (one line: cause and fix) if that fails."""
    try:
        deep_gemm = importlib.import_module("deep_gemm")
        sgl_kernel = importlib.import_module("sgl_kernel")
        kernels = SglangKernels(
            name="sglang",
            get_paged_mqa_logits_metadata=deep_gemm.get_paged_mqa_logits_metadata,
            fp8_paged_mqa_logits=deep_gemm.fp8_paged_mqa_logits,
            fp8_mqa_logits=deep_gemm.fp8_mqa_logits,
            fast_topk_transform_fused=sgl_kernel.fast_topk_transform_fused,
            num_sms=int(deep_gemm.get_num_sms()),
            versions={
                "deep_gemm": str(getattr(deep_gemm, "__version__", "?")),
                "sgl_kernel": str(getattr(sgl_kernel, "__version__", "?")),
            },
        )
    except Exception as exc:  # ImportError, a missing .so dependency, a missing attribute: all one answer
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        raise ToolMissing(
            f"sglang's indexer kernels failed to load ({detail}); {INSTALL_HINT}", tool="sgl_kernel"
        ) from None
    return kernels


def resolve_indexer_impl(
    requested: str, device: str, index_n_heads: int, index_head_dim: int, index_topk: int
) -> tuple[str, str, SglangKernels | None]:
    """(impl that runs, why, the kernels if sglang): auto takes sglang when it can, else torch.

    An explicit `sglang` that cannot run raises KitError (one line); `torch` is always possible.
    """
    if requested == "torch":
        return "torch", "indexer_impl=torch requested", None
    problem = device_problem(device) or shape_problem(index_n_heads, index_head_dim, index_topk)
    if problem is None:
        missing = missing_modules()
        if missing:
            problem = f"{' and '.join(missing)} not importable"
    if problem is None:
        try:
            kernels = load_kernels()
        except KitError as exc:
            if requested == "sglang":
                raise
            return "torch", f"auto: {exc}", None
        return "sglang", f"{requested}: sglang kernels loaded ({kernels.describe()})", kernels
    if requested == "sglang":
        raise UsageError(
            f"invalid mini parameter indexer_impl='sglang': {problem}; allowed torch | auto, or run on an "
            f"sm90/sm100 GPU with a DSA preset (dsv32 | glm5) and {INSTALL_HINT}"
        )
    return "torch", f"auto: {problem}", None


# ---- the torch stand-in -----------------------------------------------------------------------------


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise RuntimeError(f"reference kernel host check failed: {what}")


def _scores(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """logits[s] = k_scale[s] * sum_h weights[h] * relu(q[h] . k[s]) for one query row: q [H, D], k [S, D]."""
    return (k.float() @ q.float().T).relu_() @ weights.float() * k_scale.float()


class ReferenceKernels(SglangKernels):
    """Plain-torch versions of the four kernel calls (same arguments, same checks, fp32 math on fp8 inputs).

    Logits the real kernels leave unwritten (beyond a row's context length; clean_logits=False) are filled
    with a huge value here, so a top-k that ignored `lengths` or `row_starts` would pick them.
    """

    UNWRITTEN = 3.0e38

    def __init__(self, num_sms: int = 8):
        super().__init__(
            name="reference (torch stand-in for deep_gemm + sgl_kernel)",
            get_paged_mqa_logits_metadata=self._metadata,
            fp8_paged_mqa_logits=self._paged_logits,
            fp8_mqa_logits=self._ragged_logits,
            fast_topk_transform_fused=self._topk_transform,
            num_sms=num_sms,
            versions={"deep_gemm": "reference", "sgl_kernel": "reference"},
        )

    def _metadata(self, context_lens: torch.Tensor, block_kv: int, num_sms: int) -> torch.Tensor:
        _check(context_lens.dim() == 2, "context_lens.dim() == 2")
        _check(context_lens.dtype == torch.int32, "context_lens int32")
        _check(context_lens.is_contiguous(), "context_lens contiguous")
        _check(block_kv == 64, "block_kv == 64")
        _check(num_sms == self.num_sms, "num_sms == device SMs")
        return torch.zeros(num_sms + 1, 2, dtype=torch.int32, device=context_lens.device)

    def _paged_logits(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        weights: torch.Tensor,
        context_lens: torch.Tensor,
        block_table: torch.Tensor,
        schedule_meta: torch.Tensor,
        max_context_len: int,
        clean_logits: bool = False,
    ) -> torch.Tensor:
        _check(q.dim() == 4 and q.dtype == FP8 and q.is_contiguous(), "q [B, next_n, H, D] fp8 contiguous")
        batch, next_n, heads, dim = q.shape
        _check(heads in INDEX_HEADS and dim in (32, 64, 128), "num_heads 16/32/64, head_dim 32/64/128")
        _check(kv_cache.dim() == 4 and kv_cache.dtype == torch.uint8, "kv_cache [pages, block, 1, D+4] uint8")
        pages, block_kv, heads_kv, dim_sf = kv_cache.shape
        _check(block_kv in (32, 64) and heads_kv == 1 and dim_sf == dim + 4, "block_kv 32/64, 1 kv head, D+4")
        _check(kv_cache.stride(1) == dim_sf and kv_cache.stride(3) == 1, "kv_cache strides")
        _check(kv_cache.stride(0) % 4 == 0, "kv_cache page stride % 4")
        _check(weights.shape == (batch * next_n, heads), "weights [B * next_n, H]")
        _check(weights.dtype == torch.float32 and weights.is_contiguous(), "weights f32 contiguous")
        _check(block_table.dim() == 2 and block_table.shape[0] == batch, "block_table [B, blocks]")
        _check(block_table.dtype == torch.int32, "block_table int32")
        _check(block_table.stride(1) == 1, "block_table.stride(1) == 1")
        _check(schedule_meta.shape == (self.num_sms + 1, 2), "schedule_meta [num_sms + 1, 2]")
        _check(schedule_meta.dtype == torch.int32, "schedule_meta int32")
        _check(context_lens.shape == (batch, next_n), "context_lens [B, next_n]")
        _check(context_lens.dtype == torch.int32, "context_lens int32")
        _check(context_lens.is_contiguous() and not clean_logits, "context_lens contiguous, clean_logits off")
        page_bytes = kv_cache.stride(0)
        flat = torch.as_strided(kv_cache, (pages, page_bytes), (page_bytes, 1))
        values = flat[:, : block_kv * dim].reshape(pages, block_kv, dim).view(FP8)
        scales = flat[:, block_kv * dim : block_kv * dim_sf].view(torch.float32)
        aligned = -(-max_context_len // 256) * 256
        logits = torch.full((batch * next_n, aligned), self.UNWRITTEN, device=q.device)
        for b in range(batch):
            for n in range(next_n):
                ctx = int(context_lens[b, n])
                blocks = block_table[b, : -(-ctx // block_kv)].long()
                k = values[blocks].reshape(-1, dim)[:ctx]
                s = scales[blocks].reshape(-1)[:ctx]
                logits[b * next_n + n, :ctx] = _scores(q[b, n], k, s, weights[b * next_n + n])
        return logits[:, :max_context_len]

    def _ragged_logits(
        self,
        q: torch.Tensor,
        kv: tuple[torch.Tensor, torch.Tensor],
        weights: torch.Tensor,
        ks: torch.Tensor,
        ke: torch.Tensor,
        clean_logits: bool = False,
    ) -> torch.Tensor:
        k, k_scale = kv
        _check(q.dim() == 3 and q.dtype == FP8 and q.is_contiguous(), "q [S, H, D] fp8 contiguous")
        rows, heads, dim = q.shape
        _check(heads in INDEX_HEADS and 128 % heads == 0, "num_heads 16/32/64")
        _check(k.dim() == 2 and k.shape[1] == dim and k.dtype == FP8 and k.is_contiguous(), "kv [N, D] fp8")
        _check(k_scale.shape == (k.shape[0],) and k_scale.dtype == torch.float32, "kv_sf [N] f32")
        _check(k_scale.is_contiguous(), "kv_sf contiguous")
        _check(weights.shape == (rows, heads) and weights.stride(1) == 1, "weights [S, H], stride(1) 1")
        _check(weights.dtype == torch.float32, "weights f32")
        for t in (ks, ke):
            _check(t.shape == (rows,) and t.dtype == torch.int32 and t.is_contiguous(), "ks/ke [S] int32")
        _check(not clean_logits, "clean_logits off")
        logits = torch.full((rows, k.shape[0]), self.UNWRITTEN, device=q.device)
        for r in range(rows):
            a, e = int(ks[r]), int(ke[r])
            logits[r, a:e] = _scores(q[r], k[a:e], k_scale[a:e], weights[r])
        return logits

    def _topk_transform(
        self,
        score: torch.Tensor,
        lengths: torch.Tensor,
        page_table_size_1: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        topk: int,
        row_starts: torch.Tensor | None = None,
    ) -> torch.Tensor:
        _check(topk == TOPK, "topk == 2048")
        _check(score.dim() == 2 and score.stride(1) == 1 and score.dtype == torch.float32, "score [R, L] f32")
        rows = score.shape[0]
        _check(lengths.shape == (rows,) and lengths.dtype == torch.int32, "lengths [R] int32")
        _check(lengths.is_contiguous(), "lengths contiguous")
        _check(page_table_size_1.dim() == 2 and page_table_size_1.stride(1) == 1, "page table [bs, L]")
        _check(page_table_size_1.dtype == torch.int32, "page table int32")
        _check(cu_seqlens_q.dim() == 1 and cu_seqlens_q.dtype == torch.int32, "cu_seqlens_q int32")
        prefill_bs = cu_seqlens_q.shape[0] - 1
        _check(page_table_size_1.shape[0] == prefill_bs and prefill_bs <= rows, "page table rows == bs <= R")
        if row_starts is not None:
            _check(row_starts.shape == (rows,) and row_starts.dtype == torch.int32, "row_starts [R] int32")
        out = torch.full((rows, topk), -1, dtype=torch.int32, device=score.device)
        row_batch = torch.bucketize(
            torch.arange(rows, device=score.device), cu_seqlens_q[1:].long(), right=True
        )
        for r in range(rows):
            start = 0 if row_starts is None else int(row_starts[r])
            length = int(lengths[r])
            src = page_table_size_1[int(row_batch[r])]
            # the kernel's slot order (short rows: the first `length` slots), then the page table
            idx = kernel_topk(score[r, start : start + length], topk).to(src.device)
            out[r, : len(idx)] = src[idx]
        return out
