"""Cells of a batch that share one sglang server: one start, then each cell in turn, each analysed alone.

A server's command line and environment are fixed when it starts, and `run_server` applies one value of
every parameter to all its cells except `PER_CELL`: the context length and the workload, which it runs as a
list (kit.backends.sglang.launch). So sglang cells whose parameters differ only there, and that run in the
same build, form a group: the profile stage runs once for the group (01_profile with the lists and the
cells' run ids, or the plain runner's profile process), each cell still gets its own run directory at its
batch run id, then its own analyze stage, verdict and comparison. Every other cell is a group of one and
runs exactly as before.

A group's cells must be a product of its context lengths and workloads (what one server runs); cells left
from an earlier attempt (--resume) that are not are split by workload. A cell the group leaves unrun keeps
its own outcome: a server that dies between cells fails the rest with error.json, a deadline that passes
between cells leaves them not started (no directory), and the batch's other groups run on.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit import rundir
from kit.paths import unique_path
from kit.pipeline import cell as cell_mod
from kit.pipeline.cell import CellResult
from kit.pipeline.matrix import Build, Cell, server_id

PER_CELL = ("context_len", "workload")  # what run_server takes a list of; everything else is per server
# A server's cells are analysed side by side once it has stopped (each its own kernel or process): one
# after another they were most of the gap between two arms' servers (data/results/h200-pr29654, the runs'
# provenance times).
ANALYSES_AT_ONCE = 4


@dataclass(frozen=True)
class Group:
    """Cells one profile stage runs: several on one sglang server (`server`: its folder's name), or one
    alone (`server` None, exactly as a cell always ran)."""

    cells: tuple[Cell, ...]
    server: str | None = None

    @property
    def build(self) -> Build | None:
        return self.cells[0].build

    def values(self, key: str) -> list[Any]:
        """The distinct values of a per-cell parameter, in run order."""
        return list(dict.fromkeys(c.params.get(key) for c in self.cells))

    def params(self) -> dict[str, Any]:
        """The server's parameters: the cells' own, context_len (and workload, when the matrix has that
        axis) as the lists run_server runs, contexts outer."""
        out = {k: v for k, v in self.cells[0].params.items() if k not in PER_CELL}
        out["context_len"] = self.values("context_len")
        workloads = self.values("workload")
        if workloads != [None]:
            out["workload"] = workloads
        return out

    def cell_ids(self) -> list[str]:
        return [c.run_id for c in self.cells]


def server_key(cell: Cell) -> str | None:
    """Cells with one key can share a server; None: the cell runs alone (not the sglang backend)."""
    if cell.params.get("backend") != "sglang":
        return None
    rest = {k: v for k, v in cell.params.items() if k not in PER_CELL}
    build = (cell.build.pythonpath, cell.build.python) if cell.build else None
    return json.dumps([rest, build], sort_keys=True, default=str)


def _products(cells: list[Cell]) -> list[list[Cell]]:
    """Split cells of one server key into sets one server runs: contexts x workloads, contexts outer."""
    by_workload: dict[Any, list[Cell]] = {}
    for c in cells:
        by_workload.setdefault(c.params.get("workload"), []).append(c)
    same_contexts: dict[tuple[int, ...], list[Any]] = {}
    for workload, cs in by_workload.items():
        same_contexts.setdefault(tuple(c.params["context_len"] for c in cs), []).append(workload)
    index = {(c.params["context_len"], c.params.get("workload")): c for c in cells}
    return [[index[ctx, w] for ctx in ctxs for w in ws] for ctxs, ws in same_contexts.items()]


def form(cells: list[Cell], batch_dir: Path, share: bool = True) -> list[Group]:
    """The groups of `cells` (those to run), in the order their first cell comes; each shared server gets
    a folder name free in `batch_dir` (a resumed group starts a new server beside the earlier one, whose
    complete cells keep their links to it). share=False: every cell alone, a server each."""
    order: list[Group | str] = []
    keyed: dict[str, list[Cell]] = {}
    for c in cells:
        key = server_key(c) if share else None
        if key is None:
            order.append(Group((c,)))
            continue
        if key not in keyed:
            keyed[key] = []
            order.append(key)
        keyed[key].append(c)
    groups: list[Group] = []
    taken: set[str] = set()
    for item in order:
        if isinstance(item, Group):
            groups.append(item)
            continue
        for part in _products(keyed[item]):
            if len(part) == 1:
                groups.append(Group((part[0],)))
                continue
            one_workload = len({c.params.get("workload") for c in part}) == 1
            named = {**part[0].params, "arm": part[0].name}  # a mutant's server: named after it
            path = unique_path(batch_dir / server_id(named, one_workload))
            while path.name in taken:
                path = unique_path(path.with_name(f"{path.name}-x"))
            taken.add(path.name)
            groups.append(Group(tuple(part), path.name))
    return groups


def describe(groups: list[Group]) -> list[str]:
    """Lines for --dry-run: each shared server, its build, and the cells it runs in order."""
    lines = []
    for g in groups:
        if g.server is None:
            continue
        build = "this interpreter"
        if g.build is not None:
            build = " ".join([*(["python " + g.build.python] if g.build.python else []), *g.build.pythonpath])
        lines.append(f"  server {g.server}: {len(g.cells)} cells, one start ({build})")
        lines += [f"    {c.run_id}" for c in g.cells]
    return lines


def run_group(
    group: Group, runs_root: Path | str, batch: str, runner: str, start_before: float | None = None
) -> list[CellResult]:
    """A group's profile stage once, then its cells' analyze stages side by side (ANALYSES_AT_ONCE); never
    raises for a failed stage.

    start_before (time.time()): no cell of a shared server starts from then on (they come back not
    started). Ctrl-C: the server's cells hold error.json (run_server writes it), and it is raised.
    """
    runs_root = Path(runs_root).resolve()
    if group.server is None:
        return [cell_mod.run_cell(group.cells[0], runs_root, batch, runner)]
    batch_dir = runs_root / batch
    t0 = time.perf_counter()
    options: dict[str, Any] = {"cell_ids": group.cell_ids()}
    if start_before is not None:
        options["start_before"] = start_before
    step = cell_mod.profile_step(runner, group.params(), runs_root, batch, group.server, group.build, options)
    if cell_mod.interrupted():
        return [cell_mod.not_started(c, batch_dir, "interrupted (Ctrl-C)") for c in group.cells]
    failure: Exception | None = None
    try:
        for c in group.cells:  # made by another process since the plan: the server would fail on it
            cell_mod.refuse_existing(batch_dir / c.run_id)
        step.run()
    except Exception as exc:  # per cell below: run_server wrote error.json where it failed
        failure = exc
    dirs = [batch_dir / group.server, *(batch_dir / c.run_id for c in group.cells)]
    if failure is not None and any(cell_mod.made_elsewhere(failure, d) for d in dirs):
        wall = round(time.perf_counter() - t0, 1)  # nothing of another process's is written or analysed
        msg = cell_mod.one_line(failure)
        return [
            CellResult(c.run_id, "failed", str(batch_dir / c.run_id), step.stage, msg, wall)
            for c in group.cells
        ]
    made = any((batch_dir / c.run_id).exists() for c in group.cells)
    record = step.record if step.record is not None and step.record.exists() else None
    if record is not None:  # each cell's directory names the notebook that profiled it
        for c in group.cells:
            link = batch_dir / c.run_id / cell_mod.PROFILE_NOTEBOOK
            if link.parent.is_dir() and not link.exists():
                link.symlink_to(Path("..") / group.server / cell_mod.PROFILE_NOTEBOOK)
    results: list[CellResult | Future[CellResult]] = []
    with ThreadPoolExecutor(ANALYSES_AT_ONCE, thread_name_prefix="kit-analyze") as pool:
        for c in group.cells:
            run_dir = batch_dir / c.run_id
            if not run_dir.exists():
                if failure is None or made:  # the deadline passed before it could start
                    results.append(cell_mod.not_started(c, batch_dir))
                    continue
                # the stage failed before the server made any directory (parameters, pre-flight)
                cell_mod.record_failure(run_dir, step.stage, failure, record)
            if rundir.failed(run_dir):
                err = rundir.read_json(rundir.RunDir(run_dir).error)
                msg = cell_mod.one_line(failure) if failure is not None and not made else _message(err)
                wall = round(time.perf_counter() - t0, 1)
                results.append(CellResult(c.run_id, "failed", str(run_dir), step.stage, msg, wall))
                continue
            steps = [cell_mod.analyze_step(runner, run_dir, c.build)] if cell_mod.profiled(c) else []
            results.append(pool.submit(cell_mod.run_steps, c, run_dir, steps, runner, t0, False))
        return [r.result() if isinstance(r, Future) else r for r in results]


def _message(err: dict[str, Any]) -> str:
    """error.json's exception as the summary shows it: one line."""
    first = (str(err.get("message") or "").strip().splitlines() or [""])[0]
    text = f"{err.get('error') or 'Error'}: {first}"
    return text if len(text) <= 400 else text[:397] + "..."
