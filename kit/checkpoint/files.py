"""Writing a generated checkpoint: bf16 safetensors byte for byte, the byte-level tokenizer, and the directory
published whole (built beside the target and renamed into place, so an interrupted run leaves nothing)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kit.checkpoint.layout import _ALNUM, BOS, EOS, PAD, SPECIAL_TOKENS, TensorSpec
from kit.errors import ExistsError, ToolMissing, UsageError
from kit.provenance import sha256_file
from kit.rundir import check_folder

FORMAT = "kit.checkpoint/dsa-mtp-v1"
MANIFEST = "kit-checkpoint.json"
WEIGHTS = "model.safetensors"


def bf16_bytes(a: np.ndarray) -> bytes:
    """float32 -> bfloat16 (round to nearest even), little-endian; what torch's .to(bfloat16) does."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    u = u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    return (u >> np.uint32(16)).astype("<u2").tobytes()


def encode(spec: TensorSpec, a: np.ndarray) -> bytes:
    if a.shape != spec.shape:
        raise AssertionError(f"{spec.name}: values {a.shape} != spec {spec.shape}")
    return bf16_bytes(a) if spec.dtype == "BF16" else np.ascontiguousarray(a, "<f4").tobytes()


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
        raise UsageError(f"vocab_size {vocab_size} is outside what the kit's byte-level tokenizer can fill")
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
        raise ToolMissing(
            f"{path}: tokenizers {tokenizers.__version__} does not read it back as written", tool="tokenizers"
        )
    return tokenizers.__version__


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ExistsError(
            f"{out_dir} exists and is not an empty directory; pass a new directory (or delete it)",
            path=out_dir,
        )
    check_folder(out_dir.parent, "the checkpoint (written beside its folder, then renamed)", "DIR")


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


def publish(
    out_dir: Path,
    cfg: dict[str, Any],
    specs: list[TensorSpec],
    values: Callable[[TensorSpec], np.ndarray],
    tokenizer: dict[str, Any],
    check_tokenizer: Callable[[Path], str | None],
    extra_json: dict[str, Any],
    manifest: Callable[[Path, dict[str, Any], dict[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    """Write config, generation config, tokenizer files, `extra_json` files and the weights into a sibling
    temporary directory, then `manifest(tmp, files, facts)` (it may run checks on the finished files), then
    rename the whole into `out_dir` (new or empty). Returns the manifest, also written as MANIFEST."""
    out_dir = Path(out_dir)
    check_out_dir(out_dir)
    t0 = time.monotonic()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        write_json(tmp / "config.json", cfg)
        write_json(
            tmp / "generation_config.json",
            {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"], "do_sample": False},
        )
        for name, obj in tokenizer.items():
            write_json(tmp / name, obj)
        facts: dict[str, Any] = {"tokenizer_checked_with": check_tokenizer(tmp / "tokenizer.json")}
        for name, obj in extra_json.items():
            write_json(tmp / name, obj)
        write_safetensors(tmp / WEIGHTS, specs, lambda s: encode(s, values(s)))
        facts["generation_seconds"] = round(time.monotonic() - t0, 2)
        files = {
            p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size}
            for p in sorted(tmp.iterdir())
            if p.is_file()
        }
        result = manifest(tmp, files, facts)
        write_json(tmp / MANIFEST, result)
        if out_dir.exists():
            out_dir.rmdir()  # empty (checked above)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result
