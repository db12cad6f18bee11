"""Where a batch's groups of cells run, by name: `local` (threads here) or `slurm` (one submitit job per
group: a cell alone, or the cells of one sglang server, kit.pipeline.groups).

Each executor starts a group only while the batch's deadline has not passed, and a group's server starts
no further cell after it; a cell not started is returned as such (no directory: `--resume` runs it).
Running cells are never cut short, except by Ctrl-C: it reaches only this process (every stage runs in a
session of its own), which then stops the running cells (kit.pipeline.cell.interrupt), waits until they
have stopped what they started, and raises. A Slurm job that leaves the queue without a result (cancelled,
killed, its node lost) fails its cells, also where Slurm keeps no accounting to say so.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kit.errors import ToolMissing
from kit.pipeline import cell as cell_mod
from kit.pipeline import groups as groups_mod
from kit.pipeline.cell import CellResult
from kit.pipeline.groups import Group

Progress = Callable[[CellResult], None]
# How long the main thread blocks at a time while cells run: a Ctrl-C is handled between two waits, where
# one long blocking wait was seen to hold it back under load (the first Ctrl-C acted only after the cell).
POLL_S = 0.2
T = TypeVar("T")


def stop_running(futures: Iterable[Future[Any]]) -> None:
    """After Ctrl-C: tell every running cell or stage to stop, and wait until each has (its processes
    stopped, error.json written); a second Ctrl-C does not cut that short (it would leave processes)."""
    cell_mod.interrupt()  # even with no future known yet: one may be starting (Ctrl-C inside submit)
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
            while True:  # short waits, as in LocalExecutor.run
                try:
                    return future.result(timeout=POLL_S)
                except FuturesTimeout:
                    continue
        except KeyboardInterrupt:
            stop_running([future])
            raise


@dataclass(frozen=True)
class Deadline:
    """No new cell starts after `at` (time.monotonic()); None: no deadline. `wall` is the same moment as
    time.time(), for the processes that run a group's server (another interpreter, another node)."""

    at: float | None = None
    wall: float | None = None

    @classmethod
    def after(cls, seconds: float | None) -> Deadline:
        if seconds is None:
            return cls()
        return cls(time.monotonic() + seconds, time.time() + seconds)

    def passed(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at


@dataclass(frozen=True)
class Work:
    """What every executor runs for one group (picklable: submitit ships it to the node)."""

    runs_root: Path
    batch: str
    runner: str
    start_before: float | None = None  # time.time(): no cell of a shared server starts from then on

    def __call__(self, group: Group) -> list[CellResult]:
        return groups_mod.run_group(group, self.runs_root, self.batch, self.runner, self.start_before)

    def not_started(self, group: Group) -> list[CellResult]:
        return [cell_mod.not_started(c, self.runs_root / self.batch) for c in group.cells]

    def failed(self, group: Group, stage: str, exc: BaseException, message: str) -> list[CellResult]:
        """Every cell of a group whose job died: error.json in each (as if its stage had failed)."""
        out = []
        for c in group.cells:
            run_dir = self.runs_root / self.batch / c.run_id
            cell_mod.record_failure(run_dir, stage, exc, None)
            out.append(CellResult(c.run_id, "failed", str(run_dir), stage, message))
        return out


def _cells(groups: list[Group]) -> list[str]:
    return [c.run_id for g in groups for c in g.cells]


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

    def run(self, groups: list[Group], work: Work, done: Progress, deadline: Deadline) -> list[CellResult]:
        # No group starts before every one is submitted: a Ctrl-C during submit (it can land inside a
        # worker thread's start, before the pool tracks that thread) then leaves nothing running.
        submitted, aborted = threading.Event(), threading.Event()

        def one(g: Group) -> list[CellResult]:
            submitted.wait()
            return work.not_started(g) if aborted.is_set() or deadline.passed() else work(g)

        out: dict[str, CellResult] = {}
        with ThreadPoolExecutor(max_workers=max(self.jobs, 1), thread_name_prefix="kit-batch") as pool:
            futures: dict[Future[list[CellResult]], Group] = {}
            try:
                for g in groups:
                    futures[pool.submit(one, g)] = g
                submitted.set()
                pending = list(futures)  # in submission order: with one job, cells finish in matrix order
                while pending:  # short waits: the main thread runs its Ctrl-C handler between them
                    finished, _ = wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)
                    for f in [f for f in pending if f in finished]:
                        for r in f.result():
                            out[r.run_id] = r
                            done(r)
                    pending = [f for f in pending if f not in finished]
            except BaseException:
                aborted.set()
                submitted.set()
                pool.shutdown(wait=False, cancel_futures=True)
                stop_running(futures)
                raise
        return [out[run_id] for run_id in _cells(groups)]


