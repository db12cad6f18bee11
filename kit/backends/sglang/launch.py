"""`kit run --backend sglang`: one arm = one probed sglang server under Nsight Systems, a deterministic
long-context workload over HTTP, and the whole process tree stopped afterwards.

One command runs one arm, because each arm needs its own sglang build installed; the pre-flight
(kit.backends.sglang.preflight) refuses a build that does not match the arm before anything starts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kit import provenance, rundir
from kit.backends.sglang.http import SglangClient, free_port, profile_window_bodies, wait_healthy
from kit.backends.sglang.params import validate
from kit.backends.sglang.plan import arm_plan, server_env
from kit.backends.sglang.preflight import check_port, preflight
from kit.backends.sglang.workload import (
    Tokenizer,
    generate_body,
    load_tokenizer,
    output_row,
    prompt_ids,
    requests,
)
from kit.errors import HttpError, KitError, ServerError, UsageError
from kit.proc import cmdline, log_tail, session_pids, start_logged, stop_tree
from kit.rundir import RunDir
from kit.trace import nsys as capture


def _graceful(proc: subprocess.Popen, profiled: bool, timeout_s: float, grace_s: float) -> None:
    """Under nsys: SIGTERM sglang's main process (it stops its schedulers), let nsys see the app exit and
    write the report; SIGINT to nsys only if that does not happen. Without nsys: SIGTERM the server."""
    if not profiled:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=min(grace_s, timeout_s))
        return
    app = [
        pid for pid in session_pids(proc.pid) if pid != proc.pid and b"sglang.launch_server" in cmdline(pid)
    ]
    for pid in app or [proc.pid]:
        os.kill(pid, signal.SIGTERM if app else signal.SIGINT)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGINT)  # nsys: stop, write what it has
        proc.wait(timeout=min(grace_s, timeout_s))


def stop_server(proc: subprocess.Popen, profiled: bool, timeout_s: float, grace_s: float = 30.0) -> None:
    """The graceful stop above, then whatever is left in the server's session (schedulers, nsys helpers)."""
    stop_tree(proc, graceful=lambda: _graceful(proc, profiled, timeout_s, grace_s), term_wait_s=3.0)


def _stop_window(client: SglangClient) -> Any:
    """/stop_profile as a safety net: sglang closes a window given num_steps by itself and then answers
    HTTP 500 (its log says "Profiling is not in progress"; seen on 0.5.14), so a 500 means closed.
    The report is checked by the analysis anyway (NVTX present, rounds found)."""
    try:
        return client.post("/stop_profile", {}, timeout=600)
    except HttpError as e:
        if e.status == 500:
            return {"closed_by_sglang": str(e)}
        raise


