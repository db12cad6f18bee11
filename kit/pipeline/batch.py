"""`kit batch`: each cell of a matrix through the notebooks, then a comparison per bug/fix pair and a report.

Each cell runs 01_profile then 02_analyze with papermill into runs/<batch>/<run_id>/; cells are isolated
(one failure leaves error.json and the partly executed notebook, the others go on); --resume skips cells
that hold a verdict and sets failed ones aside; nothing already written is overwritten or deleted.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kit
from kit import rundir
from kit.errors import KitError
from kit.pipeline import matrix as matrix_mod
from kit.pipeline import notebooks
from kit.pipeline.matrix import Cell, Matrix

EXECUTORS = ("local", "slurm")
BATCH_STAGE_FILES = ("executed-04_report.ipynb", "report.html", "report_plots.png")
_FAILED = re.compile(r"\.failed-\d+$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class CellResult:
    run_id: str
    status: str  # done | skipped | failed
    run_dir: str
    stage: str | None = None  # the stage that failed
    message: str = ""
    wall_s: float = 0.0
    verdict: dict[str, Any] | None = None


@dataclass
class StageResult:
    name: str
    status: str  # done | skipped | failed
    path: str
    message: str = ""
    gate: list[str] | None = None


@dataclass
class SlurmOptions:
    partition: str | None = None
    gpus_per_node: int | None = None
    time_min: int = 120
    cluster: str = "slurm"  # submitit's name; the tests use "local" (submitit's LocalExecutor)


@dataclass
class BatchResult:
    batch_dir: Path
    cells: list[CellResult]
    compares: list[StageResult] = field(default_factory=list)
    report: StageResult | None = None
    wall_s: float = 0.0
    set_aside: list[Path] = field(default_factory=list)

    @property
    def failures(self) -> list[CellResult | StageResult]:
        stages = [*self.compares, *([self.report] if self.report else [])]
        return [r for r in [*self.cells, *stages] if r.status == "failed"]

    @property
    def exit_code(self) -> int:
        return 1 if self.failures else 0


# ---------------------------------------------------------------- one cell (also the demo's implementation)


def _one_line(exc: BaseException) -> str:
    """papermill's message is a whole traceback; the summary wants the notebook's exception, on one line."""
    ename, evalue = getattr(exc, "ename", None), getattr(exc, "evalue", None)
    text = f"{ename}: {evalue}" if ename else f"{type(exc).__name__}: {exc}"
    first = _ANSI.sub("", text).strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first if len(first) <= 400 else first[:397] + "..."


def _unique(path: Path) -> Path:
    """`path` if free, else path with a counter: moving a file never replaces another."""
    n = 1
    candidate = path
    while candidate.exists():
        candidate = path.with_name(f"{path.stem}.{n}{path.suffix}")
        n += 1
    return candidate


def _adopt_staged(staging: Path, run_dir: Path) -> None:
    """01_profile creates the run dir itself, so its notebook is written beside it and moved in after.

    When the stage failed before the run dir existed (bad parameters), the dir is created here, so that the
    failure is recorded where the cell's results would have been.
    """
    if not staging.exists():
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.move(staging, _unique(run_dir / "executed-01_profile.ipynb"))


def _record_failure(run_dir: Path, stage: str, exc: BaseException, notebook: Path | None) -> None:
    """error.json, unless the stage already wrote one (run_profile does, with the engine log's tail)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if rundir.failed(run_dir):
        return
    trace = getattr(exc, "traceback", None)
    err: dict[str, Any] = {
        "stage": stage,
        "error": getattr(exc, "ename", None) or type(exc).__name__,
        "message": _one_line(exc).split(": ", 1)[-1],
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "notebook": str(notebook) if notebook else None,
    }
    if trace:
        err["log_tail"] = _ANSI.sub("", "\n".join(trace[-20:]))
    rundir.write_json(run_dir / "error.json", err)


def _verdict_brief(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "verdict.json"
    if not path.is_file():
        return None
    v = json.loads(path.read_text())
    keys = ("arm", "status", "passed", "launches_per_round", "expected_per_round", "source", "method")
    return {k: v.get(k) for k in keys}


def run_cell(cell: Cell, runs_root: Path | str, batch: str) -> CellResult:
    """01_profile then 02_analyze for one cell; never raises for a failed stage (the batch goes on)."""
    runs_root = Path(runs_root).resolve()
    batch_dir = runs_root / batch
    run_dir = batch_dir / cell.run_id
    staging = batch_dir / f".{cell.run_id}.01_profile.ipynb"
    t0 = time.perf_counter()
    stage, notebook = "01_profile", run_dir / "executed-01_profile.ipynb"
    try:
        try:
            notebooks.execute(
                "01_profile",
                staging,
                {
                    **cell.params,
                    "runs_root": str(runs_root),
                    "batch": batch,
                    "run_id": cell.run_id,
                },
            )
        finally:
            _adopt_staged(staging, run_dir)
        stage, notebook = "02_analyze", run_dir / "executed-02_analyze.ipynb"
        notebooks.execute("02_analyze", notebook, {"run_dir": str(run_dir)})
    except KeyboardInterrupt as exc:  # Ctrl-C stops the batch; the cell says why it is incomplete
        _record_failure(run_dir, stage, exc, notebook if notebook.exists() else None)
        raise
    except Exception as exc:  # a cell's failure is recorded and isolated: the batch goes on
        _record_failure(run_dir, stage, exc, notebook if notebook.exists() else None)
        return CellResult(
            cell.run_id,
            "failed",
            str(run_dir),
            stage,
            _one_line(exc),
            round(time.perf_counter() - t0, 1),
            _verdict_brief(run_dir),
        )
    return CellResult(
        cell.run_id,
        "done",
        str(run_dir),
        wall_s=round(time.perf_counter() - t0, 1),
        verdict=_verdict_brief(run_dir),
    )


# ---------------------------------------------------------------- checks before anything runs


def notebook_parameters(name: str) -> set[str]:
    """Names assigned in a notebook's `parameters` cell: what papermill can actually set."""
    import jupytext

    nb = jupytext.read(notebooks.source(name))
    names: set[str] = set()
    for c in nb.cells:
        if "parameters" in c.metadata.get("tags", []):
            for node in ast.walk(ast.parse(c.source)):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    names.add(node.id)
    return names


def check_notebook_accepts(m: Matrix) -> None:
    """papermill only warns about a parameter the notebook lacks, and the run would silently ignore it."""
    accepted = notebook_parameters("01_profile")
    for key in dict.fromkeys(k for c in m.cells for k in c.params):
        if key not in accepted:
            takes = ", ".join(sorted(accepted))
            raise KitError(
                f"matrix {m.path}: {key!r} is not a parameter of notebooks/01_profile.py "
                f"(it takes: {takes}); add it there or drop it from the matrix"
            )


def _run_dirs(batch_dir: Path) -> list[Path]:
    """Directories in the batch that hold (part of) a run, set-aside failures excluded."""
    if not batch_dir.is_dir():
        return []
    marks = ("params.json", "provenance.json", "error.json", "executed-01_profile.ipynb")
    return sorted(
        d
        for d in batch_dir.iterdir()
        if d.is_dir() and not _FAILED.search(d.name) and any((d / m).exists() for m in marks)
    )


def check_kit_version(batch_dir: Path) -> None:
    """Runs of two kit versions are not mixed in one batch: their numbers are not comparable."""
    for d in _run_dirs(batch_dir):
        prov = d / "provenance.json"
        if prov.is_file():
            written = json.loads(prov.read_text()).get("kit_version")
            if written != kit.__version__:
                raise KitError(
                    f"run directory {d} was written by kit {written}, this is kit "
                    f"{kit.__version__}: start a new batch (--batch NAME), versions are not mixed"
                )


def plan(m: Matrix, batch_dir: Path, resume: bool) -> tuple[list[Cell], list[Cell], list[Path]]:
    """(cells to run, cells already complete, run dirs to set aside); reads only, decides everything."""
    check_kit_version(batch_dir)
    cell_dirs = {batch_dir / c.run_id for c in m.cells if (batch_dir / c.run_id).exists()}
    existing = sorted(set(_run_dirs(batch_dir)) | cell_dirs)
    if existing and not resume:
        names = ", ".join(d.name for d in existing[:3]) + (", ..." if len(existing) > 3 else "")
        raise KitError(
            f"batch directory {batch_dir} already holds runs ({names}): use --resume to continue "
            f"it, or --batch NAME for a new batch; nothing was overwritten"
        )
    to_run, complete, aside = [], [], []
    for cell in m.cells:
        d = batch_dir / cell.run_id
        staged = batch_dir / f".{cell.run_id}.01_profile.ipynb"
        if d.exists() and rundir.is_complete(d):
            complete.append(cell)
            continue
        aside += [p for p in (d, staged) if p.exists()]
        to_run.append(cell)
    return to_run, complete, aside


def _next_failed_name(batch_dir: Path, run_id: str) -> Path:
    n = 1
    while (batch_dir / f"{run_id}.failed-{n}").exists():
        n += 1
    return batch_dir / f"{run_id}.failed-{n}"


def set_aside(paths: Iterable[Path], batch_dir: Path) -> list[Path]:
    """A failed or interrupted cell's dir becomes <run_id>.failed-<n>: kept for diagnosis, never deleted."""
    moved = []
    for p in paths:
        if not p.exists():
            continue
        if p.is_dir():
            target = _next_failed_name(batch_dir, p.name)
            p.rename(target)
        else:  # a staged notebook whose run dir was never made (the process was killed)
            run_id = p.name[1:].removesuffix(".01_profile.ipynb")
            target = _next_failed_name(batch_dir, run_id)
            target.mkdir()
            p.rename(target / "executed-01_profile.ipynb")
        moved.append(target)
    return moved


# ---------------------------------------------------------------- running cells: threads or submitit

Progress = Callable[[CellResult], None]


def _run_threads(
    cells: list[Cell], runs_root: Path, batch: str, jobs: int, done: Progress
) -> list[CellResult]:
    """Threads are enough: the work is in papermill's kernel and nsys subprocesses, not in this process."""
    if jobs <= 1:
        results = []
        for c in cells:
            results.append(run_cell(c, runs_root, batch))
            done(results[-1])
        return results
    out: dict[str, CellResult] = {}
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="kit-batch") as pool:
        futures: dict[Future[CellResult], Cell] = {
            pool.submit(run_cell, c, runs_root, batch): c for c in cells
        }
        try:
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in finished:
                    out[futures[f].run_id] = f.result()
                    done(out[futures[f].run_id])
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return [out[c.run_id] for c in cells]


def check_submitit(opts: SlurmOptions) -> None:
    """Before anything runs or is created: submitit installed, and Slurm's commands here if Slurm is asked."""
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise KitError("--executor slurm needs submitit: pip install submitit") from None
    if opts.cluster == "slurm":
        missing = [c for c in ("sbatch", "srun") if shutil.which(c) is None]
        if missing:
            raise KitError(
                f"--executor slurm: {' and '.join(missing)} not found on PATH; run kit batch on a "
                f"Slurm login node, or use --executor local"
            )


def make_submitit_executor(folder: Path, batch: str, opts: SlurmOptions) -> Any:
    import submitit

    try:
        ex = submitit.AutoExecutor(folder=folder, cluster=opts.cluster)
    except RuntimeError as exc:
        raise KitError(f"--executor slurm: {exc}") from None
    params: dict[str, Any] = {"name": f"kit-{batch}", "timeout_min": opts.time_min}
    if opts.gpus_per_node is not None:
        params["gpus_per_node"] = opts.gpus_per_node
    if opts.partition:
        params["slurm_partition"] = opts.partition
    ex.update_parameters(**params)
    return ex


def _run_submitit(
    cells: list[Cell],
    runs_root: Path,
    batch: str,
    jobs: int,
    executor: Any,
    done: Progress,
    poll_s: float = 2.0,
) -> list[CellResult]:
    """At most `jobs` cells queued or running at once; each job runs run_cell on the node it lands on."""
    out: dict[str, CellResult] = {}
    queue = list(cells)
    running: dict[str, tuple[Any, Cell]] = {}
    try:
        while queue or running:
            while queue and len(running) < max(jobs, 1):
                c = queue.pop(0)
                running[c.run_id] = (executor.submit(run_cell, c, runs_root, batch), c)
            for run_id, (job, _cell) in list(running.items()):
                if not job.done():
                    continue
                del running[run_id]
                try:
                    out[run_id] = job.result()
                except Exception as exc:  # the job itself died (timeout, node lost): one cell's failure
                    run_dir = Path(runs_root) / batch / run_id
                    _record_failure(run_dir, "submitit", exc, None)
                    msg = f"submitit job {job.job_id} failed: {_one_line(exc)}"
                    out[run_id] = CellResult(run_id, "failed", str(run_dir), "submitit", msg)
                done(out[run_id])
            if running:
                time.sleep(poll_s)
    except BaseException:
        for job, _ in running.values():
            job.cancel(check=False)
        raise
    return [out[c.run_id] for c in cells]


# ---------------------------------------------------------------- batch-level stages


def _set_aside_stage(path: Path) -> Path:
    n = 1
    while path.with_name(f"{path.name}.superseded-{n}").exists():
        n += 1
    target = path.with_name(f"{path.name}.superseded-{n}")
    path.rename(target)
    return target


def run_compares(m: Matrix, batch_dir: Path, rerun: set[str]) -> list[StageResult]:
    """03_compare for every bug/fix pair that differs only by arm (per context length, steps, device...)."""
    results = []
    groups: dict[str, dict[str, Cell]] = {}
    for c in m.cells:
        groups.setdefault(c.group, {})[c.params["arm"]] = c
    for group, arms in groups.items():
        if "bug" not in arms or "fix" not in arms:
            continue
        a, b = batch_dir / arms["bug"].run_id, batch_dir / arms["fix"].run_id
        out = batch_dir / f"compare-{group}"
        if not (rundir.is_complete(a) and rundir.is_complete(b)):
            results.append(StageResult(f"compare {group}", "skipped", str(out), "a run of the pair failed"))
            continue
        if (out / "comparison.json").is_file() and not ({a.name, b.name} & rerun):
            results.append(
                StageResult(f"compare {group}", "skipped", str(out), "already compared", _gate(out))
            )
            continue
        if out.exists():
            _set_aside_stage(out)
        out.mkdir()
        nb = out / "executed-03_compare.ipynb"
        try:
            notebooks.execute("03_compare", nb, {"run_a": str(a), "run_b": str(b), "out_dir": str(out)})
        except Exception as exc:
            _record_failure(out, "03_compare", exc, nb)
            results.append(StageResult(f"compare {group}", "failed", str(out), _one_line(exc)))
            continue
        results.append(StageResult(f"compare {group}", "done", str(out), gate=_gate(out)))
    return results


def _gate(out: Path) -> list[str] | None:
    path = out / "comparison.json"
    return json.loads(path.read_text()).get("gate_failures") if path.is_file() else None


def run_report(batch_dir: Path, anything_new: bool) -> StageResult:
    """04_report once for the whole batch, plus a self-contained HTML page; an older report is kept aside."""
    from kit.pipeline import report  # matplotlib and pandas: only when there is something to report

    html = batch_dir / "report.html"
    if not report.batch_runs(batch_dir):
        return StageResult("report", "skipped", str(html), "no completed runs to report")
    if html.is_file() and not anything_new:
        return StageResult("report", "skipped", str(html), "nothing new since the last report")
    old = [batch_dir / name for name in BATCH_STAGE_FILES if (batch_dir / name).exists()]
    if old:
        n = 1
        while (batch_dir / f"superseded-{n}").exists():
            n += 1
        (batch_dir / f"superseded-{n}").mkdir()
        for p in old:
            p.rename(batch_dir / f"superseded-{n}" / p.name)
    nb = batch_dir / "executed-04_report.ipynb"
    try:
        executed = notebooks.execute("04_report", nb, {"batch_dir": str(batch_dir)})
        report.export_html(executed, html)
    except Exception as exc:
        return StageResult("report", "failed", str(nb), _one_line(exc))
    return StageResult("report", "done", str(html))


def _keep_matrix(m: Matrix, batch_dir: Path) -> None:
    """The matrix as run, beside its runs; a resume with a changed matrix adds a copy, never replaces one."""
    text = m.path.read_text() if m.path.is_file() else json.dumps({"axes": m.axes, "params": m.params})
    target = batch_dir / "matrix.yaml"
    n = 1
    while target.exists():
        if target.read_text() == text:
            return
        target = batch_dir / f"matrix.resume-{n}.yaml"
        n += 1
    rundir.write_new(target, text)


# ---------------------------------------------------------------- the batch


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
) -> BatchResult:
    """Check everything first (matrix, notebooks, executor, existing runs), then run; see the module doc."""
    if executor not in EXECUTORS:
        raise KitError(f"unknown executor {executor!r}; allowed: {', '.join(EXECUTORS)}")
    if jobs < 1:
        raise KitError(f"-j must be >= 1, got {jobs}")
    batch = batch or m.batch
    if not re.fullmatch(r"[A-Za-z0-9._-]+", batch):
        raise KitError(f"invalid batch name {batch!r}: use letters, digits, '.', '_' or '-'")
    matrix_mod.check_cells(m)
    check_notebook_accepts(m)
    runs_root = Path(runs_root).resolve()
    batch_dir = runs_root / batch
    to_run, complete, aside = plan(m, batch_dir, resume)
    slurm = slurm or SlurmOptions()
    if executor == "slurm":
        check_submitit(slurm)

    t0 = time.perf_counter()
    batch_dir.mkdir(parents=True, exist_ok=True)
    sub_ex = make_submitit_executor(batch_dir / ".submitit", batch, slurm) if executor == "slurm" else None
    moved = set_aside(aside, batch_dir)
    _keep_matrix(m, batch_dir)
    results = {
        c.run_id: CellResult(
            c.run_id,
            "skipped",
            str(batch_dir / c.run_id),
            message="already complete",
            verdict=_verdict_brief(batch_dir / c.run_id),
        )
        for c in complete
    }
    bar = _progress_bar(len(to_run), batch, progress)
    finished: list[CellResult] = []

    def done(r: CellResult) -> None:
        finished.append(r)
        bar.update(1)
        what = "ok" if r.status == "done" else f"FAILED in {r.stage}: {r.message}"
        bar.write(f"[{len(finished)}/{len(to_run)}] {r.run_id}: {what} ({r.wall_s:.0f} s)", file=sys.stderr)

    try:
        if sub_ex is not None:
            ran = _run_submitit(to_run, runs_root, batch, jobs, sub_ex, done)
        else:
            ran = _run_threads(to_run, runs_root, batch, jobs, done)
    finally:
        bar.close()
    results.update({r.run_id: r for r in ran})
    cells = [results[c.run_id] for c in m.cells]
    compares = run_compares(m, batch_dir, {r.run_id for r in ran})
    new = any(r.status == "done" for r in ran) or any(c.status == "done" for c in compares)
    rep = run_report(batch_dir, new)
    return BatchResult(batch_dir, cells, compares, rep, round(time.perf_counter() - t0, 1), moved)


