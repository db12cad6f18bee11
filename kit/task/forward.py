"""float32 CPU forward of a DeepseekV32 DSA + NextN checkpoint as sglang 0.5.14 computes it, for task
checkpoints: MLA attention in its absorbed form (deepseek_v2 forward_absorb), the DSA lightning indexer
(dsa_indexer.Indexer: weights_proj gate, wq_b/wk heads, k_norm LayerNorm, Hadamard rotation, fp8 keys and
ue8m0 queries, sum_h w_h relu(q_h.k), top-index_topk over the causal prefix; every token when the prefix
fits), sparse attention over the selected tokens with the yarn mscale^2 softmax scale, MLP / grouped noaux_tc
MoE, the final norm and lm_head, and the NextN layer (enorm/hnorm/eh_proj, shared_head.norm, the target's
embedding and lm_head).

Not modelled: RoPE. Refused unless every query rope row is zero (MLA q_pe and the indexer's first 64 dims),
which makes the rope terms exactly zero whatever the keys are. Exact shortcuts keep it fast at long context
(each adds exactly zero where it skips): attention heads whose value path never reaches o_proj, an attention
with no such head (kept without a cache), indexer heads with zero weights, MLPs whose down projections are
zero, all-zero lm_head rows; and when only layer 0 attends and the draft ignores the target hidden, a prompt
position's keys depend on its embedding alone and are computed once per distinct embedding row
(tests/test_task_reference.py checks this against every position through every layer).
"""

from __future__ import annotations

import contextlib
import json
import math
import struct
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kit.errors import InputError, InternalError, UsageError
from kit.task.spec import INDEX_ROPE, LATENT_TILE, hadamard
from kit.task.topk import kernel_topk

_DTYPES = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16}
FP8_MAX = 448.0


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a .safetensors file as float32 (the format is a JSON header and raw tensors)."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, meta in header.items():
        lo, hi = meta["data_offsets"]
        out[name] = tensor_from_bytes(raw[8 + n + lo : 8 + n + hi], meta["dtype"], meta["shape"])
    return out


def tensor_from_bytes(data: bytes, dtype: str, shape: list[int] | tuple[int, ...]) -> torch.Tensor:
    """One safetensors tensor (its dtype name, raw little-endian bytes) as float32."""
    return torch.frombuffer(bytearray(data), dtype=_DTYPES[dtype]).reshape(shape).float()


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Round x/scale to float8_e4m3fn (saturating at 448) and back."""
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * scale


@dataclass(frozen=True)
class Numerics:
    """What the H200 run quantises: fp8_e4m3 MLA latent (flashmla_kv, 4 tiles of 128, scale amax/448),
    fp8 indexer keys (fp32 scale) and queries (ue8m0 power-of-two scale), bf16 activations in between."""

    fp8_kv: bool = True
    fp8_index: bool = True


def softmax_scale(cfg: dict[str, Any]) -> float:
    """DeepseekV2AttentionMLA.scaling: qk_head_dim^-0.5, times yarn mscale^2 (compute_mla_mscale_scaling)."""
    scale = (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5
    rs = cfg.get("rope_scaling") or {}
    if rs and rs.get("apply_yarn_scaling", True) and rs.get("apply_scale", True):
        factor = float(rs.get("factor", 1.0))
        mscale = 1.0 if factor <= 1 else 0.1 * float(rs.get("mscale_all_dim") or 0.0) * math.log(factor) + 1.0
        scale *= mscale * mscale
    return scale


def _one_request(
    forward_batch: Callable[..., tuple[list[torch.Tensor], list[list[torch.Tensor]]]],
    x: torch.Tensor,
    cache: KVCache | None,
    start: int,
    *,
    mode: str = "indexer",
    gen: torch.Generator | None = None,
    topk: list[torch.Tensor] | None = None,
    stats: list[dict[str, float]] | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One request through a `forward_batch` (output, selections): the single-request path is the batch
    path with one request, so the two cannot drift apart."""
    outs, used = forward_batch(
        [x], [cache], [start], mode=mode, gens=[gen], topks=None if topk is None else [topk], stats=[stats]
    )
    return outs[0], used[0]