class _SacctOnce(logging.Filter):
    """submitit warns at every poll when sacct fails (a cluster without accounting); the first warning
    says it, the rest would drown the per-cell lines. squeue is watched instead (SlurmExecutor._queued)."""

    seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        if "Bypassing sacct error" not in record.getMessage():
            return True
        first, _SacctOnce.seen = not _SacctOnce.seen, True
        return first


@dataclass
class SlurmExecutor:
    """At most `jobs` groups queued or running at once; each job runs its group on the node it lands on."""

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
            missing = [c for c in ("sbatch", "srun", "squeue") if shutil.which(c) is None]
            if missing:
                raise ToolMissing(
                    f"--executor slurm: {' and '.join(missing)} not found on PATH; run kit batch on a "
                    f"Slurm login node, or use --executor local",
                    tool=missing[0],
                )

    def _submitit(self) -> Any:
        import submitit

        log = logging.getLogger("submitit")
        if not any(isinstance(f, _SacctOnce) for f in log.filters):
            log.addFilter(_SacctOnce())

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

    def run(self, groups: list[Group], work: Work, done: Progress, deadline: Deadline) -> list[CellResult]:
        executor = self._submitit()
        out: dict[str, CellResult] = {}
        queue = list(groups)
        running: dict[int, tuple[Group, Any]] = {}

        def finish(results: list[CellResult]) -> None:
            for r in results:
                out[r.run_id] = r
                done(r)

        try:
            while queue or running:
                while queue and len(running) < max(self.jobs, 1):
                    g = queue.pop(0)
                    if deadline.passed():
                        finish(work.not_started(g))
                    else:
                        running[id(g)] = (g, executor.submit(work, g))
                # who is still queued, asked before looking for results: a job that leaves the queue
                # writes its result first, so no result afterwards means it never will
                queued = self._queued() if running else set()
                for key, (g, job) in list(running.items()):
                    if job.done():
                        del running[key]
                        try:
                            finish(job.result())
                        except Exception as exc:  # the job itself died (timeout, node lost): its cells fail
                            msg = f"submitit job {job.job_id} failed: {cell_mod.one_line(exc)}"
                            finish(work.failed(g, "submitit", exc, msg))
                    elif queued is not None and str(job.job_id) not in queued and not job.done():
                        del running[key]
                        msg = f"Slurm job {job.job_id} left the Slurm queue without a result"
                        msg += " (cancelled or killed)"
                        finish(work.failed(g, "slurm", RuntimeError(msg), msg))
                if running:
                    time.sleep(self.poll_s)
        except BaseException:
            for _, job in running.values():
                job.cancel(check=False)
            raise
        return [out[run_id] for run_id in _cells(groups)]

    def _queued(self) -> set[str] | None:
        """Job ids Slurm still lists (pending, running, completing); None where that cannot be asked (not
        Slurm, or squeue failed): then submitit's own state is all there is."""
        if self.opts.cluster != "slurm":
            return None
        try:
            res = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if res.returncode != 0:
            return None
        return set(res.stdout.split())


EXECUTORS: dict[str, type[LocalExecutor] | type[SlurmExecutor]] = {
    "local": LocalExecutor,
    "slurm": SlurmExecutor,
}
