"""The lightning indexer on sglang's own kernels: sglang 0.5.14 `Indexer.forward_cuda` (dsa/dsa_indexer.py).

Same weights, projections, LayerNorm and RoPE as the torch `Indexer` (kit/mini/dsa_indexer.py), then what
sglang does on CUDA, in its order:
1. q = wq_b(q_lora), k = k_norm(wk(x)), RoPE; both in bf16 through `rotate_activation` (Hadamard);
2. `_store_index_k_cache`: k -> fp8 + per-token fp32 scale into the paged index-K cache
   (fused_store_index_k_cache; here the torch equivalent in kit/mini/index_buf_accessor.py);
3. q_fp8, q_scale = act_quant(q, 128, "ue8m0"); weights = weights_proj(x) * n_heads**-0.5 * q_scale *
   head_dim**-0.5 (`_get_logits_head_gate`), [rows, H] fp32;
4. `_get_topk_paged` (decode, target_verify, draft_extend: every forward the mini has): schedule metadata,
   `fp8_paged_mqa_logits` over the paged cache with one row per query token (q [rows, 1, H, 128] — the
   layout sglang uses off sm100, block table repeated per token), then `fast_topk_transform_fused`;
   or, with path="ragged", `_get_topk_ragged` (sglang's extend/prefill path): the cache gathered into a
   contiguous fp8 K + scales (GetKAndS), `fp8_mqa_logits` with per-row [ks, ke), the same top-k with
   row_starts = ks. sglang 0.5.14 never takes the ragged path for decode, target_verify or draft_extend;
   in the mini it is a counterfactual switch for measuring that path's cost per indexer call.
The output is the mini's: positions [B, T, 2048] sorted ascending, -1 padded (page_table_1 maps a
request's slot s to position s, so the transformed top-k are positions).

Kept from the torch indexer on purpose: the q/k projections' dtypes and the mini's RoPE. Two deviations a
profile shows, both per indexer call: the quantize/store steps are several torch kernels where sglang
launches one fused kernel each (hadamard, act_quant, fused_store_index_k_cache); the schedule metadata is
computed inside the call (sglang 0.5.14's `_get_topk_paged` fallback) where sglang's DSA backend normally
computes it once per forward batch, before graph replay; plus the final sort (the mini's canonical order).
"""

from __future__ import annotations

import torch

from kit.backends.mini.dsa_indexer import Indexer, IndexerWeights, Rope
from kit.backends.mini.dsa_kernels import SglangKernels
from kit.backends.mini.index_buf_accessor import (
    PAGE_SIZE,
    QUANT_BLOCK_SIZE,
    IndexKWithScaleBuffer,
    act_quant,
    rotate_activation,
)
from kit.probe import ranges as nr


