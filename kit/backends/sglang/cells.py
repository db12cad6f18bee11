"""One cell's workload against a running sglang server: its warm-ups, its measured requests (`concurrency`
of them in flight at once), the profile window opened on the first one, and outputs.jsonl in prompt order.

The first measured request is streamed: after `profile_skip` decode chunks the kit posts /start_profile
(sglang counts `profile_steps` forwards and stops by itself), and /stop_profile when it ends. With
concurrency > 1 the requests in flight beside it are streamed too, and the window waits until each of them
has decoded a chunk, so the rounds inside it run at that batch size rather than beside a prefill.
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kit.backends.sglang.http import SglangClient, profile_window_bodies
from kit.backends.sglang.requests import Request, make_prompt, requests
from kit.backends.sglang.workload import Prompt, Tokenizer, generate_body, output_row, prompt_ids
from kit.errors import HttpError, ServerError
from kit.rundir import RunDir

if TYPE_CHECKING:
    from kit.backends.sglang.params import SglangParams


def stop_window(client: SglangClient) -> Any:
    """/stop_profile as a safety net: sglang closes a window given num_steps by itself and then answers
    HTTP 500 (its log says "Profiling is not in progress"; seen on 0.5.14), so a 500 means closed.
    The report is checked by the analysis anyway (NVTX present, rounds found)."""
    try:
        return client.post("/stop_profile", {}, timeout=600)
    except HttpError as e:
        if e.status == 500:
            return {"closed_by_sglang": str(e)}
        raise


class WindowGate:
    """Opens the profile window once: when the profiled prompt has streamed `skip` chunks and every
    companion (a prompt in flight beside it) has streamed one or finished. Called from the requests'
    threads; the facts it keeps become the cell's `profile_window`."""

    def __init__(
        self,
        client: SglangClient,
        p: SglangParams,
        companions: list[int],
        facts: dict[str, Any],
        log: Path | None,
        trace_dir: str | None = None,
    ):
        self._client, self._log = client, log
        self._body, _ = profile_window_bodies(p.profile_steps, p.profiler, trace_dir)
        self._skip = p.profile_skip
        self._lock = threading.Lock()
        self._chunks = {0: 0, **dict.fromkeys(companions, 0)}
        self._done: set[int] = set()
        self.facts = facts
        facts.update(prompt_id=0, skip_chunks=self._skip, opened=False)

    def on_chunk(self, prompt_id: int, n: int) -> None:
        with self._lock:
            self._chunks[prompt_id] = n
            self._maybe_open()

    def finished(self, prompt_id: int) -> None:
        with self._lock:
            self._done.add(prompt_id)
            if prompt_id != 0:
                self._maybe_open()

    def try_open(self) -> None:
        with self._lock:
            self._maybe_open()

    def _maybe_open(self) -> None:
        if self.facts["opened"] or 0 in self._done or self._chunks[0] < self._skip:
            return
        if any(n < 1 and c not in self._done for c, n in self._chunks.items() if c != 0):
            return
        self.facts["start_response"] = self._client.post("/start_profile", self._body, timeout=60)
        self.facts["opened"], self.facts["at_chunk"] = True, self._chunks[0]
        if len(self._chunks) > 1:
            self.facts["companion_chunks"] = {str(c): n for c, n in self._chunks.items() if c != 0}

    def close(self) -> None:
        """After the profiled prompt: the safety-net stop; a window that never opened fails the cell."""
        self.facts["stop_response"] = stop_window(self._client)
        if not self.facts["opened"]:
            raise ServerError(
                f"the profile window never opened: prompt 0 streamed fewer than {self._skip} chunks"
                + (" or a prompt in flight beside it never decoded" if len(self._chunks) > 1 else ""),
                log=self._log,
            )


def _send(
    client: SglangClient, r: Request, prompt: Prompt, p: SglangParams, gate: WindowGate | None
) -> dict[str, Any]:
    body = generate_body(prompt.input_ids, r.max_new_tokens, r.stream)
    chunks = None
    if not r.stream:
        resp = client.generate(body)
    else:
        on_chunk = None if gate is None else (lambda n: gate.on_chunk(r.prompt_id, n))
        timeline: list[tuple[float, Any, Any]] = []
        sent = time.monotonic()
        try:
            resp = client.generate_stream(body, on_chunk=on_chunk, timeline=timeline)
        finally:
            if gate is not None:
                gate.finished(r.prompt_id)
        chunks = [[round(t - sent, 6), tokens, verify] for t, tokens, verify in timeline]
        if r.profiled and gate is not None:
            gate.close()
    index_topk = p.model["index_topk"]
    return output_row(r.prompt_id, prompt, resp, index_topk, r.profiled, p.workload, chunks)


TRACE_WAIT_S = 600.0  # the most a rank-0 trace may take to appear after the cell (a 500k-context export)


