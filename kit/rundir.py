"""The run directory is the only interface between stages; it is written once and never overwritten.

`RunDir` names every file of the contract once; stages ask it for paths instead of spelling file names.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit.errors import ExistsError, InputError, NotWritable, UsageError

_ID_OK = re.compile(r"^[A-Za-z0-9._-]+$")


@dataclass(frozen=True)
class RunDir:
    """One run's directory: `runs/<batch>/<run_id>/`. Each property is a file of the contract."""

    path: Path

    # written by the profile stage (both backends)
    @property
    def params(self) -> Path:
        return self.path / "params.json"

    @property
    def provenance(self) -> Path:
        return self.path / "provenance.json"

    @property
    def outputs(self) -> Path:
        return self.path / "outputs.jsonl"

    @property
    def nsys_rep(self) -> Path:
        return self.path / "profile.nsys-rep"

    @property
    def nsys_sqlite(self) -> Path:
        return self.path / "profile.sqlite"

    @property
    def nsys_sqlite_packed(self) -> Path:
        """The export as committed to git (result sets, test fixtures): xz-compressed, read in memory."""
        return self.path / "profile.sqlite.xz"

    @property
    def recorder(self) -> Path:
        """The in-process NVTX recorder's SQLite, where nsys was missing (not a Nsight measurement)."""
        return self.path / "recorder.sqlite"

    @property
    def task(self) -> Path:
        """The retrieval task a task-checkpoint run was made with (its checkpoint's task.json, copied): what
        the share model judges against, so a run never needs its checkpoint's host path again."""
        return self.path / "task.json"

    @property
    def kineto(self) -> Path:
        """The PyTorch profiler's Chrome trace of a run profiled with `profiler: torch`."""
        return self.path / "profile.trace.json.gz"

    @property
    def torch_traces(self) -> Path:
        """Where sglang's PyTorch profiler writes each rank's trace of this cell's window (rank 0's is then
        moved to `kineto`)."""
        return self.path / "torch_traces"

    # the mini backend
    @property
    def engine(self) -> Path:
        return self.path / "engine.json"

    @property
    def engine_log(self) -> Path:
        return self.path / "engine.log"

    # the sglang backend
    @property
    def plan(self) -> Path:
        return self.path / "plan.json"

    @property
    def preflight(self) -> Path:
        return self.path / "preflight.json"

    @property
    def server_log(self) -> Path:
        return self.path / "server.log"

    @property
    def census(self) -> Path:
        """The probe's own count of indexer calls per captured draft step (no Nsight needed)."""
        return self.path / "probe_census.jsonl"

    # the analyze stage
    @property
    def rounds(self) -> Path:
        return self.path / "rounds.csv"

    @property
    def verdict(self) -> Path:
        return self.path / "verdict.json"

    @property
    def timeline(self) -> Path:
        return self.path / "timeline.png"

    # any stage that failed
    @property
    def error(self) -> Path:
        return self.path / "error.json"

    def reports(self) -> tuple[Path, ...]:
        """Profile reports in the order the analysis prefers them."""
        return (self.nsys_sqlite, self.nsys_sqlite_packed, self.nsys_rep, self.recorder, self.kineto)

    # one sglang server running several cells: its folder holds these once, each cell's run dir links them
    def server_files(self) -> tuple[Path, ...]:
        """What a server writes once for all its cells (in a server folder, or in a one-cell run dir)."""
        return (self.server_log, self.preflight, self.census, self.nsys_rep, self.nsys_sqlite)

    def link_server_files(self, server: RunDir) -> list[str]:
        """Relative symlinks here to the server folder's files that exist (so every stage finds the report,
        the log and the census from the cell's own directory); returns the names linked."""
        linked = []
        for target, link in zip(server.server_files(), self.server_files(), strict=True):
            if target.exists() and not link.exists() and not link.is_symlink():
                link.symlink_to(os.path.relpath(target, self.path))
                linked.append(link.name)
        return linked

    def server(self) -> RunDir:
        """The folder of the server that ran this cell (params.json's relative `server_dir`), or this run
        directory itself when it ran alone on its server."""
        rel = read_json(self.params).get("server_dir") if self.params.is_file() else None
        return RunDir((self.path / rel).resolve()) if rel else self

    def read_params(self) -> dict[str, Any]:
        return read_json(self.params)

    def failed(self) -> bool:
        return failed(self.path)

    def is_complete(self) -> bool:
        return is_complete(self.path)

    def errors(self) -> list[Path]:
        """error.json and the error-<stage>-*.json written beside it, first failure first."""
        return sorted(self.path.glob("error*.json"), key=lambda p: (p != self.error, p.name))


