"""`kit make-checkpoint`: a small DeepSeek-V3.2-shaped checkpoint (DSA indexer + one NextN/MTP layer) that
sglang 0.5.14 serves on one H200 with EAGLE MTP, because no real DSA weights can be downloaded.

Weights are random bf16 from numpy's PCG64 (no torch, same bytes on any machine), one stream per tensor.
Structure, so the target's logits depend on the context yet its greedy choice has a margin that bf16
numerics cannot flip: the lm_head is the embedding with its rows permuted along one cycle over the ordinary
tokens, so a hidden state near embed(t) predicts next(t); the target's attention is sharp and its branch
larger than the embedding (so every logprob depends on the context and on the indexer's top-k) but not
large enough to override next(t); the NextN eh_proj passes its embedding half through and the draft's
branches are small, so the draft predicts next(t) too. Attention that does override next(t) does so at
near-ties (a continuous score crossing a threshold), which the kernels' rounding then decides; see GAINS.

Kernel constraints the config honours (sglang 0.5.14 on sm90, TP1, bf16 KV cache) are in
`sglang_constraints`, each with the place in sglang or its kernels where it was found.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kit.errors import KitError
from kit.provenance import sha256_file

FORMAT = "kit.checkpoint/dsa-mtp-v1"
MANIFEST = "kit-checkpoint.json"
WEIGHTS = "model.safetensors"
# sha256 of what make_checkpoint(out) writes with seed 0 and no overrides (tests/test_checkpoint.py checks it
# on CPU): a GPU host's manifest says in "reference_match" whether it built the very same checkpoint.
REFERENCE_SHA256: dict[str, str] = {
    "config.json": "b85aa6470fafc73745c451b6d7215865ba18355e846582f123530c19f62654d1",
    "generation_config.json": "9c8879c84d1093ea0930a5550de42c3e631861858d04287380550f5f04cd44c2",
    "model.safetensors": "87a785978236079ecfe74df46c5b5d182aad89f92cbbd676ae313693fc5095e9",
    "special_tokens_map.json": "c3974182ae9574047e7fdacdbabf9702ddf43331af733e3d58bd438edb4af4c2",
    "tokenizer.json": "b24d32adc59319fad2f6e55c87a44d7425517c93800f1ad81c638133b845ccf9",
    "tokenizer_config.json": "6a3b8122bd42e929b8c5a64e9047795bccb250ac03af22f3ae4a1731aed815d7",
}

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
SPECIAL_TOKENS = [BOS, EOS, PAD]  # ids 0, 1, 2 (DeepSeek-V3 has bos 0, eos 1)
_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

# config.json. Numbers that the sm90 DSA kernels pin are V3.2's own; the rest is shrunk.
# model_type: V3.2 ships "deepseek_v32", which transformers 5.8.1 (sglang 0.5.14's pin) does not know: sglang
# registers an alias (a DeepseekV3Config subclass, utils/hf_transformers/common.py) in its own process, but
# AutoTokenizer anywhere else (kit.backends.sglang.workload.load_tokenizer) fails on it. "deepseek_v3" gives
# sglang the same DeepseekV3Config fields; the architecture (DeepseekV32ForCausalLM) picks the model class,
# the DSA backend (is_deepseek_dsa: architecture + index_topk) and the NextN draft class.
DEFAULT_CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV32ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 4096,
    "hidden_size": 1024,
    "intermediate_size": 2048,
    "moe_intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_nextn_predict_layers": 1,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "index_topk": 2048,
    "index_head_dim": 128,
    "index_n_heads": 64,
    "index_share_for_mtp_iteration": True,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 4,
    "topk_group": 2,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "ep_size": 1,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-06,
    "max_position_embeddings": 524288,
    "rope_theta": 10000,
    "rope_scaling": {
        "type": "yarn",
        "factor": 128,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "initializer_range": 0.02,
    "use_cache": True,
    "torch_dtype": "bfloat16",
    "dtype": "bfloat16",
}

# Gains of the weight structure (see the module docstring), set with a float32 CPU reference forward of this
# checkpoint (dense attention, 2 prompts x 96 greedy tokens at 512 and 2048 tokens of context). attn_out 3.5:
# the target follows next(t) at every token, its top-2 logprob margin is >= 0.70 nats (median 2.4-2.6), the
# attention branch ~2.7x the embedding's norm. attn_out 5.5 (the checkpoint of the first H200 runs): 3-6% of
# tokens follow the attention instead (at 512 tokens), each at a near-tie (margins 0.00-0.26 nats), and
# greedy outputs of two runs diverge there; 8: 38-45%, margins 0.00-0.52. `kit make-checkpoint --gain
# attn_out=5.5` rebuilds the 5.5 checkpoint.
GAINS: dict[str, float] = {
    "attn_q": 3.0,  # q_b_proj std multiplier: sharp attention, so its output does not fade at long context
    "attn_out": 3.5,  # target o_proj: attention branch size; above ~4.5 it overrides next(t) at near-ties
    "draft_attn_out": 0.25,  # NextN o_proj: the draft keeps following next(t)
    "mlp_out": 0.25,  # down_proj of dense MLP, shared and routed experts
    "eh_hidden": 0.1,  # eh_proj hidden half (the embedding half is the identity)
    "lm_head": 16.0,  # lm_head row = embedding row * lm_head / hidden_size: logits of a few units
}


@dataclass(frozen=True)
class TensorSpec:
    """One checkpoint tensor: its name and shape as sglang's loader expects, and how to fill it."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype: BF16 or F32
    init: str  # normal | ones | zeros | embed | lm_head | eh_proj
    std: float = 0.0

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * (2 if self.dtype == "BF16" else 4)


