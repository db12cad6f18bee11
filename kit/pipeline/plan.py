"""Before a batch runs: every check, then the plan (what to run, what is complete, what to set aside).

Nothing here runs a cell. The checks only read; `set_aside` and `keep_matrix` are the only writes, and
neither replaces or deletes anything: a failed or interrupted cell's directory becomes
`<run_id>.failed-<n>`, a changed matrix is kept beside the first one.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable
from pathlib import Path

import kit
from kit import rundir
from kit.errors import ExistsError, InputError, UsageError
from kit.paths import unique_path
from kit.pipeline import cell as cell_mod
from kit.pipeline import mutant_cells, notebooks
from kit.pipeline.matrix import Cell, Matrix

_FAILED = re.compile(r"\.failed-\d+$")
_BATCH_OK = re.compile(r"[A-Za-z0-9._-]+")


def check_batch_name(batch: str) -> None:
    if not _BATCH_OK.fullmatch(batch):
        raise UsageError(
            f"invalid batch name {batch!r}: use letters, digits, '.', '_' or '-'", param="--batch"
        )


def check_notebook_accepts(m: Matrix) -> None:
    """papermill only warns about a parameter the notebook lacks, and the run would silently ignore it."""
    accepted = notebooks.declared(notebooks.PROFILE)
    for key in dict.fromkeys(k for c in m.cells for k in c.params):
        if key not in accepted:
            takes = ", ".join(sorted(accepted))
            raise UsageError(
                f"matrix {m.path}: {key!r} is not a parameter of notebooks/01_profile.py "
                f"(it takes: {takes}); add it there or drop it from the matrix",
                param=key,
            )


def check_builds(m: Matrix) -> None:
    """Every arm's build, and every mutant's, is on this host (folders, interpreter) before the first cell
    starts."""
    arms = {c.params["arm"] for c in m.cells if not c.mutant}
    for arm, build in m.builds.items():
        problems = build.problems() if arm in arms else []
        if problems:
            raise InputError(f"matrix {m.path}: builds.{arm}: {'; '.join(problems)}", path=m.path)
    for c in m.cells:
        problems = c.build.problems() if c.mutant and c.build else []
        if problems:
            raise InputError(
                f"matrix {m.path}: mutant {c.mutant}: {'; '.join(problems)} (build it: kit build --patch)",
                path=m.path,
            )


def _run_dirs(batch_dir: Path) -> list[Path]:
    """Directories in the batch that hold (part of) a run, set-aside failures excluded."""
    if not batch_dir.is_dir():
        return []

    def holds_a_run(d: Path) -> bool:
        r = rundir.RunDir(d)
        marks = (r.params, r.provenance, r.error, d / cell_mod.PROFILE_NOTEBOOK, d / cell_mod.CELL_LOG)
        return any(m.exists() for m in marks)

    return sorted(
        d for d in batch_dir.iterdir() if d.is_dir() and not _FAILED.search(d.name) and holds_a_run(d)
    )


def check_kit_version(batch_dir: Path) -> None:
    """Runs of two kit versions are not mixed in one batch: their numbers are not comparable."""
    for d in _run_dirs(batch_dir):
        prov = rundir.RunDir(d).provenance
        if prov.is_file():
            written = json.loads(prov.read_text()).get("kit_version")
            if written != kit.__version__:
                raise InputError(
                    f"run directory {d} was written by kit {written}, this is kit "
                    f"{kit.__version__}: start a new batch (--batch NAME), versions are not mixed",
                    path=d,
                )


def _staged(batch_dir: Path, run_id: str) -> list[Path]:
    return [cell_mod.staged(batch_dir, run_id, what) for what in cell_mod.STAGED]


def plan(m: Matrix, batch_dir: Path, resume: bool) -> tuple[list[Cell], list[Cell], list[Path]]:
    """(cells to run, cells already complete, run dirs to set aside); reads only, decides everything.

    Cells run pair by pair (every arm of one context, steps, ... before the next), so that a deadline or a
    Ctrl-C leaves whole bug/fix pairs behind. A mutant whose run failed as a kill (refused, died starting)
    is complete: its failure is its result.
    """
    check_kit_version(batch_dir)
    cell_dirs = {batch_dir / c.run_id for c in m.cells if (batch_dir / c.run_id).exists()}
    existing = sorted(set(_run_dirs(batch_dir)) | cell_dirs)
    if existing and not resume:
        names = ", ".join(d.name for d in existing[:3]) + (", ..." if len(existing) > 3 else "")
        raise ExistsError(
            f"batch directory {batch_dir} already holds runs ({names}): use --resume to continue "
            f"it, or --batch NAME for a new batch; nothing was overwritten",
            path=batch_dir,
        )
    groups = list(dict.fromkeys(c.group for c in m.cells))
    to_run, complete, aside = [], [], []
    for c in sorted(m.cells, key=lambda c: groups.index(c.group)):
        d = batch_dir / c.run_id
        if d.exists() and (cell_mod.is_complete(c, d) or (c.mutant and mutant_cells.kill_cause(d))):
            complete.append(c)
            continue
        aside += [p for p in (d, *_staged(batch_dir, c.run_id)) if p.exists()]
        to_run.append(c)
    return to_run, complete, aside


def set_aside(paths: Iterable[Path], batch_dir: Path) -> list[Path]:
    """A failed or interrupted cell's dir becomes <run_id>.failed-<n>: kept for diagnosis, never deleted.

    A staged record whose run dir was never made (the process was killed) is first moved into a run dir of
    its own, which is then set aside like any other.
    """
    moved = []
    for p in paths:
        if not p.exists():
            continue
        if p.is_file():
            what = next(w for w in cell_mod.STAGED if p.name.endswith(f".{w}"))
            run_dir = batch_dir / p.name[1 : -len(what) - 1]
            cell_mod.adopt(p, run_dir, cell_mod.STAGED[what])
            p = run_dir
        target = unique_path(p, sep=".failed-")  # p exists, so this counts from .failed-1
        p.rename(target)
        moved.append(target)
    return moved


def keep_matrix(m: Matrix, batch_dir: Path) -> None:
    """The matrix as run, beside its runs; a resume with a changed matrix adds a copy, never replaces one."""
    text = m.record()
    copies = itertools.chain(
        [batch_dir / "matrix.yaml"], (batch_dir / f"matrix.resume-{n}.yaml" for n in itertools.count(1))
    )
    for target in copies:
        if not target.exists():
            rundir.write_new(target, text)
            return
        if target.read_text() == text:
            return
