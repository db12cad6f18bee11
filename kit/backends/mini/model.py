"""The target DSA model (sglang models/deepseek_v2.py: DeepseekV2AttentionMLA + Indexer; deepseek_v32).

Each layer: RMSNorm -> attention -> residual -> RMSNorm -> SwiGLU -> residual. The attention is MLA's
absorbed decode form without RoPE: one latent KV vector of kv_lora_rank per token (the KV cache),
queries q_lora -> q_nope (per head) -> W_UK into the latent space, values read back through W_UV and
o_proj. It is sparse: each query attends only to the cache slots its layer's lightning indexer selects
(kit/mini/dsa_indexer.py), plus, for the MTP draft layer only, a dense window over the in-flight tokens
of the current pass (see `DecoderLayer`). Not modelled: MLA's decoupled RoPE, MoE, fp8 outside the
indexer, TP. The indexer is the torch one or, with `indexer_impl` sglang, sglang's fp8 kernels
(kit/mini/dsa_indexer_sglang.py); `LayerCache.index_k` is then sglang's paged fp8 index-K cache.

Two attention semantics, each chosen for a property the tests check:
- target layers (window 0): every query ranks all slots up to its own position (causal DSA). A
  token's result depends only on its position, not on how tokens were grouped into verify blocks,
  so greedy outputs cannot depend on what the draft proposed: speculative decoding is lossless.
- the NextN draft layer (window = num_draft_tokens): the indexer ranks the COMMITTED draft cache
  (slots < seq_lens, fixed during a draft round); the num_draft_tokens slots after it (this round's
  draft tokens, or the verified block in draft_extend) are always attended, causally. With
  <= index_topk committed slots the indexer keeps all of them, so a reused top-k equals a recomputed
  one exactly, as PR #29654 relies on.

Cheap prefill (so that a 64k prompt costs seconds on 2 CPU cores): for every prompt token but the
last, each layer's cache entries (latent KV, index key) are the layer's own projections of a
context-free input, the token's embedding; attention and FFN contributions of the prompt are not
computed, and no indexer scores anything. The last prompt token then runs the real sparse forward
(target, then the MTP layer) to give the first output token and the first draft token. Every forward
after that (verify, draft steps, draft_extend) is the real sparse path over the whole cache.

How the weights make the draft predict the target (see `build_weights`): token embeddings E are
random; the LM head is E permuted (W[perm[t]] = E[t]), so a residual stream dominated by E[t] predicts
perm[t] (a bigram backbone). Attention values are read back into embedding space (kv_a = Q^T with Q
orthonormal, W_UV selects a latent slice per head, o_proj = Q's matching columns), so a focused head
adds the embedding of an earlier token u and can switch the prediction to perm[u]: context changes
the output. Only kv_lora_rank / v_head_dim "writer" heads write back (one per latent slice: 4 in
`tiny` and `dsv32`, 2 in `glm5`) and they share one query, so together they return the focused
token's whole latent; the other heads are computed at full cost but their o_proj columns are zero.
This keeps the mixing strength independent of width and head count. Layer 0 mixes weakly
(`mix_modeled`), later layers strongly (`mix_unmodeled`). The MTP draft layer re-uses layer 0's
weights (attention, indexer, FFN), with eh_proj = [I | eps*I] and the shared embedding/head: it
computes the target's layer-0 function one position ahead, and misses what the later layers add.
The mixing strengths were tuned on `tiny` for accept lengths near 3 at num_steps 5 (measured: ~2.9-3.3
on CPU at 4k-16k; on an H200 `dsv32` 2.5-4.0 and `glm5` 2.9-4.6 at 8k-512k, equal in every arm).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kit.backends.mini.dsa_indexer import Indexer, IndexerWeights, Rope
from kit.backends.mini.forward_batch_info import ForwardBatch
from kit.backends.mini.index_buf_accessor import IndexKWithScaleBuffer
from kit.backends.mini.presets import Preset

# (weights, index_n_heads, index_head_dim, index_topk, rope) -> the layer's indexer: the torch `Indexer`
# or, with sglang's kernels, kit/mini/dsa_indexer_sglang.SglangIndexer (bound to its kernels and path).
IndexerFactory = Callable[[IndexerWeights, int, int, int, Rope], Indexer]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


@dataclass
class AttnWeights:
    q_a: torch.Tensor  # [q_lora, hidden]
    q_a_norm: torch.Tensor  # [q_lora]
    q_b: torch.Tensor  # [heads * qk_nope, q_lora]
    w_uk: torch.Tensor  # [heads, qk_nope, kv_lora]
    kv_a: torch.Tensor  # [kv_lora, hidden]
    kv_norm: torch.Tensor  # [kv_lora]
    w_uv: torch.Tensor  # [heads, kv_lora, v_head]
    o_proj: torch.Tensor  # [hidden, heads * v_head]


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor
    attn: AttnWeights
    indexer: IndexerWeights
    ffn_norm: torch.Tensor
    gate: torch.Tensor  # [inter, hidden]
    up: torch.Tensor  # [inter, hidden]
    down: torch.Tensor  # [hidden, inter]


@dataclass
class ModelWeights:
    embed: torch.Tensor  # [vocab, hidden], shared with the MTP layer (as in DeepSeek-V3)
    lm_head: torch.Tensor  # [vocab, hidden], shared with the MTP layer's shared_head
    norm: torch.Tensor
    layers: list[LayerWeights]
    # the MTP (NextN) layer's own weights; its decoder block re-uses layers[0]
    enorm: torch.Tensor
    hnorm: torch.Tensor
    eh_proj: torch.Tensor  # [hidden, 2 * hidden]
    shared_head_norm: torch.Tensor
    perm: torch.Tensor = field(repr=False)  # the bigram backbone (for diagnostics)


@dataclass
class LayerCache:
    """One layer's caches for B requests over a fixed max_len: memory = context x layers."""

    kv: torch.Tensor  # [B, max_len, kv_lora] latent KV (model dtype)
    # torch indexer: [B, max_len, index_head_dim] float32; sglang kernels: sglang's paged fp8 index-K cache
    index_k: torch.Tensor | IndexKWithScaleBuffer

    @staticmethod
    def allocate(
        p: Preset,
        batch: int,
        max_len: int,
        device: torch.device,
        dtype: torch.dtype,
        indexer_impl: str = "torch",
    ) -> LayerCache:
        if indexer_impl == "sglang":
            index_k = IndexKWithScaleBuffer.allocate(batch, max_len, device, p.index_head_dim)
        else:
            index_k = torch.zeros(batch, max_len, p.index_head_dim, device=device, dtype=torch.float32)
        return LayerCache(
            kv=torch.zeros(batch, max_len, p.kv_lora_rank, device=device, dtype=dtype), index_k=index_k
        )


