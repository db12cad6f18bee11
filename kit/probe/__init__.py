"""NVTX probes inside a running sglang, installed at interpreter start-up, without editing sglang.

How it reaches every process: `site_dir()` holds a `sitecustomize.py`. Put it first on PYTHONPATH and
set KIT_PROBE=1, and every Python started with that environment — the sglang server and the scheduler
subprocesses it starts with multiprocessing "spawn" (one per TP rank) — installs an import hook that
wraps the targets in kit.probe.targets when sglang imports their modules. Without KIT_PROBE=1 the
sitecustomize returns at once: no kit import, no hook, nothing wrapped.

This module stays import-light (stdlib only): it runs inside sglang's interpreter.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ENV_ENABLE = "KIT_PROBE"  # "1": install the probe
ENV_SINK = "KIT_PROBE_SINK"  # "nvtx" (default) | "recorder" | "torch" (PyTorch-profiler ranges only) | "off"
ENV_RECORDER = "KIT_PROBE_RECORDER"  # recorder sink: SQLite path (kit_ranges table)
ENV_ROOT = "KIT_PROBE_ROOT"  # directory holding kit/, when kit is not installed in sglang's env
ENV_PROFILE_FROM = (
    "KIT_PROBE_PROFILE_FROM"  # "capture": cudaProfilerStart before the first draft graph capture
)
ENV_PROFILE_DEVICE = "KIT_PROBE_PROFILE_DEVICE"  # CUDA device whose process starts the profiler (default 0)
ENV_CENSUS = "KIT_PROBE_CENSUS"  # JSONL: indexer calls per captured draft_forward, written at capture
ENV_VERIFIED = "KIT_PROBE_VERIFIED"  # internal: sglang dir already checked by a parent process
ENV_TARGET_SET = "KIT_PROBE_TARGET_SET"  # internal: the probe-target set that parent chose for it
ENV_TARGET_TOPK = "KIT_PROBE_TARGET_TOPK"  # "last": the control override (kit.probe.targets.OVERRIDE_TARGETS)

# off: no ranges at all (an unprofiled run that needs the override); torch: PyTorch-profiler ranges only
SINKS = ("nvtx", "recorder", "torch", "off")
TARGET_TOPK_MODES = ("last",)


def target_topk_warning(mode: str) -> str:
    """What every artifact of a control run says: its outputs are not what the model computes."""
    return (
        f"CONTROL RUN, target_topk={mode}: the target model's DSA indexer did not choose its top-k; the kit "
        "replaced its scores by a ramp over key positions, so sparse attention read the last index_topk "
        "tokens (the MTP draft's indexer was left alone). Outputs show what depends on the selection; "
        "they are not the model's answers"
    )


def classifier_only_warning(why: str | None = None) -> str:
    """What every artifact of a run without the probe says (`why`: e.g. the release the registry lacks)."""
    return (
        "CLASSIFIER ONLY: sglang ran without the kit's probe (no NVTX ranges: no draft_round, draft_step or "
        "indexer range), so indexer launches per draft round come from the NVTX-free kernel classifier "
        "alone (draft-loop CUDA-graph replays and indexer kernel names), unchecked by the probe's ranges"
        + (f"; {why}" if why else "")
    )


def site_dir() -> Path:
    """The directory to put first on PYTHONPATH (it holds sitecustomize.py)."""
    return Path(__file__).resolve().parent / "site"


def kit_root() -> Path:
    """The directory that holds the kit package (what ENV_ROOT points at)."""
    from kit.paths import REPO

    return REPO


def probe_env(
    base: Mapping[str, str] | None = None,
    *,
    sink: str = "nvtx",
    recorder: Path | None = None,
    profile_from: str | None = None,
    profile_device: int = 0,
    census: Path | None = None,
    target_topk: str | None = None,
) -> dict[str, str]:
    """The environment variables to ADD to `base` (default os.environ) for a probed sglang."""
    if target_topk not in (None, *TARGET_TOPK_MODES):
        raise ValueError(f"target_topk must be None or one of {TARGET_TOPK_MODES}, not {target_topk!r}")
    if sink not in SINKS:
        raise ValueError(f"unknown probe sink {sink!r}; use one of {SINKS}")
    if sink == "recorder" and recorder is None:
        raise ValueError("the recorder sink needs a recorder path")
    if profile_from not in (None, "capture"):
        raise ValueError(f"profile_from must be None or 'capture', not {profile_from!r}")
    base = os.environ if base is None else base
    existing = base.get("PYTHONPATH", "")
    parts = [str(site_dir())] + [p for p in existing.split(os.pathsep) if p and p != str(site_dir())]
    env = {
        ENV_ENABLE: "1",
        ENV_SINK: sink,
        ENV_ROOT: str(kit_root()),
        "PYTHONPATH": os.pathsep.join(parts),
    }
    if recorder is not None:
        env[ENV_RECORDER] = str(recorder)
    if profile_from:
        env[ENV_PROFILE_FROM] = profile_from
        env[ENV_PROFILE_DEVICE] = str(profile_device)
    if census is not None:
        env[ENV_CENSUS] = str(census)
    if target_topk is not None:
        env[ENV_TARGET_TOPK] = target_topk
    return env
