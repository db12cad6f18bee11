"""NVTX ranges for the draft loop, in one domain, with a fallback recorder for machines without nsys.

Sinks: "nvtx" (the `nvtx` package; nsys records it), "recorder" (in-process timestamps written to
recorder.sqlite; NOT a Nsight measurement and every artifact says so), "torch" (PyTorch-profiler ranges
only, for runs under torch.profiler without Nsight), "off" (nothing wrapped).

Under an active PyTorch profiler every sink but "off" also opens each range as a profiler range
(`record_function`, named `profiler_name(name)`), so a Kineto trace carries the same rounds, steps and
indexer calls an NVTX report does. torch is never imported here: the check runs only once the host
process has imported it (this module is loaded inside sglang's processes by the probe).
"""

from __future__ import annotations

import atexit
import contextlib
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
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
SINKS = ("nvtx", "recorder", "torch", "off")
PROFILER_SEP = "/"  # a profiler range is named DOMAIN/name: Kineto traces have no NVTX domains


def profiler_name(name: str, domain: str = DOMAIN) -> str:
    """The PyTorch-profiler range name of an NVTX range `name` of `domain` (the default domain: bare)."""
    return f"{domain}{PROFILER_SEP}{name}" if domain else name


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
    else:  # torch (profiler ranges only, see _range) or off (annotate never calls _range)
        _push = _pop = None


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


_profiler_enabled: Callable[[], bool] | None = None  # torch's own check, once torch is loaded


def profiler_active() -> bool:
    """A PyTorch profiler is collecting in this process (False while torch is not imported)."""
    global _profiler_enabled
    if _profiler_enabled is None:
        torch = sys.modules.get("torch")
        enabled = getattr(getattr(getattr(torch, "_C", None), "_autograd", None), "_profiler_enabled", None)
        if enabled is None:  # not imported, or still initialising: ask again next time
            return False
        _profiler_enabled = enabled
    return _profiler_enabled()


@contextlib.contextmanager
def _range(name: str) -> Iterator[None]:
    mirror = None
    if profiler_active():
        mirror = sys.modules["torch"].autograd.profiler.record_function(profiler_name(name))
        mirror.__enter__()
    if _push is not None:
        _push(name)
    try:
        yield
    finally:
        if _pop is not None:
            _pop()
        if mirror is not None:
            mirror.__exit__(None, None, None)


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
