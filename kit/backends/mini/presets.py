"""Model shapes of the mini engine: a CPU-sized `tiny` and two presets at real DSA shapes.

`dsv32` and `glm5` take every attention/indexer/FFN width from the models' public `config.json`
(DeepSeek-V3.2: architecture `DeepseekV32ForCausalLM`, deepseek-ai/DeepSeek-V3.2(-Exp); GLM-5:
`GlmMoeDsaForCausalLM`, zai-org/GLM-5). What the mini does NOT copy, on purpose:
- depth: the target has `num_target_layers` (2) layers, not 61/78; the MTP draft has its 1 layer,
  like the real `num_nextn_predict_layers: 1`;
- MoE: the FFN is one dense SwiGLU of the config's `intermediate_size` (the shape of the models'
  `first_k_dense_replace` layers; DeepSeek-V3.2's 18432 equals its 8 routed + 1 shared experts of 2048);
- RoPE in attention (MLA's decoupled rope part), fp8, TP: see kit/mini/model.py.
The attention keeps MLA's absorbed decode form at these shapes: a latent KV of `kv_lora_rank` per token
(the KV cache) read by `num_attention_heads` heads through W_UK (qk_nope_head_dim) and W_UV
(v_head_dim); the indexer keeps DSA's shapes (index_n_heads x index_head_dim, keys shared by all
index heads, the first half of each key rotated by RoPE).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Preset:
    name: str
    source: str  # where the shapes come from
    vocab_size: int
    hidden_size: int
    num_attention_heads: int
    q_lora_rank: int
    qk_nope_head_dim: int
    kv_lora_rank: int  # latent KV width per token (MLA's compressed KV = the KV cache)
    v_head_dim: int
    index_n_heads: int
    index_head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    num_target_layers: int = 2
    prefill_chunk: int = 4096  # tokens per step of the cheap prefill path (kit/mini/model.py)
    # Largest context_len per device: memory grows as context x layers x (kv_lora_rank + index_head_dim).
    max_context: dict[str, int] = field(default_factory=dict)
    dtype: dict[str, str] = field(default_factory=dict)
    # Weight-construction knobs (kit/mini/model.py); tuned on `tiny` for accept lengths of 2-4.
    attn_temperature: float = 5.0
    mix_modeled: float = 0.8  # strength of layer 0's context mixing (the draft copies layer 0)
    mix_unmodeled: float = 1.4  # strength of the later layers' mixing (the draft cannot see it)
    mlp_scale: float = 0.2
    draft_hidden_weight: float = 0.1  # the hidden-state half of the MTP layer's eh_proj

    def to_dict(self) -> dict:
        return asdict(self)

    def torch_dtype(self, device: str) -> torch.dtype:
        import torch

        return getattr(torch, self.dtype[device])


PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        name="tiny",
        source="kit's own small shapes for CPU (index_topk and the algorithm as in DeepSeek-V3.2)",
        vocab_size=1024,
        hidden_size=128,
        num_attention_heads=4,
        q_lora_rank=64,
        qk_nope_head_dim=32,
        kv_lora_rank=64,
        v_head_dim=16,
        index_n_heads=16,
        index_head_dim=32,
        intermediate_size=256,
        rms_norm_eps=1e-6,
        prefill_chunk=4096,
        max_context={"cpu": 65536, "cuda": 524288},
        dtype={"cpu": "float32", "cuda": "float32"},
    ),
    "dsv32": Preset(
        name="dsv32",
        source="deepseek-ai/DeepSeek-V3.2 config.json (DeepseekV32ForCausalLM): hidden_size 7168, "
        "num_attention_heads 128, q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, v_head_dim 128, "
        "index_n_heads 64, index_head_dim 128, index_topk 2048, intermediate_size 18432, vocab_size 129280, "
        "rms_norm_eps 1e-6",
        vocab_size=129280,
        hidden_size=7168,
        num_attention_heads=128,
        q_lora_rank=1536,
        qk_nope_head_dim=128,
        kv_lora_rank=512,
        v_head_dim=128,
        index_n_heads=64,
        index_head_dim=128,
        intermediate_size=18432,
        rms_norm_eps=1e-6,
        prefill_chunk=16384,
        max_context={"cpu": 8192, "cuda": 524288},
        dtype={"cpu": "bfloat16", "cuda": "bfloat16"},
    ),
    "glm5": Preset(
        name="glm5",
        source="zai-org/GLM-5 config.json (GlmMoeDsaForCausalLM): hidden_size 6144, num_attention_heads 64, "
        "q_lora_rank 2048, kv_lora_rank 512, qk_nope_head_dim 192, v_head_dim 256, index_n_heads 32, "
        "index_head_dim 128, index_topk 2048, intermediate_size 12288, vocab_size 154880, rms_norm_eps 1e-5",
        vocab_size=154880,
        hidden_size=6144,
        num_attention_heads=64,
        q_lora_rank=2048,
        qk_nope_head_dim=192,
        kv_lora_rank=512,
        v_head_dim=256,
        index_n_heads=32,
        index_head_dim=128,
        intermediate_size=12288,
        rms_norm_eps=1e-5,
        prefill_chunk=16384,
        max_context={"cpu": 8192, "cuda": 524288},
        dtype={"cpu": "bfloat16", "cuda": "bfloat16"},
    ),
}


def get(name: str) -> Preset:
    return PRESETS[name]
