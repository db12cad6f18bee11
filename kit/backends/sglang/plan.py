"""What one sglang arm runs, as data: the server's argument list, the nsys command around it, the variables
added to its environment, and every HTTP request in order. `plan()` shows it all without starting or
creating anything; the launcher runs exactly what `arm_plan` returns.

CUDA-graph mode needs the capture-time NVTX ranges in the report (replayed kernels are attributed to
them), but sglang's /start_profile window opens long after capture. So with graphs the probe calls
cudaProfilerStart just before the first draft-graph capture ("profile_from=capture") and the window's end
stops collection; eager mode uses the window alone ("window").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from kit.arms import EXPECTED_STATE
from kit.backends.sglang.http import HOST, profile_window_bodies
from kit.backends.sglang.params import feature_override, validate, warnings_for
from kit.backends.sglang.workload import GENERATOR, generate_body, requests
from kit.probe import probe_env
from kit.rundir import RunDir
from kit.trace import nsys as capture


def server_cmd(p: dict, arm: str, port: int | str, python: str) -> list[str]:
    cmd = [
        python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        p["model_path"],
        "--tp-size",
        str(p["tp_size"]),
        "--speculative-algorithm",
        "EAGLE",
        "--speculative-num-steps",
        str(p["num_steps"]),
        "--speculative-eagle-topk",
        str(p["eagle_topk"]),
        "--speculative-num-draft-tokens",
        str(p["num_draft_tokens"]),
    ]
    over = feature_override(p, arm)
    if over:
        cmd += ["--json-model-override-args", json.dumps(over, sort_keys=True)]
    if not p["cuda_graph"]:
        cmd.append("--disable-cuda-graph")
    cmd += ["--host", HOST, "--port", str(port)]
    if p["nnodes"] > 1:
        cmd += [
            "--nnodes",
            str(p["nnodes"]),
            "--node-rank",
            str(p["node_rank"]),
            "--dist-init-addr",
            p["dist_init_addr"],
        ]
    if p["trust_remote_code"]:
        cmd.append("--trust-remote-code")
    return cmd + p["extra_args"]


def nsys_cmd(nsys: str, out_base: Path | str, program: list[str]) -> list[str]:
    """Collection starts and stops with cudaProfilerStart/Stop (the window, or the probe at capture)."""
    return [
        nsys,
        "profile",
        "--trace=cuda,nvtx",
        "--trace-fork-before-exec=true",
        "--cuda-graph-trace=node",
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=stop",
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


def server_env(p: dict, run_dir: Path | str, base: dict[str, str] | None = None) -> dict[str, str]:
    """Variables added to the server's environment (PYTHONPATH gets the probe's site dir first)."""
    rd = RunDir(Path(run_dir))
    env = {"PYTHONUNBUFFERED": "1", "SGLANG_TORCH_PROFILER_DIR": str(rd.path / "sglang_profiler")}
    if p["profile"]:
        env.update(
            probe_env(
                base if base is not None else {},
                sink="nvtx",
                profile_from="capture" if p["profile_from"] == "capture" else None,
                profile_device=_base_gpu_id(p["extra_args"]),
                census=rd.census,
            )
        )
    return env


def _ids_placeholder(input_len: int, prompt_id: int, seed: int) -> str:
    return f"<{input_len} token ids: prompt {prompt_id}, seed {seed}, {GENERATOR}, model tokenizer>"


def requests_plan(p: dict) -> list[dict]:
    """Every HTTP request the run sends, in order (token ids shown as placeholders)."""
    out: list[dict] = []
    start, _ = profile_window_bodies(p["profile_steps"])
    for r in requests(p):
        i = r.prompt_id
        entry: dict[str, Any] = {"endpoint": "/generate", "purpose": r.purpose, "prompt_id": i}
        if r.purpose == "measure":
            entry["profiled"] = r.profiled
        entry["body"] = generate_body(
            _ids_placeholder(r.input_len, i, p["seed"]), r.max_new_tokens, r.profiled
        )
        out.append(entry)
        if r.profiled:
            out.append(
                {
                    "endpoint": "/start_profile",
                    "when": f"after {p['profile_skip']} streamed chunks of prompt {i} (decode rounds)",
                    "body": start,
                }
            )
            out.append(
                {
                    "endpoint": "/stop_profile",
                    "when": f"after prompt {i} completes (no-op if sglang already stopped after num_steps)",
                    "body": {},
                }
            )
    return out


def arm_plan(p: dict, arm: str, run_dir: str, port: int | str, nsys: str | None, python: str) -> dict:
    """One arm's commands, environment, requests and outputs (run_dir may be a placeholder)."""
    rd = RunDir(Path(run_dir))
    program = server_cmd(p, arm, port, python)
    return {
        "arm": arm,
        "run_dir": run_dir,
        "expected_state": EXPECTED_STATE[arm],
        "server_cmd": program,
        "nsys_cmd": nsys_cmd(nsys or "<NSYS>", rd.nsys_rep.with_suffix(""), program)
        if p["profile"]
        else None,
        "env": server_env(p, run_dir),
        "env_note": "added to the caller's environment; PYTHONPATH is prepended to the caller's",
        "profile_from": p["profile_from"] if p["profile"] else None,
        "health": {"endpoint": "/health", "timeout_s": p["health_timeout_s"]},
        "requests": requests_plan(p) if p["node_rank"] == 0 else [],
        "outputs": str(rd.outputs),
        "warnings": warnings_for(p),
    }


def plan(
    params: dict[str, Any], runs_root: Path | str = "runs", batch: str = "default", run_id: str | None = None
) -> dict:
    """What `kit run --backend sglang` would do for every arm in params['arms'] (or params['arm']):
    commands, environment, requests, run directory. Starts nothing, creates nothing."""
    p = validate(params)
    python = p["python"] or sys.executable
    nsys = capture.find_nsys() if p["profile"] else None
    port = p["port"] if p["port"] is not None else "<PORT>"
    arms = {}
    for arm in p["arms"]:
        rid = run_id or f"<RUN_ID:{arm}>"
        arms[arm] = arm_plan(p, arm, f"{Path(runs_root)}/{batch}/{rid}", port, nsys, python)
    return {"backend": "sglang", "model": p["model"], "arms": arms}