def _progress_bar(total: int, batch: str, enabled: bool) -> Any:
    from tqdm import tqdm

    # disable=None: a bar on a terminal only; logs get the per-cell lines instead of carriage returns
    return tqdm(
        total=total,
        desc=f"kit batch {batch}",
        unit="cell",
        file=sys.stderr,
        disable=None if enabled else True,
        dynamic_ncols=True,
    )


# ---------------------------------------------------------------- summary and CLI


def _verdict_text(v: dict[str, Any] | None) -> str:
    if not v:
        return "-"
    per_round = v.get("launches_per_round") or []
    launches = ",".join(map(str, sorted(set(per_round)))) or "?"
    return (
        f"{v.get('status', '?')}  launches/round {launches} over {len(per_round)} rounds "
        f"(expected {v.get('expected_per_round')})"
    )


def summary(res: BatchResult) -> str:
    counts = {s: sum(c.status == s for c in res.cells) for s in ("done", "skipped", "failed")}
    lines = [
        f"Batch {res.batch_dir}: {len(res.cells)} cells: {counts['done']} run, "
        f"{counts['skipped']} already complete, {counts['failed']} failed ({res.wall_s:.0f} s)"
    ]
    width = max((len(c.run_id) for c in res.cells), default=10)
    for c in res.cells:
        status = c.status.upper() if c.status == "failed" else c.status
        lines.append(f"  {c.run_id:<{width}}  {status:<7}  {_verdict_text(c.verdict)}")
    for s in res.compares:
        gate = "" if s.gate is None else "  gate " + ("PASS" if not s.gate else f"FAIL: {'; '.join(s.gate)}")
        why = f" ({s.message})" if s.status == "skipped" and s.message else ""
        lines.append(f"  {s.name}: {s.status}{why}{gate}  {s.path}")
    if res.report:
        lines.append(
            f"  report: {res.report.status}  {res.report.path}"
            + (f"  ({res.report.message})" if res.report.message else "")
        )
    for p in res.set_aside:
        lines.append(f"  set aside (earlier failure, kept): {p}")
    if res.failures:
        lines.append(f"FAILED ({len(res.failures)}):")
        for f in res.failures:
            if isinstance(f, CellResult):
                lines.append(f"  {f.run_id}: {f.stage}: {f.message}")
                lines.append(f"    see {f.run_dir}/error.json and its executed-*.ipynb")
            else:
                lines.append(f"  {f.name}: {f.message}  ({f.path})")
    return "\n".join(lines)
