"""The task checkpoint's weights: a DeepSeek-V3.2-shaped DSA + NextN checkpoint (kit.checkpoint's
architecture, names and shapes, a larger vocabulary) whose target answers a long-context lookup THROUGH its
sparse attention. kit.task.make writes them (`kit make-checkpoint --task`); task_tensors builds them in
memory.

Constructed, not trained. Target layer 0 does the lookup: the query of node n(k) matches only the key part
of fact f(k->v) (nope dims; every rope row is zero, so position plays no role), the fact's value part goes
through o_proj to the answer coordinate of n(v), which the lm_head reads. Its indexer scores by group: a
node's query carries its key's group code, a fact's key the same code, fillers a small positive share of every
code, nodes nothing; so the top-k holds the query's group of facts, then fillers, and other facts only when
fillers run out. Fillers carry an `unknown` value: with no matching fact selected the answer is <unknown>.
Layer 1's attention and every MLP/MoE write nothing (zero o_proj / down_proj). The NextN layer repeats layer
0's lookup from the embedding alone (eh_proj passes the embedding half, drops the target hidden), except that
for `draft_miss_per_group` keys per group its query names another key of the group: the draft is wrong there.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kit.checkpoint import files as ckfiles
from kit.checkpoint import layout
from kit.errors import UsageError
from kit.task.spec import INDEX_ROPE, TaskSpec

# Multipliers of the selection matrices (why each value: see the module docstring and the report).
TASK_GAINS: dict[str, float] = {
    "attn_q": 1.0,  # q_b_proj: node query -> nope dim of its key (heads 0 and 1)
    "attn_k": 0.75,  # kv_b_proj key half: latent A dim -> nope dim
    "attn_v": 4.0,  # kv_b_proj value half: latent B / unknown dim -> v dim
    "attn_out": 4.25,  # o_proj: v dim -> answer coordinate
    "lm_head": 0.5,  # answer coordinate -> logit
    "index_q": 0.25,  # indexer wq_b: node -> group code
    "index_k": 0.0625,  # indexer wk: fact -> group code, filler -> every code + junk (k_norm rescales)
    "index_w": 0.0625,  # indexer weights_proj head 0 <- bias coordinate (positive head weight)
    "filler_junk": 8.0,  # filler index key: junk row weight; larger = smaller filler score
}
ATTN_HEADS = (0, 1)  # head 0 carries the answer values, head 1 the unknown value (128 v dims per head)


def task_config(spec: TaskSpec, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """kit.checkpoint's config (with `overrides`, e.g. smaller sizes for tests) and the task's vocabulary;
    refused unless sglang 0.5.14 can serve it."""
    if "vocab_size" in (overrides or {}):
        raise UsageError("vocab_size is set by the task (keys and fact tokens); do not override it")
    cfg = layout.model_config({**(overrides or {}), "vocab_size": spec.vocab_size})
    bad = layout.sglang_constraints(cfg)
    if spec.hidden_layout()["bias"] >= cfg["hidden_size"] or cfg["q_lora_rank"] < spec.n_keys:
        need = spec.hidden_layout()["bias"] + 1
        bad.append(f"{spec.n_keys} keys need hidden_size >= {need} and q_lora_rank >= {spec.n_keys}")
    if bad:
        raise UsageError("task checkpoint config rejected: " + "; ".join(bad))
    return cfg


class TaskValues:
    """float32 values of every tensor of the task checkpoint, by name (kit.checkpoint.tensor_specs order)."""

    def __init__(self, spec: TaskSpec, cfg: dict[str, Any], gains: dict[str, float] = TASK_GAINS) -> None:
        self.spec, self.cfg, self.g = spec, cfg, gains
        self.hid, self.lat = spec.hidden_layout(), spec.latent_dims()
        h, k = cfg["hidden_size"], spec.n_keys
        embed = np.zeros((spec.vocab_size, h), np.float32)
        filler = math.sqrt(h / 2)  # every row has RMS 1: enorm/input_layernorm see the same scale
        embed[:, self.hid["F"]] = filler
        embed[:, self.hid["bias"]] = filler
        for key in range(k):
            row = embed[spec.node(key)]
            row[:] = 0
            row[self.hid["Q"] + key] = row[self.hid["bias"]] = filler
        embed[spec.unknown_id] = 0
        embed[spec.unknown_id, self.hid["bias"]] = math.sqrt(h)
        third = math.sqrt(h / 3)
        for key in range(k):
            rows = embed[spec.fact(key, 0) : spec.fact(key, k)]
            rows[:] = 0
            rows[:, self.hid["A"] + key] = third
            rows[np.arange(k), self.hid["B"] + np.arange(k)] = third
            rows[:, self.hid["bias"]] = third
        self.embed = embed
        head = np.zeros_like(embed)
        for v in range(k):
            head[spec.node(v), self.hid["R"] + v] = gains["lm_head"]
        head[spec.unknown_id, self.hid["R_unknown"]] = gains["lm_head"]
        self.head = head

    def __call__(self, s: layout.TensorSpec) -> np.ndarray:
        name, shape = s.name, s.shape
        if name.endswith("embed_tokens.weight"):
            return self.embed
        if name in ("lm_head.weight",) or name.endswith("shared_head.head.weight"):
            return self.head
        if name.endswith(("norm.weight", "layernorm.weight", "k_norm.weight")):
            return np.ones(shape, np.float32)
        if name.endswith("eh_proj.weight"):
            h = self.cfg["hidden_size"]
            return np.concatenate([np.eye(h, dtype=np.float32), np.zeros((h, h), np.float32)], 1)
        layer = int(name.split(".")[2])
        if ".mlp." in name:
            if name.endswith("down_proj.weight") or name.endswith("e_score_correction_bias"):
                return np.zeros(shape, np.float32)
            rng = layout.tensor_rng(self.spec.seed, "task:" + name)
            return rng.standard_normal(shape, dtype=np.float32) * np.float32(shape[1] ** -0.5)
        part = name.split(".self_attn.")[1].removesuffix(".weight").removesuffix(".bias")
        if layer == self.cfg["num_hidden_layers"]:  # the NextN layer: the draft
            return self._attention(part, shape, list(self.spec.draft_query))
        if layer == 0:
            return self._attention(part, shape, list(range(self.spec.n_keys)))
        out = np.zeros(shape, np.float32)  # target layers >= 1: attention writes nothing
        if part == "kv_a_proj_with_mqa":
            out[self.lat["pads"], self.hid["bias"]] = 1.0  # but no fp8 latent tile may be all zero
        return out

    def _attention(self, part: str, shape: tuple[int, ...], looks_up: list[int]) -> np.ndarray:
        """One retrieval attention + indexer; node k's query looks up key looks_up[k]."""
        spec, g, hid, lat, cfg = self.spec, self.g, self.hid, self.lat, self.cfg
        k = spec.n_keys
        keys = np.arange(k)
        nope, rope, v_dim = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        out = np.zeros(shape, np.float32)
        codes = spec.index_codes()
        group_code = codes["group"][np.array(spec.group_of)]  # [k, 64]
        if part == "q_a_proj":
            out[keys, hid["Q"] + keys] = 1.0  # q_lora dim k <- node k
        elif part == "q_b_proj":
            for head in ATTN_HEADS:
                out[head * (nope + rope) + np.array(looks_up), keys] = g["attn_q"]
        elif part == "kv_a_proj_with_mqa":
            out[lat["A"], hid["A"] + keys] = 1.0
            out[lat["B"], hid["B"] + keys] = 1.0
            out[lat["unknown"], hid["F"]] = 1.0
            out[lat["pads"], hid["bias"]] = 1.0
        elif part == "kv_b_proj":
            for head in ATTN_HEADS:
                out[head * (nope + v_dim) + keys, lat["A"]] = g["attn_k"]
            out[0 * (nope + v_dim) + nope + keys, lat["B"]] = g["attn_v"]
            out[1 * (nope + v_dim) + nope, lat["unknown"]] = g["attn_v"]
        elif part == "o_proj":
            out[hid["R"] + keys, 0 * v_dim + keys] = g["attn_out"]
            out[hid["R_unknown"], 1 * v_dim] = g["attn_out"]
        elif part == "indexer.wq_b":  # head 0, non-rotated half: the group code of the looked-up key
            out[INDEX_ROPE : 2 * INDEX_ROPE, keys] = g["index_q"] * group_code[np.array(looks_up)].T
        elif part == "indexer.wk":
            out[INDEX_ROPE:, hid["A"] + keys] = g["index_k"] * group_code.T
            filler = codes["group"].sum(0) + g["filler_junk"] * codes["junk"]
            out[INDEX_ROPE:, hid["F"]] = g["index_k"] * filler
        elif part == "indexer.weights_proj":
            out[0, hid["bias"]] = g["index_w"]
        elif part != "indexer.k_norm":  # k_norm.bias stays zero
            raise AssertionError(f"unexpected attention tensor {part}")
        return out