def collect_trace(rd: RunDir, timeout_s: float, log: Path | None = None) -> dict[str, Any]:
    """Rank 0's Kineto trace of the window, moved to the cell's `profile.trace.json.gz`. sglang exports
    each rank's trace in the scheduler loop when the window closes, before it decodes on, so it is
    normally complete when the cell's requests are; the wait (size unchanged for two polls) is the net."""
    deadline, last = time.monotonic() + timeout_s, -1
    while True:
        found = sorted(rd.torch_traces.glob("*-TP-0*.trace.json.gz"))
        size = found[0].stat().st_size if found else -1
        if size > 0 and size == last:
            break
        if time.monotonic() > deadline:
            raise ServerError(
                f"sglang's PyTorch profiler wrote no rank-0 trace into {rd.torch_traces} within "
                f"{timeout_s:g} s (see the server log)",
                log=log,
            )
        last = size
        time.sleep(1.0)
    os.replace(found[0], rd.kineto)
    ranks = sorted(f.name for f in rd.torch_traces.glob("*.trace.json.gz"))
    return {"trace": rd.kineto.name, "bytes": size, "from": found[0].name, "other_ranks": ranks}


def run_cell(
    client: SglangClient,
    p: SglangParams,
    tokenizer: Tokenizer,
    outputs: Path,
    window: dict[str, Any],
    log: Path | None = None,
) -> dict[str, Any]:
    """Warm-ups, then the measured requests; rows go to `outputs` (created here) in prompt order as soon
    as every earlier prompt is done. `p`: the cell's parameters. Returns the cell's facts; `window` is
    filled as the profile window goes (so that a caller sees whether it opened even when the cell fails)."""
    t0 = time.monotonic()
    reqs = requests(p)
    for r in (r for r in reqs if r.purpose == "warmup"):
        ids = prompt_ids(tokenizer, r.input_len, r.prompt_id, p.seed)
        client.generate(generate_body(ids, r.max_new_tokens, False))
    measure = [r for r in reqs if r.purpose == "measure"]
    t1 = time.monotonic()
    prompts = {r.prompt_id: make_prompt(tokenizer, p, r.prompt_id) for r in measure}
    facts: dict[str, Any] = {"warmup_s": round(t1 - t0, 3), "prompts_s": round(time.monotonic() - t1, 3)}
    gate = None
    if any(r.profiled for r in measure):
        companions = [r.prompt_id for r in measure if r.companion]
        traces = RunDir(outputs.parent).torch_traces if p.profiler == "torch" else None
        gate = WindowGate(client, p, companions, window, log, str(traces) if traces else None)
        gate.try_open()  # profile_skip 0 and nothing beside it: open before the request, as sglang counts
    t2 = time.monotonic()
    rows = _send_all(client, measure, prompts, p, gate, outputs)
    facts["requests_s"] = round(time.monotonic() - t2, 3)
    facts["profile_window"] = gate.facts if gate is not None else None
    if gate is not None and p.profiler == "torch":
        facts["kineto"] = collect_trace(RunDir(outputs.parent), TRACE_WAIT_S, log)
    expected = [r for r in rows if "correct" in r]
    if expected:
        facts["correct"] = sum(r["correct"] for r in expected)
        facts["judged"] = len(expected)
    return facts


def _send_all(
    client: SglangClient,
    measure: list[Request],
    prompts: dict[int, Prompt],
    p: SglangParams,
    gate: WindowGate | None,
    outputs: Path,
) -> list[dict]:
    """The measured requests on `concurrency` threads, submitted in prompt order. The first failure
    cancels what has not started, waits for the requests in flight (so none runs into the next cell) and
    is raised; a Ctrl-C waits for nothing (stopping the server ends them)."""
    done: dict[int, dict] = {}
    written: list[dict] = []
    order = [r.prompt_id for r in measure]
    pool = ThreadPoolExecutor(max_workers=p.concurrency, thread_name_prefix="kit-request")
    interrupted = False
    try:
        with open(outputs, "x") as fout:
            futures: dict[Future, int] = {
                pool.submit(_send, client, r, prompts[r.prompt_id], p, gate): r.prompt_id for r in measure
            }
            pending = set(futures)
            failed: BaseException | None = None
            while pending and failed is None:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in sorted(finished, key=futures.__getitem__):
                    if fut.exception() is not None:
                        failed = failed or fut.exception()
                    else:
                        done[futures[fut]] = fut.result()
                while len(written) < len(order) and order[len(written)] in done:
                    row = done[order[len(written)]]
                    fout.write(json.dumps(row) + "\n")
                    fout.flush()
                    written.append(row)
            if failed is not None:
                for fut in pending:
                    fut.cancel()
                wait(pending)
                raise failed
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        pool.shutdown(wait=not interrupted, cancel_futures=True)
    return written
