"""Where a measurement came from: enough to tell two runs apart and to regenerate one."""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import kit
from kit.paths import PR_PATCH, REPO

PATCH = PR_PATCH


def _run(cmd: list[str]) -> str | None:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=REPO)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def git_sha() -> str | None:
    """The kit's commit. KIT_GIT_SHA, when set, wins: a tree copied to a GPU host may carry no .git or a
    stale one (seen: the H200 copy answered an older commit, "-dirty")."""
    if os.environ.get("KIT_GIT_SHA"):
        return os.environ["KIT_GIT_SHA"]
    top = _run(["git", "rev-parse", "--show-toplevel"])
    if top is None or Path(top).resolve() != REPO.resolve():  # no .git here: never a repository around it
        return None
    sha = _run(["git", "rev-parse", "HEAD"])
    if sha is None:
        return None
    if sha and _run(["git", "status", "--porcelain", "--untracked-files=no"]):
        sha += "-dirty"
    return sha


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def gpu_info() -> dict[str, Any] | None:
    if not shutil.which("nvidia-smi"):
        return None
    out = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,uuid", "--format=csv,noheader"])
    if not out:
        return None
    name, driver, mem, uuid = (s.strip() for s in out.splitlines()[0].split(","))
    # the UUID tells two machines of the same model apart (two "same" H200s were once two hosts)
    return {"name": name, "driver": driver, "memory": mem, "uuid": uuid, "count": len(out.splitlines())}


def collect(backend: str, arm: str, nsys_version: str | None) -> dict[str, Any]:
    """Static facts at run start; the stage adds end time and engine details."""
    try:
        import torch

        torch_info = {"version": torch.__version__, "cuda": torch.version.cuda}
    except ImportError:
        torch_info = None
    return {
        "kit_version": kit.__version__,
        "git_sha": git_sha(),
        "backend": backend,
        "arm": arm,
        "patch_sha256": sha256_file(PATCH) if PATCH.exists() else None,
        "nsys_version": nsys_version,
        "measured_under_nsight": nsys_version is not None,
        "python": platform.python_version(),
        "torch": torch_info,
        "gpu": gpu_info(),
        "host": platform.node(),
        "platform": platform.platform(),
        "executable": sys.executable,
        "start": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
