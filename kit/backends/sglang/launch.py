"""`kit run --backend sglang`: one arm = one probed sglang server under Nsight Systems, one or more cells
(context length x workload) run on it in order, and the whole process tree stopped afterwards.

One command runs one arm, because each arm needs its own sglang build installed; the pre-flight
(kit.backends.sglang.preflight) refuses a build that does not match the arm before anything starts.

Layout. One cell: `runs/<batch>/<run_id>/` holds everything, as it always has. Several cells: the server
folder `runs/<batch>/<id>-server/` holds what the server writes once (its plan.json, preflight.json,
server.log, the Nsight report and export, probe_census.jsonl, provenance.json, error.json when the server
failed) and each cell `runs/<batch>/<id>-ctx<N>-<workload>/` its own params.json (with `server_dir` and
the profile window it opened), plan.json, outputs.jsonl, provenance.json and error.json, plus relative
links to the server's files, so every later stage reads a cell like any run directory.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kit import provenance, rundir
from kit.backends.sglang import ports
from kit.backends.sglang.cells import run_cell, stop_window
from kit.backends.sglang.http import SglangClient, wait_healthy
from kit.backends.sglang.params import Cell, SglangParams, validate
from kit.backends.sglang.plan import arm_plan, cell_plan, multi_plan, run_ids, server_env
from kit.backends.sglang.preflight import check_port, preflight
from kit.backends.sglang.workload import DEFAULT_WORKLOAD, Tokenizer, load_tokenizer
from kit.errors import ExistsError, KitError, ServerError, StartupError, UsageError
from kit.probe import override
from kit.proc import cmdline, gpu_turn, log_tail, session_pids, start_logged, stop_tree
from kit.rundir import RunDir
from kit.task.spec import TASK_FILE
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


@dataclass
class CellRun:
    """One cell on a server: where it writes, what happened. `window`: the ordinal of the profile window it
    opened in the server's report (1 = the first), None when it opened none."""

    cell: Cell
    rd: RunDir
    params: SglangParams
    facts: dict[str, Any] = field(default_factory=dict)
    window: int | None = None
    error: BaseException | None = None
    ran: bool = False  # started
    done: bool = False  # finished without error
    skipped: bool = False  # never started: the caller's deadline had passed


def _unusable(proc: subprocess.Popen, client: SglangClient, run_id: str) -> str | None:
    """Why the server cannot take another cell after `run_id` failed (None: it can)."""
    code = proc.poll()
    if code is not None:
        return f"the server exited (exit code {code}) during cell {run_id}"
    try:
        healthy = client.get_status("/health", timeout=10.0) == 200
    except OSError:
        healthy = False
    return None if healthy else f"the server stopped answering /health after cell {run_id}"


