"""A rung of the report's evidence ladder and the ladder's registry: each rung is one function decorated with
`@rung(rank)` that, handed the batch, returns a `Rung` (or None when its data is absent): what ran (engine,
device, model, Nsight Systems, where the files are), its headline, its tables and its figures. The report
shows every registered rung in rank order (kit.report.ladder), so a new rung is one function in a module of
its own, listed in kit.report.ladder, and nothing else needs to change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from kit.compare import per_request

CONFIRMED, NOT_CONFIRMED, NO_RUNS = "CONFIRMED", "NOT CONFIRMED", "NO RUNS"


@dataclass(frozen=True)
class Batch:
    """What every rung is handed: the batch's folder, and `group_of`, a run's params.json -> its group (the
    runs that differ only by arm, whose outputs and draft steps are compared with each other). The pairing
    is the batch's own (kit.pipeline.matrix.group_id), so the pipeline passes it in: the report sits below
    the pipeline and never imports it."""

    path: Path
    group_of: Callable[[dict[str, Any]], str]


@dataclass
class Table:
    title: str
    frame: pd.DataFrame
    note: str = ""
    marked: set[tuple[int, str]] = field(default_factory=set)  # (row, column) cells that fail a check


@dataclass
class Plot:
    """A figure drawn by `draw` (or a PNG already on disk), with its units in the axes and its source."""

    title: str
    source: str
    draw: Callable[[Figure], None] | None = None
    png: Path | None = None
    size: tuple[float, float] = (12.5, 4.2)
    save_as: Path | None = None


@dataclass
class Rung:
    key: str
    title: str
    scope: str  # what ran, in a few words: the headline starts with it
    status: str  # CONFIRMED..., NOT CONFIRMED..., NO RUNS, or "" for a section that is not evidence
    claim: str  # the rest of the headline, after the status
    about: dict[str, str]  # engine, device, model, Nsight, files
    note: str = ""  # markdown: how to read this rung
    tables: list[Table] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)

    @property
    def headline(self) -> str:
        return ": ".join(part for part in (self.scope, self.status, self.claim) if part)


RungFn = Callable[[Batch], Rung | None]
RUNGS: list[tuple[int, RungFn]] = []


def rung(rank: int) -> Callable[[RungFn], RungFn]:
    """Register a rung: `rank` orders the ladder (lower = stronger evidence, shown first)."""

    def register(fn: RungFn) -> RungFn:
        RUNGS.append((rank, fn))
        RUNGS.sort(key=lambda item: item[0])
        return fn

    return register


def span(values: pd.Series) -> str:
    """A headline's range of ratios: "1.12x-1.39x", or one value where the ends round alike."""
    lo, hi = float(values.min()), float(values.max())
    return f"{lo:.2f}x" if round(lo, 2) == round(hi, 2) else f"{lo:.2f}x-{hi:.2f}x"


def launch_claim(bug: pd.Series, fix: pd.Series, steps: pd.Series) -> tuple[bool, str]:
    """Did every row show num_steps - 1 launches per round unpatched and 1 patched?"""
    ok = bool(((bug == steps - 1) & (fix == 1)).all())
    per_steps = ", ".join(f"{s - 1} at {s} steps" for s in sorted(set(steps.astype(int)), reverse=True))
    return ok, f"num_steps - 1 indexer launches per draft round unpatched ({per_steps}), 1 with the fix"


def per_request_table(
    title: str, tables: list[tuple[dict[str, Any], dict[str, Any]]], note: str = ""
) -> Table:
    """Per-request tables of gated comparisons (kit.compare.per_request), each under its labels (e.g. its
    context, its candidate: one column with its workload), as one report table: a row per request, the cells
    that fail the gate marked.
    Notes of tables rebuilt from their runs or not recorded are added to `note`."""
    rows: list[dict[str, Any]] = []
    marked: set[tuple[int, str]] = set()
    notes: dict[str, list[str]] = {}  # a table's note -> the comparisons it holds for
    for labels, table in tables:
        if table.get("note"):
            notes.setdefault(table["note"], []).append(" ".join(str(v) for v in labels.values()))
        for w in table["by_workload"]:
            header, cells, bad = per_request.grid(table, w)
            names = [f"{group} {side}".strip() for group, side in header]
            for i, r in enumerate(cells):
                marked |= {(len(rows), names[j]) for k, j in bad if k == i}
                r = [c + per_request.MARK if (i, j) in bad else c for j, c in enumerate(r)]
                where = " ".join(dict.fromkeys(str(v) for v in (*labels.values(), w)))
                rows.append({"comparison": where, **dict(zip(names, r, strict=True))})
    how = (
        "accept length = completion tokens / verify rounds of the request; verify rounds ran, and in "
        "brackets what the share model predicts (kit/compare/share_model.py); right: the answer; tokens: "
        f"the candidate's greedy tokens equal to the bug's; {per_request.MARK} (red): the cell that fails "
        "the gate"
    )
    told = [
        f"{f'All {len(tables)} comparisons' if len(where) == len(tables) else ', '.join(where)}: {n}."
        for n, where in notes.items()
    ]
    text = " ".join(part for part in (note, how + ".", *told) if part)
    return Table(title, pd.DataFrame(rows), text, marked)
