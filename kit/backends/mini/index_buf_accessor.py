"""The DSA indexer's fp8 index-K cache, laid out byte for byte as sglang 0.5.14 lays it out, in plain torch.

Layout (sglang mem_cache/memory_pool.py `DSATokenToKVPool.index_k_with_scale_buffer`, read and written by
layers/attention/dsa/index_buf_accessor.py and jit_kernel/csrc/dsa/fused_store_index_cache.cuh): one uint8
buffer per layer, [num_pages, page_size * (index_head_dim + 4)] with page_size 64 and index_head_dim 128.
Page i holds FIRST the fp8 e4m3 values of its 64 tokens (token-major, 64 x 128 bytes), THEN their 64 fp32
scales (one per token: index_head_dim // quant_block_size = 1). DeepGEMM's `fp8_paged_mqa_logits` takes it
as a [num_pages, 64, 1, 132] uint8 view and itself splits each page into values (page + t*128) and scales
(page + 64*128 + t*4): 132 is the per-token byte count, not a per-token interleaving.

Quantization, matched to sglang's CUDA path:
- keys (`fused_store_index_k_cache`, the store sglang prefers on CUDA): per token,
  scale = max(amax, 1e-4) / 448 as a plain fp32 (no ue8m0 rounding, whatever the model's scale_fmt),
  value = fp8(clamp(k * (1 / scale), ±448));
- queries (`act_quant(query, block_size=128, scale_fmt)` in dsa/triton_kernel.py; DeepSeek-V3.2 and GLM-5
  pass scale_fmt="ue8m0"): per group of 128, scale = 2 ** ceil(log2(max(amax, 1e-4) / 448)) (a power of two;
  plain amax / 448 when scale_fmt is None), value = fp8(clamp(q / scale, ±448));
- before quantization both q and k go through `rotate_activation` (a normalized Hadamard transform of the
  128 dims, sglang.jit_kernel.hadamard with scale dim**-0.5): orthonormal, so q.k is unchanged, but it
  spreads outliers before the fp8 cast. Here it is one GEMM with the Sylvester Hadamard matrix.

The mini's request b owns the cache slots of positions 0..max_len-1; `page_table_64[b, j]` names the page
holding its positions 64j..64j+63 (sglang's `real_page_table`), `page_table_1[b, s]` the slot of position s
(sglang's `page_table_1`; in the mini a request's slot is its position, so the top-k transform returns
positions). Pages are assigned contiguously by default; any permutation works (the tests use one).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PAGE_SIZE = 64  # sglang asserts page_size == 64 for DSA on CUDA ("blocksize = 64 is hardcoded in deep_gemm")
QUANT_BLOCK_SIZE = 128  # Indexer.block_size
INDEX_HEAD_DIM = 128  # DSATokenToKVPool asserts index_head_dim == 128
FP8_E4M3_MAX = 448.0
AMAX_FLOOR = 1e-4
FP8 = torch.float8_e4m3fn


def act_quant(
    x: torch.Tensor, block_size: int = QUANT_BLOCK_SIZE, scale_fmt: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """sglang dsa/triton_kernel.py act_quant: fp8 values shaped like x, fp32 scales [..., N // block_size]."""
    n = x.shape[-1]
    if n % block_size:
        raise ValueError(f"last dimension {n} is not a multiple of block_size {block_size}")
    xg = x.float().reshape(*x.shape[:-1], n // block_size, block_size)
    amax = xg.abs().amax(dim=-1, keepdim=True).clamp_min(AMAX_FLOOR)
    if scale_fmt is not None:  # "ue8m0": round the scale up to a power of two (round_scale in the kernel)
        scale = torch.exp2(torch.ceil(torch.log2(amax * (1.0 / FP8_E4M3_MAX))))
    else:
        scale = amax * (1.0 / FP8_E4M3_MAX)
    y = (xg / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8).reshape(x.shape)
    return y, scale.squeeze(-1)


def quant_index_k(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fused_store_index_k_cache's quantization of keys [N, 128]: (fp8 [N, 128], fp32 scale [N])."""
    kf = key.float()
    scale = kf.abs().amax(dim=-1, keepdim=True).clamp_min(AMAX_FLOOR) / FP8_E4M3_MAX
    k_fp8 = (kf * (1.0 / scale)).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8)
    return k_fp8, scale.squeeze(-1)


_HADAMARD: dict[tuple[int, torch.device, torch.dtype], torch.Tensor] = {}


def hadamard_matrix(n: int, device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
    """The normalized Sylvester Hadamard matrix H_n / sqrt(n) (symmetric and orthonormal), cached."""
    if n <= 0 or n & (n - 1):
        raise ValueError(f"Hadamard size must be a power of 2, got {n}")
    key = (n, torch.device(device), dtype)
    if key not in _HADAMARD:
        h = torch.ones(1, 1, dtype=torch.float64)
        while h.shape[0] < n:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        _HADAMARD[key] = (h * n**-0.5).to(device=device, dtype=dtype)
    return _HADAMARD[key]


def rotate_activation(x: torch.Tensor) -> torch.Tensor:
    """sglang dsa_indexer.rotate_activation: hadamard_transform(x, scale=dim**-0.5) over the last dim."""
    return x @ hadamard_matrix(x.shape[-1], x.device, x.dtype)


@dataclass
class IndexKWithScaleBuffer:
    """One layer's index_k_with_scale_buffer for B requests of max_len slots each, plus their page tables."""

    buf: torch.Tensor  # [num_pages, PAGE_SIZE * (head_dim + 4)] uint8
    page_table_64: torch.Tensor  # [B, max_len // PAGE_SIZE] int32: the page of each request's 64-slot block
    page_table_1: torch.Tensor  # [B, max_len] int32: the slot of each position (here: the position)
    head_dim: int = INDEX_HEAD_DIM

    @staticmethod
    def allocate(
        batch: int,
        max_len: int,
        device: torch.device | str,
        head_dim: int = INDEX_HEAD_DIM,
        page_table_64: torch.Tensor | None = None,
    ) -> IndexKWithScaleBuffer:
        if head_dim != INDEX_HEAD_DIM:
            raise ValueError(f"sglang's index-K cache holds index_head_dim {INDEX_HEAD_DIM}, got {head_dim}")
        if max_len % PAGE_SIZE:
            raise ValueError(f"max_len {max_len} is not a multiple of the page size {PAGE_SIZE}")
        blocks = max_len // PAGE_SIZE
        if page_table_64 is None:
            page_table_64 = torch.arange(batch * blocks, dtype=torch.int32, device=device).view(batch, blocks)
        if page_table_64.shape != (batch, blocks) or page_table_64.dtype != torch.int32:
            raise ValueError(f"page_table_64 must be int32 [{batch}, {blocks}]")
        num_pages = int(page_table_64.max()) + 1
        return IndexKWithScaleBuffer(
            buf=torch.zeros(num_pages, PAGE_SIZE * (head_dim + 4), dtype=torch.uint8, device=device),
            page_table_64=page_table_64.to(device).contiguous(),
            page_table_1=torch.arange(max_len, dtype=torch.int32, device=device).repeat(batch, 1),
            head_dim=head_dim,
        )

    @property
    def batch(self) -> int:
        return self.page_table_64.shape[0]

    @property
    def max_len(self) -> int:
        return self.page_table_64.shape[1] * PAGE_SIZE

    @property
    def num_pages(self) -> int:
        return self.buf.shape[0]

    def values(self) -> torch.Tensor:
        """[num_pages, 64, head_dim] uint8 view of the fp8 bytes (the first 64 * head_dim bytes of a page)."""
        return self.buf[:, : PAGE_SIZE * self.head_dim].view(self.num_pages, PAGE_SIZE, self.head_dim)

    def scales(self) -> torch.Tensor:
        """[num_pages, 64] float32 view of the per-token scales (the last 64 * 4 bytes of a page)."""
        return self.buf[:, PAGE_SIZE * self.head_dim :].view(torch.float32)

    def kv_cache_fp8(self) -> torch.Tensor:
        """The [num_pages, 64, 1, head_dim + 4] uint8 view DeepGEMM's fp8_paged_mqa_logits takes."""
        return self.buf.view(self.num_pages, PAGE_SIZE, 1, self.head_dim + 4)

    def loc(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(page, offset in page) of positions [B, T] of requests 0..B-1, flattened to [B*T] int64."""
        b = torch.arange(positions.shape[0], device=positions.device)[:, None].expand_as(positions)
        page = self.page_table_64[b, torch.div(positions, PAGE_SIZE, rounding_mode="floor")].long()
        return page.reshape(-1), (positions % PAGE_SIZE).reshape(-1)

    def set_index_k_scale_buffer(
        self, positions: torch.Tensor, index_k: torch.Tensor, index_k_scale: torch.Tensor
    ) -> None:
        """SetKAndS: fp8 keys [B*T, head_dim] and fp32 scales [B*T] into the slots of positions [B, T]."""
        page, off = self.loc(positions)
        self.values()[page, off] = index_k.reshape(-1, self.head_dim).view(torch.uint8)
        self.scales()[page, off] = index_k_scale.reshape(-1).float()

    def store(self, key: torch.Tensor, positions: torch.Tensor) -> None:
        """fused_store_index_k_cache: quantize keys [B, T, head_dim] and write them at positions [B, T]."""
        k_fp8, k_scale = quant_index_k(key.reshape(-1, self.head_dim))
        self.set_index_k_scale_buffer(positions, k_fp8, k_scale)

    def get_index_k_scale_buffer(self) -> tuple[torch.Tensor, torch.Tensor]:
        """GetKAndS over every slot: (fp8 [B * max_len, head_dim], fp32 scale [B * max_len]), request-major.

        sglang gathers only each request's live seq_len (host-side sizes); the mini gathers the fixed
        max_len so the shapes stay static under a CUDA graph (ks/ke then bound what is read).
        """
        pages = self.page_table_64.reshape(-1).long()
        k = self.values()[pages].reshape(-1, self.head_dim).view(FP8)
        s = self.scales()[pages].reshape(-1)
        return k, s

    def dequantize(self) -> torch.Tensor:
        """The keys the kernels see as float32 [B, max_len, head_dim] (value * scale): the torch reference."""
        k, s = self.get_index_k_scale_buffer()
        return (k.float() * s[:, None]).view(self.batch, self.max_len, self.head_dim)
