"""A standard-library HTTP client for sglang's server: health, /generate (plain or streamed), the
/start_profile -> /stop_profile capture window. urllib only, so GPU nodes need nothing new.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kit.errors import HttpError, ServerError, StartupError

HOST = "127.0.0.1"  # the kit only ever talks to a server it started on this host


class SglangClient:
    """Calls one sglang server. A request that fails is an HttpError naming the endpoint and the cause
    (with the HTTP status when one came back); a response that is not what sglang sends is a ServerError."""

    def __init__(self, port: int, host: str = HOST, timeout_s: float = 3600.0):
        self.base = f"http://{host}:{port}"
        self.timeout_s = timeout_s

    def _open(self, path: str, body: Any | None, timeout: float | None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base + path,
            data=data,
            method="GET" if body is None else "POST",
            headers={"Content-Type": "application/json"} if data is not None else {},
        )
        url = self.base + path
        try:
            return urllib.request.urlopen(req, timeout=self.timeout_s if timeout is None else timeout)
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace").strip()[:300]
            raise HttpError(f"{path}: HTTP {e.code} from sglang: {detail}", url=url, status=e.code) from None
        except TimeoutError:
            raise self._timeout(path, timeout) from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, (TimeoutError, socket.timeout)):
                raise self._timeout(path, timeout) from None
            raise HttpError(f"{path}: cannot reach sglang at {self.base}: {e.reason}", url=url) from None

    def _timeout(self, path: str, timeout: float | None, what: str = "no answer within") -> HttpError:
        return HttpError(
            f"{path}: {what} {timeout or self.timeout_s:.0f} s (request timeout)", url=self.base + path
        )

    def get_status(self, path: str, timeout: float = 5.0) -> int | None:
        """HTTP status of a GET, or None when nothing answers (server still starting). A reply that is no
        HTTP, or a dropped connection, is no answer either: a poll of a port nothing listens on yet can
        connect to itself and read back its own request (kit.backends.sglang.ports)."""
        try:
            with self._open(path, None, timeout) as resp:
                return resp.status
        except HttpError as e:
            return e.status
        except (http.client.HTTPException, ConnectionError):
            return None

    def post(self, path: str, body: Any, timeout: float | None = None) -> Any:
        try:
            with self._open(path, body, timeout) as resp:
                raw = resp.read().decode(errors="replace")
        except TimeoutError:
            raise HttpError(
                f"{path}: response not complete within {timeout or self.timeout_s:.0f} s",
                url=self.base + path,
            ) from None
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw

    def generate(self, body: dict, timeout: float | None = None) -> dict:
        out = self.post("/generate", {**body, "stream": False}, timeout)
        if not isinstance(out, dict):
            raise ServerError(f"/generate: expected a JSON object, got {str(out)[:200]!r}")
        return out

    def generate_stream(
        self,
        body: dict,
        on_chunk: Callable[[int], None] | None = None,
        timeout: float | None = None,
        timeline: list[tuple[float, Any, Any]] | None = None,
    ) -> dict:
        """Streamed /generate (server-sent events); on_chunk(n) after the n-th chunk. Returns the last chunk,
        which carries the full output_ids, text and meta_info. `timeline`: each chunk's arrival
        (time.monotonic(), its completion_tokens, its spec_verify_ct) is appended to it, so the decode
        rounds can be timed from the client, with or without a profiler attached."""
        last: dict | None = None
        n = 0
        try:
            with self._open("/generate", {**body, "stream": True}, timeout) as resp:
                for raw in resp:
                    line = raw.decode(errors="replace").strip()
                    if not line.startswith("data:"):
                        continue
                    payload = line[len("data:") :].strip()
                    if payload == "[DONE]":
                        break
                    chunk = json.loads(payload)
                    if "error" in chunk:
                        raise ServerError(f"/generate: sglang reported an error mid-stream: {chunk['error']}")
                    last = chunk
                    n += 1
                    if timeline is not None:
                        meta = chunk.get("meta_info") or {}
                        timeline.append(
                            (time.monotonic(), meta.get("completion_tokens"), meta.get("spec_verify_ct"))
                        )
                    if on_chunk is not None:
                        on_chunk(n)
        except TimeoutError:
            raise self._timeout("/generate", timeout, "stream stalled for") from None
        except json.JSONDecodeError as e:
            raise ServerError(f"/generate: a streamed chunk is not JSON ({e.msg})") from None
        if last is None:
            raise ServerError("/generate: the stream ended without any output")
        return last


def wait_healthy(
    client: SglangClient,
    alive: Callable[[], bool],
    timeout_s: float,
    path: str = "/health",
    poll_s: float = 2.0,
    on_dead: Callable[[], str] | None = None,
    log: Path | None = None,
) -> float:
    """Poll GET `path` until 200; ServerError (naming the server's `log`) when the server process dies
    first or time runs out.

    Returns the seconds waited. `alive()` is checked every poll so a crash at start-up is reported at
    once with `on_dead()` (the log tail), not after the whole timeout.
    """
    t0 = time.monotonic()
    delay = min(0.1, poll_s)  # quick at first (a stand-in or a warm restart), then every poll_s
    while True:
        if not alive():
            tail = on_dead() if on_dead else ""
            raise StartupError(
                f"sglang exited during start-up (before {path} answered 200)" + (f": {tail}" if tail else ""),
                log=log,
            )
        if client.get_status(path, timeout=min(10.0, max(poll_s, 1.0))) == 200:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise StartupError(
                f"sglang did not become healthy ({path} != 200) within {timeout_s:.0f} s", log=log
            )
        time.sleep(delay)
        delay = min(delay * 2, poll_s)


def profile_window_bodies(
    num_steps: int, profiler: str = "nsys", output_dir: str | None = None
) -> tuple[dict, None]:
    """(/start_profile body, /stop_profile body).

    nsys: CUDA_PROFILER makes the scheduler call cudaProfilerStart/Stop (paired with nsys
    --capture-range=cudaProfilerApi). torch: sglang's own PyTorch profiler, activities CPU and GPU as its
    docs run it, each rank's Kineto trace written into `output_dir` when the window closes. sglang's
    start_step is an absolute forward count floored at the next forward (max(start_step, forward_ct + 1)),
    so 1 means "at the next forward"; the kit picks the moment by sending the request after N streamed
    decode chunks. num_steps forwards later sglang stops by itself; /stop_profile afterwards is the safety
    net (a no-op when already stopped).
    """
    if profiler == "torch":
        body = {"activities": ["CPU", "GPU"], "start_step": 1, "num_steps": num_steps}
        return ({**body, "output_dir": output_dir} if output_dir else body), None
    return {"activities": ["CUDA_PROFILER"], "start_step": 1, "num_steps": num_steps}, None
