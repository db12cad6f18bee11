"""The architecture every generated checkpoint shares: a small DeepSeek-V3.2-shaped DSA + NextN model that
sglang 0.5.14 loads on one sm90 GPU. Its config.json, the constraints sglang's kernels put on it (each with
the place in sglang where it was found), and every tensor's name and shape as sglang's loader reads them.
Which values fill the tensors is each checkpoint's own business (kit.checkpoint.cycle, kit.task.weights).
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from kit.errors import UsageError

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


def tensor_rng(seed: int, name: str) -> np.random.Generator:
    """One PCG64 stream per (seed, tensor name): a tensor's values do not depend on the others."""
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, key])))


# Gains of the next-token-cycle checkpoint's weight structure (kit.checkpoint.cycle's docstring): the std of
# the "normal" tensors below, and what cycle builds its heads with (lm_head, eh_hidden). Here, beside the
# specs that read them, so that the layout never imports a checkpoint of its own. Set with a float32 CPU
# reference forward of that checkpoint (dense attention, 2 prompts x 96 greedy tokens at 512 and 2048 tokens
# of context). attn_out 3.5: the target follows next(t) at every token, its top-2 logprob margin is >= 0.70
# nats (median 2.4-2.6), the attention branch ~2.7x the embedding's norm. attn_out 5.5 (the checkpoint of the
# first H200 runs): 3-6% of tokens follow the attention instead (at 512 tokens), each at a near-tie (margins
# 0.00-0.26 nats), and greedy outputs of two runs diverge there; 8: 38-45%, margins 0.00-0.52.
# `kit make-checkpoint --gain attn_out=5.5` rebuilds the 5.5 checkpoint.
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


def model_config(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """config.json for this checkpoint: DEFAULT_CONFIG with `overrides` (tests shrink sizes with it)."""
    cfg = copy.deepcopy(DEFAULT_CONFIG)
    for k, v in (overrides or {}).items():
        if k not in cfg:
            raise UsageError(f"unknown checkpoint config key {k!r}; known keys: {', '.join(sorted(cfg))}")
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


def tensor_specs(cfg: dict[str, Any], gains: dict[str, float] | None = None) -> list[TensorSpec]:
    """Every tensor of the checkpoint, in file order.

    Target: model.embed_tokens, model.layers.{0..L-1} (dense below first_k_dense_replace, MoE above),
    model.norm, lm_head. NextN (read by DeepseekV3ForCausalLMNextN from model.layers.{L}): enorm, hnorm,
    eh_proj, shared_head.norm, a full MoE decoder layer, and embed_tokens / shared_head.head, which sglang
    skips (the draft shares the target's) but real V3 checkpoints carry, so they are written as copies.
    """
    gains = GAINS if gains is None else gains  # the std of "normal" tensors; a checkpoint may ignore them
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
