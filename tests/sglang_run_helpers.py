"""Shared bits for the sglang-backend tests: a fake DSA model directory, a fake tokenizer, the parameters
of a small run against the stand-in, and a check that a process group is gone."""

from __future__ import annotations

import json
import os
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


def run_params(model: Path, **kw: object) -> dict:
    """A small, quick run against the stand-in: 2 requests of 4096 tokens, 64 new tokens, no nsys."""
    base = {
        "arm": "bug",
        "model_path": str(model),
        "context_len": 4096,
        "num_requests": 2,
        "max_new_tokens": 64,
        "profile": False,
        "profile_skip": 2,
        "profile_steps": 4,
        "health_timeout_s": 30.0,
        "request_timeout_s": 30.0,
        "shutdown_timeout_s": 10.0,
    }
    return {**base, **kw}


def run_on_standin(
    model: Path, root: Path, *, mode: str = "ok", run_id: str | None = None, **kw: object
) -> Path:
    """launch.run_arm of run_params(model, **kw) into root/runs/b, served by the stand-in in `mode`."""
    import sglang_standin_helpers as standin

    from kit.backends.sglang import launch

    return launch.run_arm(
        run_params(model, **kw),
        root / "runs",
        "b",
        run_id=run_id,
        tokenizer=FakeTokenizer(),
        server_cmd_factory=lambda port: standin.command(port, mode=mode),
    )


def group_gone(pgid: int) -> bool:
    """No process is left in the group (the server's session) any more."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


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
