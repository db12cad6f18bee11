"""The mini backend's profile stage: the engine as its own process (`python -m kit.backends.mini RUN_DIR`),
under Nsight Systems when it is there, into a new run directory.

Without nsys the engine records its NVTX ranges in-process (recorder.sqlite); every artifact then says it
was not measured under Nsight, and in CI that fallback is refused. With `profiler: torch` the engine runs
under the PyTorch profiler instead (no nsys needed) and leaves a Kineto trace (profile.trace.json.gz).
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
from kit.backends.mini.params import MiniParams, validate
from kit.errors import EngineError, ToolMissing
from kit.proc import engine_failed, hold_interrupts, log_tail, run_logged
from kit.rundir import RunDir
from kit.trace import nsys as capture

NO_NSIGHT_WARNING = "NOT measured under Nsight Systems: nsys was not available, in-process NVTX recorder used"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def run(
    params: dict[str, Any] | MiniParams,
    runs_root: Path | str = "runs",
    batch: str = "default",
    run_id: str | None = None,
    *,
    timeout_s: float | None = 3600,
) -> Path:
    """Validate first (nothing is created for bad input), then run the engine as its own process.

    Once the run directory exists, whatever stops the stage (an error, the timeout, a Ctrl-C at any moment,
    even while the directory is being made) leaves error.json in it, so the run analyses as inconclusive."""
    params = validate(params)
    nsys = version = None
    if params.profiler == "torch":
        from kit.backends.mini.torch_profile import SINK

        params.nvtx_sink = SINK
    else:
        nsys = capture.find_nsys()
        if nsys is None and in_ci():
            raise ToolMissing(
                "nsys not found and CI=true: Nsight-backed runs must not fall back in CI (run make nsys)",
                tool="nsys",
            )
        params.nvtx_sink = "nvtx" if nsys else "recorder"
        version = capture.nsys_version(nsys) if nsys else None
        if nsys is None:
            print(f"WARNING: {NO_NSIGHT_WARNING}", file=sys.stderr)

    release = hold_interrupts()  # a Ctrl-C while the directory and params.json are written waits ...
    try:
        rd = RunDir(
            rundir.create_run_dir(Path(runs_root), batch, run_id or rundir.new_run_id(params.to_json()))
        )
        rundir.write_json(rd.params, params.to_json())
    except BaseException:
        release()
        raise
    try:
        release()  # ... and is raised here, where it is recorded
        if params.profiler == "torch":
            _profile_torch(rd, params, timeout_s)
        else:
            _profile_nsys(rd, params, nsys, version, timeout_s)
    except subprocess.TimeoutExpired:
        err = EngineError(f"engine did not finish within {timeout_s:.0f} s; see {rd.engine_log}")
        _record(rd, err)
        raise err from None
    except (Exception, KeyboardInterrupt) as exc:
        _record(rd, exc)
        raise
    return rd.path


def _record(rd: RunDir, exc: BaseException) -> None:
    """error.json for the stage that stopped, with the engine log's tail; a second Ctrl-C waits for it."""
    release = hold_interrupts()
    try:
        rundir.write_error(rd.path, "profile", exc, log_tail(rd.engine_log))
    finally:
        release()


def _profile_nsys(
    rd: RunDir, params: MiniParams, nsys: str | None, version: str | None, timeout_s: float | None
) -> None:
    """The engine under nsys (or with the in-process recorder when nsys is missing), then the export."""
    prov = provenance.collect(params.backend, params.arm, version)
    log = rd.engine_log
    program = [sys.executable, "-m", "kit.backends.mini", str(rd.path)]
    cuda = params.device == "cuda"
    cmd = capture.profile_cmd(nsys, rd.nsys_rep.with_suffix(""), program, cuda) if nsys else program
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    retried: list[str] = []
    if nsys:
        rc, retried = capture.run_profiled(cmd, log, rd.nsys_rep.with_suffix(""), env, timeout_s)
    else:
        rc = run_logged(cmd, log, env=env, timeout=timeout_s)
    if rc != 0:
        raise EngineError(engine_failed(rc, log))
    if not rd.outputs.is_file():
        raise EngineError(f"engine exited without writing {rd.outputs}; see {log}")
    if nsys:
        capture.export_sqlite(nsys, rd.nsys_rep, rd.nsys_sqlite)
    prov.update(
        end=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        wall_s=round(time.perf_counter() - t0, 3),
        command=cmd,
        engine=json.loads(rd.engine.read_text()) if rd.engine.is_file() else None,
        warnings=[] if nsys else [NO_NSIGHT_WARNING],
        profiler_retries=retried,
    )
    rundir.write_json(rd.provenance, prov)


def _profile_torch(rd: RunDir, params: MiniParams, timeout_s: float | None) -> None:
    """The engine under torch.profiler: probe ranges as record_function ranges, a Kineto trace out."""
    from kit.backends.mini.torch_profile import describe

    prov = provenance.collect(params.backend, params.arm, None)
    cmd = [sys.executable, "-m", "kit.backends.mini", str(rd.path)]
    t0 = time.perf_counter()
    rc = run_logged(cmd, rd.engine_log, env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=timeout_s)
    if rc != 0:
        raise EngineError(engine_failed(rc, rd.engine_log))
    for need in (rd.outputs, rd.kineto):
        if not need.is_file():
            raise EngineError(f"engine exited without writing {need}; see {rd.engine_log}")
    prov.update(
        describe(params.device),
        end=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        wall_s=round(time.perf_counter() - t0, 3),
        command=cmd,
        engine=json.loads(rd.engine.read_text()) if rd.engine.is_file() else None,
        warnings=[TORCH_PROFILER_NOTE],
    )
    rundir.write_json(rd.provenance, prov)


TORCH_PROFILER_NOTE = "measured under the PyTorch profiler (Kineto trace), not Nsight Systems"
