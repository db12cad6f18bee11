"""The report's evidence ladder: every registered rung (kit.report.rung) with data, strongest first.

The rungs register themselves when their modules are imported; the imports below are the one list of
them. A new rung is a module with one `@rung(rank)` function, added here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kit.errors import InputError
from kit.report import (  # noqa: F401  (a rung's module registers its rung when imported)
    kineto,
    mini_h200,
    mutation_suite,
    pr_grid,
    sglang_h200,
    sglang_task,
    tensor_parallel,
    this_batch,
)
from kit.report import rung as registry


def ladder(batch: Path, group_of: Callable[[dict[str, Any]], str]) -> list[registry.Rung]:
    """Every rung with data, strongest first; `batch` is this batch's directory and `group_of` a run's
    params -> its group, the runs that differ only by arm (kit.report.rung.Batch)."""
    if not Path(batch).is_dir():
        raise InputError(
            f"batch folder {batch} not found: name a folder kit batch wrote (runs/<batch>), or leave "
            "batch_dir empty for the newest analysed run's",
            path=batch,
        )
    handed = registry.Batch(Path(batch), group_of)
    return [r for _, fn in registry.RUNGS if (r := fn(handed)) is not None]