def build_weights(p: Preset, seed: int, device: torch.device, dtype: torch.dtype) -> ModelWeights:
    """Seeded weights (same seed + device -> same weights); the module docstring says why this shape."""
    g = torch.Generator(device=device).manual_seed(seed)
    d, r, H, v = p.hidden_size, p.kv_lora_rank, p.num_attention_heads, p.v_head_dim

    def randn(*shape: int, std: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * std

    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype).contiguous()

    embed = randn(p.vocab_size, d)
    perm = torch.randperm(p.vocab_size, generator=g, device=device)
    lm_head = embed[torch.argsort(perm)] / math.sqrt(d)  # lm_head[perm[t]] = embed[t] / sqrt(d)
    layers = []
    for layer_id in range(p.num_target_layers):
        mix = p.mix_modeled if layer_id == 0 else p.mix_unmodeled
        basis = torch.linalg.qr(randn(d, r)).Q  # [d, r] orthonormal: latent = basis^T x
        writers = max(1, min(H, r // v))  # one head per latent slice writes back (module docstring)
        w_uv = torch.zeros(H, r, v, device=device)
        o_proj = torch.zeros(d, H * v, device=device)
        for h in range(H):
            start = (h * v) % r
            w = min(v, r - start)
            w_uv[h, start : start + w, :w] = torch.eye(w, device=device)
            if h < writers:
                o_proj[:, h * v : h * v + w] = basis[:, start : start + w] * (mix * d / r)
        q_b = randn(H, p.qk_nope_head_dim, p.q_lora_rank, std=p.q_lora_rank**-0.5)
        w_uk = randn(H, p.qk_nope_head_dim, r, std=p.qk_nope_head_dim**-0.5)
        q_b[:writers], w_uk[:writers] = q_b[0].clone(), w_uk[0].clone()  # the writing heads attend alike
        attn = AttnWeights(
            q_a=cast(randn(p.q_lora_rank, d, std=d**-0.5)),
            q_a_norm=cast(torch.ones(p.q_lora_rank, device=device)),
            q_b=cast(q_b.reshape(H * p.qk_nope_head_dim, p.q_lora_rank)),
            w_uk=cast(w_uk),
            kv_a=cast(basis.T),
            kv_norm=cast(torch.ones(r, device=device)),
            w_uv=cast(w_uv),
            o_proj=cast(o_proj),
        )
        indexer = IndexerWeights(
            wq_b=cast(randn(p.index_n_heads * p.index_head_dim, p.q_lora_rank, std=p.q_lora_rank**-0.5)),
            wk=cast(randn(p.index_head_dim, d, std=d**-0.5)),
            weights_proj=cast(randn(p.index_n_heads, d, std=d**-0.5)),
        )
        layers.append(
            LayerWeights(
                attn_norm=cast(torch.ones(d, device=device)),
                attn=attn,
                indexer=indexer,
                ffn_norm=cast(torch.ones(d, device=device)),
                gate=cast(randn(p.intermediate_size, d, std=d**-0.5)),
                up=cast(randn(p.intermediate_size, d, std=d**-0.5)),
                down=cast(randn(d, p.intermediate_size, std=p.mlp_scale * p.intermediate_size**-0.5)),
            )
        )
    eye = torch.eye(d, device=device)
    return ModelWeights(
        embed=cast(embed),
        lm_head=cast(lm_head),
        norm=cast(torch.ones(d, device=device)),
        layers=layers,
        enorm=cast(torch.ones(d, device=device)),
        hnorm=cast(torch.ones(d, device=device)),
        eh_proj=cast(torch.cat([eye, p.draft_hidden_weight * eye], dim=1)),
        shared_head_norm=cast(torch.ones(d, device=device)),
        perm=perm,
    )


class DecoderLayer:
    """One DSA decoder layer; `window` > 0 makes it the MTP draft layer's variant (module docstring)."""

    def __init__(
        self,
        w: LayerWeights,
        p: Preset,
        index_topk: int,
        rope: Rope,
        window: int,
        make_indexer: IndexerFactory = Indexer,
    ):
        self.w = w
        self.p = p
        self.window = window
        self.indexer = make_indexer(w.indexer, p.index_n_heads, p.index_head_dim, index_topk, rope)
        self.scale = p.attn_temperature / math.sqrt(p.kv_lora_rank)
        self.cache: LayerCache | None = None

    # --- pieces shared by the sparse path and the cheap prefill path ---
    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a, p = self.w.attn, self.p
        B, T, _ = x.shape
        q_lora = rms_norm(x @ a.q_a.T, a.q_a_norm, p.rms_norm_eps)
        q_nope = (q_lora @ a.q_b.T).view(B * T, p.num_attention_heads, p.qk_nope_head_dim).transpose(0, 1)
        q_lat = torch.bmm(q_nope, a.w_uk).transpose(0, 1).reshape(B, T, p.num_attention_heads, -1)
        latent = rms_norm(x @ a.kv_a.T, a.kv_norm, p.rms_norm_eps)  # [B, T, kv_lora]
        return q_lora, q_lat * self.scale, latent

    def _out(self, out_lat: torch.Tensor) -> torch.Tensor:
        """[B, T, heads, kv_lora] -> [B, T, hidden] through W_UV and o_proj."""
        a = self.w.attn
        B, T, H, r = out_lat.shape
        o = torch.bmm(out_lat.reshape(B * T, H, r).transpose(0, 1), a.w_uv)  # [H, B*T, v]
        return o.transpose(0, 1).reshape(B, T, -1) @ a.o_proj.T

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        x = rms_norm(h, self.w.ffn_norm, self.p.rms_norm_eps)
        return (torch.nn.functional.silu(x @ self.w.gate.T) * (x @ self.w.up.T)) @ self.w.down.T

    # --- the real (decode / verify / draft / draft-extend) path ---
    def forward(
        self,
        h: torch.Tensor,
        positions: torch.Tensor,
        forward_batch: ForwardBatch,
        prev_topk_indices: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cache = self.cache
        B, T, _ = h.shape
        x = rms_norm(h, self.w.attn_norm, self.p.rms_norm_eps)
        q_lora, q_lat, latent = self._project(x)
        b = torch.arange(B, device=h.device)[:, None]
        cache.kv[b, positions] = latent
        # forward_absorb_prepare: the indexer runs only when no top-k is handed in.
        if prev_topk_indices is None:
            limit = forward_batch.seq_lens[:, None] if self.window else positions + 1
            topk_indices = self.indexer.forward(x, q_lora, positions, cache.index_k, limit)
        else:
            topk_indices = prev_topk_indices
        slots, valid = topk_indices, topk_indices >= 0
        if topk_indices.shape[1] != T:
            slots, valid = slots.expand(B, T, -1), valid.expand(B, T, -1)
        if self.window:
            win = forward_batch.seq_lens[:, None, None] + torch.arange(self.window, device=h.device)
            win = win.expand(B, T, self.window)
            slots = torch.cat([slots, win], dim=-1)
            valid = torch.cat([valid, win <= positions.unsqueeze(-1)], dim=-1)
        kv = cache.kv[b.unsqueeze(-1), slots.clamp(min=0)]  # [B, T, S, kv_lora]
        scores = torch.matmul(q_lat, kv.transpose(-1, -2)).float()  # [B, T, heads, S]
        scores = scores.masked_fill(~valid.unsqueeze(2), float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(kv.dtype)
        h = h + self._out(torch.matmul(probs, kv))
        h = h + self._mlp(h)
        return h, topk_indices

    # --- the cheap prefill path (module docstring) ---
    def fill_prefill_cache(self, h: torch.Tensor, positions: torch.Tensor) -> None:
        """Write this layer's latent KV and index keys for prompt tokens whose layer input is `h`."""
        x = rms_norm(h, self.w.attn_norm, self.p.rms_norm_eps)
        b = torch.arange(h.shape[0], device=h.device)[:, None]
        self.cache.kv[b, positions] = rms_norm(
            x @ self.w.attn.kv_a.T, self.w.attn.kv_norm, self.p.rms_norm_eps
        )
        self.indexer.store_k(x, positions, self.cache.index_k)


class DeepseekV32ForCausalLM:
    """The target model: embedding, `num_target_layers` DSA layers, final norm, LM head."""

    def __init__(
        self, w: ModelWeights, p: Preset, index_topk: int, rope: Rope, make_indexer: IndexerFactory = Indexer
    ):
        self.w = w
        self.p = p
        self.layers = [DecoderLayer(lw, p, index_topk, rope, 0, make_indexer) for lw in w.layers]

    def attach_caches(self, caches: list[LayerCache]) -> None:
        for layer, cache in zip(self.layers, caches, strict=True):
            layer.cache = cache

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden, self.w.norm, self.p.rms_norm_eps) @ self.w.lm_head.T

    def forward(self, forward_batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (logits [B, T, vocab], hidden [B, T, hidden] before the final norm, for the MTP layer)."""
        h = self.w.embed[forward_batch.input_ids]
        for layer in self.layers:
            h, _ = layer.forward(h, forward_batch.positions, forward_batch)
        return self.logits(h), h

    def fill_prefill_cache(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Cheap prefill: every layer's input is taken to be the token embedding; returns it as `hidden`."""
        h = self.w.embed[input_ids]
        for layer in self.layers:
            layer.fill_prefill_cache(h, positions)
        return h