class SglangIndexer(Indexer):
    """One layer's indexer on deep_gemm + sgl_kernel; `calls` counts invocations like the torch one."""

    scale_fmt = "ue8m0"  # deepseek_v2.py builds the Indexer with scale_fmt="ue8m0" (DeepSeek-V3.2, GLM-5)

    def __init__(
        self,
        weights: IndexerWeights,
        n_heads: int,
        head_dim: int,
        index_topk: int,
        rope: Rope,
        kernels: SglangKernels,
        path: str = "paged",
    ):
        super().__init__(weights, n_heads, head_dim, index_topk, rope)
        if path not in ("paged", "ragged"):
            raise ValueError(f"indexer path must be paged or ragged, got {path!r}")
        self.kernels = kernels
        self.path = path
        self.softmax_scale = head_dim**-0.5
        self._consts: dict[tuple, torch.Tensor] = {}

    def _const(self, key: tuple, make) -> torch.Tensor:
        """Per-shape constant tensors (made before graph capture by the warm-up runs, read by the graph)."""
        if key not in self._consts:
            self._consts[key] = make()
        return self._consts[key]

    def _key(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        k = torch.nn.functional.layer_norm((x @ self.w.wk.T).float(), (self.head_dim,))
        return rotate_activation(self.rope.apply(k, positions).to(torch.bfloat16))

    def store_k(self, x: torch.Tensor, positions: torch.Tensor, index_k_cache: IndexKWithScaleBuffer) -> None:
        """_store_index_k_cache: the input tokens' quantized keys into their slots (also used by prefill)."""
        index_k_cache.store(self._key(x, positions), positions)

    def forward(
        self,
        x: torch.Tensor,
        q_lora: torch.Tensor,
        positions: torch.Tensor,
        index_k_cache: IndexKWithScaleBuffer,
        limit: torch.Tensor,
    ) -> torch.Tensor:
        """Top-k cache slots per query: slots s < limit[b, t] compete; [B, T, 2048] int64 (-1 = none)."""
        with nr.annotate(nr.INDEXER):
            self.calls += 1
            B, T, _ = x.shape
            H, D, R = self.n_heads, self.head_dim, B * T
            self.store_k(x, positions, index_k_cache)
            q = (q_lora @ self.w.wq_b.T).float().view(B, T, H, D)
            q = rotate_activation(self.rope.apply(q, positions).to(torch.bfloat16))
            # q_fp8 [R, H, D], q_scale [R, H, 1]
            q_fp8, q_scale = act_quant(q.reshape(R, H, D), QUANT_BLOCK_SIZE, self.scale_fmt)
            gate = (x @ self.w.weights_proj.T).float().reshape(R, H) * H**-0.5
            weights = (gate.unsqueeze(-1) * q_scale * self.softmax_scale).squeeze(-1)  # [R, H] f32
            lengths = limit.expand(B, T).reshape(R).to(torch.int32)  # sglang's seqlens_expanded
            cu_seqlens_q = self._const(
                ("cu", B, T), lambda: torch.arange(0, R + 1, T, dtype=torch.int32, device=x.device)
            )
            if self.path == "paged":
                topk = self._get_topk_paged(index_k_cache, q_fp8, weights, lengths, cu_seqlens_q, B, T)
            else:
                topk = self._get_topk_ragged(index_k_cache, q_fp8, weights, lengths, cu_seqlens_q, B, T)
            return torch.sort(topk.view(B, T, -1), dim=-1).values.long()

    def _get_topk_paged(
        self,
        cache: IndexKWithScaleBuffer,
        q_fp8: torch.Tensor,
        weights: torch.Tensor,
        lengths: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        B: int,
        T: int,
    ) -> torch.Tensor:
        k = self.kernels
        context_lens = lengths.view(B * T, 1)  # [B*T, next_n=1]: one row per query token
        block_table = cache.page_table_64
        if T > 1:  # sglang repeats the request's real_page_table for each of its query tokens
            block_table = self._const(
                ("bt", B, T), lambda: cache.page_table_64.repeat_interleave(T, dim=0).contiguous()
            )
        schedule = k.get_paged_mqa_logits_metadata(context_lens, PAGE_SIZE, k.num_sms)
        logits = k.fp8_paged_mqa_logits(
            q_fp8.unsqueeze(1),
            cache.kv_cache_fp8(),
            weights,
            context_lens,
            block_table,
            schedule,
            cache.max_len,  # block_tables.shape[1] * page_size, as sglang passes it
            clean_logits=False,
        )
        return k.fast_topk_transform_fused(
            score=logits,
            lengths=lengths,
            page_table_size_1=cache.page_table_1,
            cu_seqlens_q=cu_seqlens_q,
            topk=self.index_topk,
        )

    def _get_topk_ragged(
        self,
        cache: IndexKWithScaleBuffer,
        q_fp8: torch.Tensor,
        weights: torch.Tensor,
        lengths: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        B: int,
        T: int,
    ) -> torch.Tensor:
        k = self.kernels
        kv_fp8 = cache.get_index_k_scale_buffer()  # request b's slots at [b * max_len, (b + 1) * max_len)
        ks = self._const(
            ("ks", B, T),
            lambda: (
                torch.arange(B, dtype=torch.int32, device=q_fp8.device).repeat_interleave(T) * cache.max_len
            ).contiguous(),
        )
        ke = ks + lengths
        logits = k.fp8_mqa_logits(q_fp8, kv_fp8, weights, ks, ke, clean_logits=False)
        return k.fast_topk_transform_fused(
            score=logits,
            lengths=lengths,
            page_table_size_1=cache.page_table_1,
            cu_seqlens_q=cu_seqlens_q,
            topk=self.index_topk,
            row_starts=ks,
        )
