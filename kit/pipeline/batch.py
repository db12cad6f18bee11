"""`kit batch`: each cell of a matrix (profile, analyze), then a comparison per bug/fix pair and a report.

Every check comes first (kit.pipeline.plan; `--dry-run` makes the same ones and stops there); then the batch
takes its folder (a lock a second batch there is refused by) and plans; then the cells run through an
executor (kit.pipeline.executors)
with a runner (kit.pipeline.cell), each in its arm's build, the sglang cells of one arm and server settings
on one server (kit.pipeline.groups); then the batch-level stages (kit.pipeline.stages), with each mutant's
judgement where the matrix runs a mutation suite (kit.pipeline.mutant_cells). Cells are isolated
(one failure leaves error.json, the others go on); --resume skips cells that hold a verdict and sets failed
ones aside; a deadline stops new cells from starting; nothing already written is overwritten or deleted.
Ctrl-C stops every running stage and its processes, marks the cells it cut short (error.json) and raises
KeyboardInterrupt (exit 130).

Exit code (kit.errors.EXIT), the first that applies: 1 a check failed (a verdict "fail", a gate that
failed, a mutant the gate passed), 2 a cell or stage failed to run (a mutant's kill is no failure), 3
incomplete (an inconclusive verdict, cells the deadline left unstarted, a mutant not judged), 0 every cell
passed, every gate passed and every mutant was killed.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from kit import rundir
from kit.errors import EXIT, BusyError, UsageError
from kit.pipeline import cell as cell_mod
from kit.pipeline import groups as groups_mod
from kit.pipeline import matrix as matrix_mod
from kit.pipeline import mutant_cells, notebooks, stages
from kit.pipeline import plan as plan_mod
from kit.pipeline.cell import CellResult
from kit.pipeline.executors import EXECUTORS, Deadline, SlurmOptions, Work, in_worker
from kit.pipeline.matrix import Cell, Matrix
from kit.pipeline.stages import StageResult
from kit.proc import GPU_TURNS_ENV

EXIT_INCOMPLETE = EXIT["inconclusive"]  # no failure, but cells the deadline left unstarted: --resume
BATCH_LOCK = ".batch.lock"  # in the batch folder: flock'ed by the one batch writing there, names its holder


@dataclass
class BatchResult:
    batch_dir: Path
    cells: list[CellResult]
    compares: list[StageResult] = field(default_factory=list)
    report: StageResult | None = None
    wall_s: float = 0.0
    set_aside: list[Path] = field(default_factory=list)
    runner: str = "notebooks"
    overheads: list[StageResult] = field(default_factory=list)
    mutants: list[StageResult] = field(default_factory=list)  # each mutant's judgement

    @property
    def killed(self) -> set[str]:
        """The mutant cells killed (their failed run, a refusal or a start-up death, is the kill)."""
        return {s.cell for s in self.mutants if s.verdict == "killed" and s.cell}

    @property
    def failures(self) -> list[CellResult | StageResult]:
        stages_ = [*self.compares, *self.mutants, *self.overheads, *([self.report] if self.report else [])]
        cells = [c for c in self.cells if c.run_id not in self.killed]
        return [r for r in [*cells, *stages_] if r.status == "failed"]

    @property
    def not_started(self) -> list[CellResult]:
        return [c for c in self.cells if c.status == "not_started"]

    @property
    def checks_failed(self) -> list[str]:
        """Cells whose verdict failed and comparisons whose gate failed (what a CI job must refuse)."""
        mutant = {s.cell for s in self.mutants}  # a wrong fix's verdict is no check: its judgement is
        cells = [c.run_id for c in self.cells if (c.verdict or {}).get("status") == "fail"]
        cells = [c for c in cells if c not in mutant]
        survivors = [s.name for s in self.mutants if s.verdict == "survived"]
        return cells + [s.name for s in self.compares if s.gate] + survivors

    @property
    def inconclusive(self) -> list[str]:
        mutant = {s.cell for s in self.mutants}
        cells = [c.run_id for c in self.cells if (c.verdict or {}).get("status") == "inconclusive"]
        unjudged = [s.name for s in self.mutants if s.status == "skipped" and s.verdict is None]
        return [c for c in cells if c not in mutant] + unjudged

    @property
    def exit_code(self) -> int:
        """EXIT's "fail" when a check failed; else "error" when a cell or stage failed to run; else
        EXIT_INCOMPLETE when a verdict was inconclusive or the deadline left cells unstarted; else 0."""
        if self.checks_failed:
            return EXIT["fail"]
        if self.failures:
            return EXIT["error"]
        return EXIT_INCOMPLETE if self.not_started or self.inconclusive else EXIT["pass"]


def check(m: Matrix, runner: str = "notebooks") -> None:
    """The matrix's checks: the backend's validation of every cell, the notebook's parameters (with the
    notebooks runner) and every arm's build on this host."""
    matrix_mod.check_cells(m)
    if runner == "notebooks":
        plan_mod.check_notebook_accepts(m)
    plan_mod.check_builds(m)