def execute_arm(
    p: dict, run_dir: Path, tokenizer: Tokenizer | None, port: int, cmd: list[str], env: dict[str, str]
) -> dict:
    """Start the server, wait for health, run the workload, stop everything. Returns run facts."""
    rd = RunDir(Path(run_dir))
    log = rd.server_log
    facts: dict[str, Any] = {"port": port, "profile_window": None}
    t0 = time.monotonic()
    proc = start_logged(cmd, log, env)
    facts["server_pid"] = proc.pid
    try:
        if p["node_rank"] > 0:  # a follower node: node 0 drives everything; serve until the server exits
            facts["exit_code"] = proc.wait()
            return facts
        client = SglangClient(port, timeout_s=p["request_timeout_s"])
        facts["startup_s"] = round(
            wait_healthy(
                client,
                alive=lambda: proc.poll() is None,
                timeout_s=p["health_timeout_s"],
                on_dead=lambda: f"exit code {proc.poll()}; see {log}: {log_tail(log, 5)}",
                log=log,
            ),
            3,
        )
        reqs = requests(p)
        for r in (r for r in reqs if r.purpose == "warmup"):
            client.generate(
                generate_body(
                    prompt_ids(tokenizer, r.input_len, r.prompt_id, p["seed"]), r.max_new_tokens, False
                )
            )
        start_body, _ = profile_window_bodies(p["profile_steps"])
        with open(rd.outputs, "x") as fout:
            for r in (r for r in reqs if r.purpose == "measure"):
                ids = prompt_ids(tokenizer, r.input_len, r.prompt_id, p["seed"])
                body = generate_body(ids, r.max_new_tokens, r.profiled)
                if r.profiled:
                    window: dict[str, Any] = {
                        "prompt_id": r.prompt_id,
                        "skip_chunks": p["profile_skip"],
                        "opened": False,
                    }

                    def open_window(n: int, window: dict = window) -> None:
                        if not window["opened"] and n >= p["profile_skip"]:
                            window["start_response"] = client.post("/start_profile", start_body, timeout=60)
                            window["opened"], window["at_chunk"] = True, n

                    if p["profile_skip"] == 0:
                        open_window(0)
                    resp = client.generate_stream(body, on_chunk=open_window)
                    window["stop_response"] = _stop_window(client)
                    facts["profile_window"] = window
                    if not window["opened"]:
                        raise ServerError(
                            f"the profile window never opened: prompt {r.prompt_id} streamed fewer than "
                            f"{p['profile_skip']} chunks",
                            log=log,
                        )
                else:
                    resp = client.generate(body)
                row = output_row(r.prompt_id, ids, resp, p["model"]["index_topk"], r.profiled)
                fout.write(json.dumps(row) + "\n")
                fout.flush()
    finally:
        stop_server(proc, profiled=p["profile"], timeout_s=p["shutdown_timeout_s"])
        facts["wall_s"] = round(time.monotonic() - t0, 3)
        facts["left_running"] = session_pids(proc.pid)
    return facts


def run_arm(
    params: dict[str, Any],
    runs_root: Path | str = "runs",
    batch: str = "default",
    run_id: str | None = None,
    *,
    tokenizer: Tokenizer | None = None,
    server_cmd_factory: Callable[[int], list[str]] | None = None,
) -> Path:
    """`kit run --backend sglang`: validate, pre-flight, then one arm into a new run directory.

    tokenizer / server_cmd_factory exist for tests (a stand-in server); real runs leave them None.
    """
    p = validate(params)
    if len(p["arms"]) != 1:
        raise UsageError(
            f"one arm per run (each needs its own sglang build installed); got {p['arms']}", param="arms"
        )
    arm = p["arm"]
    pre = preflight(p, arm) if server_cmd_factory is None else {"skipped": "stand-in server"}
    if tokenizer is None and p["node_rank"] == 0:
        tokenizer = load_tokenizer(Path(p["model_path"]), p["trust_remote_code"])
    port = p["port"] if p["port"] is not None else free_port()
    check_port(p["port"])
    python = p["python"] or sys.executable
    rd = RunDir(rundir.create_run_dir(Path(runs_root), batch, run_id or rundir.new_run_id({**p, "arm": arm})))
    the_plan = arm_plan(p, arm, str(rd.path), port, pre.get("nsys"), python)
    rundir.write_json(rd.params, {k: v for k, v in p.items() if k != "arms"})
    rundir.write_json(rd.plan, the_plan)
    rundir.write_json(rd.preflight, pre)
    if server_cmd_factory is not None:
        cmd = server_cmd_factory(port)
    else:
        cmd = the_plan["nsys_cmd"] if p["profile"] else the_plan["server_cmd"]
    env = {**os.environ, **server_env(p, rd.path, base=dict(os.environ))}
    prov = provenance.collect("sglang", arm, pre.get("nsys_version"))
    try:
        facts = execute_arm(p, rd.path, tokenizer, port, cmd, env)
        if p["profile"] and (p["node_rank"] == 0 or rd.nsys_rep.exists()):  # node 0 must have one
            capture.export_sqlite(pre["nsys"], rd.nsys_rep, rd.nsys_sqlite)
    except (KitError, KeyboardInterrupt, OSError) as exc:
        rundir.write_error(rd.path, "sglang_run", exc, log_tail(rd.server_log, 40))
        raise
    prov.update(
        end=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        command=cmd,
        run=facts,
        sglang={k: pre.get(k) for k in ("sglang_dir", "state")},
        model=p["model"],
        warnings=the_plan["warnings"] + pre.get("warnings", []),
    )
    rundir.write_json(rd.provenance, prov)
    return rd.path
