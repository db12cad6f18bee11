"""The mini engine under the PyTorch profiler (`profiler: torch`): what a user without Nsight runs.

The engine's probe ranges go to the profiler as record_function ranges (kit.probe.ranges, sink "torch"),
and the trace is exported as the run directory's profile.trace.json.gz, the file sglang's `/start_profile`
writes per rank. Activities: CPU, plus CUDA on a CUDA device (kernels, launch calls, correlation ids).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SINK = "torch"


def activities(device: str) -> list[Any]:
    import torch

    acts = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


@contextlib.contextmanager
def profiled(device: str, trace: Path) -> Iterator[None]:
    """Run the block under torch.profiler and export its Chrome trace to `trace` (gzipped: .json.gz)."""
    import torch

    with torch.profiler.profile(activities=activities(device), record_shapes=False, with_stack=False) as prof:
        yield
    if device == "cuda":
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace))


def describe(device: str) -> dict[str, Any]:
    """What provenance.json says about the measurement."""
    import torch

    return {
        "profiler": "torch",
        "torch_profiler": {
            "torch": torch.__version__,
            "activities": [a.name for a in activities(device)],
            "record_function_sink": SINK,
        },
    }