def _checked(
    m: Matrix,
    runs_root: Path | str,
    batch: str | None,
    jobs: int,
    executor: str,
    slurm: SlurmOptions | None,
    runner: str,
    deadline_s: float | None,
) -> tuple[Path, Any]:
    """Every check that needs nothing of the batch folder but its name, in the order the user meets them:
    options, batch name and folder, the matrix, the executor. Reads only. Returns (batch folder, executor)."""
    if executor not in EXECUTORS:
        raise UsageError(
            f"unknown executor {executor!r}; allowed: {', '.join(EXECUTORS)}", param="--executor"
        )
    if runner not in cell_mod.RUNNERS:
        raise UsageError(
            f"unknown runner {runner!r}; allowed: {', '.join(cell_mod.RUNNERS)}", param="--runner"
        )
    if jobs < 1:
        raise UsageError(f"-j must be >= 1, got {jobs}", param="-j")
    if deadline_s is not None and deadline_s < 0:
        raise UsageError(f"--deadline must be >= 0 seconds, got {deadline_s}", param="--deadline")
    batch = batch or m.batch
    plan_mod.check_batch_name(batch)
    batch_dir = rundir.check_batch_folder(Path(runs_root).resolve() / batch)
    check(m, runner)
    ex = EXECUTORS[executor].create(jobs, batch_dir, slurm)
    ex.check()
    return batch_dir, ex


def _busy(batch_dir: Path, lock: IO[str]) -> BusyError:
    lock.seek(0)
    holder = lock.read().strip() or "a process that has not written its pid yet"
    return BusyError(
        f"batch folder {batch_dir} is in use by another kit batch ({holder}): let it finish, then "
        "--resume, or use --batch NAME for another batch; nothing was touched",
        path=batch_dir,
        holder=holder,
    )


@contextmanager
def hold(batch_dir: Path) -> Iterator[None]:
    """The batch folder for this process alone, taken before anything in it is read or written: a second
    batch there is refused (BusyError naming this one's pid). An flock on an open file: it goes with its
    holder, so a batch that died (killed, Ctrl-C) never blocks the next one (--resume)."""
    batch_dir.mkdir(parents=True, exist_ok=True)
    with open(batch_dir / BATCH_LOCK, "a+") as lock:  # a+: the holder's record is read before it is replaced
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _busy(batch_dir, lock) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}")
        lock.flush()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def check_free(batch_dir: Path) -> None:
    """What `hold` would refuse, found without writing anything (the dry run): BusyError while another
    process holds the folder."""
    path = batch_dir / BATCH_LOCK
    if not path.is_file():
        return
    with open(path) as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _busy(batch_dir, lock) from None
        fcntl.flock(lock, fcntl.LOCK_UN)


@dataclass
class DryRun:
    """What a batch would do: its folder, the cells it would run and those already complete (--resume)."""

    batch_dir: Path
    to_run: list[Cell]
    complete: list[Cell]


def dry_run(
    m: Matrix,
    runs_root: Path | str = "runs",
    *,
    batch: str | None = None,
    jobs: int = 1,
    resume: bool = False,
    executor: str = "local",
    slurm: SlurmOptions | None = None,
    runner: str = "notebooks",
    deadline_s: float | None = None,
    share_server: bool = True,
) -> DryRun:
    """`kit batch --dry-run`: every check run_batch makes, with the same error, and its plan; writes
    nothing (another batch holding the folder is found without taking it). It takes run_batch's options
    (`share_server` only shapes the servers, which the CLI lists from the matrix)."""
    batch_dir, _ = _checked(m, runs_root, batch, jobs, executor, slurm, runner, deadline_s)
    check_free(batch_dir)
    to_run, complete, _ = plan_mod.plan(m, batch_dir, resume)
    return DryRun(batch_dir, to_run, complete)


