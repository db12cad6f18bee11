"""Shared by tests/test_task_*.py: the default task checkpoint, built once per test process (2-3 s)."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

# A small task in small (still sglang-legal) sizes, for tests that build several checkpoints.
SMALL = {
    "n_keys": 16,
    "n_groups": 4,
    "draft_miss_per_group": 1,
    "overrides": {
        "hidden_size": 256,
        "q_lora_rank": 256,
        "intermediate_size": 256,
        "moe_intermediate_size": 128,
    },
}


@functools.cache
def task_checkpoint() -> tuple[Path, dict]:
    """(directory, manifest) of make_task_checkpoint(seed=0) without the self-check (tested separately)."""
    from kit.task import make_task_checkpoint

    root = Path(tempfile.mkdtemp(prefix="kit-task-"))
    atexit.register(shutil.rmtree, root, True)
    manifest = make_task_checkpoint(root / "task", seed=0, self_check=False)
    return root / "task", manifest


@functools.cache
def task_model():
    from kit.task.reference import TaskModel

    return TaskModel(task_checkpoint()[0])