def run_stamp() -> str:
    """The time part of a run id: sortable, and unique enough for one host."""
    return time.strftime("%Y%m%d-%H%M%S") + f"-{time.time_ns() % 1_000_000:06d}"


def new_run_id(params: dict[str, Any]) -> str:
    """A readable, sortable id: backend, arm, context, draft steps and a timestamp (unique enough for one
    host); two runs that differ only in num_steps are told apart by their names."""
    steps = f"-s{params['num_steps']}" if params.get("num_steps") is not None else ""
    return (
        f"{params.get('backend', 'run')}-{params.get('arm', 'x')}-ctx{params.get('context_len', 0)}"
        f"{steps}-{run_stamp()}"
    )


def check_folder(path: Path, what: str, flag: str = "--out") -> Path:
    """`path` may be created or used as a folder: refused in one line when it (or a folder above it) is
    a file, or when the folder it would be written in (itself, else its nearest existing parent) cannot
    be written (a read-only mount, an immutable or a permission-denied folder), before anything is
    written."""
    path = Path(path)
    for p in (path, *path.parents):
        if p.exists() and not p.is_dir():
            raise InputError(f"{p} is a file, not a folder: {flag} must name a folder (for {what})", path=p)
    here = next((p for p in (path, *path.absolute().parents) if p.exists()), None)
    if here is not None and not os.access(here, os.W_OK):
        raise NotWritable(
            f"cannot write {what} in {here}: {_why_unwritable(here)}; pass {flag} a folder you can write",
            path=here,
        )
    return path


def _why_unwritable(folder: Path) -> str:
    """A read-only mount, or else permissions (or the immutable flag): the cause the user must fix."""
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return "it is on a read-only file system"
    except OSError:
        pass
    return "permission denied (its mode, owner or immutable flag)"


def check_batch_folder(batch_dir: Path, flag: str = "--batch") -> Path:
    """A batch folder holds runs; one that holds params.json is a run itself: nesting runs in it would
    make both unreadable to every stage (latest_run, kit batch --resume, the report)."""
    check_folder(batch_dir, "runs", "--out")
    for p in (batch_dir, batch_dir.parent):
        if RunDir(p).params.is_file():
            raise UsageError(
                f"{flag} {batch_dir.name}: {p} is a run directory (it holds params.json), not a batch "
                "folder: pick another --batch name",
                param=flag,
            )
    return batch_dir


def new_folder(path: Path, what: str, flag: str = "OUT") -> Path:
    """Create `path` (and its parents) as a folder that must not exist yet: one line, never a traceback,
    when it exists (also when another run made it a moment ago) or cannot be written."""
    path = check_folder(path, what, flag)
    try:
        path.mkdir(parents=True, exist_ok=False)
    except FileExistsError:
        raise ExistsError(
            f"{path} exists: name a new folder for {what} (nothing is overwritten)", path=path
        ) from None
    except OSError as e:
        raise NotWritable(
            f"cannot create {path} for {what}: {e.strerror}; pass {flag} a folder you can write", path=path
        ) from None
    return path


def folder(path: Path, what: str, flag: str = "OUT") -> Path:
    """`path` as a folder to add to (created if missing, kept if there: a GPU host call's OUT is reused by
    the next call): one line, never a traceback, when it cannot be."""
    path = check_folder(path, what, flag)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NotWritable(
            f"cannot create {path} for {what}: {e.strerror}; pass {flag} a folder you can write", path=path
        ) from None
    return path


