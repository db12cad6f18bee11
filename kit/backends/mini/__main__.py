"""`python -m kit.backends.mini RUN_DIR`: run the mini engine on RUN_DIR/params.json.

Writes RUN_DIR/outputs.jsonl (one line per request) and RUN_DIR/engine.json (shapes, device, timings,
warnings), plus RUN_DIR/recorder.sqlite with the recorder NVTX sink, or the PyTorch profiler's
RUN_DIR/profile.trace.json.gz with `profiler: torch`. Never overwrites. Bad parameters:
one line on stderr, exit code 2, nothing written.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from kit.backends.mini.params import MiniParams, validate, warnings_for
from kit.errors import ExistsError, InputError, KitError, ToolMissing
from kit.probe import ranges as nr
from kit.rundir import RunDir, read_json, write_json, write_new

OUTPUTS = "outputs.jsonl"
ENGINE = "engine.json"
RECORDER = "recorder.sqlite"


def _check_sink(sink: str) -> None:
    if sink == "nvtx":
        try:
            import nvtx  # noqa: F401
        except ImportError:
            raise ToolMissing(
                "invalid mini parameter nvtx_sink='nvtx': the python package nvtx is not installed here; "
                "allowed recorder | off (or install nvtx==0.2.10)",
                tool="nvtx",
            ) from None


def run(params: dict[str, Any] | MiniParams, run_dir: Path) -> list[dict[str, Any]]:
    """Validate, run, write outputs.jsonl and engine.json into run_dir; returns the output rows."""
    p = validate(params)
    _check_sink(p.nvtx_sink)
    nr.configure(p.nvtx_sink, Path(run_dir) / RECORDER)
    try:
        return run_engine(p, run_dir)
    finally:
        nr.flush()


def run_engine(p: MiniParams, run_dir: Path) -> list[dict[str, Any]]:
    """The engine on validated params, with the NVTX sink already configured: outputs.jsonl and
    engine.json into run_dir (kit.backends.mini.cells runs several of these in one process)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(f"run directory {run_dir} does not exist", path=run_dir)
    for name in (OUTPUTS, ENGINE):
        if (run_dir / name).exists():
            raise ExistsError(
                f"{run_dir / name} already exists: refusing to overwrite it (use a new run directory)",
                path=run_dir / name,
            )
    warnings = warnings_for(p)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    from kit.backends.mini.engine import (
        Engine,  # imports torch: only once the parameters are known to be good
    )

    profiled = contextlib.nullcontext()
    if p.profiler == "torch":
        from kit.backends.mini.torch_profile import profiled as torch_profiled

        profiled = torch_profiled(p.device, RunDir(run_dir).kineto)
    engine = Engine(p)
    with profiled:
        rows, info = engine.run()
    info["warnings"] = warnings
    info["nvtx_sink"] = p.nvtx_sink
    write_new(run_dir / OUTPUTS, "".join(json.dumps(r) + "\n" for r in rows))
    write_json(run_dir / ENGINE, info)
    if engine.task_spec is not None:  # the run carries its task: the share model never reads the checkpoint
        write_json(RunDir(run_dir).task, engine.task_spec.to_json())
    return rows


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print(
            "usage: python -m kit.backends.mini RUN_DIR   (RUN_DIR/params.json holds the parameters)",
            file=sys.stderr,
        )
        return 2
    run_dir = Path(args[0])
    try:
        run(read_json(run_dir / "params.json"), run_dir)
    except KitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
