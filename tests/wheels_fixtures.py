"""Helpers shared by test_wheels/test_build/test_verify: pinned release wheels and one patched build.

Plain memoised functions rather than fixtures, so test modules can share them without the lead's
conftest.py. Downloads land in the kit's wheel cache (.cache/wheels or $KIT_CACHE), so re-runs only
re-hash; the patched build happens once per test session.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import zipfile
from pathlib import Path

from kit.sglang_src.build import build_patched_wheel
from kit.sglang_src.releases import BASELINE, PATCHED
from kit.sglang_src.wheels import fetch_wheel

# release -> (expected state, expected carrier); the classification is by data flow, not version. The
# oracle for `kit verify`, kept apart from the registry (kit.sglang_src.releases) on purpose.
RELEASES: dict[str, tuple[str, str | None]] = {
    "0.5.12.post1": ("absent", None),
    "0.5.13": ("absent", "ForwardBatch.topk_indices"),  # fields exist, nothing switches the gate on
    "0.5.13.post1": ("bug", "ForwardBatch.topk_indices"),
    "0.5.14": ("bug", "ForwardBatch.topk_indices"),
    "0.5.15": ("fix", "EagleDraftInput.dsa_topk_indices"),
    "0.5.16": ("fix", "EagleDraftInput.dsa_topk_indices"),
    "0.5.21": ("fix", "IndexTopKShareState"),
    "0.5.23": ("fix", "IndexTopKShareState"),
}

PATCHED_FILES = [
    "sglang/srt/model_executor/forward_batch_info.py",
    "sglang/srt/models/deepseek_nextn.py",
    "sglang/srt/speculative/eagle_info.py",
    "sglang/srt/speculative/eagle_worker_v2.py",
]

_SCRATCH = Path(tempfile.mkdtemp(prefix="kit-test-wheels-"))
atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)
_memo: dict[str, object] = {}


def release_wheel(version: str) -> Path:
    """The pinned PyPI wheel, or for PATCHED the kit's own build."""
    if version == PATCHED:
        out, manifest = patched_build()
        return out / manifest["output_wheel"]
    return fetch_wheel(version)


def unpacked(wheel: Path) -> Path:
    """The wheel extracted once per session (its root is laid out like site-packages)."""
    key = f"tree:{wheel}"
    if key not in _memo:
        dest = _SCRATCH / f"tree-{len(_memo)}"
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(dest)
        _memo[key] = dest
    return _memo[key]  # type: ignore[return-value]


def patched_build() -> tuple[Path, dict]:
    """(out_dir, manifest) of one build of the patched baseline (PATCHED) per session."""
    if "patched" not in _memo:
        out = _SCRATCH / "patched-out"
        _memo["patched"] = (out, build_patched_wheel(BASELINE, out))
    return _memo["patched"]  # type: ignore[return-value]