# ---------------------------------------------------------------------------------------------------
# config


def model_config(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """config.json for this checkpoint: DEFAULT_CONFIG with `overrides` (tests shrink sizes with it)."""
    cfg = copy.deepcopy(DEFAULT_CONFIG)
    for k, v in (overrides or {}).items():
        if k not in cfg:
            raise KitError(f"unknown checkpoint config key {k!r}; known keys: {', '.join(sorted(cfg))}")
        cfg[k] = v
    cfg["num_key_value_heads"] = cfg["num_attention_heads"]
    return cfg


def sglang_constraints(cfg: dict[str, Any]) -> list[str]:
    """What sglang 0.5.14 needs of a DSA+MTP config on one sm90 GPU (TP1, bf16 KV); one line per violation.

    With a bf16 KV cache on sm90, server_args._set_default_dsa_backends picks prefill=flashmla_sparse and
    decode=fa3 (target verify and draft extend use the decode backend); prefill up to index_topk tokens
    runs dense (MHA_ONE_SHOT, FA3 varlen) per dsa_backend.set_dsa_prefill_impl.
    """
    bad: list[str] = []
    heads = cfg["num_attention_heads"]
    if heads not in (2, 4, 8, 16, 32, 64, 128):
        bad.append(
            f"num_attention_heads={heads}: flashmla_sparse on sm90 needs a multiple of 64 or a divisor of 64 "
            "(dsa_backend._forward_flashmla_sparse pads q heads to 64), and MHA_ONE_SHOT prefill asserts "
            "more than one head (dsa_backend.forward_extend); one of 2..128, a power of two"
        )
    if cfg["kv_lora_rank"] != 512 or cfg["qk_rope_head_dim"] != 64:
        bad.append(
            "kv_lora_rank must be 512 and qk_rope_head_dim 64: FlashMLA sparse takes d_qk=576, d_v=512 only "
            "(sgl_kernel.flash_mla.flash_mla_sparse_fwd) and the fa3 decode path splits the latent cache "
            "into a 64-wide rope part and a 512-wide qv part (dsa_backend._forward_fa3)"
        )
    if cfg["qk_nope_head_dim"] != 128 or cfg["v_head_dim"] != 128:
        bad.append(
            "qk_nope_head_dim and v_head_dim must be 128: dense MHA_ONE_SHOT prefill runs FA3 varlen with "
            "head dims 192/128, DeepSeek's (dsa_backend._forward_standard_mha)"
        )
    if (cfg["index_head_dim"], cfg["index_n_heads"], cfg["index_topk"]) != (128, 64, 2048):
        bad.append(
            "index_head_dim/index_n_heads/index_topk must be DeepSeek-V3.2's 128/64/2048: sgl_kernel's "
            "fast_topk_v2/fast_topk_transform_fused assert topk == 2048 (sgl_kernel/top_k.py), the hadamard "
            "rotation needs a power-of-two head dim, and 64x128 is the indexer deep_gemm's fp8 MQA-logits "
            "kernels run for V3.2"
        )
    e, g, tg, k = cfg["n_routed_experts"], cfg["n_group"], cfg["topk_group"], cfg["num_experts_per_tok"]
    per_group = e // g if g and e % g == 0 else 0
    if (
        e < 2
        or e & (e - 1)
        or not per_group
        or not 2 <= per_group <= 32
        or not 1 <= tg <= min(g, 4)
        or not 1 <= k <= 8
        or tg * per_group < k
        or tg * per_group > 128
    ):
        bad.append(
            f"experts {e}/groups {g}/topk_group {tg}/top-k {k}: the grouped noaux_tc router "
            "(layers/moe/topk.biased_grouped_topk_gpu -> flashinfer fused_topk_deepseek, noAuxTcKernels.cu) "
            "needs a power-of-two expert count, 2..32 experts per group (a group scores its top two), "
            "topk_group <= min(n_group, 4), top-k <= 8 and within the selected groups, and at most 128 "
            "experts in the selected groups"
        )
    if cfg["n_shared_experts"] != 1:
        bad.append("n_shared_experts must be 1 (DeepSeek-V3's; the shared-expert loader paths assume it)")
    if cfg["num_hidden_layers"] < 2:
        bad.append(
            "num_hidden_layers must be >= 2: with 1 the NextN weights are read from model.layers.0 "
            "(deepseek_weight_loader._initialize_nextn_conf), colliding with the target's layer 0"
        )
    if not 1 <= cfg["first_k_dense_replace"] < cfg["num_hidden_layers"]:
        bad.append("first_k_dense_replace must leave at least one dense and one MoE target layer")
    if cfg["num_nextn_predict_layers"] != 1:
        bad.append("num_nextn_predict_layers must be 1 (deepseek_weight_loader asserts a single NextN layer)")
    if cfg["moe_layer_freq"] != 1:
        bad.append("moe_layer_freq must be 1")
    for key in ("hidden_size", "q_lora_rank", "intermediate_size", "moe_intermediate_size", "vocab_size"):
        if cfg[key] <= 0 or cfg[key] % 64:
            bad.append(f"{key}={cfg[key]} must be a positive multiple of 64 (vectorised norms/GEMM tiles)")
    if cfg["vocab_size"] < len(SPECIAL_TOKENS) + 256 + 62:
        bad.append(
            f"vocab_size must be at least {len(SPECIAL_TOKENS) + 256 + 62} for the byte-level tokenizer"
        )
    if cfg["max_position_embeddings"] < 131072:
        bad.append("max_position_embeddings must be >= 131072 (long-context runs)")
    if cfg["tie_word_embeddings"]:
        bad.append("tie_word_embeddings must be false: the lm_head is a permutation of the embedding")
    return bad


# ---------------------------------------------------------------------------------------------------
# tensor names and shapes (sglang 0.5.14 deepseek_v2.py / deepseek_nextn.py / deepseek_weight_loader.py)


def _attention(p: str, cfg: dict[str, Any], gains: dict[str, float], out_gain: float) -> list[TensorSpec]:
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    ql, kvl, rope = cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    nope, v = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    ih, idim = cfg["index_n_heads"], cfg["index_head_dim"]
    a = f"{p}.self_attn"
    return [
        TensorSpec(f"{a}.q_a_proj.weight", (ql, h), "BF16", "normal", h**-0.5),
        TensorSpec(f"{a}.q_a_layernorm.weight", (ql,), "BF16", "ones"),
        TensorSpec(
            f"{a}.q_b_proj.weight", (heads * (nope + rope), ql), "BF16", "normal", gains["attn_q"] * ql**-0.5
        ),
        TensorSpec(f"{a}.kv_a_proj_with_mqa.weight", (kvl + rope, h), "BF16", "normal", h**-0.5),
        TensorSpec(f"{a}.kv_a_layernorm.weight", (kvl,), "BF16", "ones"),
        TensorSpec(f"{a}.kv_b_proj.weight", (heads * (nope + v), kvl), "BF16", "normal", kvl**-0.5),
        TensorSpec(f"{a}.o_proj.weight", (h, heads * v), "BF16", "normal", out_gain * (heads * v) ** -0.5),
        TensorSpec(f"{a}.indexer.wq_b.weight", (ih * idim, ql), "BF16", "normal", ql**-0.5),
        TensorSpec(f"{a}.indexer.wk.weight", (idim, h), "BF16", "normal", h**-0.5),
        TensorSpec(f"{a}.indexer.k_norm.weight", (idim,), "BF16", "ones"),
        TensorSpec(f"{a}.indexer.k_norm.bias", (idim,), "BF16", "zeros"),
        TensorSpec(f"{a}.indexer.weights_proj.weight", (ih, h), "BF16", "normal", h**-0.5),
    ]


def _mlp(p: str, h: int, inter: int, out_std_gain: float) -> list[TensorSpec]:
    return [
        TensorSpec(f"{p}.gate_proj.weight", (inter, h), "BF16", "normal", h**-0.5),
        TensorSpec(f"{p}.up_proj.weight", (inter, h), "BF16", "normal", h**-0.5),
        TensorSpec(f"{p}.down_proj.weight", (h, inter), "BF16", "normal", out_std_gain * inter**-0.5),
    ]


def _decoder_layer(
    p: str, cfg: dict[str, Any], gains: dict[str, float], moe: bool, attn_gain: float
) -> list[TensorSpec]:
    h = cfg["hidden_size"]
    specs = [TensorSpec(f"{p}.input_layernorm.weight", (h,), "BF16", "ones")]
    specs += _attention(p, cfg, gains, attn_gain)
    specs.append(TensorSpec(f"{p}.post_attention_layernorm.weight", (h,), "BF16", "ones"))
    if not moe:
        return specs + _mlp(f"{p}.mlp", h, cfg["intermediate_size"], gains["mlp_out"])
    e, inter = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    specs.append(TensorSpec(f"{p}.mlp.gate.weight", (e, h), "BF16", "normal", h**-0.5))
    # MoEGate creates it in fp32 (noaux_tc); DeepSeek-V3 checkpoints store it as F32 too.
    specs.append(TensorSpec(f"{p}.mlp.gate.e_score_correction_bias", (e,), "F32", "zeros"))
    # Routed outputs are weighted (sum 1, norm_topk_prob) then scaled by routed_scaling_factor.
    routed_gain = gains["mlp_out"] / cfg["routed_scaling_factor"]
    for i in range(e):
        specs += _mlp(f"{p}.mlp.experts.{i}", h, inter, routed_gain)
    specs += _mlp(f"{p}.mlp.shared_experts", h, inter * cfg["n_shared_experts"], gains["mlp_out"])
    return specs


def tensor_specs(cfg: dict[str, Any], gains: dict[str, float] = GAINS) -> list[TensorSpec]:
    """Every tensor of the checkpoint, in file order.

    Target: model.embed_tokens, model.layers.{0..L-1} (dense below first_k_dense_replace, MoE above),
    model.norm, lm_head. NextN (read by DeepseekV3ForCausalLMNextN from model.layers.{L}): enorm, hnorm,
    eh_proj, shared_head.norm, a full MoE decoder layer, and embed_tokens / shared_head.head, which sglang
    skips (the draft shares the target's) but real V3 checkpoints carry, so they are written as copies.
    """
    h, vocab, n = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    specs = [TensorSpec("model.embed_tokens.weight", (vocab, h), "BF16", "embed")]
    for i in range(n):
        moe = i >= cfg["first_k_dense_replace"] and i % cfg["moe_layer_freq"] == 0
        specs += _decoder_layer(f"model.layers.{i}", cfg, gains, moe, gains["attn_out"])
    specs.append(TensorSpec("model.norm.weight", (h,), "BF16", "ones"))
    specs.append(TensorSpec("lm_head.weight", (vocab, h), "BF16", "lm_head"))
    p = f"model.layers.{n}"
    specs += [
        TensorSpec(f"{p}.embed_tokens.weight", (vocab, h), "BF16", "embed"),
        TensorSpec(f"{p}.enorm.weight", (h,), "BF16", "ones"),
        TensorSpec(f"{p}.hnorm.weight", (h,), "BF16", "ones"),
        TensorSpec(f"{p}.eh_proj.weight", (h, 2 * h), "BF16", "eh_proj"),
    ]
    specs += _decoder_layer(p, cfg, gains, True, gains["draft_attn_out"])
    specs += [
        TensorSpec(f"{p}.shared_head.norm.weight", (h,), "BF16", "ones"),
        TensorSpec(f"{p}.shared_head.head.weight", (vocab, h), "BF16", "lm_head"),
    ]
    return specs


# ---------------------------------------------------------------------------------------------------
# deterministic values


def _rng(seed: int, name: str) -> np.random.Generator:
    """One PCG64 stream per (seed, tensor name): a tensor's values do not depend on the others."""
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, key])))


