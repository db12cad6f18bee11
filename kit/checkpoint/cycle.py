"""`kit make-checkpoint`: the next-token-cycle checkpoint, random bf16 weights on kit.checkpoint.layout's
architecture (DSA indexer + one NextN/MTP layer) that sglang 0.5.14 serves on one H200 with EAGLE MTP.

Weights are random bf16 from numpy's PCG64 (no torch, same bytes on any machine), one stream per tensor.
Structure, so the target's logits depend on the context yet its greedy choice has a margin that bf16
numerics cannot flip: the lm_head is the embedding with its rows permuted along one cycle over the ordinary
tokens, so a hidden state near embed(t) predicts next(t); the target's attention is sharp and its branch
larger than the embedding (so every logprob depends on the context and on the indexer's top-k) but not
large enough to override next(t); the NextN eh_proj passes its embedding half through and the draft's
branches are small, so the draft predicts next(t) too. Attention that does override next(t) does so at
near-ties (a continuous score crossing a threshold), which the kernels' rounding then decides; see
layout.GAINS.

Kernel constraints the config honours (sglang 0.5.14 on sm90, TP1, bf16 KV cache) are in
`sglang_constraints`, each with the place in sglang or its kernels where it was found.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kit.checkpoint.files import FORMAT, check_tokenizer, publish, summary, tokenizer_files
from kit.checkpoint.layout import (
    GAINS,
    SPECIAL_TOKENS,
    TensorSpec,
    model_config,
    sglang_constraints,
    tensor_rng,
    tensor_specs,
)
from kit.errors import UsageError

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


def next_token_cycle(seed: int, vocab: int) -> np.ndarray:
    """nxt[t]: the token the lm_head favours after t; one cycle through all ordinary (non-special) ids."""
    order = tensor_rng(seed, "next-token-cycle").permutation(np.arange(len(SPECIAL_TOKENS), vocab))
    nxt = np.arange(vocab)
    nxt[order] = np.roll(order, -1)
    return nxt


class _Values:
    """Produces each spec's float32 values; keeps the embedding because the heads are built from it."""

    def __init__(self, cfg: dict[str, Any], seed: int, gains: dict[str, float]) -> None:
        self.cfg, self.seed, self.gains = cfg, seed, gains
        vocab, h = cfg["vocab_size"], cfg["hidden_size"]
        self.embed = tensor_rng(seed, "model.embed_tokens.weight").standard_normal(
            (vocab, h), dtype=np.float32
        )
        nxt = next_token_cycle(seed, vocab)
        head = np.zeros_like(self.embed)  # special tokens: logit 0, never the argmax
        ordinary = np.arange(len(SPECIAL_TOKENS), vocab)
        head[nxt[ordinary]] = self.embed[ordinary] * np.float32(gains["lm_head"] / h)
        self.head = head

    def __call__(self, spec: TensorSpec) -> np.ndarray:
        if spec.init == "normal":
            return tensor_rng(self.seed, spec.name).standard_normal(
                spec.shape, dtype=np.float32
            ) * np.float32(spec.std)
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
            noise = tensor_rng(self.seed, spec.name).standard_normal((h, h), dtype=np.float32)
            return np.concatenate(
                [np.eye(h, dtype=np.float32), noise * np.float32(self.gains["eh_hidden"] / h**0.5)], 1
            )
        raise AssertionError(spec.init)


def model_gains(overrides: dict[str, float] | None = None) -> dict[str, float]:
    """GAINS with `overrides` (`kit make-checkpoint --gain attn_out=8`: explore logit margins)."""
    gains = dict(GAINS)
    for k, v in (overrides or {}).items():
        if k not in gains:
            raise UsageError(f"unknown checkpoint gain {k!r}; known gains: {', '.join(sorted(gains))}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1e3:
            raise UsageError(f"gain {k}={v!r} must be a positive number below 1000")
        gains[k] = float(v)
    return gains


def make_checkpoint(
    out_dir: Path,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
    gains: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Write the checkpoint into `out_dir` (new or empty) and return its manifest (also kit-checkpoint.json).

    Same seed and overrides -> the same bytes in every model file; nothing is left behind if interrupted.
    """
    from kit import __version__
    from kit.provenance import git_sha

    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UsageError(f"seed must be a non-negative integer, got {seed!r}", param="seed")
    cfg = model_config(overrides)
    weight_gains = model_gains(gains)
    bad = sglang_constraints(cfg)
    if bad:
        raise UsageError("checkpoint config rejected: " + "; ".join(bad))
    specs = tensor_specs(cfg, weight_gains)

    def manifest(_tmp: Path, files: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "seed": seed,
            "overrides": overrides or {},
            "gains": weight_gains,
            "tokenizer_checked_with": facts["tokenizer_checked_with"],
            "summary": summary(cfg, specs),
            "files": files,
            "kit_version": __version__,
            "reference_match": (
                all(files[n]["sha256"] == h for n, h in REFERENCE_SHA256.items())
                if seed == 0 and not overrides and weight_gains == GAINS
                else None
            ),
            "git_sha": git_sha(),
            "generation_seconds": facts["generation_seconds"],
        }

    return publish(
        Path(out_dir),
        cfg,
        specs,
        _Values(cfg, seed, weight_gains),
        tokenizer_files(cfg["vocab_size"], cfg["max_position_embeddings"]),
        lambda path: check_tokenizer(path, cfg["vocab_size"]),
        {},
        manifest,
    )