def run_batch(
    m: Matrix,
    runs_root: Path | str = "runs",
    *,
    batch: str | None = None,
    jobs: int = 1,
    resume: bool = False,
    executor: str = "local",
    slurm: SlurmOptions | None = None,
    progress: bool = True,
    runner: str = "notebooks",
    deadline_s: float | None = None,
    share_server: bool = True,
) -> BatchResult:
    """Check everything first (options, matrix, notebooks, builds, executor), take the batch folder
    (`hold`), check what it holds (existing runs) and plan, then run; the folder is let go at the end.

    `deadline_s`: seconds from now after which no cell starts (running ones finish); the cells left are
    listed as not started and the exit code says the batch is incomplete. `share_server`: the sglang cells
    of one arm and server settings run on one server (kit.pipeline.groups); False: a server per cell.
    """
    batch_dir, ex = _checked(m, runs_root, batch, jobs, executor, slurm, runner, deadline_s)
    with hold(batch_dir):
        return _run(m, batch_dir, ex, jobs, resume, executor, progress, runner, deadline_s, share_server)


def _run(
    m: Matrix,
    batch_dir: Path,
    ex: Any,
    jobs: int,
    resume: bool,
    executor: str,
    progress: bool,
    runner: str,
    deadline_s: float | None,
    share_server: bool,
) -> BatchResult:
    """The batch in its folder, which this process holds: plan, set aside, run, compare, report."""
    runs_root, batch = batch_dir.parent, batch_dir.name
    to_run, complete, aside = plan_mod.plan(m, batch_dir, resume)
    groups = groups_mod.form(to_run, batch_dir, share_server)

    t0 = time.perf_counter()
    notebooks.INTERRUPTED.clear()  # a new batch in this process (a test, the demo) starts uninterrupted
    deadline = Deadline.after(deadline_s)
    moved = plan_mod.set_aside(aside, batch_dir)
    plan_mod.keep_matrix(m, batch_dir)
    results = {c.run_id: cell_mod.skipped(c, batch_dir, "already complete") for c in complete}
    bar = _progress_bar(len(to_run), batch, progress)
    finished: list[CellResult] = []

    def done(r: CellResult) -> None:
        finished.append(r)
        bar.update(1)
        what = {"done": "ok", "not_started": "not started: deadline reached"}.get(
            r.status, f"FAILED in {r.stage}: {r.message}"
        )
        bar.write(f"[{len(finished)}/{len(to_run)}] {r.run_id}: {what} ({r.wall_s:.0f} s)", file=sys.stderr)

    # -j N here: N servers start side by side, and measure a cell at a time, in turn (kit.proc.gpu_turn)
    turns = executor == "local" and jobs > 1 and GPU_TURNS_ENV not in os.environ
    if turns:  # a queue left by an earlier call's killed batch goes: its pids may be taken by now
        os.environ[GPU_TURNS_ENV] = str(batch_dir / ".gpu-turns.lock")
        Path(f"{os.environ[GPU_TURNS_ENV]}.queue").unlink(missing_ok=True)
    try:
        ran = ex.run(groups, Work(runs_root, batch, runner, deadline.wall), done, deadline)
    finally:
        if turns:
            os.environ.pop(GPU_TURNS_ENV, None)
        bar.close()
    results.update({r.run_id: r for r in ran})
    cells = [results[c.run_id] for c in m.cells]
    rerun = {r.run_id for r in ran if r.status != "not_started"}
    compares = in_worker(stages.run_compares, m, batch_dir, rerun, runner)
    judged = in_worker(mutant_cells.judge, m, batch_dir, rerun, runner)
    overheads = stages.run_overheads(m, batch_dir, rerun)
    new = any(r.status == "done" for r in ran) or any(c.status == "done" for c in compares)
    if mutant_cells.holds_suite(m, batch_dir):  # the report reads a mutant's run as the fix's
        why = "a mutation suite: its table is scripts/mutants.py h200 (kit host mutants OUT compare)"
        rep = StageResult("report", "skipped", str(batch_dir / "report.html"), why)
    else:
        rep = in_worker(stages.run_report, batch_dir, new, runner)
    wall = round(time.perf_counter() - t0, 1)
    return BatchResult(batch_dir, cells, compares, rep, wall, moved, runner, overheads, judged)


class _Lines:
    """The per-cell lines without a bar: for logs, and for hosts without tqdm."""

    def update(self, n: int) -> None:
        pass

    def write(self, text: str, file: Any = None) -> None:
        print(text, file=file or sys.stderr, flush=True)

    def close(self) -> None:
        pass


def _progress_bar(total: int, batch: str, enabled: bool) -> Any:
    if not enabled:
        return _Lines()
    from tqdm import tqdm

    # disable=None: a bar on a terminal only; logs get the per-cell lines instead of carriage returns
    return tqdm(
        total=total, desc=f"kit batch {batch}", unit="cell", file=sys.stderr, disable=None, dynamic_ncols=True
    )
