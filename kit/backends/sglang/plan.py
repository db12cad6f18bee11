"""What one sglang arm runs, as data: the server's argument list, the nsys command around it, the variables
added to its environment, and every HTTP request of every cell in order. `plan()` shows it all without
starting or creating anything; the launcher runs exactly what `arm_plan` / `server_plan` return.

CUDA-graph mode needs the capture-time NVTX ranges in the report (replayed kernels are attributed to
them), but sglang's /start_profile window opens long after capture. So with graphs the probe calls
cudaProfilerStart just before the first draft-graph capture ("profile_from=capture"); eager mode starts
at the window ("window"). One cell: the window's end stops collection. Several cells on one server:
collection runs on to the server's exit (--capture-range-end=none), one report holds every cell's window,
and each cell's plan names the window it opens (the n-th start mark the probe leaves in the report).
Under nsys the server sleeps on idle, so the seconds collected between capture and window hold few calls.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from kit.arms import EXPECTED_STATE, expected_per_round
from kit.backends.sglang.http import HOST, profile_window_bodies
from kit.backends.sglang.params import Cell, SglangParams, feature_override, validate, warnings_for
from kit.backends.sglang.requests import requests
from kit.backends.sglang.workload import DEFAULT_WORKLOAD, generate_body, get_workload
from kit.probe import probe_env, target_topk_warning
from kit.rundir import RunDir
from kit.trace import nsys as capture


def server_cmd(
    p: SglangParams, arm: str, port: int | str, python: str, nccl_port: int | str | None = None
) -> list[str]:
    cmd = [
        python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        p.model_path,
        "--tp-size",
        str(p.tp_size),
        "--speculative-algorithm",
        "EAGLE",
        "--speculative-num-steps",
        str(p.num_steps),
        "--speculative-eagle-topk",
        str(p.eagle_topk),
        "--speculative-num-draft-tokens",
        str(p.num_draft_tokens),
    ]
    over = feature_override(p, arm)
    if over:
        cmd += ["--json-model-override-args", json.dumps(over, sort_keys=True)]
    if not p.cuda_graph:
        cmd.append("--disable-cuda-graph")
    if p.under_nsys:
        # Collection is on while the server idles between requests, and an idle scheduler spins: each turn
        # waits on its forward stream (an event created, recorded, waited, destroyed), which nsys records.
        # Most of a report's runtime calls were these (kit.trace.composition); sleeping on idle skips them.
        cmd.append("--sleep-on-idle")
    cmd += ["--host", HOST, "--port", str(port)]
    if nccl_port is not None and p.nnodes == 1:  # kit.backends.sglang.ports: never sglang's own pick
        cmd += ["--nccl-port", str(nccl_port)]
    if p.nnodes > 1:
        cmd += [
            "--nnodes",
            str(p.nnodes),
            "--node-rank",
            str(p.node_rank),
            "--dist-init-addr",
            p.dist_init_addr,
        ]
    if p.trust_remote_code:
        cmd.append("--trust-remote-code")
    return cmd + p.extra_args


def nsys_cmd(nsys: str, out_base: Path | str, program: list[str], several_windows: bool = False) -> list[str]:
    """Collection starts with cudaProfilerStart (the window, or the probe at capture) and stops with the
    window's cudaProfilerStop; with several windows (cells) it runs on to the app's exit instead."""
    return [
        nsys,
        "profile",
        "--trace=cuda,nvtx",
        "--trace-fork-before-exec=true",
        "--cuda-graph-trace=node",
        "--capture-range=cudaProfilerApi",
        f"--capture-range-end={'none' if several_windows else 'stop'}",
        "--sample=none",
        "--cpuctxsw=none",
        "-o",
        str(out_base),
        *program,
    ]


def _base_gpu_id(extra: list[str]) -> int:
    """sglang's rank 0 runs on --base-gpu-id (default 0): the process that must start the profiler."""
    for i, a in enumerate(extra):
        if a.startswith("--base-gpu-id="):
            return int(a.split("=", 1)[1])
        if a == "--base-gpu-id" and i + 1 < len(extra):
            return int(extra[i + 1])
    return 0


