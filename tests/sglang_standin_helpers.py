"""A stand-in for sglang's HTTP server: same endpoints (/health, /health_generate, /generate with
meta_info and SSE streaming, /start_profile, /stop_profile), deterministic outputs, no GPU.

Use it in a thread (`StandIn`) or as the server process (`python sglang_standin_helpers.py --port N
--mode ok|die|hang|slow|stubborn|closed --record calls.jsonl [--die-after N]`), which also starts a child
process the way sglang starts schedulers, and deliberately leaves it behind on SIGTERM so the kit's
clean-up is tested. `--die-after N`: the process exits right after answering its N-th /generate (a server
that dies between two cells). Every /generate call records how many were in flight when it arrived.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve()
LOG_HEALTH = "STANDIN_LOG_HEALTH"  # set: the record also says when /health first answered 200


def fake_output(input_ids: list[int], n: int) -> list[int]:
    base = sum(input_ids[-16:]) % 997
    return [(base + 7 * i) % 1000 for i in range(n)]


def fake_logprobs(out: list[int]) -> dict:
    """sglang's meta_info logprob lists for `out`: (logprob, id, text) per token, and the top 2 of each."""
    lps = [-0.001 * (i % 5) for i in range(len(out))]
    return {
        "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, out, strict=True)],
        "output_top_logprobs": [
            [[lp, t, None], [lp - 1.5, (t + 1) % 1000, None]] for lp, t in zip(lps, out, strict=True)
        ],
    }


def _write_torch_traces(out: Path, num_steps: int) -> None:
    """What sglang 0.5.14's PyTorch profiler leaves when a window of num_steps forwards closes (here at
    once): `<profile_id>-TP-<rank>.trace.json.gz` per rank, a synthetic bug-arm round structure
    (tests/kineto_synth.py: 4 indexer launches per round, CUDA graphs replayed) for rank 0 and rank 1."""
    sys.path.insert(0, str(HERE.parent))
    from kineto_synth import sglang_like, write_trace

    out.mkdir(parents=True, exist_ok=True)
    stamp = f"{time.time():.6f}"
    for rank in (0, 1):
        write_trace(out / f"{stamp}-TP-{rank}.trace.json.gz", [sglang_like("bug", 5, 3, mode="graph")])


def _prefix_logprobs(meta: dict, k: int) -> dict:
    return {key: meta[key][:k] for key in ("output_token_logprobs", "output_top_logprobs") if key in meta}


class _State:
    def __init__(self, mode: str, record: Path | None, ready_after_s: float, die_after: int | None = None):
        self.mode = mode
        self.record = record
        self.ready_at = time.monotonic() + ready_after_s
        self.calls: list[dict] = []
        self.streamed = 0  # chunks sent so far on the current stream
        self.lock = threading.Lock()
        self.in_flight = 0  # /generate calls being answered now
        self.answered = 0
        self.die_after = die_after
        self.answered_health = False
        self.delay: Callable[[list[int]], float] | None = None  # in-thread only: seconds before answering

    def log(self, entry: dict) -> None:
        entry = {**entry, "t": time.time()}  # when: tests check that servers took turns on the GPU
        with self.lock:
            self.calls.append(entry)
            if self.record is not None:
                with open(self.record, "a") as f:
                    f.write(json.dumps(entry) + "\n")


