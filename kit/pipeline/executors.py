"""Where a batch's cells run, by name: `local` (threads here) or `slurm` (one submitit job per cell).

Each executor starts a cell only while the batch's deadline has not passed; a cell it did not start is
returned as not started (no directory: `--resume` runs it). Running cells are never cut short, except by
Ctrl-C: it reaches only this process (every stage runs in a session of its own), which then stops the
running cells (kit.pipeline.cell.interrupt), waits until they have stopped what they started, and raises.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kit.errors import ToolMissing
from kit.pipeline import cell as cell_mod
from kit.pipeline.cell import CellResult
from kit.pipeline.matrix import Cell

Progress = Callable[[CellResult], None]
T = TypeVar("T")


def stop_running(futures: Iterable[Future[Any]]) -> None:
    """After Ctrl-C: tell every running cell or stage to stop, and wait until each has (its processes
    stopped, error.json written); a second Ctrl-C does not cut that short (it would leave processes)."""
    left = [f for f in futures if not f.done()]
    while left:
        cell_mod.interrupt()  # again each time: reaches kernels started since the last call
        try:
            wait(left, timeout=0.5)
        except KeyboardInterrupt:
            pass
        left = [f for f in left if not f.done()]


def in_worker(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) in a worker thread, so that Ctrl-C reaches this one and can stop fn's stages cleanly
    (papermill would otherwise take the signal for its own kernel and carry on)."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kit-stage") as pool:
        future = pool.submit(fn, *args)
        try:
            return future.result()
        except KeyboardInterrupt:
            stop_running([future])
            raise


@dataclass(frozen=True)
class Deadline:
    """No new cell starts after `at` (time.monotonic()); None: no deadline."""

    at: float | None = None

    @classmethod
    def after(cls, seconds: float | None) -> Deadline:
        return cls(None if seconds is None else time.monotonic() + seconds)

    def passed(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at


@dataclass(frozen=True)
class Work:
    """What every executor runs for one cell (picklable: submitit ships it to the node)."""

    runs_root: Path
    batch: str
    runner: str

    def __call__(self, cell: Cell) -> CellResult:
        return cell_mod.run_cell(cell, self.runs_root, self.batch, self.runner)

    def not_started(self, cell: Cell) -> CellResult:
        return cell_mod.not_started(cell, self.runs_root / self.batch)


@dataclass
class SlurmOptions:
    partition: str | None = None
    gpus_per_node: int | None = None
    time_min: int = 120
    cluster: str = "slurm"  # submitit's name; the tests use "local" (submitit's LocalExecutor)


@dataclass
class LocalExecutor:
    """Threads are enough: the work is in papermill's kernels and the stages' processes, not in this one.
    Even one job runs in a worker thread, so that Ctrl-C reaches this thread (see stop_running)."""

    jobs: int = 1

    @classmethod
    def create(cls, jobs: int, batch_dir: Path, slurm: SlurmOptions | None) -> LocalExecutor:
        return cls(jobs)

    def check(self) -> None:
        """Nothing to check: this host runs the cells."""

    def run(self, cells: list[Cell], work: Work, done: Progress, deadline: Deadline) -> list[CellResult]:
        def one(c: Cell) -> CellResult:
            return work.not_started(c) if deadline.passed() else work(c)

        out: dict[str, CellResult] = {}
        with ThreadPoolExecutor(max_workers=max(self.jobs, 1), thread_name_prefix="kit-batch") as pool:
            futures: dict[Future[CellResult], Cell] = {pool.submit(one, c): c for c in cells}
            pending = list(futures)  # in submission order: with one job, cells finish in matrix order
            try:
                while pending:
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for f in [f for f in pending if f in finished]:
                        out[futures[f].run_id] = f.result()
                        done(out[futures[f].run_id])
                    pending = [f for f in pending if f not in finished]
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)
                stop_running(futures)
                raise
        return [out[c.run_id] for c in cells]


@dataclass
class SlurmExecutor:
    """At most `jobs` cells queued or running at once; each job runs the cell on the node it lands on."""

    jobs: int = 1
    opts: SlurmOptions = field(default_factory=SlurmOptions)
    folder: Path = Path(".submitit")
    batch: str = "batch"
    poll_s: float = 2.0

    @classmethod
    def create(cls, jobs: int, batch_dir: Path, slurm: SlurmOptions | None) -> SlurmExecutor:
        return cls(jobs, slurm or SlurmOptions(), batch_dir / ".submitit", batch_dir.name)

    def check(self) -> None:
        """Before anything runs or is created: submitit installed, and Slurm's commands here if Slurm."""
        try:
            import submitit  # noqa: F401
        except ImportError:
            raise ToolMissing(
                "--executor slurm needs submitit: pip install submitit", tool="submitit"
            ) from None
        if self.opts.cluster == "slurm":
            missing = [c for c in ("sbatch", "srun") if shutil.which(c) is None]
            if missing:
                raise ToolMissing(
                    f"--executor slurm: {' and '.join(missing)} not found on PATH; run kit batch on a "
                    f"Slurm login node, or use --executor local",
                    tool=missing[0],
                )

    def _submitit(self) -> Any:
        import submitit

        try:
            ex = submitit.AutoExecutor(folder=self.folder, cluster=self.opts.cluster)
        except RuntimeError as exc:
            raise ToolMissing(f"--executor slurm: {exc}", tool="slurm") from None
        params: dict[str, Any] = {"name": f"kit-{self.batch}", "timeout_min": self.opts.time_min}
        if self.opts.gpus_per_node is not None:
            params["gpus_per_node"] = self.opts.gpus_per_node
        if self.opts.partition:
            params["slurm_partition"] = self.opts.partition
        ex.update_parameters(**params)
        return ex

    def run(self, cells: list[Cell], work: Work, done: Progress, deadline: Deadline) -> list[CellResult]:
        executor = self._submitit()
        out: dict[str, CellResult] = {}
        queue = list(cells)
        running: dict[str, Any] = {}
        try:
            while queue or running:
                while queue and len(running) < max(self.jobs, 1):
                    c = queue.pop(0)
                    if deadline.passed():
                        out[c.run_id] = work.not_started(c)
                        done(out[c.run_id])
                    else:
                        running[c.run_id] = executor.submit(work, c)
                for run_id, job in list(running.items()):
                    if not job.done():
                        continue
                    del running[run_id]
                    try:
                        out[run_id] = job.result()
                    except Exception as exc:  # the job itself died (timeout, node lost): one cell's failure
                        run_dir = work.runs_root / work.batch / run_id
                        cell_mod.record_failure(run_dir, "submitit", exc, None)
                        msg = f"submitit job {job.job_id} failed: {cell_mod.one_line(exc)}"
                        out[run_id] = CellResult(run_id, "failed", str(run_dir), "submitit", msg)
                    done(out[run_id])
                if running:
                    time.sleep(self.poll_s)
        except BaseException:
            for job in running.values():
                job.cancel(check=False)
            raise
        return [out[c.run_id] for c in cells]


EXECUTORS: dict[str, type[LocalExecutor] | type[SlurmExecutor]] = {
    "local": LocalExecutor,
    "slurm": SlurmExecutor,
}