class KVCache:
    """One attention layer's cache: the (dequantised) latent and the indexer key of every position."""

    def __init__(self, capacity: int, kv_lora: int, index_dim: int) -> None:
        self.latent = torch.zeros(capacity, kv_lora)
        self.index_k = torch.zeros(capacity, index_dim)
        self.n = 0

    def write(self, start: int, latent: torch.Tensor, index_k: torch.Tensor) -> None:
        end = start + latent.shape[0]
        if end > self.latent.shape[0]:
            raise InternalError(f"reference KV cache full ({self.latent.shape[0]} positions)")
        self.latent[start:end], self.index_k[start:end], self.n = latent, index_k, end


class Attention:
    """DeepseekV2AttentionMLA + Indexer of one layer.

    `indexer_scope` wraps every indexer run (scores and selection of one forward): a caller that must see
    the indexer as a unit (the mini engine's NVTX `indexer` range and launch counter) sets it; a reused
    top-k never enters it.
    """

    indexer_scope: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext

    def __init__(self, w: dict[str, torch.Tensor], p: str, cfg: dict[str, Any], num: Numerics) -> None:
        a = f"{p}.self_attn"
        self.cfg, self.num, self.eps = cfg, num, cfg["rms_norm_eps"]
        self.heads, self.nope = cfg["num_attention_heads"], cfg["qk_nope_head_dim"]
        self.rope, self.v, self.kvl = cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
        self.topk, self.ih, self.idim = cfg["index_topk"], cfg["index_n_heads"], cfg["index_head_dim"]
        self.o_proj = w[f"{a}.o_proj.weight"]
        self.q_a, self.q_a_norm = w[f"{a}.q_a_proj.weight"], w[f"{a}.q_a_layernorm.weight"]
        self.q_b = w[f"{a}.q_b_proj.weight"].view(self.heads, self.nope + self.rope, -1)
        self.kv_a, self.kv_a_norm = w[f"{a}.kv_a_proj_with_mqa.weight"], w[f"{a}.kv_a_layernorm.weight"]
        kv_b = w[f"{a}.kv_b_proj.weight"].view(self.heads, self.nope + self.v, self.kvl)
        o_cols = self.o_proj.view(-1, self.heads, self.v)
        # heads whose value path reaches the output; the others add exactly zero
        self.heads_used = [h for h in range(self.heads) if kv_b[h, self.nope :].any() and o_cols[:, h].any()]
        self.w_kc = kv_b[self.heads_used, : self.nope].contiguous()  # [used heads, nope, kv_lora]
        self.w_vc = kv_b[self.heads_used, self.nope :].contiguous()  # [used heads, v, kv_lora]
        self.o_used = o_cols[:, self.heads_used].reshape(o_cols.shape[0], -1).contiguous()
        self.live = bool(self.heads_used)  # else the attention writes nothing: skipped, no cache
        wq_b = w[f"{a}.indexer.wq_b.weight"].view(self.ih, self.idim, -1)
        wp = w[f"{a}.indexer.weights_proj.weight"]
        if self.q_b[:, self.nope :].any() or wq_b[:, :INDEX_ROPE].any():
            raise InputError(f"{p}: query rope rows are not zero; the task reference does not model RoPE")
        active = [h for h in range(self.ih) if wq_b[h].any() and wp[h].any()]  # others add relu(.)*0
        self.wq_b, self.wp = wq_b[active].contiguous(), wp[active].contiguous()
        self.q_b_nope = self.q_b[self.heads_used, : self.nope].contiguous()
        self.wk = w[f"{a}.indexer.wk.weight"]
        self.k_norm_w, self.k_norm_b = w[f"{a}.indexer.k_norm.weight"], w[f"{a}.indexer.k_norm.bias"]
        self.scale = softmax_scale(cfg)
        self.rot = torch.from_numpy(hadamard(self.idim)) * self.idim**-0.5

    # ---- keys
    def kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Latent (as stored in the KV cache) and indexer key (as stored in the index-K cache) of inputs x."""
        lat = rms_norm(x @ self.kv_a[: self.kvl].T, self.kv_a_norm, self.eps).bfloat16().float()
        if self.num.fp8_kv:
            tiles = lat.view(lat.shape[0], -1, LATENT_TILE)
            amax = tiles.abs().amax(-1, keepdim=True)
            if not bool((amax > 0).all()):
                raise InputError(
                    "a latent fp8 tile is all zero: sglang's quant_k_cache would store NaN there"
                )
            lat = _fp8(tiles, amax / FP8_MAX).view_as(lat)
        key = self.index_key(x)
        if self.num.fp8_index:
            key = _fp8(key, key.abs().amax(-1, keepdim=True).clamp_min(1e-4) / FP8_MAX)
        return lat, key

    def index_key(self, x: torch.Tensor) -> torch.Tensor:
        """Indexer keys as sglang hands them to its fp8 store: k_norm(wk x) in bf16, Hadamard-rotated in bf16
        (what scripts/topk_slots.py writes into the real fp8 index-K cache)."""
        key = torch.nn.functional.layer_norm(x @ self.wk.T, (self.idim,), self.k_norm_w, self.k_norm_b, 1e-6)
        key = key.bfloat16().float()
        return (key @ self.rot).bfloat16().float() if self.num.fp8_index else key

    # ---- queries
    def q_lora(self, x: torch.Tensor) -> torch.Tensor:
        """The query latent (q_a_proj, q_a_layernorm, bf16) the attention and the indexer both read."""
        return rms_norm(x @ self.q_a.T, self.q_a_norm, self.eps).bfloat16().float()

    def index_query(self, x: torch.Tensor, q_lora: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(q [T, H, D] before its fp8 cast: bf16, Hadamard-rotated; head gates [T, H] = weights_proj(x)
        H^-1/2 D^-1/2) of the active heads (self.wq_b's; the others add exactly zero)."""
        q = torch.einsum("tl,hdl->thd", q_lora, self.wq_b).bfloat16().float()
        wts = (x @ self.wp.T) * self.ih**-0.5 * self.idim**-0.5
        return ((q @ self.rot).bfloat16().float() if self.num.fp8_index else q), wts

    def index_scores(self, x: torch.Tensor, q_lora: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """[T, n] indexer logits: sum over heads of w_h * relu(q_h . k)."""
        q, wts = self.index_query(x, q_lora)
        if self.num.fp8_index:
            amax = q.abs().amax(-1, keepdim=True).clamp_min(1e-4)
            q = _fp8(q, torch.exp2(torch.ceil(torch.log2(amax / FP8_MAX))))
        return torch.einsum("th,thn->tn", wts, torch.relu(torch.einsum("thd,nd->thn", q, keys)))

    def select(self, scores: torch.Tensor, n: int, mode: str, gen: torch.Generator | None) -> torch.Tensor:
        """Positions one query attends: all of [0, n) when they fit in index_topk, else the top-k."""
        if n <= self.topk:
            return torch.arange(n)
        if mode == "indexer":  # in the slot order sgl-kernel's top-k writes
            return kernel_topk(scores[:n], self.topk)
        if mode == "last":
            return torch.arange(n - self.topk, n)
        if mode == "random":
            return torch.randperm(n, generator=gen)[: self.topk]
        raise UsageError(f"unknown top-k mode {mode!r}: indexer, last or random")

    def indexer(
        self,
        x: torch.Tensor,
        q_lora: torch.Tensor,
        cache: KVCache,
        start: int,
        mode: str = "indexer",
        gen: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The lightning indexer for T queries at positions start..: scores over the cache and each query's
        causal selection."""
        scores = self.index_scores(x, q_lora, cache.index_k[: cache.n])
        return scores, [self.select(scores[t], start + t + 1, mode, gen) for t in range(x.shape[0])]

    def forward(
        self,
        x: torch.Tensor,
        cache: KVCache,
        start: int,
        *,
        mode: str = "indexer",
        gen: torch.Generator | None = None,
        topk: list[torch.Tensor] | None = None,
        stats: list[dict[str, float]] | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Attention of T new tokens at positions start.. (their keys written first, as sglang does);
        `topk` given = reuse those selections (the MTP share); returns the output and the selections."""
        return _one_request(self.forward_batch, x, cache, start, mode=mode, gen=gen, topk=topk, stats=stats)

    def forward_batch(
        self,
        xs: list[torch.Tensor],
        caches: list[KVCache],
        starts: list[int],
        *,
        mode: str = "indexer",
        gens: list[torch.Generator | None] | None = None,
        topks: list[list[torch.Tensor]] | None = None,
        stats: list[list[dict[str, float]] | None] | None = None,
    ) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
        """`forward` of several requests, each computed on its own, except that the indexer runs of all of
        them form one `indexer_scope` (sglang launches the indexer once for the batch)."""
        n = len(xs)
        gens, stats = gens or [None] * n, stats or [None] * n
        queries = []
        for x, cache, start in zip(xs, caches, starts, strict=True):
            cache.write(start, *self.kv(x))
            q_lora = self.q_lora(x)
            q_nope = torch.einsum("tl,hdl->thd", q_lora, self.q_b_nope)
            queries.append((q_lora, torch.einsum("thd,hdc->thc", q_nope, self.w_kc)))  # absorbed q
        scores: list[torch.Tensor | None] = [None] * n
        if topks is None:
            with self.indexer_scope():
                runs = [
                    self.indexer(x, q[0], cache, start, mode, g)
                    for x, q, cache, start, g in zip(xs, queries, caches, starts, gens, strict=True)
                ]
            scores, topks = [r[0] for r in runs], [r[1] for r in runs]
        outs = [
            self._attend(q[1], cache, start, topk, sc, st)
            for q, cache, start, topk, sc, st in zip(
                queries, caches, starts, topks, scores, stats, strict=True
            )
        ]
        return [torch.stack(o) for o in outs], topks

    def _attend(
        self,
        q_abs: torch.Tensor,
        cache: KVCache,
        start: int,
        topk: list[torch.Tensor],
        scores: torch.Tensor | None,
        stats: list[dict[str, float]] | None,
    ) -> list[torch.Tensor]:
        """Sparse attention of each query over its selection; one output row per query."""
        outs = []
        for t, sel in enumerate(topk):
            n = start + t + 1
            lat = cache.latent[sel]
            logits = (q_abs[t] @ lat.T) * self.scale  # [heads, |sel|]
            p = torch.softmax(logits, -1)
            if stats is not None:
                stats.append(self._stats(logits[0], p[0], None if scores is None else scores[t, :n]))
            o = torch.einsum("hc,hvc->hv", p @ lat, self.w_vc)
            outs.append(o.reshape(-1) @ self.o_used.T)
        return outs

    @staticmethod
    def _stats(logits: torch.Tensor, p: torch.Tensor, scores: torch.Tensor | None) -> dict[str, Any]:
        """First used head: best key's logit minus the next and its weight; indexer: the distinct score
        levels from the top (value, how many positions), to see the group / filler / rest tiers."""
        top2 = torch.topk(logits, min(2, len(logits))).values
        out: dict[str, Any] = {"attn_gap": float(top2[0] - top2[-1]), "attn_top_p": float(p.max())}
        if scores is not None:
            levels, counts = torch.unique(scores, sorted=True, return_counts=True)
            out["index_levels"] = [
                (float(v), int(c)) for v, c in zip(levels[-4:].flip(0), counts[-4:].flip(0), strict=True)
            ]
        return out


class MLP:
    """DeepseekV2MLP, or DeepseekV2MoE (sigmoid noaux_tc grouped top-k, renormalised, routed scale, plus
    the shared expert)."""

    def __init__(self, w: dict[str, torch.Tensor], p: str, cfg: dict[str, Any], moe: bool) -> None:
        self.cfg, self.moe = cfg, moe

        def ffn(q: str) -> tuple[torch.Tensor, ...]:
            return w[f"{q}.gate_proj.weight"], w[f"{q}.up_proj.weight"], w[f"{q}.down_proj.weight"]

        if not moe:
            self.dense = ffn(f"{p}.mlp")
            self.dead = not self.dense[2].any()
            return
        self.gate, self.bias = w[f"{p}.mlp.gate.weight"], w[f"{p}.mlp.gate.e_score_correction_bias"]
        self.experts = [ffn(f"{p}.mlp.experts.{i}") for i in range(cfg["n_routed_experts"])]
        self.shared = ffn(f"{p}.mlp.shared_experts")
        self.dead = not any(f[2].any() for f in [*self.experts, self.shared])  # adds exactly zero

    @staticmethod
    def _ffn(x: torch.Tensor, f: tuple[torch.Tensor, ...]) -> torch.Tensor:
        g, u, d = f
        return (torch.nn.functional.silu(x @ g.T) * (x @ u.T)) @ d.T

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.dead:
            return torch.zeros_like(x)
        if not self.moe:
            return self._ffn(x, self.dense)
        c = self.cfg
        scores = torch.sigmoid(x @ self.gate.T)
        choice = scores + self.bias
        groups = choice.view(x.shape[0], c["n_group"], -1).topk(2, -1).values.sum(-1)
        keep = torch.zeros_like(groups).scatter_(1, groups.topk(c["topk_group"], -1).indices, 1.0)
        mask = keep.repeat_interleave(c["n_routed_experts"] // c["n_group"], 1).bool()
        ids = choice.masked_fill(~mask, float("-inf")).topk(c["num_experts_per_tok"], -1).indices
        wts = scores.gather(1, ids)
        if c["norm_topk_prob"]:
            wts = wts / wts.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows, slot = (ids == e).nonzero(as_tuple=True)
            if len(rows):
                out[rows] += wts[rows, slot, None] * self._ffn(x[rows], expert)
        return out * c["routed_scaling_factor"] + self._ffn(x, self.shared)


class LMHead:
    """hidden @ lm_head.T, computing only the rows that are not all zero (the others are exactly 0)."""

    def __init__(self, head: torch.Tensor) -> None:
        self.vocab = head.shape[0]
        self.rows = head.abs().sum(-1).nonzero().flatten()
        self.w = head[self.rows].contiguous()

    def __call__(self, hid: torch.Tensor) -> torch.Tensor:
        out = hid.new_zeros(hid.shape[0], self.vocab)
        out[:, self.rows] = hid @ self.w.T
        return out


class Layer:
    def __init__(self, w: dict[str, torch.Tensor], p: str, cfg: dict[str, Any], moe: bool, num: Numerics):
        self.eps = cfg["rms_norm_eps"]
        self.in_norm, self.post_norm = (
            w[f"{p}.input_layernorm.weight"],
            w[f"{p}.post_attention_layernorm.weight"],
        )
        self.attn = Attention(w, p, cfg, num)
        self.mlp = MLP(w, p, cfg, moe)

    def forward(
        self, r: torch.Tensor, cache: KVCache | None, start: int, **kw: Any
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Pre-norm residual block; a dead attention (zero o_proj) is skipped and keeps no cache.
        Keywords: Attention.forward's."""
        return _one_request(self.forward_batch, r, cache, start, **kw)

    def forward_batch(
        self,
        rs: list[torch.Tensor],
        caches: list[KVCache | None],
        starts: list[int],
        **kw: Any,
    ) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
        """`forward` of several requests (Attention.forward_batch: one indexer scope for all of them)."""
        used: list[list[torch.Tensor]] = [[] for _ in rs]
        if self.attn.live:
            assert all(c is not None for c in caches)
            xs = [rms_norm(r, self.in_norm, self.eps) for r in rs]
            outs, used = self.attn.forward_batch(xs, caches, starts, **kw)
            rs = [r + o for r, o in zip(rs, outs, strict=True)]
        return [r + self.mlp(rms_norm(r, self.post_norm, self.eps)) for r in rs], used