def next_token_cycle(seed: int, vocab: int) -> np.ndarray:
    """nxt[t]: the token the lm_head favours after t; one cycle through all ordinary (non-special) ids."""
    order = _rng(seed, "next-token-cycle").permutation(np.arange(len(SPECIAL_TOKENS), vocab))
    nxt = np.arange(vocab)
    nxt[order] = np.roll(order, -1)
    return nxt


class _Values:
    """Produces each spec's float32 values; keeps the embedding because the heads are built from it."""

    def __init__(self, cfg: dict[str, Any], seed: int, gains: dict[str, float]) -> None:
        self.cfg, self.seed, self.gains = cfg, seed, gains
        vocab, h = cfg["vocab_size"], cfg["hidden_size"]
        self.embed = _rng(seed, "model.embed_tokens.weight").standard_normal((vocab, h), dtype=np.float32)
        nxt = next_token_cycle(seed, vocab)
        head = np.zeros_like(self.embed)  # special tokens: logit 0, never the argmax
        ordinary = np.arange(len(SPECIAL_TOKENS), vocab)
        head[nxt[ordinary]] = self.embed[ordinary] * np.float32(gains["lm_head"] / h)
        self.head = head

    def __call__(self, spec: TensorSpec) -> np.ndarray:
        if spec.init == "normal":
            return _rng(self.seed, spec.name).standard_normal(spec.shape, dtype=np.float32) * np.float32(
                spec.std
            )
        if spec.init == "ones":
            return np.ones(spec.shape, np.float32)
        if spec.init == "zeros":
            return np.zeros(spec.shape, np.float32)
        if spec.init == "embed":
            return self.embed
        if spec.init == "lm_head":
            return self.head
        if spec.init == "eh_proj":
            h = self.cfg["hidden_size"]
            noise = _rng(self.seed, spec.name).standard_normal((h, h), dtype=np.float32)
            return np.concatenate(
                [np.eye(h, dtype=np.float32), noise * np.float32(self.gains["eh_hidden"] / h**0.5)], 1
            )
        raise AssertionError(spec.init)