def _handler(state: _State) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # keep test output quiet
            pass

        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path in ("/health", "/health_generate"):
                ok = time.monotonic() >= state.ready_at
                if ok and not state.answered_health and os.environ.get(LOG_HEALTH):
                    state.answered_health = True  # when the kit saw it ready (the GPU-turn test)
                    state.log({"endpoint": "/health"})
                self._send(200 if ok else 503, b"" if ok else b"starting")
            else:
                self._send(404, b"not found")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path == "/start_profile":
                state.log({"endpoint": "/start_profile", "body": body, "streamed": state.streamed})
                if "GPU" in body.get("activities", []) and body.get("output_dir"):
                    _write_torch_traces(Path(body["output_dir"]), body.get("num_steps") or 4)
                self._send(200, b"Start profiling.\n", "text/plain")
            elif self.path == "/stop_profile":
                state.log({"endpoint": "/stop_profile", "streamed": state.streamed})
                if state.mode == "closed":  # sglang once a window given num_steps has closed by itself
                    self._send(500, b'{"error": "Profiling is not in progress"}')
                else:
                    self._send(200, b"Stop profiling. This will take some time.\n", "text/plain")
            elif self.path == "/generate":
                with state.lock:
                    state.in_flight += 1
                try:
                    self._generate(body)
                finally:
                    with state.lock:
                        state.in_flight -= 1
                        state.answered += 1
                        last = state.die_after is not None and state.answered >= state.die_after
                if last:
                    print(f"[stand-in] dying after {state.answered} /generate calls", flush=True)
                    os._exit(1)
            else:
                self._send(404, b"not found")

        def _generate(self, body: dict) -> None:
            ids = body["input_ids"]
            sp = body.get("sampling_params", {})
            n = int(sp.get("max_new_tokens", 16))
            state.log(
                {
                    "endpoint": "/generate",
                    "input_len": len(ids),
                    "stream": bool(body.get("stream")),
                    "sampling_params": sp,
                    "return_logprob": body.get("return_logprob"),
                    "top_logprobs_num": body.get("top_logprobs_num"),
                    "in_flight": state.in_flight,
                }
            )
            if state.delay is not None:
                time.sleep(state.delay(ids))
            if state.mode == "hang":
                time.sleep(3600)
            out = fake_output(ids, n)
            meta = {
                "prompt_tokens": len(ids),
                "completion_tokens": n,
                "spec_verify_ct": math.ceil(n / 4),
                "finish_reason": {"type": "length", "length": n},
                "e2e_latency": 0.01,
                **(fake_logprobs(out) if body.get("return_logprob") else {}),
            }
            final = {"text": " ".join(map(str, out)), "output_ids": out, "meta_info": meta}
            if not body.get("stream"):
                self._send(200, json.dumps(final).encode())
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            state.streamed = 0
            # counted before each chunk is written: a client that has read chunk n finds streamed >= n
            for k in range(4, n, 4):  # one chunk per "decode round" of 4 tokens
                part_meta = {
                    **meta,
                    **_prefix_logprobs(meta, k),
                    "completion_tokens": k,
                    "spec_verify_ct": math.ceil(k / 4),  # cumulative, as sglang's chunks carry it
                }
                part = {"text": None, "output_ids": out[:k], "meta_info": part_meta}
                state.streamed += 1
                self.wfile.write(b"data: " + json.dumps(part).encode() + b"\n\n")
                self.wfile.flush()
                time.sleep(0.01)
            state.streamed += 1
            self.wfile.write(b"data: " + json.dumps(final).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return H


class StandIn:
    """In-thread stand-in on 127.0.0.1 and an ephemeral port; `delay(input_ids)`: seconds each /generate
    waits before answering (to make requests finish out of order)."""

    def __init__(
        self,
        mode: str = "ok",
        ready_after_s: float = 0.0,
        delay: Callable[[list[int]], float] | None = None,
    ):
        self.state = _State(mode, None, ready_after_s)
        self.state.delay = delay
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state))
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def calls(self) -> list[dict]:
        return self.state.calls


def command(
    port: int,
    mode: str = "ok",
    record: Path | None = None,
    ready_after_s: float = 0.3,
    die_after: int | None = None,
    nccl_port: int | None = None,
) -> list[str]:
    """The stand-in as a server command (what run_arm's server_cmd_factory returns)."""
    cmd = [
        sys.executable,
        str(HERE),
        "--port",
        str(port),
        "--mode",
        mode,
        "--ready-after",
        str(ready_after_s),
    ]
    cmd += ["--die-after", str(die_after)] if die_after is not None else []
    cmd += ["--nccl-port", str(nccl_port)] if nccl_port is not None else []
    return cmd + (["--record", str(record)] if record else [])


def fake_nsys_command(report: Path, program: list[str]) -> list[str]:
    """A stand-in for `nsys profile -o REPORT PROGRAM`: runs PROGRAM, writes REPORT only after it exits."""
    return [sys.executable, str(HERE), "--fake-nsys", str(report), "--", *program]


def _fake_nsys(report: str, program: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # like nsys: finish the report rather than die
    print(f"[fake nsys] pid {os.getpid()} running {program[:3]}", flush=True)
    rc = subprocess.Popen(program).wait()
    Path(report).write_text(f"report written after the app exited with {rc}\n")
    sys.exit(0)


def main() -> None:
    if len(sys.argv) > 3 and sys.argv[1] == "--fake-nsys":
        _fake_nsys(sys.argv[2], sys.argv[4:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", default="ok", choices=["ok", "die", "hang", "slow", "stubborn", "closed"])
    ap.add_argument("--record")
    ap.add_argument("--ready-after", type=float, default=0.3)
    ap.add_argument("--die-after", type=int)
    ap.add_argument("--generate-delay", type=float, default=0.0)  # seconds each /generate takes
    ap.add_argument("--nccl-port", type=int)  # sglang's torch.distributed store binds it at start-up
    args, _ = ap.parse_known_args()
    print(f"[stand-in] pid {os.getpid()} starting on port {args.port}, mode {args.mode}", flush=True)
    # a "scheduler" child, left behind on purpose when the parent is terminated
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(f"[stand-in] scheduler child pid {child.pid}", flush=True)
    if args.mode == "die":
        print(
            "[stand-in] Loading weights ...\nRuntimeError: CUDA out of memory (stand-in failure)", flush=True
        )
        sys.exit(1)
    if args.mode == "stubborn":
        signal.signal(signal.SIGTERM, lambda *a: print("[stand-in] ignoring SIGTERM", flush=True))
    ready = 5.0 if args.mode == "slow" else args.ready_after
    store = None
    if args.nccl_port is not None:  # bound before the HTTP port, held while it serves, as sglang does
        store = socket.socket()
        store.bind(("127.0.0.1", args.nccl_port))
        store.listen()
    state = _State(args.mode, Path(args.record) if args.record else None, ready, args.die_after)
    if args.generate_delay:
        state.delay = lambda ids: args.generate_delay
    server = ThreadingHTTPServer(("127.0.0.1", args.port), _handler(state))
    server.daemon_threads = True
    print("[stand-in] serving", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