def server_env(p: SglangParams, run_dir: Path | str, base: dict[str, str] | None = None) -> dict[str, str]:
    """Variables added to the server's environment (PYTHONPATH gets the probe's site dir first). An
    unprofiled control run still needs the probe, for the override alone (no ranges); a classifier-only run
    has none."""
    rd = RunDir(Path(run_dir))
    env = {"PYTHONUNBUFFERED": "1", "SGLANG_TORCH_PROFILER_DIR": str(rd.path / "sglang_profiler")}
    base = base if base is not None else {}
    if p.classifier_only:
        return env
    if p.profile:
        env.update(
            probe_env(
                base,
                sink="torch" if p.profiler == "torch" else "nvtx",
                profile_from="capture" if p.profile_from == "capture" else None,
                profile_device=_base_gpu_id(p.extra_args),
                census=rd.census,
                target_topk=p.target_topk,
            )
        )
    elif p.target_topk:
        env.update(probe_env(base, sink="off", target_topk=p.target_topk))
    return env


def _ids_placeholder(input_len: int, prompt_id: int, seed: int, generator: str) -> str:
    return f"<{input_len} token ids: prompt {prompt_id}, seed {seed}, {generator}, model tokenizer>"


def requests_plan(p: SglangParams) -> list[dict]:
    """Every HTTP request of one cell (p: its parameters), in order (token ids shown as placeholders)."""
    out: list[dict] = []
    start, _ = profile_window_bodies(p.profile_steps, p.profiler, "<the cell's run dir>/torch_traces")
    records = get_workload(DEFAULT_WORKLOAD).version  # warm-ups are always short records prompts
    measured = get_workload(p.workload).version
    in_flight = p.concurrency
    for r in requests(p):
        i = r.prompt_id
        entry: dict[str, Any] = {"endpoint": "/generate", "purpose": r.purpose, "prompt_id": i}
        if r.purpose == "measure":
            entry["profiled"] = r.profiled
        generator = measured if r.purpose == "measure" else records
        entry["body"] = generate_body(
            _ids_placeholder(r.input_len, i, p.seed, generator), r.max_new_tokens, r.stream
        )
        out.append(entry)
        if r.profiled:
            when = f"after {p.profile_skip} streamed chunks of prompt {i} (decode rounds)"
            if in_flight > 1:
                beside = "prompt 1" if in_flight == 2 else f"prompts 1..{in_flight - 1}"
                when += f", once {beside} (in flight beside it) streamed a chunk too"
            out.append({"endpoint": "/start_profile", "when": when, "body": start})
            out.append(
                {
                    "endpoint": "/stop_profile",
                    "when": f"after prompt {i} completes (no-op if sglang already stopped after num_steps)",
                    "body": {},
                }
            )
    return out


def server_plan(
    p: SglangParams,
    arm: str,
    server_dir: str,
    port: int | str,
    nsys: str | None,
    python: str,
    nccl_port: int | str | None = None,
) -> dict:
    """What runs once per server: its commands, environment and health check (server_dir may be a
    placeholder; for one cell it is the run directory itself)."""
    rd = RunDir(Path(server_dir))
    program = server_cmd(p, arm, port, python, nccl_port)
    several = len(p.cells) > 1
    out = {
        "arm": arm,
        "run_dir": server_dir,
        "expected_state": EXPECTED_STATE[arm],
        # indexer launches per draft round (per TP rank) that `kit analyze` will hold each cell to
        "expected_per_round": expected_per_round(arm, p.num_steps, "sglang"),
        "server_cmd": program,
        "nsys_cmd": nsys_cmd(nsys or "<NSYS>", rd.nsys_rep.with_suffix(""), program, several)
        if p.under_nsys
        else None,
        "env": server_env(p, server_dir),
        "env_note": "added to the caller's environment; PYTHONPATH is prepended to the caller's",
        "profile_from": p.profile_from if p.profile else None,
        "health": {"endpoint": "/health", "timeout_s": p.health_timeout_s},
    }
    if p.target_topk:
        out["target_topk"] = p.target_topk
    return out


