"""The real-sglang backend: one arm = one probed sglang server under Nsight Systems, a deterministic
long-context workload over HTTP, and the whole process tree stopped afterwards.

Why it is built this way:
- Each arm needs a different sglang build installed (0.5.14 for "bug", 0.5.14+pr29654 for "fix"), so
  one command runs one arm, and it first checks the installed build's state by AST (kit.sglang_src.verify)
  and the probe targets (kit.sglang_src.probe_check), refusing with the install command when they do not
  match the arm.
- Everything sglang receives is an argument list built here from validated parameters; flags the kit
  owns cannot be smuggled in through extra args, and `plan()` shows it all without starting anything.
- CUDA-graph mode needs the capture-time NVTX ranges in the report (replayed kernels are attributed
  to them), but sglang's /start_profile window opens long after capture. So with graphs the probe
  calls cudaProfilerStart just before the first draft-graph capture ("profile_from=capture") and the
  window's end stops collection; eager mode uses the window alone ("window").
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

from kit import rundir
from kit.arms import ARMS, EXPECTED_STATE
from kit.backends.sglang.http import (
    HOST,
    SGLANG_PORT_MAX,
    SglangClient,
    free_port,
    port_busy,
    profile_window_bodies,
    wait_healthy,
)
from kit.backends.sglang.workload import (
    GENERATOR,
    MAX_INPUT_LEN,
    MIN_INPUT_LEN,
    Tokenizer,
    generate_body,
    load_tokenizer,
    output_row,
    prompt_ids,
)
from kit.errors import KitError
from kit.paths import REPO
from kit.probe import probe_env
from kit.proc import log_tail, start_logged
from kit.sglang_src import releases
from kit.trace import nsys as capture

FEATURE = "index_share_for_mtp_iteration"
PR_CARRIER = releases.PR_CARRIER
WARMUP_INPUT_LEN = 256
WARMUP_NEW_TOKENS = 16

DEFAULTS: dict[str, Any] = {
    "backend": "sglang",
    "tp_size": 1,
    "num_steps": 5,
    "eagle_topk": 1,
    "num_draft_tokens": 6,
    "context_len": 81920,
    "num_requests": 4,
    "max_new_tokens": 256,
    "cuda_graph": True,
    "profile": True,
    "profile_from": "auto",
    "profile_skip": 4,
    "profile_steps": 24,
    "warmup_requests": 1,
    "health_timeout_s": 3600.0,
    "request_timeout_s": 3600.0,
    "shutdown_timeout_s": 1800.0,
    "port": None,
    "nnodes": 1,
    "node_rank": 0,
    "dist_init_addr": None,
    "extra_args": [],
    "model_overrides": {},
    "python": None,
    "seed": 0,
    "trust_remote_code": False,
}

# Flags the kit sets itself: passing them through extra_args would silently change the experiment.
_OWNED = {
    "--model-path",
    "--model",
    "--tp-size",
    "--tp",
    "--tensor-parallel-size",
    "--speculative-algorithm",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
    "--json-model-override-args",
    "--disable-cuda-graph",
    "--cuda-graph-backend-decode",
    "--host",
    "--port",
    "--nnodes",
    "--node-rank",
    "--dist-init-addr",
    "--nccl-init-addr",
    "--trust-remote-code",
}
# Flags that move the draft loop off the path the probe instruments.
_REFUSED = {
    "--enable-multi-layer-eagle": "runs MultiLayerEagleWorkerV2, a draft loop the probe does not instrument",
    "--speculative-draft-model-path": "the MTP draft must be the model's own NextN layer",
    "--speculative-draft-model": "the MTP draft must be the model's own NextN layer",
    "--enable-dp-attention": "not part of the PR's setup; its draft path is not verified by the kit",
}


# ---------------------------------------------------------------------------------------------------
# Parameters


def model_info(model_path: Path) -> dict[str, Any]:
    """What the kit needs from config.json; refuses a model without a DSA indexer or an MTP layer."""
    cfg_path = Path(model_path) / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text())
    except FileNotFoundError:
        raise KitError(f"{cfg_path} not found: --model-path must be a local model directory") from None
    except json.JSONDecodeError as e:
        raise KitError(f"{cfg_path} is not valid JSON ({e.msg} at line {e.lineno})") from None
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    merged = {**text, **cfg}
    if "index_topk" not in merged:
        indexer_keys = sorted(k for k in merged if k.startswith("index_"))
        raise KitError(
            f"{model_path} is not a DSA model (config.json has no index_topk"
            + (f"; index keys: {indexer_keys}" if indexer_keys else "")
            + "): PR #29654 concerns the DSA indexer of GLM-5.x / DeepSeek-V3.2"
        )
    nextn = merged.get("num_nextn_predict_layers")
    if not nextn:
        raise KitError(
            f"{model_path}: config.json has no num_nextn_predict_layers >= 1: the model has no MTP layer "
            "to draft with"
        )
    return {
        "architectures": merged.get("architectures"),
        "index_topk": int(merged["index_topk"]),
        "index_head_dim": merged.get("index_head_dim"),
        "index_n_heads": merged.get("index_n_heads"),
        "num_nextn_predict_layers": nextn,
        "max_position_embeddings": merged.get("max_position_embeddings"),
        FEATURE: merged.get(FEATURE),
    }


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def _int(p: dict, key: str, lo: int, hi: int | None = None) -> int:
    v = p[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise KitError(f"{key} must be an integer, got {v!r}")
    if v < lo or (hi is not None and v > hi):
        raise KitError(f"{key}={v} is out of range ({lo}..{hi if hi is not None else 'inf'})")
    return v


def validate(params: dict[str, Any]) -> dict[str, Any]:
    """Defaults filled, every value checked, model config read. Nothing is started or created."""
    params = dict(params)
    if params.pop("device", None) not in (None, "cuda"):  # the notebooks' shared parameter
        raise KitError("the sglang backend runs on CUDA: set device='cuda' (or leave it unset)")
    unknown = {k for k, v in params.items() if v is not None} - set(DEFAULTS) - {"arm", "arms", "model_path"}
    if unknown:
        raise KitError(
            f"unknown sglang-backend parameter(s): {sorted(unknown)} (mini-backend ones like "
            "preset do not apply)"
        )
    p = {**DEFAULTS, **{k: v for k, v in params.items() if v is not None}}
    if p["backend"] != "sglang":
        raise KitError(f"kit.backends.sglang.run handles backend 'sglang', not {p['backend']!r}")
    arms = p.pop("arms", None) or [p.get("arm")]
    for arm in arms:
        if arm not in ARMS:
            raise KitError(f"unknown arm {arm!r} for the sglang backend: use one of {ARMS}")
    p["arms"] = list(arms)
    p["arm"] = arms[0]
    if not p.get("model_path"):
        raise KitError("the sglang backend needs --model-path (a local GLM-5.x / DeepSeek-V3.2 checkpoint)")
    p["model_path"] = str(Path(p["model_path"]).expanduser().resolve())
    p["model"] = model_info(Path(p["model_path"]))
    for key, lo in (
        ("tp_size", 1),
        ("num_steps", 2),
        ("num_requests", 1),
        ("max_new_tokens", 1),
        ("profile_skip", 0),
        ("profile_steps", 1),
        ("warmup_requests", 0),
        ("nnodes", 1),
        ("node_rank", 0),
        ("seed", 0),
    ):
        _int(p, key, lo)
    _int(p, "context_len", MIN_INPUT_LEN, MAX_INPUT_LEN)
    if _int(p, "eagle_topk", 1) != 1:
        raise KitError(
            f"eagle_topk={p['eagle_topk']}: {FEATURE} only takes effect with --speculative-eagle-topk 1"
        )
    if _int(p, "num_draft_tokens", 2) != p["num_steps"] + 1:
        raise KitError(
            f"num_draft_tokens={p['num_draft_tokens']} with topk 1 must be num_steps + 1 = "
            f"{p['num_steps'] + 1} (the PR used 5/1/6)"
        )
    if p["node_rank"] >= p["nnodes"]:
        raise KitError(f"node_rank={p['node_rank']} must be below nnodes={p['nnodes']}")
    if p["nnodes"] > 1 and not p["dist_init_addr"]:
        raise KitError("nnodes > 1 needs dist_init_addr (host:port of node 0), as sglang does")
    if p["port"] is not None:
        _int(p, "port", 1024, SGLANG_PORT_MAX)  # sglang adds 10000 for its gRPC port
    for key in ("cuda_graph", "profile", "trust_remote_code"):
        if not isinstance(p[key], bool):
            raise KitError(f"{key} must be true or false, got {p[key]!r}")
    if p["profile_from"] not in ("auto", "window", "capture"):
        raise KitError(f"profile_from={p['profile_from']!r}: use auto, window or capture")
    if p["profile_from"] == "auto":
        p["profile_from"] = "capture" if p["cuda_graph"] else "window"
    if p["profile_from"] == "capture" and not p["cuda_graph"]:
        raise KitError("profile_from=capture needs CUDA graphs (there is no graph capture to start from)")
    min_rounds = p["max_new_tokens"] // (p["num_steps"] + 1)  # every draft accepted: fewest decode rounds
    if p["profile"] and p["profile_skip"] + p["profile_steps"] > min_rounds:
        raise KitError(
            f"profile window (skip {p['profile_skip']} + {p['profile_steps']} steps) may outlast the "
            f"request: {p['max_new_tokens']} new tokens can finish in {min_rounds} rounds; raise "
            "max_new_tokens or shorten the window"
        )
    max_pos = p["model"]["max_position_embeddings"]
    if max_pos and p["context_len"] + p["max_new_tokens"] > max_pos:
        raise KitError(
            f"context_len + max_new_tokens = {p['context_len'] + p['max_new_tokens']} exceeds the "
            f"model's max_position_embeddings {max_pos}"
        )
    extra = p["extra_args"]
    if not isinstance(extra, (list, tuple)) or not all(isinstance(a, str) for a in extra):
        raise KitError("extra_args must be a list of strings (an argument list, never a shell string)")
    for a in extra:
        name = _flag_name(a)
        if name in _OWNED:
            raise KitError(f"extra arg {name} is set by the kit; use the kit's own parameter instead")
        if name in _REFUSED:
            raise KitError(f"extra arg {name} refused: {_REFUSED[name]}")
    p["extra_args"] = list(extra)
    if not isinstance(p["model_overrides"], dict):
        raise KitError("model_overrides must be a JSON object")
    if FEATURE in p["model_overrides"]:
        raise KitError(
            f"{FEATURE} is set by the arm (bug/fix/upstream: on, off: off), not by model_overrides"
        )
    return p


def feature_override(p: dict, arm: str) -> dict[str, Any]:
    """The --json-model-override-args object for one arm (empty: nothing to override)."""
    in_config = p["model"][FEATURE]
    want = arm != "off"
    over = dict(p["model_overrides"])
    if bool(in_config) != want:
        over[FEATURE] = want
    return over


# ---------------------------------------------------------------------------------------------------
# Commands and the plan


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
    env = {"PYTHONUNBUFFERED": "1", "SGLANG_TORCH_PROFILER_DIR": str(Path(run_dir) / "sglang_profiler")}
    if p["profile"]:
        env.update(
            probe_env(
                base if base is not None else {},
                sink="nvtx",
                profile_from="capture" if p["profile_from"] == "capture" else None,
                profile_device=_base_gpu_id(p["extra_args"]),
                census=Path(run_dir) / "probe_census.jsonl",
            )
        )
    return env


def _ids_placeholder(input_len: int, prompt_id: int, seed: int) -> str:
    return f"<{input_len} token ids: prompt {prompt_id}, seed {seed}, {GENERATOR}, model tokenizer>"


def requests_plan(p: dict) -> list[dict]:
    """Every HTTP request the run sends, in order (token ids shown as placeholders)."""
    out: list[dict] = []
    for w in range(p["warmup_requests"]):
        out.append(
            {
                "endpoint": "/generate",
                "purpose": "warmup",
                "prompt_id": -1 - w,
                "body": generate_body(
                    _ids_placeholder(WARMUP_INPUT_LEN, -1 - w, p["seed"]), WARMUP_NEW_TOKENS, False
                ),
            }
        )
    start, _ = profile_window_bodies(p["profile_steps"])
    for i in range(p["num_requests"]):
        profiled = p["profile"] and i == 0
        out.append(
            {
                "endpoint": "/generate",
                "purpose": "measure",
                "prompt_id": i,
                "profiled": profiled,
                "body": generate_body(
                    _ids_placeholder(p["context_len"], i, p["seed"]), p["max_new_tokens"], profiled
                ),
            }
        )
        if profiled:
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


def warnings_for(p: dict) -> list[str]:
    w = []
    topk = p["model"]["index_topk"]
    if p["context_len"] <= topk:
        w.append(
            f"context_len {p['context_len']} <= index_topk {topk}: the indexer selects every token, so "
            "reuse and recompute are identical and this run cannot show the bug"
        )
    if p["nnodes"] > 1 and p["node_rank"] > 0:
        w.append("node_rank > 0: this node only serves its ranks; node 0 drives the workload and the window")
    return w




def arm_plan(p: dict, arm: str, run_dir: str, port: int | str, nsys: str | None, python: str) -> dict:
    program = server_cmd(p, arm, port, python)
    return {
        "arm": arm,
        "run_dir": run_dir,
        "expected_state": EXPECTED_STATE[arm],
        "server_cmd": program,
        "nsys_cmd": nsys_cmd(nsys or "<NSYS>", f"{run_dir}/profile", program) if p["profile"] else None,
        "env": server_env(p, run_dir),
        "env_note": "added to the caller's environment; PYTHONPATH is prepended to the caller's",
        "profile_from": p["profile_from"] if p["profile"] else None,
        "health": {"endpoint": "/health", "timeout_s": p["health_timeout_s"]},
        "requests": requests_plan(p) if p["node_rank"] == 0 else [],
        "outputs": f"{run_dir}/outputs.jsonl",
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


# ---------------------------------------------------------------------------------------------------
# Pre-flight: the installed build must match the arm, and every probe target must exist


def _install_hint(arm: str) -> str:
    built = sorted(REPO.glob(f"build/*/sglang-{releases.PATCHED}-*.whl"))
    return releases.install_hint(arm, str(built[-1]) if built else None)


def check_state(arm: str, state: dict, where: str) -> None:
    """One-line refusal when the installed sglang's state does not match the arm."""
    st, carrier, ver = state.get("state"), state.get("carrier"), state.get("version")
    if st == "unknown":
        raise KitError(
            f"cannot tell whether the sglang at {where} ({ver}) has the bug or the fix: "
            f"{'; '.join(state.get('reasons') or [])}"
        )
    ok = {
        "bug": st == "bug",
        "fix": st == "fix" and carrier == PR_CARRIER,
        "upstream": st == "fix" and carrier != PR_CARRIER,
        "off": st in ("bug", "fix", "absent"),
    }[arm]
    if not ok:
        raise KitError(
            f"arm {arm!r} cannot run on the installed sglang {ver} (state {st}, carrier {carrier}, "
            f"{where}): {_install_hint(arm)}"
        )


