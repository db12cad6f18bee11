"""One cell of a batch: its profile and analyze stages, in its arm's build, isolated from every other cell.

Two runners do the same two stages. `notebooks` executes 01_profile and 02_analyze with papermill (the
kernel gets the arm's build); `plain` runs them as Python processes of their own (`python -m
kit.pipeline.cell profile|analyze`, in the arm's build), for hosts without Jupyter. A failed stage never
raises: it leaves error.json (and, with notebooks, the notebook executed up to the failing cell), and the
batch goes on. Ctrl-C (`interrupt`, from the executor) stops a cell's running stage, with everything it
started, marks the cell with error.json and starts no further stage.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from kit import rundir
from kit.errors import EXIT, ExistsError, KitError, exit_code
from kit.paths import unique_path
from kit.pipeline import notebooks
from kit.pipeline.matrix import Build, Cell
from kit.proc import log_tail, start_logged, stop_tree

PROFILE_NOTEBOOK = "executed-01_profile.ipynb"
ANALYZE_NOTEBOOK = "executed-02_analyze.ipynb"
CELL_LOG = "cell.log"  # the plain runner's record of both stages (what the notebooks are for the other)
CELL_ENTRY = ("-m", "kit.pipeline.cell")  # what the plain runner starts after the interpreter
# staged beside the run dir until the profile stage has made it: name there -> name in the run dir
STAGED = {
    "01_profile.ipynb": PROFILE_NOTEBOOK,
    f"01_profile{notebooks.KERNEL_LOG}": notebooks.kernel_log(Path(PROFILE_NOTEBOOK)).name,
    CELL_LOG: CELL_LOG,
}
INTERRUPT_GRACE_S = 120.0  # a plain stage stops its server itself on SIGINT; after this it is killed
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*): (.*)$")


@dataclass
class CellResult:
    run_id: str
    status: str  # done | skipped | failed | not_started
    run_dir: str
    stage: str | None = None  # the stage that failed
    message: str = ""
    wall_s: float = 0.0
    verdict: dict[str, Any] | None = None


def skipped(cell: Cell, batch_dir: Path, message: str) -> CellResult:
    run_dir = batch_dir / cell.run_id
    return CellResult(cell.run_id, "skipped", str(run_dir), message=message, verdict=verdict_brief(run_dir))


def not_started(cell: Cell, batch_dir: Path, why: str = "deadline reached") -> CellResult:
    return CellResult(cell.run_id, "not_started", str(batch_dir / cell.run_id), message=why)


class StageFailed(KitError):
    """A stage that failed in a process of its own, shaped like papermill's error: the exception's name
    and value as that process printed them, and the tail of its log."""

    def __init__(self, ename: str, evalue: str, traceback: list[str]) -> None:
        super().__init__(f"{ename}: {evalue}")
        self.ename, self.evalue, self.traceback = ename, evalue, traceback


def one_line(exc: BaseException) -> str:
    """papermill's message is a whole traceback; the summary wants the notebook's exception, on one line."""
    ename, evalue = getattr(exc, "ename", None), getattr(exc, "evalue", None)
    text = f"{ename}: {evalue}" if ename else f"{type(exc).__name__}: {exc}"
    first = _ANSI.sub("", text).strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first if len(first) <= 400 else first[:397] + "..."


def record_failure(run_dir: Path, stage: str, exc: BaseException, notebook: Path | None) -> None:
    """error.json, unless the stage already wrote one (run_profile does, with the engine log's tail)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if rundir.failed(run_dir):
        return
    trace = getattr(exc, "traceback", None)
    err: dict[str, Any] = {
        "stage": stage,
        "error": getattr(exc, "ename", None) or type(exc).__name__,
        "message": one_line(exc).split(": ", 1)[-1],
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "notebook": str(notebook) if notebook else None,
    }
    if trace:
        err["log_tail"] = _ANSI.sub("", "\n".join(trace[-20:]))
    rundir.write_json(rundir.RunDir(run_dir).error, err)


def verdict_brief(run_dir: Path) -> dict[str, Any] | None:
    path = rundir.RunDir(run_dir).verdict
    if not path.is_file():
        return None
    v = json.loads(path.read_text())
    keys = ("arm", "status", "passed", "launches_per_round", "expected_per_round", "source", "method")
    return {k: v.get(k) for k in keys}


def staged(batch_dir: Path, run_id: str, what: str) -> Path:
    """Where the profile stage's record is written until the stage has made the run dir (it makes it)."""
    return batch_dir / f".{run_id}.{what}"


def made_elsewhere(exc: BaseException, run_dir: Path) -> bool:
    """Whether a stage failed because `run_dir` was already there (create_run_dir's ExistsError, as the
    stage's kernel or process reported it): another process made it, so nothing may be written into it."""
    name = getattr(exc, "ename", None) or type(exc).__name__
    value = getattr(exc, "evalue", None) or str(exc)
    return name == ExistsError.__name__ and f"{run_dir} already exists" in str(value)


def refuse_existing(run_dir: Path) -> None:
    """Before a profile stage: its run directory must not exist (the plan set every earlier one aside, with
    the batch folder held); one that does was made by another process, and is left as it is."""
    if run_dir.exists():
        raise ExistsError(
            f"run directory {run_dir} already exists: another process made it after this batch planned; "
            "nothing was written into it",
            path=run_dir,
        )


def adopt(staging: Path, run_dir: Path, name: str) -> None:
    """Move a staged record into the run dir, creating the dir when the stage failed before it did (bad
    parameters), so that the failure is recorded where the cell's results would have been."""
    if not staging.exists():
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.move(staging, unique_path(run_dir / name))


# ---------------------------------------------------------------- the runners: (stage, run, record) steps


class Step(NamedTuple):
    stage: str
    run: Callable[[], None]
    record: Path | None  # what to name in error.json when the stage fails (an executed notebook)


RUNNERS = ("notebooks", "plain")


def profiled(cell: Cell) -> bool:
    """Whether the cell runs under nsys with the probes (an sglang cell with profile: false does not, and
    has nothing to analyse: its outputs and timings are its result)."""
    return cell.params.get("profile") is not False


def is_complete(cell: Cell, run_dir: Path) -> bool:
    """What --resume skips: an analysed run (rundir.is_complete), or for an unprofiled cell its outputs
    and provenance, nothing failed."""
    if profiled(cell):
        return rundir.is_complete(run_dir)
    rd = rundir.RunDir(run_dir)
    return rd.outputs.is_file() and rd.provenance.is_file() and not rd.failed()


def profile_step(
    runner: str,
    params: dict[str, Any],
    runs_root: Path,
    batch: str,
    run_id: str,
    build: Build | None,
    options: dict[str, Any] | None = None,
) -> Step:
    """run_profile into `run_id` (a cell's run dir, or with options["cell_ids"] a server folder whose
    cells get those names): 01_profile, or `python -m kit.pipeline.cell profile` in the build. Its record
    (executed notebook or cell.log) is staged beside the batch until the stage has made the directory."""
    home = runs_root / batch / run_id
    options = options or {}
    if runner == "notebooks":
        staging = staged(runs_root / batch, run_id, "01_profile.ipynb")
        given = {**params, **options, "runs_root": str(runs_root), "batch": batch, "run_id": run_id}

        def records() -> None:
            adopt(staging, home, PROFILE_NOTEBOOK)
            adopt(notebooks.kernel_log(staging), home, STAGED[f"01_profile{notebooks.KERNEL_LOG}"])

        def notebook() -> None:
            refuse_existing(home)
            _keeping(home, records, lambda: notebooks.execute("01_profile", staging, given, build=build))

        return Step("01_profile", notebook, home / PROFILE_NOTEBOOK)
    log = staged(runs_root / batch, run_id, CELL_LOG)
    args = [str(runs_root), batch, run_id, json.dumps(profile_params(params))]
    args += [json.dumps(options)] if options else []

    def plain() -> None:
        refuse_existing(home)
        _keeping(
            home,
            lambda: adopt(log, home, CELL_LOG),
            lambda: run_stage([*_entry(build), "profile", *args], log, _env(build)),
        )

    return Step("profile", plain, None)


def _keeping(home: Path, records: Callable[[], None], stage: Callable[[], Any]) -> None:
    """Run the profile stage, then move its staged records into its run dir, also when it failed, unless
    the dir was made by another process: then they stay staged beside it (never written into its run)."""
    try:
        stage()
    except BaseException as exc:
        if not made_elsewhere(exc, home):
            records()
        raise
    records()


def analyze_step(runner: str, run_dir: Path, build: Build | None) -> Step:
    """02_analyze, or `python -m kit.pipeline.cell analyze`, on one run directory, in the build."""
    if runner == "notebooks":

        def notebook() -> None:
            notebooks.execute(
                "02_analyze", run_dir / ANALYZE_NOTEBOOK, {"run_dir": str(run_dir)}, build=build
            )

        return Step("02_analyze", notebook, run_dir / ANALYZE_NOTEBOOK)

    def plain() -> None:
        run_stage([*_entry(build), "analyze", str(run_dir)], run_dir / CELL_LOG, _env(build))

    return Step("analyze", plain, None)


def _entry(build: Build | None) -> list[str]:
    return [(build.python if build else None) or sys.executable, *CELL_ENTRY]


def _env(build: Build | None) -> dict[str, str]:
    return {**os.environ, **(build.env(os.environ) if build else {})}


def cell_steps(cell: Cell, runs_root: Path, batch: str, runner: str) -> list[Step]:
    """A cell alone: its profile stage, then (when profiled) its analyze stage."""
    run_dir = runs_root / batch / cell.run_id
    steps = [profile_step(runner, cell.params, runs_root, batch, cell.run_id, cell.build)]
    return steps + ([analyze_step(runner, run_dir, cell.build)] if profiled(cell) else [])


def profile_params(params: dict[str, Any]) -> dict[str, Any]:
    """What 01_profile hands run_profile for these parameters: its parameters cell's defaults, the
    given values over them, unset (None) ones left to the backend."""
    return notebooks.profile_args({**notebooks.defaults(notebooks.PROFILE), **params})[0]


def interrupt() -> None:
    """Ctrl-C of the batch (called from the thread that got it, again while waiting for the cells): every
    running stage stops, notebook kernels and plain processes alike, and no stage starts any more."""
    notebooks.interrupt()


def interrupted() -> bool:
    return notebooks.INTERRUPTED.is_set()


def run_stage(cmd: list[str], log: Path, env: dict[str, str]) -> None:
    """One plain stage as its own process, output appended to `log`; StageFailed with its last line.

    Its own session, so that a Ctrl-C reaches it exactly once, forwarded from here (`interrupt`, or a
    KeyboardInterrupt in this thread): it then stops what it started (the sglang server) and records why
    it is incomplete.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    proc = start_logged(cmd, log, env)

    def graceful() -> None:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=INTERRUPT_GRACE_S)

    try:
        while True:
            try:
                rc = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if interrupted():
                    raise KeyboardInterrupt from None
    except KeyboardInterrupt:
        stop_tree(proc, graceful)
        raise
    stop_tree(proc)  # anything the stage left behind in its session
    if rc != 0:
        tail = log_tail(log, 20).splitlines()
        last = next((line for line in reversed(tail) if line.strip()), f"exit status {rc}")
        m = _ERROR_LINE.match(last)
        raise StageFailed(m[1] if m else "StageFailed", m[2] if m else last, tail)


def _record(run_dir: Path, step: Step | None, runner: str, exc: BaseException) -> str:
    """error.json for the step that failed (naming its executed notebook, if any); returns the stage."""
    stage = step.stage if step is not None else runner
    record = step.record if step is not None and step.record is not None and step.record.exists() else None
    record_failure(run_dir, stage, exc, record)
    return stage


def run_steps(
    cell: Cell, run_dir: Path, steps: list[Step], runner: str, t0: float, fresh: bool = True
) -> CellResult:
    """The cell's steps in order; never raises for a failed stage (the batch goes on). `fresh`: nothing
    of the cell exists yet, so a Ctrl-C before the first step leaves it not started."""
    step = None
    try:
        for n, step in enumerate(steps):
            if interrupted():
                if n == 0 and fresh:  # nothing of the cell exists: --resume runs it
                    return not_started(cell, run_dir.parent, "interrupted (Ctrl-C)")
                raise KeyboardInterrupt("interrupted (Ctrl-C) before this stage started")
            step.run()
    except KeyboardInterrupt as exc:  # Ctrl-C stops the batch; the cell says why it is incomplete
        _record(run_dir, step, runner, exc if str(exc) else KeyboardInterrupt("interrupted (Ctrl-C)"))
        raise
    except Exception as exc:  # a cell's failure is recorded and isolated: the batch goes on
        wall = round(time.perf_counter() - t0, 1)
        if step is steps[0] and fresh and made_elsewhere(exc, run_dir):  # not this cell's: left untouched
            return CellResult(cell.run_id, "failed", str(run_dir), step.stage, one_line(exc), wall)
        stage = _record(run_dir, step, runner, exc)
        return CellResult(
            cell.run_id, "failed", str(run_dir), stage, one_line(exc), wall, verdict_brief(run_dir)
        )
    wall = round(time.perf_counter() - t0, 1)
    return CellResult(cell.run_id, "done", str(run_dir), wall_s=wall, verdict=verdict_brief(run_dir))


def run_cell(cell: Cell, runs_root: Path | str, batch: str, runner: str = "notebooks") -> CellResult:
    """The cell's profile then analyze stage; never raises for a failed stage (the batch goes on)."""
    runs_root = Path(runs_root).resolve()
    steps = cell_steps(cell, runs_root, batch, runner)
    return run_steps(cell, runs_root / batch / cell.run_id, steps, runner, time.perf_counter())


# ---------------------------------------------------------------- a plain stage, in its own process


def main(argv: list[str]) -> int:
    """`profile RUNS_ROOT BATCH RUN_ID PARAMS_JSON [OPTIONS_JSON]` or `analyze RUN_DIR`: the functions
    01_profile and 02_analyze call (OPTIONS: run_profile's, e.g. the cell ids of a shared server); the
    last line printed on failure is `ErrorName: message` (what the batch reports)."""
    try:
        if argv[:1] == ["profile"] and len(argv) in (5, 6):
            from kit.backends.profile import run_profile

            runs_root, batch, run_id, params = argv[1:5]
            options = json.loads(argv[5]) if len(argv) == 6 else {}
            print(run_profile(json.loads(params), runs_root, batch, run_id, **options))
        elif argv[:1] == ["analyze"] and len(argv) == 2:
            from kit.analysis.analyze import analyze

            print(json.dumps(analyze(Path(argv[1])), indent=1, default=str))
        else:
            print(f"usage: python -m kit.pipeline.cell profile|analyze ...; got {argv}", file=sys.stderr)
            return EXIT["error"]
    except KeyboardInterrupt as exc:
        print("KeyboardInterrupt: interrupted", file=sys.stderr)
        return exit_code(exc)
    except Exception as exc:
        if not isinstance(exc, KitError):
            traceback.print_exc()
        print(f"{type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        return exit_code(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