def task_tokenizer(spec: TaskSpec, model_max_length: int) -> dict[str, Any]:
    """kit.checkpoint's byte-level tokenizer plus one added (non-special) token per task id, so every id
    sglang may detokenize has text: <k17> node, <k?> unknown, <f17:42> fact, <r0> unused padding."""
    files = ckfiles.tokenizer_files(spec.base_vocab, model_max_length)
    added = files["tokenizer.json"]["added_tokens"]
    k = spec.n_keys
    for tid in range(spec.base_vocab, spec.vocab_size):
        if tid < spec.unknown_id:
            text = f"<k{tid - spec.base_vocab}>"
        elif tid == spec.unknown_id:
            text = "<k?>"
        elif tid < spec.first_fact_id + k * k:
            key, value = divmod(tid - spec.first_fact_id, k)
            text = f"<f{key}:{value}>"
        else:
            text = f"<r{tid - spec.first_fact_id - k * k}>"
        added.append({"id": tid, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": False})  # fmt: skip
    return files


def task_tensors(
    seed: int = 0,
    *,
    n_keys: int = 128,
    n_groups: int = 8,
    draft_miss_per_group: int = 2,
    overrides: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], TaskSpec, dict[str, Any]]:
    """(config, task, float32 torch tensors by name) of the checkpoint make_task_checkpoint would write with
    these arguments, without writing it: every tensor goes through the same encoder as the file's bytes,
    so it equals what kit.task.forward.read_safetensors reads back from the directory."""
    from kit.task.forward import tensor_from_bytes  # torch: only where tensors are wanted

    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UsageError(f"seed must be a non-negative integer, got {seed!r}", param="seed")
    spec = TaskSpec(seed=seed, n_keys=n_keys, n_groups=n_groups, draft_miss_per_group=draft_miss_per_group)
    cfg = task_config(spec, overrides)
    values = TaskValues(spec, cfg)
    tensors = {
        s.name: tensor_from_bytes(ckfiles.encode(s, values(s)), s.dtype, s.shape)
        for s in layout.tensor_specs(cfg)
    }
    return cfg, spec, tensors
