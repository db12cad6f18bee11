"""Several mini cells in ONE engine process under ONE Nsight Systems session, each in its own run directory.

What the sglang backend does with one server and many cells, for the mini: every cell runs between a
`profile_window_start` and a `profile_window_end` mark, its params.json names its window
(`profile_window_ordinal`), and its run directory links the session's one report, so `kit analyze CELL`
keeps that cell's draft rounds only. One process pays for the interpreter, torch and nsys once instead of
per cell (a mutation suite is a few dozen cells of a few seconds each).

    python -m kit.backends.mini.cells SESSION_DIR     # SESSION_DIR/cells.json lists the cell folders

Without nsys the cells run one process each (kit.backends.mini.run): an in-process recorder file holds
no windows the analysis would cut.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kit import provenance, rundir
from kit.backends.mini import run as single
from kit.backends.mini.params import validate
from kit.errors import EngineError, KitError, ToolMissing
from kit.probe import ranges as nr
from kit.probe.targets import WINDOW_END, WINDOW_START
from kit.proc import engine_failed, log_tail
from kit.rundir import RunDir
from kit.trace import nsys as capture

CELLS = "cells.json"
REPORT = "profile"  # SESSION_DIR/profile.nsys-rep and profile.sqlite


def run_cells(
    cells: list[tuple[str, dict[str, Any]]],
    runs_root: Path | str,
    batch: str,
    session_id: str,
    *,
    timeout_s: float | None = 3600,
) -> list[Path]:
    """Run each (run_id, params) cell; returns the cell run directories in order. Validates every cell
    first (nothing is created for bad input)."""
    checked = [(run_id, validate(params)) for run_id, params in cells]
    nsys = capture.find_nsys()
    if nsys is None:
        if single.in_ci():
            raise ToolMissing(
                "nsys not found and CI=true: Nsight-backed runs must not fall back in CI (run make nsys)",
                tool="nsys",
            )
        return [single.run(p, runs_root, batch, run_id, timeout_s=timeout_s) for run_id, p in checked]
    session = RunDir(rundir.create_run_dir(Path(runs_root), batch, f"{session_id}-session"))
    dirs = []
    for n, (run_id, p) in enumerate(checked, 1):
        d = rundir.create_run_dir(Path(runs_root), batch, run_id)
        rundir.write_json(RunDir(d).params, {**p.to_json(), "nvtx_sink": "nvtx", "profile_window_ordinal": n})
        dirs.append(d)
    rundir.write_json(session.path / CELLS, [d.name for d in dirs])
    version = capture.nsys_version(nsys)
    program = [sys.executable, "-m", "kit.backends.mini.cells", str(session.path)]
    cmd = capture.profile_cmd(nsys, session.path / REPORT, program, cuda=False)
    log = session.engine_log
    t0 = time.perf_counter()
    try:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        rc, retried = capture.run_profiled(cmd, log, session.path / REPORT, env, timeout_s)
        if rc != 0:
            raise EngineError(engine_failed(rc, log))
        capture.export_sqlite(nsys, session.nsys_rep, session.nsys_sqlite)
    except subprocess.TimeoutExpired:
        err = EngineError(f"the cells did not finish within {timeout_s:.0f} s; see {log}")
        _fail(dirs, err, log)
        raise err from None
    except (KitError, KeyboardInterrupt) as exc:
        _fail(dirs, exc, log)
        raise
    wall = round(time.perf_counter() - t0, 3)
    for d, (_, p) in zip(dirs, checked, strict=True):
        cell = RunDir(d)
        cell.nsys_sqlite.symlink_to(Path("..") / session.path.name / session.nsys_sqlite.name)
        prov = provenance.collect(p.backend, p.arm, version)
        prov.update(
            end=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            wall_s=wall,
            command=cmd,
            session=session.path.name,
            engine=json.loads(cell.engine.read_text()),
            warnings=[],
            profiler_retries=retried,
        )
        rundir.write_json(cell.provenance, prov)
    return dirs


def _fail(dirs: list[Path], exc: BaseException, log: Path) -> None:
    """Every cell the session did not finish holds the error."""
    for d in dirs:
        if not RunDir(d).outputs.is_file():
            rundir.write_error(d, "profile", exc, log_tail(log))


def main(argv: list[str] | None = None) -> int:
    """The profiled process: each listed cell's engine inside its own window marks."""
    from kit.backends.mini.__main__ import _check_sink, run_engine

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m kit.backends.mini.cells SESSION_DIR", file=sys.stderr)
        return 2
    session = Path(args[0])
    try:
        _check_sink("nvtx")
        nr.configure("nvtx")
        for name in rundir.read_json(session / CELLS):
            cell = session.parent / name
            params = validate(rundir.read_json(RunDir(cell).params))
            with nr.annotate(WINDOW_START):
                pass
            run_engine(params, cell)
            with nr.annotate(WINDOW_END):
                pass
    except KitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