def _bf16_bytes(a: np.ndarray) -> bytes:
    """float32 -> bfloat16 (round to nearest even), little-endian; what torch's .to(bfloat16) does."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    u = u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    return (u >> np.uint32(16)).astype("<u2").tobytes()


def _encode(spec: TensorSpec, a: np.ndarray) -> bytes:
    if a.shape != spec.shape:
        raise AssertionError(f"{spec.name}: values {a.shape} != spec {spec.shape}")
    return _bf16_bytes(a) if spec.dtype == "BF16" else np.ascontiguousarray(a, "<f4").tobytes()


def write_safetensors(path: Path, specs: list[TensorSpec], values: Callable[[TensorSpec], bytes]) -> None:
    """The safetensors format written directly (header, then the tensors in order), one tensor in memory
    at a time; byte-for-byte the same on any machine and safetensors version."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for s in specs:
        header[s.name] = {
            "dtype": s.dtype,
            "shape": list(s.shape),
            "data_offsets": [offset, offset + s.nbytes],
        }
        offset += s.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for s in specs:
            data = values(s)
            if len(data) != s.nbytes:
                raise AssertionError(f"{s.name}: {len(data)} bytes, expected {s.nbytes}")
            f.write(data)


# ---------------------------------------------------------------------------------------------------
# tokenizer: byte-level BPE, vocabulary and merges fixed by construction (no training, no download)


