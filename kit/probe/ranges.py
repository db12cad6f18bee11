"""NVTX ranges for the draft loop, in one domain, with a fallback recorder for machines without nsys.

Sinks: "nvtx" (the `nvtx` package; nsys records it), "recorder" (in-process timestamps written to
recorder.sqlite; NOT a Nsight measurement and every artifact says so), "off" (nothing wrapped).
"""

from __future__ import annotations

import atexit
import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

DOMAIN = "pr29654"
ROUND = "draft_round"  # one EagleDraftWorker.draft_forward (or one graph replay of it)
STEP = "draft_step"  # one draft-model forward inside the loop
INDEXER = "indexer"  # one lightning-indexer invocation
EXTEND = "draft_extend"  # the draft model's forward after verification
VERIFY = "verify"  # the target model's verification forward
PREFILL = "prefill"
GRAPH_CAPTURE = "graph_capture"

RECORDER_TABLE = "kit_ranges"
SINKS = ("nvtx", "recorder", "off")

_sink = "off"
_push = _pop = None
_records: list[tuple[int, int, int, str]] = []
_stack = threading.local()
_recorder_path: Path | None = None


def configure(sink: str, recorder_path: Path | None = None) -> None:
    """Choose where ranges go; must be called before the engine runs."""
    global _sink, _push, _pop, _recorder_path
    if sink not in SINKS:
        raise ValueError(f"unknown NVTX sink {sink!r}; use one of {SINKS}")
    _sink = sink
    if sink == "nvtx":
        import nvtx

        _push = lambda name: nvtx.push_range(message=name, domain=DOMAIN)  # noqa: E731
        _pop = lambda: nvtx.pop_range(domain=DOMAIN)  # noqa: E731
    elif sink == "recorder":
        if recorder_path is None:
            raise ValueError("the recorder sink needs a recorder_path")
        _recorder_path = Path(recorder_path)
        _push = _record_push
        _pop = _record_pop
        atexit.register(flush)


def sink() -> str:
    return _sink


def _record_push(name: str) -> None:
    stack = getattr(_stack, "items", None)
    if stack is None:
        stack = _stack.items = []
    stack.append((name, time.perf_counter_ns()))


def _record_pop() -> None:
    name, start = _stack.items.pop()
    _records.append((start, time.perf_counter_ns(), threading.get_native_id(), name))


@contextlib.contextmanager
def _range(name: str) -> Iterator[None]:
    _push(name)
    try:
        yield
    finally:
        _pop()


_NULL = contextlib.nullcontext()


def annotate(name: str) -> contextlib.AbstractContextManager:
    """A range around a block; a shared no-op when the sink is off (zero cost beyond one call)."""
    return _NULL if _sink == "off" else _range(name)


def flush() -> None:
    """Write recorded ranges (recorder sink only) to SQLite, in a table the trace reader knows."""
    if _sink != "recorder" or _recorder_path is None or not _records:
        return
    con = sqlite3.connect(_recorder_path)
    with con:
        con.execute(
            f"CREATE TABLE IF NOT EXISTS {RECORDER_TABLE} "
            "(start INTEGER, end INTEGER, tid INTEGER, domain TEXT, name TEXT)"
        )
        con.execute("CREATE TABLE IF NOT EXISTS kit_meta (key TEXT PRIMARY KEY, value TEXT)")
        con.executemany(
            f"INSERT INTO {RECORDER_TABLE} VALUES (?, ?, ?, ?, ?)",
            [(s, e, t, DOMAIN, n) for s, e, t, n in _records],
        )
        con.execute(
            "INSERT OR REPLACE INTO kit_meta VALUES ('source', 'recorder'), "
            "('warning', 'NOT measured under Nsight Systems: in-process timestamps only')"
        )
    con.close()
    _records.clear()