def cell_plan(p: SglangParams, cell: Cell, run_dir: str, window: int | None = None) -> dict:
    """One cell's requests, outputs and warnings (p: the server's parameters). Settings at their defaults
    are left out, so that a one-cell plan reads as it always has."""
    cp = p.for_cell(cell)
    out: dict[str, Any] = {
        "requests": requests_plan(cp) if p.node_rank == 0 else [],
        "outputs": str(RunDir(Path(run_dir)).outputs),
        "warnings": warnings_for(cp),
    }
    if cell.workload != DEFAULT_WORKLOAD:
        out["workload"] = cell.workload
    if p.concurrency > 1:
        out["concurrency"] = p.concurrency
    if window is not None:
        out["profile_window"] = window
    return out


def arm_plan(
    p: SglangParams,
    arm: str,
    run_dir: str,
    port: int | str,
    nsys: str | None,
    python: str,
    nccl_port: int | str | None = None,
) -> dict:
    """One arm with one cell: its commands, environment, requests and outputs (run_dir may be a
    placeholder)."""
    (cell,) = p.cells
    return {**server_plan(p, arm, run_dir, port, nsys, python, nccl_port), **cell_plan(p, cell, run_dir)}


def run_ids(p: SglangParams, arm: str, run_id: str) -> tuple[str, list[str]]:
    """(server folder, cell run dirs) under one batch: `<run_id>-server` and `<run_id>-ctx<N>-<workload>`;
    with one cell both are `run_id` itself (the run directory holds the server's files too)."""
    cs = p.cells
    if len(cs) == 1:
        return run_id, [run_id]
    return f"{run_id}-server", [f"{run_id}-{c.tag}" for c in cs]


def multi_plan(
    p: SglangParams,
    arm: str,
    server_dir: str,
    cell_dirs: list[str],
    port: int | str,
    nsys: str | None,
    python: str,
    nccl_port: int | str | None = None,
) -> dict:
    """One arm's server and every cell it runs, in order; cell k opens profile window k (1-based)."""
    out = server_plan(p, arm, server_dir, port, nsys, python, nccl_port)
    out["cells"] = [
        {"run_dir": d, "context_len": c.context_len, "workload": c.workload}
        | cell_plan(p, c, d, (k + 1) if p.profile else None)
        for k, (c, d) in enumerate(zip(p.cells, cell_dirs, strict=True))
    ]
    if p.target_topk:
        out["warnings"] = [target_topk_warning(p.target_topk)]
    return out


def plan(
    params: dict[str, Any], runs_root: Path | str = "runs", batch: str = "default", run_id: str | None = None
) -> dict:
    """What `kit run --backend sglang` would do for every arm in params['arms'] (or params['arm']):
    commands, environment, requests, run directories (one per cell). Starts nothing, creates nothing."""
    p = validate(params)
    python = p.python or sys.executable
    nsys = capture.find_nsys() if p.profile else None
    port = p.port if p.port is not None else "<PORT>"
    nccl = "<NCCL_PORT>"  # leased when it runs (kit.backends.sglang.ports)
    arms = {}
    for arm in p.arms:
        server_id, cell_ids = run_ids(p, arm, run_id or f"<RUN_ID:{arm}>")
        where = f"{Path(runs_root)}/{batch}"
        if len(cell_ids) == 1:
            arms[arm] = arm_plan(p, arm, f"{where}/{server_id}", port, nsys, python, nccl)
        else:
            dirs = [f"{where}/{c}" for c in cell_ids]
            arms[arm] = multi_plan(p, arm, f"{where}/{server_id}", dirs, port, nsys, python, nccl)
    return {"backend": "sglang", "model": p.model, "arms": arms}