def _byte_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte value (the ByteLevel pre-tokenizer's alphabet)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def tokenizer_files(vocab_size: int, model_max_length: int) -> dict[str, Any]:
    """tokenizer.json, tokenizer_config.json, special_tokens_map.json as dicts.

    Ids 0-2 are <s>, </s>, <pad>; then the 256 byte symbols; then merges in rank order: space+letter/digit,
    then letter/digit pairs, until the vocabulary is exactly vocab_size. Every text round-trips.
    """
    space = _byte_chars()[ord(" ")]
    merges = [(space, c) for c in _ALNUM] + [(a, b) for a in _ALNUM for b in _ALNUM]
    n_merges = vocab_size - len(SPECIAL_TOKENS) - 256
    if not 0 <= n_merges <= len(merges):
        raise KitError(f"vocab_size {vocab_size} is outside what the kit's byte-level tokenizer can fill")
    merges = merges[:n_merges]
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for c in _byte_chars():
        vocab[c] = len(vocab)
    for a, b in merges:
        vocab[a + b] = len(vocab)
    assert len(vocab) == vocab_size
    added = [
        {
            "id": i,
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, t in enumerate(SPECIAL_TOKENS)
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [
                {"SpecialToken": {"id": BOS, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": BOS, "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {BOS: {"id": BOS, "ids": [0], "tokens": [BOS]}},
        },
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [f"{a} {b}" for a, b in merges],
        },
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": (
            "{{ bos_token }}{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
            "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
        ),
    }
    special = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    return {"tokenizer.json": tokenizer, "tokenizer_config.json": config, "special_tokens_map.json": special}


def check_tokenizer(path: Path, vocab_size: int) -> str | None:
    """Load tokenizer.json with the `tokenizers` library where it is installed (it is wherever sglang is)
    and round-trip a sample; returns the library version used, None where it is absent."""
    try:
        import tokenizers
    except ImportError:
        return None
    tok = tokenizers.Tokenizer.from_file(str(path))
    sample = "Record 7: 42 crates of rice left Lisbon on Monday.\n\tÜnïcödé ✓ 日本"
    ids = tok.encode(sample, add_special_tokens=False).ids
    if tok.get_vocab_size() != vocab_size or tok.decode(ids) != sample or max(ids) >= vocab_size:
        raise KitError(f"{path}: tokenizers {tokenizers.__version__} does not read it back as written")
    return tokenizers.__version__


# ---------------------------------------------------------------------------------------------------
# the checkpoint


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise KitError(f"{out_dir} exists and is not an empty directory; pass a new directory (or delete it)")


def summary(cfg: dict[str, Any], specs: list[TensorSpec]) -> dict[str, Any]:
    """The numbers a reader checks first: sizes, and which parts exist."""
    keys = [
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "q_lora_rank",
        "kv_lora_rank", "index_topk", "index_n_heads", "index_head_dim", "n_routed_experts",
        "num_experts_per_tok", "max_position_embeddings",
    ]  # fmt: skip
    return {
        **{k: cfg[k] for k in keys},
        "nextn_layer": f"model.layers.{cfg['num_hidden_layers']}",
        "tensors": len(specs),
        "parameters": sum(s.nbytes // (2 if s.dtype == "BF16" else 4) for s in specs),
        "weight_bytes": sum(s.nbytes for s in specs),
    }


def model_gains(overrides: dict[str, float] | None = None) -> dict[str, float]:
    """GAINS with `overrides` (`kit make-checkpoint --gain attn_out=8`: explore logit margins)."""
    gains = dict(GAINS)
    for k, v in (overrides or {}).items():
        if k not in gains:
            raise KitError(f"unknown checkpoint gain {k!r}; known gains: {', '.join(sorted(gains))}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1e3:
            raise KitError(f"gain {k}={v!r} must be a positive number below 1000")
        gains[k] = float(v)
    return gains


def make_checkpoint(
    out_dir: Path,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
    gains: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Write the checkpoint into `out_dir` (new or empty) and return its manifest (also kit-checkpoint.json).

    Files are built in a sibling temporary directory and renamed into place, so an interrupted run
    leaves no half checkpoint behind. Same seed and overrides -> the same bytes in every model file.
    """
    from kit import __version__
    from kit.provenance import git_sha

    out_dir = Path(out_dir)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise KitError(f"seed must be a non-negative integer, got {seed!r}")
    _check_out_dir(out_dir)
    cfg = model_config(overrides)
    weight_gains = model_gains(gains)
    bad = sglang_constraints(cfg)
    if bad:
        raise KitError("checkpoint config rejected: " + "; ".join(bad))
    specs = tensor_specs(cfg, weight_gains)
    t0 = time.monotonic()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        _write_json(tmp / "config.json", cfg)
        _write_json(
            tmp / "generation_config.json",
            {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"], "do_sample": False},
        )
        for name, obj in tokenizer_files(cfg["vocab_size"], cfg["max_position_embeddings"]).items():
            _write_json(tmp / name, obj)
        tokenizer_lib = check_tokenizer(tmp / "tokenizer.json", cfg["vocab_size"])
        values = _Values(cfg, seed, weight_gains)
        write_safetensors(tmp / WEIGHTS, specs, lambda s: _encode(s, values(s)))
        files = {
            p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size}
            for p in sorted(tmp.iterdir())
            if p.is_file()
        }
        manifest = {
            "format": FORMAT,
            "seed": seed,
            "overrides": overrides or {},
            "gains": weight_gains,
            "tokenizer_checked_with": tokenizer_lib,
            "summary": summary(cfg, specs),
            "files": files,
            "kit_version": __version__,
            "reference_match": (
                all(files[n]["sha256"] == h for n, h in REFERENCE_SHA256.items())
                if seed == 0 and not overrides and weight_gains == GAINS
                else None
            ),
            "git_sha": git_sha(),
            "generation_seconds": round(time.monotonic() - t0, 2),
        }
        _write_json(tmp / MANIFEST, manifest)
        if out_dir.exists():
            out_dir.rmdir()  # empty (checked above)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest
