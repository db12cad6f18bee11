"""Reading a PyTorch-profiler (Kineto) Chrome trace into the few numpy columns the analyses ask about.

Only four event categories matter: `user_annotation` (record_function ranges: the kit's probe ranges),
`cuda_runtime` / `cuda_driver` (launch calls) and `kernel` (GPU kernels, joined to their launch by the
`correlation` arg; a kernel replayed from a CUDA graph carries the graph launch's correlation and, with
newer Kineto, its `graph id` and `graph node id`). The bulk of a real trace is other events
(python_function, cpu_op, flows), which are skipped without being built into Python objects.

Fast path: one regular expression over the decompressed bytes, in the key order Kineto writes (ph, cat,
name, pid, tid, ts, dur, args), whatever the whitespace (torch's exporter, Kineto's own writer, json.dumps
of a merged trace). It is checked against an independent count of those categories; when a writer used
another key order or layout, the whole document is parsed with json instead (same columns, slower).
Times become integer nanoseconds from the exact decimal text (no float rounding).
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kit.errors import TraceError

CATEGORIES = (b"kernel", b"cuda_runtime", b"cuda_driver", b"user_annotation")
# One event of those categories, keys in Kineto's order; groups: cat, name, pid, tid, ts, dur, args body.
# (Patterns are unrolled and start at "ph": measured several times faster than a brace-first pattern.)
EVENT = re.compile(
    rb'"ph":\s*"X",\s*"cat":\s*"(kernel|cuda_runtime|cuda_driver|user_annotation)",\s*"name":\s*'
    rb'"([^"\\]*(?:\\.[^"\\]*)*)",\s*"pid":\s*(-?\d+|"[^"]*"),\s*"tid":\s*(-?\d+|"[^"]*"),\s*'
    rb'"ts":\s*([-\d.eE+]+),\s*"dur":\s*([-\d.eE+]+)\s*(?:,\s*"args":\s*\{([^{}]*)\})?\s*\}'
)
ARGS = {"corr": b"correlation", "graph": b"graph id", "node": b"graph node id"}
COUNT = re.compile(rb'"cat":\s*"(kernel|cuda_runtime|cuda_driver|user_annotation)"')
_RANK = re.compile(r"^(\[[^\]]*\])\s+(.*)$")  # sglang's merged traces: pid "[TP01] 12345"


@dataclass
class Events:
    """One category's events as columns; `name` indexes `names`, `proc` indexes Parsed.processes."""

    names: list[str]
    name: np.ndarray
    proc: np.ndarray
    pid: np.ndarray  # the numeric pid field (OS pid on CPU rows, device on GPU rows; -1 when not numeric)
    tid: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    corr: np.ndarray  # -1 where absent
    graph: np.ndarray  # -1 where absent
    node: np.ndarray  # -1 where absent

    def __len__(self) -> int:
        return len(self.start)


@dataclass
class Parsed:
    """What a trace file holds for the analyses. `processes` are the rank labels of a merged trace
    ("[TP00]"), or [""] for a trace of one process."""

    processes: list[str]
    annotations: Events
    runtime: Events  # cuda_runtime and cuda_driver calls
    kernels: Events
    meta: dict = field(default_factory=dict)
    parser: str = "regex"


def read_bytes(path: Path) -> bytes:
    """The trace text; a .gz that is not gzip, or is cut short, is one TraceError naming the file."""
    data = path.read_bytes()
    if not path.name.endswith(".gz"):
        return data
    if not data.startswith(b"\x1f\x8b"):
        raise TraceError(
            f"{path} is not gzip-compressed (no gzip header): re-copy it or rename it", path=path
        )
    out = []
    rest = data
    try:
        while rest:  # gzip members, one after another (what `cat a.gz b.gz` makes)
            d = zlib.decompressobj(wbits=31)
            out.append(d.decompress(rest))
            if not d.eof:
                raise TraceError(
                    f"{path} is a truncated gzip file (the stream ends early): re-copy the trace", path=path
                )
            rest = d.unused_data
    except zlib.error as exc:
        raise TraceError(f"{path} is a damaged gzip file ({exc}): re-copy the trace", path=path) from None
    return b"".join(out) if len(out) > 1 else out[0]


def parse(path: Path) -> Parsed:
    """Parse a Kineto trace file (.json or .json.gz) into columns; TraceError when it is not one."""
    data = read_bytes(path)
    if not data.lstrip()[:1] == b"{" or data.find(b'"traceEvents"') < 0:
        raise TraceError(
            f"{path} is not a PyTorch-profiler trace (a JSON object with traceEvents expected)", path=path
        )
    if not _complete(data):
        raise TraceError(
            f"{path} is truncated (the traceEvents list never closes): re-export the trace", path=path
        )
    meta = _meta(data)
    rows = EVENT.findall(data)
    if len(rows) == len(COUNT.findall(data)):
        parsed = _from_rows(rows, meta)
        parsed.parser = "regex"
        return parsed
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise TraceError(
            f"{path} is not valid JSON ({exc}): the trace is damaged or truncated", path=path
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError(f"{path} has no traceEvents list: not a PyTorch-profiler trace", path=path)
    parsed = _from_json(doc["traceEvents"], {**meta, **_doc_meta(doc)})
    parsed.parser = "json"
    return parsed


def _complete(data: bytes) -> bool:
    """The document ends, and after its last event the event list closes (an object, then `]`): a trace cut
    right after an event still ends in `}`."""
    tail = data[-65536:]
    if not tail.rstrip().endswith(b"}"):
        return False
    last = tail.rfind(b'"ph"')
    return last < 0 or re.search(rb"\}\s*\]", tail[last:]) is not None


def _meta(data: bytes) -> dict:
    """Top-level keys written before traceEvents (schemaVersion, deviceProperties, distributedInfo...)."""
    head = data[: data.find(b'"traceEvents"')].rstrip().rstrip(b",")
    try:
        doc = json.loads(head + b"}")
    except ValueError:
        return {}
    return _doc_meta(doc) if isinstance(doc, dict) else {}


def _doc_meta(doc: dict) -> dict:
    keep = ("schemaVersion", "deviceProperties", "distributedInfo", "baseTimeNanoseconds", "trace_id")
    return {k: doc[k] for k in keep if k in doc}


# ---- building columns ------------------------------------------------------------------------------


def _ns(text: tuple[bytes, ...]) -> np.ndarray:
    """Microsecond decimal text -> integer nanoseconds: exact for Kineto's three decimals, else via float."""
    if not text:
        return np.zeros(0, dtype=np.int64)
    joined = b",".join(text)
    if b"." not in joined and b"e" not in joined and b"E" not in joined:
        return np.fromstring(joined.decode(), dtype=np.int64, sep=",") * 1000
    if len(_THREE.findall(joined)) == len(text):
        return np.fromstring(joined.replace(b".", b"").decode(), dtype=np.int64, sep=",")
    return np.round(np.fromstring(joined.decode(), dtype=np.float64, sep=",") * 1000).astype(np.int64)


_THREE = re.compile(rb"\d\.\d{3}(?=,|$)")


def _arg_column(bodies: tuple[bytes, ...], key: bytes) -> np.ndarray:
    """One integer arg of every event (-1 where absent): one search over all args bodies when each has it,
    else event by event."""
    pattern = re.compile(rb'"' + re.escape(key) + rb'":\s*(-?\d+)')
    found = pattern.findall(b"\x00".join(bodies))
    if not found:
        return np.full(len(bodies), -1, dtype=np.int64)
    if len(found) != len(bodies):  # some events lack it (e.g. kernels launched outside a graph)
        hits = [pattern.search(b) for b in bodies]
        found = [h.group(1) if h else b"-1" for h in hits]
    return np.fromstring(b",".join(found).decode(), dtype=np.int64, sep=",")


class _Procs:
    """Rank labels of a merged trace -> process ordinals; pid/tid text -> numbers (cached: few values)."""

    def __init__(self) -> None:
        self.labels: dict[str, int] = {}
        self._pid: dict[object, tuple[int, int]] = {}
        self._tid: dict[object, int] = {}

    def pid(self, raw: object) -> tuple[int, int]:
        """(process ordinal, numeric pid or -1)."""
        hit = self._pid.get(raw)
        if hit is None:
            text = (raw.decode() if isinstance(raw, bytes) else str(raw)).strip('"')
            m = _RANK.match(text)
            label, rest = (m.group(1), m.group(2)) if m else ("", text)
            proc = self.labels.setdefault(label, len(self.labels))
            hit = self._pid[raw] = (proc, int(rest) if rest.lstrip("-").isdigit() else -1)
        return hit

    def tid(self, raw: object) -> int:
        hit = self._tid.get(raw)
        if hit is None:
            text = (raw.decode() if isinstance(raw, bytes) else str(raw)).strip('"')
            hit = self._tid[raw] = int(text) if text.lstrip("-").isdigit() else -1
        return hit


def _columns(cat_rows: list[tuple], procs: _Procs) -> Events:
    i64 = np.int64
    if not cat_rows:
        e = np.zeros(0, dtype=i64)
        return Events([], e, e, e, e, e, e, e, e, e)
    if isinstance(cat_rows[0][4], bytes):  # regex rows: (cat, name, pid, tid, ts, dur, args body)
        _cat, names_raw, pids_raw, tids_raw, ts_raw, dur_raw, bodies = zip(*cat_rows, strict=True)
        c_raw = g_raw = n_raw = ()
    else:  # json rows: the args already looked up
        _cat, names_raw, pids_raw, tids_raw, ts_raw, dur_raw, c_raw, g_raw, n_raw = zip(
            *cat_rows, strict=True
        )
    names: dict[object, int] = {}
    name_ids = [names.setdefault(n, len(names)) for n in names_raw]
    pid_pairs = [procs.pid(p) for p in pids_raw]
    if isinstance(ts_raw[0], bytes):
        start, dur = _ns(ts_raw), _ns(dur_raw)
        corr, graph, node = (_arg_column(bodies, ARGS[k]) for k in ("corr", "graph", "node"))
        decoded = [_unescape(n) for n in names]
    else:
        start = np.array([_json_ns(t) for t in ts_raw], dtype=i64)
        dur = np.array([_json_ns(t) for t in dur_raw], dtype=i64)
        corr, graph, node = (np.array(col, dtype=i64) for col in (c_raw, g_raw, n_raw))
        decoded = [str(n) for n in names]
    return Events(
        names=decoded,
        name=np.asarray(name_ids, dtype=i64),
        proc=np.asarray([p for p, _ in pid_pairs], dtype=i64),
        pid=np.asarray([n for _, n in pid_pairs], dtype=i64),
        tid=np.asarray([procs.tid(t) for t in tids_raw], dtype=i64),
        start=start,
        dur=dur,
        corr=corr,
        graph=graph,
        node=node,
    )


def _unescape(raw: bytes) -> str:
    """A JSON string body as text (escapes resolved only where there are any)."""
    return json.loads(b'"' + raw + b'"') if b"\\" in raw else raw.decode("utf-8", "replace")


def _json_ns(v: object) -> int:
    return int(round(float(v) * 1000)) if v is not None else 0  # type: ignore[arg-type]


def _from_rows(rows: list[tuple], meta: dict) -> Parsed:
    procs = _Procs()
    by_cat: dict[object, list[tuple]] = {}
    for r in rows:
        by_cat.setdefault(r[0], []).append(r)

    def cat(*names: bytes) -> list[tuple]:
        return [r for n in names for r in [*by_cat.get(n, ()), *by_cat.get(n.decode(), ())]]

    ann = _columns(cat(b"user_annotation"), procs)
    rt = _columns(cat(b"cuda_runtime", b"cuda_driver"), procs)
    k = _columns(cat(b"kernel"), procs)
    return Parsed(list(procs.labels), ann, rt, k, meta)


def _from_json(events: list, meta: dict) -> Parsed:
    """The same columns from parsed JSON (any key order or layout)."""
    wanted = {c.decode() for c in CATEGORIES}
    rows = []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X" or e.get("cat") not in wanted:
            continue
        args = e.get("args") or {}
        rows.append(
            (
                e["cat"],
                str(e.get("name", "")),
                str(e.get("pid", "")),
                str(e.get("tid", "")),
                e.get("ts"),
                e.get("dur", 0),
                int(args.get("correlation", -1)),
                int(args.get("graph id", -1)),
                int(args.get("graph node id", -1)),
            )
        )
    return _from_rows(rows, meta)