def _python_has(python: str, module: str) -> bool:
    if Path(python).resolve() == Path(sys.executable).resolve():
        import importlib.util

        return importlib.util.find_spec(module) is not None
    code = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 1)"
    return subprocess.run([python, "-c", code], capture_output=True, timeout=60).returncode == 0


def preflight(p: dict, arm: str) -> dict:
    """State guard, probe targets, nvtx and nsys; KitError before anything is started."""
    from kit.sglang_src.probe_check import probe_check, refusal, warnings
    from kit.sglang_src.source import installed_sglang_dir
    from kit.sglang_src.verify import detect_state

    python = p["python"] or sys.executable
    pkg = installed_sglang_dir(python)
    state = detect_state(pkg)
    check_state(arm, state, str(pkg))
    report = probe_check(pkg)
    out: dict[str, Any] = {
        "sglang_dir": str(pkg),
        "state": state,
        "probe_check": report,
        "warnings": warnings(report),
        "nsys": None,
        "nsys_version": None,
    }
    if p["profile"]:
        message = refusal(report, str(pkg))
        if message:
            raise KitError(message)
        if not _python_has(python, "nvtx"):
            raise KitError(
                f"the nvtx package is missing for {python}: pip install nvtx (into the sglang env); "
                "without it the probe's ranges would be silently absent"
            )
        nsys = capture.find_nsys()
        if nsys is None:
            raise KitError(
                "nsys not found: put Nsight Systems on PATH or set KIT_NSYS (or run with profile off)"
            )
        out["nsys"], out["nsys_version"] = nsys, capture.nsys_version(nsys)
    if p["port"] is not None and port_busy(p["port"]):
        raise KitError(
            f"port {p['port']} on {HOST} is already in use: stop what holds it or leave port unset"
        )
    return out