def execute_server(
    p: SglangParams,
    server_dir: Path,
    runs: list[CellRun],
    tokenizer: Tokenizer | None,
    port: int,
    cmd: list[str],
    env: dict[str, str],
    start_before: float | None = None,
) -> tuple[dict, str | None]:
    """Start the server, wait for health, run every cell in order, stop everything.

    Returns (server facts, why the remaining cells did not run or None). A cell's failure is kept in its
    CellRun and the next cell runs if the server still answers; a server that dies or stops answering
    leaves the rest unrun. No cell starts at or after `start_before` (time.time()); those are marked
    skipped. A failure to start (or a Ctrl-C) is raised once everything is stopped.
    """
    server = RunDir(Path(server_dir))
    log = server.server_log
    facts: dict[str, Any] = {"port": port, "server_pid": None}
    t0 = time.monotonic()
    proc = start_logged(cmd, log, env)
    facts["server_pid"] = proc.pid
    gone: str | None = None
    try:
        if p.node_rank > 0:  # a follower node: node 0 drives everything; serve until the server exits
            facts["exit_code"] = proc.wait()
            return facts, None
        client = SglangClient(port, timeout_s=p.request_timeout_s)
        facts["startup_s"] = round(
            wait_healthy(
                client,
                alive=lambda: proc.poll() is None,
                timeout_s=p.health_timeout_s,
                on_dead=lambda: f"exit code {proc.poll()}; see {log}: {log_tail(log, 5)}",
                log=log,
            ),
            3,
        )
        windows = 0
        for k, run in enumerate(runs):
            if gone is None and proc.poll() is not None:
                gone = f"the server exited (exit code {proc.poll()}) before cell {run.rd.path.name}"
            if gone is not None:
                break
            # with -j N: one cell measures at a time, the servers' cells in turn (kit.proc.gpu_turn)
            with gpu_turn(facts, start_before) as turn:
                if not turn or (start_before is not None and time.time() >= start_before):
                    for left in runs[k:]:  # the deadline passed, waiting for the GPU or before this cell
                        left.skipped = True
                    facts["deadline_skipped"] = len(runs) - k
                    break
                run.ran = True
                window: dict[str, Any] = {}
                t, started = time.monotonic(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
                try:
                    run.facts = run_cell(client, run.params, tokenizer, run.rd.outputs, window, log)
                    run.done = True
                except (KitError, OSError) as exc:
                    run.error = exc
                    if k + 1 == len(runs):  # the last cell: nothing left to run on this server
                        continue
                    gone = _unusable(proc, client, run.rd.path.name)
                    if gone is None and window.get("opened"):
                        try:  # leave no window open for the next cell
                            stop_window(client)
                        except KitError:
                            pass
                finally:
                    if window.get("opened"):
                        windows += 1
                        run.window = windows
                    run.facts.setdefault("profile_window", window or None)
                    run.facts.update(started=started, cell_s=round(time.monotonic() - t, 3))
        facts["profile_windows"] = windows
    finally:
        nsys_profiled = p.under_nsys
        stop_server(proc, profiled=nsys_profiled, timeout_s=p.shutdown_timeout_s)
        facts["wall_s"] = round(time.monotonic() - t0, 3)
        facts["left_running"] = session_pids(proc.pid)
    return facts, gone


def _lease(p: SglangParams) -> ports.PortLease:
    """The server's ports (kit.backends.sglang.ports): HTTP unless --port names it, NCCL on one node."""
    return ports.lease(int(p.port is None) + int(p.nnodes == 1))


def _ports_of(p: SglangParams, leased: ports.PortLease) -> tuple[int, int | None]:
    """(HTTP port, NCCL port or None) from the lease and --port."""
    it = iter(leased.ports)
    port = p.port if p.port is not None else next(it)
    return port, (next(it) if p.nnodes == 1 else None)


def _set_aside(server: RunDir, port: int, nccl: int | None, why: str) -> dict[str, Any]:
    """A start-up lost to a taken port: its log, plan and any report kept as attempt-1 files (the retry)."""
    kept = []
    for f in (server.server_log, server.nsys_rep, server.plan):
        if f.exists():
            dest = f.with_name(f"attempt-1-{f.name}")
            f.replace(dest)
            kept.append(dest.name)
    return {"attempt": 1, "port": port, "nccl_port": nccl, "why": why, "kept": kept}


# ---------------------------------------------------------------------------------------------------
# Run directories


def _ids(p: SglangParams, arm: str, run_id: str | None) -> tuple[str, list[str]]:
    if run_id is None:
        (first, *rest) = p.cells
        if rest:
            run_id = f"sglang-{arm}-{rundir.run_stamp()}"
        elif first.workload != DEFAULT_WORKLOAD:
            run_id = f"sglang-{arm}-{first.tag}-{rundir.run_stamp()}"
        else:
            run_id = rundir.new_run_id(p.replace(arm=arm).to_json())
    return run_ids(p, arm, run_id)


def _create(runs_root: Path, batch: str, names: list[str]) -> list[Path]:
    """Every directory of the run, refused as a whole before any is made if one exists."""
    taken = [n for n in names if (runs_root / batch / n).exists()]
    if taken:
        raise ExistsError(
            f"run directory {runs_root / batch / taken[0]} already exists: choose another --run-id "
            "(runs are never overwritten)",
            path=runs_root / batch / taken[0],
        )
    return [rundir.create_run_dir(runs_root, batch, n) for n in names]


@dataclass
class ServerRun:
    """What `run_server` made: the server folder and each cell's run directory, in order (one cell: both
    are the same directory), the cells that failed (run dir -> one-line reason) and those the deadline
    left unstarted (no directory: a later run makes it)."""

    server_dir: Path
    cell_dirs: list[Path]
    failed: dict[Path, str]
    not_started: list[Path] = field(default_factory=list)


def run_server(
    params: dict[str, Any],
    runs_root: Path | str = "runs",
    batch: str = "default",
    run_id: str | None = None,
    *,
    tokenizer: Tokenizer | None = None,
    server_cmd_factory: Callable[[int], list[str]] | None = None,
    cell_ids: list[str] | None = None,
    start_before: float | None = None,
) -> ServerRun:
    """`kit run --backend sglang`: validate, pre-flight, then one server and every cell in order, each
    into its own new run directory. A failed start, export or a Ctrl-C is raised once every directory
    says so; a failed cell is raised when it was the only one, else listed in ServerRun.failed.

    cell_ids: the cells' run directory names, in the order they run (`kit batch` names them after its
    cells; `run_id` then names the server folder); default `<run_id>-ctx<N>-<workload>`. start_before
    (time.time()): no cell starts from then on; those cells leave no directory (ServerRun.not_started).
    tokenizer / server_cmd_factory (port -> command) exist for tests (a stand-in server); real runs leave
    them None.
    """
    p = validate(params)
    if len(p.arms) != 1:
        raise UsageError(
            f"one arm per run (each needs its own sglang build installed); got {p.arms}", param="arms"
        )
    arm = p.arm
    pre = preflight(p, arm) if server_cmd_factory is None else {"skipped": "stand-in server"}
    if tokenizer is None and p.node_rank == 0:
        tokenizer = load_tokenizer(Path(p.model_path), p.trust_remote_code)
    check_port(p.port)
    python = p.python or sys.executable
    server_id, default_ids = _ids(p, arm, run_id)
    several = len(default_ids) > 1
    if cell_ids is not None and len(cell_ids) != len(default_ids):
        raise UsageError(
            f"{len(cell_ids)} cell ids for {len(default_ids)} cells ({', '.join(c.tag for c in p.cells)})",
            param="cell_ids",
        )
    if cell_ids is None or not several:
        cell_ids = default_ids
    elif run_id is not None:
        server_id = run_id
    follower = p.node_rank > 0  # only serves: with several cells, the cells' directories are node 0's
    # (so a follower's server folder has no cells: the zip below stops at the shorter, empty, list)
    names = ([server_id] + ([] if follower else cell_ids)) if several else cell_ids
    leased = _lease(p)  # before any directory: a host without free ports leaves nothing behind
    with contextlib.ExitStack() as undo:  # until the server starts, any failure releases the lease
        undo.callback(leased.release)
        made = _create(Path(runs_root), batch, names)
        server = RunDir(made[0])
        cell_dirs = made[1:] if several else made
        runs = [CellRun(c, RunDir(d), p.for_cell(c)) for c, d in zip(p.cells, cell_dirs, strict=False)]
        nsys = pre.get("nsys")
        if not several:
            rundir.write_json(server.params, p.to_json())
        rundir.write_json(server.preflight, pre)

        def planned(port: int, nccl: int | None) -> tuple[dict[str, Any], list[str]]:
            """The plan on these ports (written to plan.json) and the command that starts the server."""
            if several:
                where = [str(server.path.parent / c) for c in cell_ids]
                the_plan = multi_plan(p, arm, str(server.path), where, port, nsys, python, nccl)
            else:
                the_plan = arm_plan(p, arm, str(server.path), port, nsys, python, nccl)
            rundir.write_json(server.plan, the_plan)
            if server_cmd_factory is not None:
                return the_plan, server_cmd_factory(port)
            return the_plan, the_plan["nsys_cmd"] or the_plan["server_cmd"]

        port, nccl = _ports_of(p, leased)
        the_plan, cmd = planned(port, nccl)
        undo.pop_all()  # from here the run's own `finally` releases it
    env = {**os.environ, **server_env(p, server.path, base=dict(os.environ))}
    prov = provenance.collect("sglang", arm, pre.get("nsys_version"))
    facts: dict[str, Any] = {}
    gone = failure = None
    stage = "sglang_run"
    retries: list[dict[str, Any]] = []
    try:
        deadline = start_before if several else None  # one cell: the caller checked before it started
        while True:
            try:
                facts, gone = execute_server(p, server.path, runs, tokenizer, port, cmd, env, deadline)
                break
            except StartupError:
                why = ports.bind_error(server.server_log)
                if why is None or retries:  # only a taken port is transient, and only once
                    raise
            retries.append(_set_aside(server, port, nccl, why))
            leased.release()
            leased = _lease(p)
            port, nccl = _ports_of(p, leased)
            the_plan, cmd = planned(port, nccl)
        under_nsys = p.under_nsys
        if under_nsys and (p.node_rank == 0 or server.nsys_rep.exists()):  # node 0 must have one
            stage = "sglang_export"
            capture.export_sqlite(nsys, server.nsys_rep, server.nsys_sqlite)
    except (KitError, KeyboardInterrupt, OSError) as exc:
        failure = exc
    finally:
        leased.release()
    facts["start_retries"] = retries
    notes = list(pre.get("warnings", []))
    chosen = ports.chosen_port_warning(p.port)
    if chosen:
        notes.append(chosen)
    if p.target_topk:  # the probe's own word that the control override ran, from the server log
        log = server.server_log.read_text(errors="replace") if server.server_log.exists() else ""
        facts["target_topk_applied"] = log.count(override.APPLIED)
        if not facts["target_topk_applied"]:
            notes.append(f"target_topk={p.target_topk}: the server log never shows the override applied")
    prov.update(
        end=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        command=cmd,
        sglang={
            k: pre.get(k)
            for k in ("sglang_dir", "state", "sglang_version", "target_set", "target_set_chosen_by")
        },
        classifier_only=p.classifier_only,
        start_retries=retries,
        model=p.model,
        profiler=p.profiler if p.profile else None,
    )
    if p.profile and p.profiler == "torch":
        prov["measured_under_nsight"] = False
        notes.append("measured under sglang's PyTorch profiler (a Kineto trace per cell), not Nsight Systems")
    tail = log_tail(server.server_log, 40)
    if several:
        failed = _record_cells(p, server, runs, the_plan, prov, facts, notes, tail, gone, failure, stage)
    else:
        failed = _record_one(server, runs[0], the_plan, prov, facts, notes, tail, failure)
    if failure is not None:
        raise failure
    if not several and runs[0].error is not None:
        raise runs[0].error
    skipped = [r.rd.path for r in runs if r.skipped]
    return ServerRun(server.path, [r.rd.path for r in runs if not r.skipped], failed, skipped)


def _record_one(
    rd: RunDir,
    run: CellRun,
    the_plan: dict,
    prov: dict,
    facts: dict,
    notes: list[str],
    tail: str,
    failure: Any,
) -> dict[Path, str]:
    """One cell alone on its server: error.json on any failure, else provenance.json (as it always was)."""
    exc = failure or run.error
    if exc is not None:
        rundir.write_error(rd.path, "sglang_run", exc, tail)
        return {rd.path: str(exc)}
    warnings = the_plan["warnings"] + notes
    rundir.write_json(rd.provenance, {**prov, "run": {**facts, **run.facts}, "warnings": warnings})
    return {}


def _record_cells(
    p: SglangParams,
    server: RunDir,
    runs: list[CellRun],
    the_plan: dict,
    prov: dict,
    facts: dict,
    notes: list[str],
    tail: str,
    gone: str | None,
    failure: BaseException | None,
    stage: str,
) -> dict[Path, str]:
    """Every cell's params.json and plan.json (only now is the window each opened known), its error.json
    or provenance.json, its links to the server's files; the server folder's provenance (and error)."""
    failed: dict[Path, str] = {}
    summary = []
    for k, r in enumerate(runs):
        if r.skipped:  # the deadline: nothing was written there, and a later run makes it
            r.rd.path.rmdir()
            summary.append({"run_dir": str(r.rd.path), "status": "not started (deadline)"})
            continue
        _write_cell(p, r, k, server, the_plan)
        r.rd.link_server_files(server)
        err = r.error
        if err is None and failure is not None:
            if stage == "sglang_export":
                err = ServerError(
                    f"cell {r.rd.path.name}: the server's report could not be exported: {failure}"
                )
            elif r.ran and not r.done:  # the cell in progress (a Ctrl-C)
                err = failure
            elif not r.ran:
                err = ServerError(f"cell {r.rd.path.name} did not run: {type(failure).__name__} {failure}")
        if err is None and not r.ran:
            err = ServerError(f"cell {r.rd.path.name} did not run: {gone}")
        status = "done" if err is None else ("failed" if r.ran else "not run")
        summary.append({"run_dir": str(r.rd.path), "status": status, "profile_window": r.window, **r.facts})
        if err is not None:
            rundir.write_error(r.rd.path, stage if r.done else "sglang_run", err, tail)
            failed[r.rd.path] = str(err)
            continue
        warnings = cell_plan(p, r.cell, str(r.rd.path))["warnings"] + notes
        run_facts = {**facts, **r.facts, "cell_index": k, "server_dir": str(server.path)}
        rundir.write_json(r.rd.provenance, {**prov, "run": run_facts, "warnings": warnings})
    rundir.write_json(server.provenance, {**prov, "run": facts, "cells": summary})
    if failure is not None or gone is not None:
        rundir.write_error(server.path, stage, failure or ServerError(gone), tail)
    return failed


def _write_cell(p: SglangParams, r: CellRun, k: int, server: RunDir, the_plan: dict) -> None:
    """A cell's params.json (with its server folder, relative, and the window it opened) and plan.json:
    the server's plan with this cell's part."""
    extra = {"server_dir": os.path.relpath(server.path, r.rd.path), "cell_index": k}
    rundir.write_json(r.rd.params, {**r.params.to_json(), **extra, "profile_window_ordinal": r.window})
    server_part = {key: v for key, v in the_plan.items() if key not in ("cells", "warnings")}
    cell_part = cell_plan(p, r.cell, str(r.rd.path), r.window)
    plan = {**server_part, "run_dir": str(r.rd.path), "server_dir": str(server.path), **cell_part}
    rundir.write_json(r.rd.plan, plan)
    task = Path(p.model_path) / TASK_FILE  # a task checkpoint: its task.json, copied into the cell
    if task.is_file():  # the cell carries its task: judging it never reads the checkpoint again
        rundir.write_new(r.rd.task, task.read_text())


def run_arm(
    params: dict[str, Any],
    runs_root: Path | str = "runs",
    batch: str = "default",
    run_id: str | None = None,
    **options: Any,
) -> Path:
    """The backend's `run` entry: `run_server` (options: its tokenizer / server_cmd_factory / cell_ids /
    start_before), returning the run directory (one cell) or the server folder (several: its
    provenance.json lists the cells). A failed cell is raised; cells the deadline left unstarted are not
    failures."""
    res = run_server(params, runs_root, batch, run_id, **options)
    if res.failed:
        raise ServerError(
            f"{len(res.failed)} of {len(res.cell_dirs)} cells failed (error.json in each): "
            + "; ".join(f"{d.name}: {why}" for d, why in res.failed.items())
        )
    return res.server_dir if res.server_dir not in res.cell_dirs else res.cell_dirs[0]