def create_run_dir(runs_root: Path, batch: str, run_id: str) -> Path:
    """Create runs/<batch>/<run_id>/ exclusively: an existing run is never reused or overwritten, and a
    run is never nested inside another run."""
    for label, flag, value in (("batch", "--batch", batch), ("run id", "--run-id", run_id)):
        if not _ID_OK.match(value):
            raise UsageError(f"invalid {label} {value!r}: use letters, digits, '.', '_' or '-'", param=flag)
    parent = check_batch_folder(Path(runs_root) / batch)
    parent.mkdir(parents=True, exist_ok=True)
    run_dir = parent / run_id
    try:
        run_dir.mkdir()
    except FileExistsError:
        raise ExistsError(
            f"run directory {run_dir} already exists: choose another --run-id (runs are never overwritten)",
            path=run_dir,
        ) from None
    return run_dir


def write_new(path: Path, text: str) -> Path:
    """Write a file that must not exist yet (atomic: readers never see half a file)."""
    path = Path(path)
    if path.exists():
        raise ExistsError(
            f"{path} already exists: refusing to overwrite it (write to another run or --out directory)",
            path=path,
        )
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    try:
        os.link(tmp, path)  # fails if path appeared meanwhile: no silent overwrite
    except FileExistsError:
        raise ExistsError(f"{path} already exists: refusing to overwrite it", path=path) from None
    finally:
        tmp.unlink()
    return path


def write_json(path: Path, obj: Any) -> Path:
    return write_new(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def read_json(path: Path) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(
            f"{path} not found: is this a run directory written by `kit run`?", path=path
        ) from None
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path} is not valid JSON ({exc.msg}, line {exc.lineno}): damaged file", path=path
        ) from None


def read_outputs(path: Path | str) -> list[dict[str, Any]]:
    """Rows of an outputs.jsonl, or of a run directory's."""
    path = Path(path)
    if path.is_dir():
        path = RunDir(path).outputs
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise InputError(f"{path} not found: did the run finish?", path=path) from None
    rows = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise InputError(
                    f"{path} line {n} is not JSON ({exc.msg}): the file is damaged", path=path
                ) from None
    return rows


def write_error(run_dir: Path, stage: str, exc: BaseException, log_tail: str | None = None) -> Path:
    """Record a failed stage without touching anything the stage already wrote."""
    err = {
        "stage": stage,
        "error": type(exc).__name__,
        "message": str(exc),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if log_tail:
        err["log_tail"] = log_tail
    path = Path(run_dir) / "error.json"
    if path.exists():  # keep the first failure; later ones go beside it
        path = Path(run_dir) / f"error-{stage}-{time.time_ns()}.json"
    return write_json(path, err)


def failed(run_dir: Path) -> bool:
    """A stage of this run failed (it left error.json or error-<stage>-*.json)."""
    return any(Path(run_dir).glob("error*.json"))


def is_complete(run_dir: Path) -> bool:
    """Analysed and nothing failed: the runs a batch counts, resumes past and reports."""
    return (Path(run_dir) / "verdict.json").is_file() and not failed(run_dir)


def latest_run(runs_root: Path | str = "runs", arm: str | None = None, analysed: bool | None = None) -> Path:
    """The newest run directory under runs_root (any batch), optionally of one arm and (not) analysed.

    Lets a notebook opened in JupyterLab run top to bottom on its defaults: 02 picks the newest run not
    yet analysed, 03 the newest analysed bug and fix runs.
    """
    root = Path(runs_root)
    runs = [p.parent for p in root.glob("*/*/params.json") if not failed(p.parent)]
    if arm is not None:
        runs = [r for r in runs if read_json(r / "params.json").get("arm") == arm]
    if analysed is not None:
        runs = [r for r in runs if (r / "verdict.json").is_file() == analysed]
    if not runs:
        state = {True: "analysed ", False: "unanalysed ", None: ""}[analysed]
        what = f"{state}{arm + ' ' if arm else ''}run"
        raise InputError(
            f"no {what} under {root.resolve()}: run notebooks/01_profile (and 02_analyze) first", path=root
        )
    return max(runs, key=lambda r: (r / "params.json").stat().st_mtime)
