"""The profile stage: one run of the workload, under Nsight Systems when it is there, into a new run dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kit import provenance, rundir
from kit.errors import KitError
from kit.proc import log_tail, run_logged
from kit.trace import nsys as capture

NO_NSIGHT_WARNING = "NOT measured under Nsight Systems: nsys was not available, in-process NVTX recorder used"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def validate(params: dict[str, Any]) -> dict[str, Any]:
    backend = params.get("backend", "mini")
    if backend == "mini":
        from kit.backends.mini.params import validate as validate_mini

        return validate_mini({**params, "backend": "mini"})
    if backend == "sglang":
        from kit.backends.sglang.run import validate as validate_sglang

        return validate_sglang(params)
    raise KitError(f"unknown backend {backend!r}: use 'mini' or 'sglang'")


def run_profile(
    params: dict[str, Any],
    runs_root: Path | str = "runs",
    batch: str = "default",
    run_id: str | None = None,
    timeout_s: float | None = 3600,
) -> Path:
    """Validate first (nothing is created for bad input), then run the engine as its own process."""
    if params.get("backend") == "sglang":
        from kit.backends.sglang.run import run_arm

        return run_arm(params, Path(runs_root), batch, run_id)
    params = validate(params)
    nsys = capture.find_nsys()
    if nsys is None and in_ci():
        raise KitError(
            "nsys not found and CI=true: Nsight-backed runs must not fall back in CI (run make nsys)"
        )
    params["nvtx_sink"] = "nvtx" if nsys else "recorder"
    version = capture.nsys_version(nsys) if nsys else None
    if nsys is None:
        print(f"WARNING: {NO_NSIGHT_WARNING}", file=sys.stderr)

    run_dir = rundir.create_run_dir(Path(runs_root), batch, run_id or rundir.new_run_id(params))
    rundir.write_json(run_dir / "params.json", params)
    prov = provenance.collect(params["backend"], params["arm"], version)
    log = run_dir / "engine.log"
    program = [sys.executable, "-m", f"kit.backends.{params['backend']}", str(run_dir)]
    cuda = params.get("device") == "cuda"
    cmd = capture.profile_cmd(nsys, run_dir / "profile", program, cuda) if nsys else program
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    try:
        rc = run_logged(cmd, log, env=env, timeout=timeout_s)
        if rc != 0:
            raise KitError(f"engine failed (exit {rc}); see {log}: {log_tail(log, 1)}")
        if not (run_dir / "outputs.jsonl").is_file():
            raise KitError(f"engine exited without writing {run_dir / 'outputs.jsonl'}; see {log}")
        if nsys:
            capture.export_sqlite(nsys, run_dir / "profile.nsys-rep", run_dir / "profile.sqlite")
    except subprocess.TimeoutExpired:
        err = KitError(f"engine did not finish within {timeout_s:.0f} s; see {log}")
        rundir.write_error(run_dir, "profile", err, log_tail(log))
        raise err from None
    except (KitError, KeyboardInterrupt) as exc:
        rundir.write_error(run_dir, "profile", exc, log_tail(log))
        raise
    engine = run_dir / "engine.json"
    prov.update(
        end=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        wall_s=round(time.perf_counter() - t0, 3),
        command=cmd,
        engine=json.loads(engine.read_text()) if engine.is_file() else None,
        warnings=[] if nsys else [NO_NSIGHT_WARNING],
    )
    rundir.write_json(run_dir / "provenance.json", prov)
    return run_dir
