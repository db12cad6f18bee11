"""Shared bits for the sglang-backend tests: a fake DSA model directory and a fake tokenizer."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

GLM52_CONFIG = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "index_topk": 2048,
    "index_head_dim": 128,
    "index_n_heads": 32,
    "num_nextn_predict_layers": 1,
    "max_position_embeddings": 1048576,
    "index_share_for_mtp_iteration": True,
}
DSV32_CONFIG = {
    "architectures": ["DeepseekV32ForCausalLM"],
    "index_topk": 2048,
    "index_head_dim": 128,
    "index_n_heads": 64,
    "num_nextn_predict_layers": 1,
    "max_position_embeddings": 163840,
}


def make_model(root: Path, config: dict, name: str = "model") -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    return d


class FakeTokenizer:
    """Whitespace words hashed to ids: deterministic, enough to build exact-length prompts."""

    bos_token_id = 1

    def __init__(self, interrupt_after: int | None = None):
        self.calls = 0
        self.interrupt_after = interrupt_after

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.calls += 1
        ids = [2 + zlib.crc32(w.encode()) % 30000 for w in text.split()]
        if self.interrupt_after is not None and self.calls > self.interrupt_after:
            raise KeyboardInterrupt  # a Ctrl-C while the workload is being prepared
        return ids


_PATCHED: list[Path] = []


def patched_wheel_once(factory: object) -> Path:
    """0.5.14+pr29654 built once per test session, shared by every module that needs it."""
    if not _PATCHED:
        from kit.sglang_src.build import build_patched_wheel

        _PATCHED.append(Path(build_patched_wheel("0.5.14", factory.mktemp("patched"))["output_path"]))
    return _PATCHED[0]