# ---------------------------------------------------------------------------------------------------
# Running one arm


def _session_pids(sid: int, zombies: bool = False) -> list[int]:
    """Processes of a session, read from /proc (no psutil): what must be gone when the run ends.
    Zombies are dead already (their parent, or init, reaps them) and are skipped unless asked for."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()  # state, ppid, pgrp, session, ...
        if (
            len(fields) > 3
            and int(fields[3]) == sid
            and (zombies or fields[0] != "Z")
            and int(entry) != os.getpid()
        ):
            pids.append(int(entry))
    return pids


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _graceful(proc: subprocess.Popen, profiled: bool, timeout_s: float, grace_s: float) -> None:
    """Under nsys: SIGTERM sglang's main process (it stops its schedulers), let nsys see the app exit and
    write the report; SIGINT to nsys only if that does not happen. Without nsys: SIGTERM the server."""
    if not profiled:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=min(grace_s, timeout_s))
        return
    app = [
        pid for pid in _session_pids(proc.pid) if pid != proc.pid and b"sglang.launch_server" in _cmdline(pid)
    ]
    for pid in app or [proc.pid]:
        os.kill(pid, signal.SIGTERM if app else signal.SIGINT)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGINT)  # nsys: stop, write what it has
        proc.wait(timeout=min(grace_s, timeout_s))


def stop_server(proc: subprocess.Popen, profiled: bool, timeout_s: float, grace_s: float = 30.0) -> None:
    """Graceful first (see _graceful), then SIGTERM/SIGKILL whatever is left anywhere in the session the
    server was started in (schedulers, nsys helpers), found through /proc."""
    sid = proc.pid  # start_new_session: the leader's pid is the session and group id
    interrupted: KeyboardInterrupt | None = None
    if proc.poll() is None:
        try:
            _graceful(proc, profiled, timeout_s, grace_s)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            pass
        except KeyboardInterrupt as e:  # a second Ctrl-C: stop waiting for a clean exit, kill everything
            interrupted = e
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = _session_pids(sid)
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (3.0 if sig == signal.SIGTERM else 10.0)
        while time.monotonic() < deadline:
            proc.poll()  # reap our own child as soon as it dies
            if not _session_pids(sid):
                break
            time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    deadline = time.monotonic() + 5.0  # let init reap the killed orphans, so the group is truly empty
    while _session_pids(sid, zombies=True) and time.monotonic() < deadline:
        time.sleep(0.05)
    if interrupted is not None:
        raise interrupted


def execute_arm(
    p: dict, run_dir: Path, tokenizer: Tokenizer | None, port: int, cmd: list[str], env: dict[str, str]
) -> dict:
    """Start the server, wait for health, run the workload, stop everything. Returns run facts."""
    log = run_dir / "server.log"
    outputs = run_dir / "outputs.jsonl"
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
            ),
            3,
        )
        for w in range(p["warmup_requests"]):
            client.generate(
                generate_body(
                    prompt_ids(tokenizer, WARMUP_INPUT_LEN, -1 - w, p["seed"]), WARMUP_NEW_TOKENS, False
                )
            )
        start_body, _ = profile_window_bodies(p["profile_steps"])
        with open(outputs, "x") as fout:
            for i in range(p["num_requests"]):
                ids = prompt_ids(tokenizer, p["context_len"], i, p["seed"])
                profiled = p["profile"] and i == 0
                body = generate_body(ids, p["max_new_tokens"], profiled)
                if profiled:
                    window: dict[str, Any] = {
                        "prompt_id": i,
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
                        raise KitError(
                            f"the profile window never opened: prompt {i} streamed fewer than "
                            f"{p['profile_skip']} chunks"
                        )
                else:
                    resp = client.generate(body)
                row = output_row(i, ids, resp, p["model"]["index_topk"], profiled)
                fout.write(json.dumps(row) + "\n")
                fout.flush()
    finally:
        stop_server(proc, profiled=p["profile"], timeout_s=p["shutdown_timeout_s"])
        facts["wall_s"] = round(time.monotonic() - t0, 3)
        facts["left_running"] = _session_pids(proc.pid)
    return facts


def _stop_window(client: SglangClient) -> Any:
    """/stop_profile as a safety net: sglang closes a window given num_steps by itself and then answers
    HTTP 500 (its log says "Profiling is not in progress"; measured on 0.5.14), so a 500 means closed.
    The report is checked by the analysis anyway (NVTX present, rounds found)."""
    try:
        return client.post("/stop_profile", {}, timeout=600)
    except KitError as e:
        if "HTTP 500" in str(e):
            return {"closed_by_sglang": str(e)}
        raise


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
    from kit import provenance
    p = validate(params)
    if len(p["arms"]) != 1:
        raise KitError(f"one arm per run (each needs its own sglang build installed); got {p['arms']}")
    arm = p["arm"]
    pre = preflight(p, arm) if server_cmd_factory is None else {"skipped": "stand-in server"}
    if tokenizer is None and p["node_rank"] == 0:
        tokenizer = load_tokenizer(Path(p["model_path"]), p["trust_remote_code"])
    port = p["port"] if p["port"] is not None else free_port()
    if p["port"] is not None and port_busy(port):
        raise KitError(f"port {port} on {HOST} is already in use: stop what holds it or leave port unset")
    python = p["python"] or sys.executable
    run_dir = rundir.create_run_dir(Path(runs_root), batch, run_id or rundir.new_run_id({**p, "arm": arm}))
    the_plan = arm_plan(p, arm, str(run_dir), port, pre.get("nsys"), python)
    saved = {k: v for k, v in p.items() if k != "arms"}
    rundir.write_json(run_dir / "params.json", saved)
    rundir.write_json(run_dir / "plan.json", the_plan)
    rundir.write_json(run_dir / "preflight.json", pre)
    if server_cmd_factory is not None:
        cmd = server_cmd_factory(port)
    else:
        cmd = the_plan["nsys_cmd"] if p["profile"] else the_plan["server_cmd"]
    env = {**os.environ, **server_env(p, run_dir, base=dict(os.environ))}
    prov = provenance.collect("sglang", arm, pre.get("nsys_version"))
    try:
        facts = execute_arm(p, run_dir, tokenizer, port, cmd, env)
        rep = run_dir / "profile.nsys-rep"
        if p["profile"] and (p["node_rank"] == 0 or rep.exists()):  # node 0 must have one; others may
            capture.export_sqlite(pre["nsys"], rep, run_dir / "profile.sqlite")
    except (KitError, KeyboardInterrupt, OSError) as exc:
        rundir.write_error(run_dir, "sglang_run", exc, log_tail(run_dir / "server.log", 40))
        raise
    prov.update(
        end=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        command=cmd,
        run=facts,
        sglang={k: pre.get(k) for k in ("sglang_dir", "state")},
        model=p["model"],
        warnings=the_plan["warnings"] + pre.get("warnings", []),
    )
    rundir.write_json(run_dir / "provenance.json", prov)
    return run_dir
