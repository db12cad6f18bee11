"""The DSA lightning indexer (sglang layers/attention/dsa/dsa_indexer.py, class Indexer), in plain torch.

Per query token t and cached token s: score(t, s) = sum_h w_h(t) * relu(q_h(t) . k(s)), with
q_h = wq_b(q_lora) (index_n_heads x index_head_dim), one key per cached token shared by all heads
(k = LayerNorm(wk(x)), stored in the index-K cache when the indexer runs, like sglang's
fused_store_index_k_cache), w = weights_proj(x) * index_n_heads^-0.5, RoPE on the first half of q and k.
Then top-`index_topk` over the allowed cache slots. Not modelled here: fp8 keys and their scales, the
Hadamard rotation, the paged cache; scores are computed in float32 over a preallocated cache of fixed
length with a length mask, so one code path (and one CUDA graph) serves every context length. All three
are in kit/mini/dsa_indexer_sglang.py, the same indexer on sglang's own kernels (deep_gemm + sgl_kernel)
over sglang's fp8 paged cache, which the engine takes instead where they run (params `indexer_impl`).

The returned indices are sorted ascending, padded with -1 when fewer slots are allowed than
index_topk: a canonical order, so that two queries selecting the same set attend in the same order
(bit-identical sums) — that is what makes reuse and recompute identical when everything fits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kit.probe import ranges as nr


@dataclass
class IndexerWeights:
    wq_b: torch.Tensor  # [index_n_heads * index_head_dim, q_lora_rank]
    wk: torch.Tensor  # [index_head_dim, hidden]
    weights_proj: torch.Tensor  # [index_n_heads, hidden]


class Rope:
    """Rotary tables for positions [0, max_len); rotates the first `rope_dim` channels (neox halves)."""

    def __init__(self, rope_dim: int, max_len: int, device: torch.device, theta: float = 10000.0):
        half = rope_dim // 2
        inv = 1.0 / (theta ** (torch.arange(half, dtype=torch.float64) / half))
        ang = torch.arange(max_len, dtype=torch.float64)[:, None] * inv[None, :]
        self.cos = ang.cos().to(device=device, dtype=torch.float32)
        self.sin = ang.sin().to(device=device, dtype=torch.float32)
        self.rope_dim = rope_dim

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [B, T, ..., D] float32; positions [B, T]."""
        half = self.rope_dim // 2
        cos = self.cos[positions]
        sin = self.sin[positions]
        while cos.dim() < x.dim():
            cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        x1, x2, rest = x[..., :half], x[..., half : self.rope_dim], x[..., self.rope_dim :]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


class Indexer:
    """One layer's lightning indexer. `calls` counts invocations (eager; a CUDA graph counts its capture)."""

    def __init__(self, weights: IndexerWeights, n_heads: int, head_dim: int, index_topk: int, rope: Rope):
        self.w = weights
        self.n_heads = n_heads
        self.head_dim = head_dim
        self.index_topk = index_topk
        self.rope = rope
        self.calls = 0

    def store_k(self, x: torch.Tensor, positions: torch.Tensor, index_k_cache: torch.Tensor) -> None:
        """Write the index keys of the input tokens (also used alone by the cheap prefill path)."""
        k = torch.nn.functional.layer_norm((x @ self.w.wk.T).float(), (self.head_dim,))
        k = self.rope.apply(k, positions)
        b = torch.arange(x.shape[0], device=x.device)[:, None]
        index_k_cache[b, positions] = k

    def forward(
        self,
        x: torch.Tensor,
        q_lora: torch.Tensor,
        positions: torch.Tensor,
        index_k_cache: torch.Tensor,
        limit: torch.Tensor,
    ) -> torch.Tensor:
        """Top-k cache slots per query: slots s < limit[b, t] compete; returns [B, T, K] int64 (-1 = none).

        x: [B, T, hidden] (normed layer input); q_lora: [B, T, q_lora_rank]; limit: [B, T] or [B, 1].
        """
        with nr.annotate(nr.INDEXER):
            self.calls += 1
            B, T, _ = x.shape
            H, D = self.n_heads, self.head_dim
            self.store_k(x, positions, index_k_cache)
            q = (q_lora @ self.w.wq_b.T).float().view(B, T, H, D)
            q = self.rope.apply(q, positions)
            w = (x @ self.w.weights_proj.T).float() * (H**-0.5)  # [B, T, H]
            n = index_k_cache.shape[1]
            # [B, N, D] @ [B, D, T*H] -> [B, N, T*H]: one GEMM over the whole cache.
            s = torch.matmul(index_k_cache, q.reshape(B, T * H, D).transpose(1, 2)).relu_()
            if T == 1:
                logits = torch.matmul(s, w.reshape(B, H, 1)).reshape(B, 1, n)
            else:
                logits = (s.view(B, n, T, H) * w.view(B, 1, T, H)).sum(-1).transpose(1, 2)  # [B, T, N]
            slots = torch.arange(n, device=x.device)
            logits = logits.masked_fill(slots >= limit.unsqueeze(-1), float("-inf"))
            k = min(self.index_topk, n)
            vals, idx = torch.topk(logits, k, dim=-1, sorted=False)
            idx = torch.where(torch.isinf(vals), torch.full_like(idx, -1), idx)
            return torch.sort(idx, dim=-1).values
