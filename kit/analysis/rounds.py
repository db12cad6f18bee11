"""Per-draft-round attribution of indexer launches: analyzers as functions over the tables of a Trace.

One row per draft round. Methods, in order of trust (design.md):
  eager       kernel -> CUPTI_ACTIVITY_KIND_RUNTIME (correlationId) -> NVTX ranges on the same thread
              enclosing runtime.start
  graph       replayed kernel.graphNodeId -> CUDA_GRAPH_NODE_EVENTS -> originalGraphNodeId (followed to the
              capture-time node) -> that node's creation event -> capture-time NVTX ranges on its thread;
              the round is the `draft_round` range enclosing the kernel's cudaGraphLaunch call
  nvtx        CPU only: indexer/step ranges that start inside a round on the same thread (no kernels)
  classifier  no NVTX: rounds = replays of the draft-loop CUDA graph, recognised as the graph that runs
              the model more than once per launch (token-embedding lookups; graph_kernels overrides);
              indexer launches = logits-kernel anchors in it (one per indexer call)
Counting is per process (TP rank): rows carry pid and `proc`, the process ordinal by pid.

SQL selects, numpy counts: ranges come out of SQLite as columns (Trace.range_columns) and nesting is a
searchsorted per thread, which keeps a million-range report well under a second of analysis. The kernel
methods read each big table once (Trace.scan_columns: narrow integer columns, rowid slices on parallel
threads): the runtime calls on the rounds' threads within their span, then the kernels in those calls'
correlation-id span, joined on (pid, correlationId) in numpy; graph nodes are resolved once per node.
Nothing big is materialised in SQLite (temp tables keyed by id cost more than the scans themselves).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from kit.errors import KitError
from kit.probe import ranges as nvtx_ranges
from kit.sglang_src import releases
from kit.trace.sqlite import NvtxStatus, Trace, pid_of

METHODS = ("auto", "nvtx", "eager", "graph", "classifier")
ROUND_COLUMNS = (
    "round",
    "proc",
    "pid",
    "tid",
    "start_ns",
    "round_ns",
    "draft_forwards",
    "step_ns",
    "indexer_launches",
    "indexer_kernels",
    "indexer_gpu_ns",
    "round_gpu_ns",
    "step_gpu_ns",
    "method",
)
DEFAULT_INDEXER_KERNELS = releases.INDEXER_KERNELS
DEFAULT_INDEXER_ANCHORS = releases.INDEXER_ANCHORS
DEFAULT_FORWARD_KERNELS = releases.FORWARD_KERNELS


@dataclass(frozen=True)
class RangeNames:
    """Which NVTX domain and range names mean round / step / indexer (our probes' names by default)."""

    domain: str = nvtx_ranges.DOMAIN
    round_range: str = nvtx_ranges.ROUND
    step_range: str = nvtx_ranges.STEP
    indexer_range: str = nvtx_ranges.INDEXER


DEFAULT_NAMES = RangeNames()
# Up to this many runtime calls in rounds, the kernel scan keeps only their correlation ids (an IN list:
# ~25% less scan time with CUDA graphs); beyond, the ids' span (eager: one call per kernel).
IN_LIST_MAX = 10_000


class RoundTable(Sequence):
    """Rows stored by column (a million-range report yields ~10^5 rounds); indexing gives a row dict."""

    def __init__(self, columns: dict[str, list]) -> None:
        self.columns = {c: columns[c] for c in ROUND_COLUMNS}
        self._n = len(columns["round"])

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        return {c: v[i] for c, v in self.columns.items()}

    def __iter__(self) -> Iterator[dict]:
        return (self[i] for i in range(self._n))

    def column(self, name: str) -> list:
        return self.columns[name]


@dataclass
class Attribution:
    """Rows plus everything the verdict must say about how they were obtained."""

    rows: RoundTable
    method: str
    warnings: list[str] = field(default_factory=list)
    inconclusive: str | None = None
    nvtx: NvtxStatus | None = None


# ---- ranges as sorted arrays ------------------------------------------------------------------


def _distinct(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values; one value without sorting (the usual single thread), and without the
    numpy.ma import a plain np.unique costs (~20 ms of a process)."""
    if not len(a) or a.min() == a.max():
        return a[:1]
    s = np.sort(a)
    return s[np.concatenate(([True], s[1:] != s[:-1]))]


@dataclass
class RangeSet:
    """Ranges of one name sorted by (thread, start); end == -1 means never closed."""

    gtid: np.ndarray
    start: np.ndarray
    end: np.ndarray
    threads: dict[int, slice]

    @classmethod
    def build(cls, gtid: np.ndarray, start: np.ndarray, end: np.ndarray) -> RangeSet:
        one_thread = len(gtid) == 0 or gtid.min() == gtid.max()
        if not (one_thread and np.all(start[1:] >= start[:-1])):  # exports are usually in start order
            order = np.lexsort((start, gtid))
            gtid, start, end = gtid[order], start[order], end[order]
        uniq, first, counts = np.unique(gtid, return_index=True, return_counts=True)
        threads = {int(g): slice(int(f), int(f + c)) for g, f, c in zip(uniq, first, counts, strict=True)}
        return cls(gtid, start, end, threads)

    def __len__(self) -> int:
        return len(self.start)

    def count_starting_in(self, gtid: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """For each (thread, [lo, hi)): how many of these ranges start inside it on that thread."""
        out = np.zeros(len(lo), dtype=np.int64)
        for g in _distinct(gtid):
            sl = self.threads.get(int(g))
            if sl is None:
                continue
            m = gtid == g
            starts = self.start[sl]
            out[m] = np.searchsorted(starts, hi[m], "left") - np.searchsorted(starts, lo[m], "left")
        return out

    def enclosing(self, gtid: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Index of the range on thread `gtid` that encloses time `t` (the latest one starting at or before
        t, if it is still open at t), or -1."""
        out = np.full(len(t), -1, dtype=np.int64)
        for g in _distinct(gtid):
            sl = self.threads.get(int(g))
            if sl is None:
                continue
            m = gtid == g
            tm = t[m]
            pos = np.searchsorted(self.start[sl], tm, "right") - 1
            cand = np.maximum(pos, 0)
            ends = self.end[sl][cand]
            ok = (pos >= 0) & ((ends < 0) | (ends >= tm))
            out[m] = np.where(ok, cand + sl.start, -1)
        return out


def _starts_only(gtid: np.ndarray, start: np.ndarray, _end: object) -> RangeSet:
    """A RangeSet for counting starts only (ends not fetched: they cost a column of the scan)."""
    return RangeSet.build(gtid, start, np.full(len(start), -1, dtype=np.int64))


def _pid_tid(trace: Trace, gtid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if trace.source == "recorder":
        return np.full(len(gtid), trace.recorder_pid, dtype=np.int64), gtid
    return (gtid >> 24) & 0xFFFFFF, gtid & 0xFFFFFF


def _round_set(trace: Trace, names: RangeNames) -> tuple[RangeSet, list[str]]:
    """Closed rounds as a RangeSet, and warnings about unclosed or nested rounds."""
    g, s, e = trace.range_columns(names.domain, names.round_range)
    closed = e >= 0
    rounds = RangeSet.build(g[closed], s[closed], e[closed])
    warnings = []
    if (~closed).any():
        warnings.append(
            f"{int((~closed).sum())} unclosed {names.round_range!r} range(s) (profile ended inside a round) "
            "left out"
        )
    if len(rounds) > 1:
        nested = (rounds.gtid[1:] == rounds.gtid[:-1]) & (rounds.start[1:] < rounds.end[:-1])
        if nested.any():
            warnings.append(
                f"{int(nested.sum())} {names.round_range!r} range(s) start inside another round on the same "
                "thread (nested rounds): their indexer ranges are counted in both"
            )
    return rounds, warnings


def _table(
    trace: Trace,
    rounds_gtid: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    forwards: np.ndarray | None,
    launches: np.ndarray,
    kernels: np.ndarray | None,
    gpu_ns: np.ndarray | None,
    method: str,
    gpu_span: np.ndarray | None = None,
) -> RoundTable:
    """Number rounds per process in time order and compute the derived columns."""
    pid, tid = _pid_tid(trace, rounds_gtid)
    order = np.lexsort((start, pid))
    pid, tid, start, end, launches = pid[order], tid[order], start[order], end[order], launches[order]
    n = len(order)
    _, first, proc = np.unique(pid, return_index=True, return_inverse=True)
    number = np.arange(n) - first[proc] + 1
    wall = end - start
    cols: dict[str, list] = {
        "round": number.tolist(),
        "proc": proc.tolist(),
        "pid": pid.tolist(),
        "tid": tid.tolist(),
        "start_ns": start.tolist(),
        "round_ns": wall.tolist(),
        "indexer_launches": launches.tolist(),
        "method": [method] * n,
    }
    if forwards is None:
        cols["draft_forwards"] = [None] * n
        cols["step_ns"] = [None] * n
    else:
        fw = forwards[order]
        cols["draft_forwards"] = fw.tolist()
        step = np.round(np.where(fw > 0, wall / np.maximum(fw, 1), np.nan), 1)  # 0.1 ns is plenty
        cols["step_ns"] = step.tolist() if (fw > 0).all() else [None if x != x else x for x in step.tolist()]
    cols["indexer_kernels"] = [None] * n if kernels is None else kernels[order].tolist()
    cols["indexer_gpu_ns"] = [None] * n if gpu_ns is None else gpu_ns[order].tolist()
    # GPU time of the round (first kernel start to last kernel end): with CUDA graphs the NVTX round only
    # spans the asynchronous launch, so this is the draft loop's real latency.
    if gpu_span is None or forwards is None:
        cols["round_gpu_ns"] = [None] * n
        cols["step_gpu_ns"] = [None] * n
    else:
        span, fw = gpu_span[order], forwards[order]
        cols["round_gpu_ns"] = span.tolist()
        per_step = np.where(fw > 0, span / np.maximum(fw, 1), np.nan).round(1)
        cols["step_gpu_ns"] = [None if x != x else x for x in per_step.tolist()]
    return RoundTable(cols)


def _empty_table(method: str) -> RoundTable:
    return RoundTable({c: [] for c in ROUND_COLUMNS})


# ---- method choice ----------------------------------------------------------------------------


def choose_method(trace: Trace, names: RangeNames = DEFAULT_NAMES) -> str:
    """graph if replayed kernels carry graphNodeId, else eager if kernels exist, else nvtx; classifier
    when the report has kernels but no range of the domain."""
    status = trace.nvtx_status(names.domain)
    if status.has_ranges:
        if trace.has_runtime and trace.has_graph_replays:
            return "graph"
        if trace.has_runtime and trace.has_kernels:
            return "eager"
        return "nvtx"
    if trace.has_kernels:
        return "classifier"
    return "nvtx"


def attribute(
    trace: Trace,
    method: str = "auto",
    names: RangeNames = DEFAULT_NAMES,
    *,
    indexer_kernels: tuple[str, ...] | None = None,
    max_gap: int = 4,
    graph_kernels: int | None = None,
    expect_nvtx: bool = False,
) -> Attribution:
    """Attribute indexer launches to draft rounds; `expect_nvtx` when the report comes from a kit run."""
    if method not in METHODS:
        raise KitError(f"unknown attribution method {method!r}: use one of {', '.join(METHODS)}")
    status = trace.nvtx_status(names.domain)
    chosen = choose_method(trace, names) if method == "auto" else method
    if chosen in ("eager", "graph", "classifier") and not trace.has_kernels:
        raise KitError(
            f"method {chosen!r} needs CUDA kernels, but {trace.path} has no CUPTI_ACTIVITY_KIND_KERNEL rows"
        )
    if chosen in ("eager", "graph") and not trace.has_runtime:
        raise KitError(f"method {chosen!r} needs CUPTI_ACTIVITY_KIND_RUNTIME rows, which {trace.path} lacks")
    if chosen == "graph" and not trace.has("CUDA_GRAPH_NODE_EVENTS"):
        raise KitError("method 'graph' needs CUDA_GRAPH_NODE_EVENTS (profile with --cuda-graph-trace=node)")

    warnings: list[str] = list(trace.warnings)
    inconclusive = None
    if chosen == "nvtx":
        rows, more = nvtx_rounds(trace, names)
    elif chosen == "eager":
        rows, more = eager_rounds(trace, names)
    elif chosen == "graph":
        rows, more = graph_rounds(trace, names)
    else:
        rows, more, inconclusive = classifier_rounds(
            trace, indexer_kernels or DEFAULT_INDEXER_KERNELS, max_gap=max_gap, graph_kernels=graph_kernels
        )
    warnings += more

    if status.dropped:
        inconclusive = (
            f"NVTX dropped: domain {names.domain!r} was created but none of its ranges were recorded "
            "(nsys 2022.4 with nvtx >= 0.2.12 does exactly this; use nvtx==0.2.10 or a newer nsys)"
        )
    elif chosen != "classifier" and not status.has_ranges:
        where = "this kit run's report" if expect_nvtx else "the report"
        inconclusive = (
            f"no NVTX ranges of domain {names.domain!r} in {where} "
            f"(domains present: {', '.join(trace.domains()) or 'none'}); was it profiled with --trace=nvtx "
            "and the NVTX sink on?"
        )
    elif not len(rows) and inconclusive is None:
        inconclusive = f"no {names.round_range!r} rounds found (method {chosen})"
    n_pids = len(set(rows.column("pid")))
    if n_pids > 1:
        warnings.append(f"{n_pids} processes (TP ranks): rounds are counted per pid, see columns proc/pid")
    return Attribution(rows=rows, method=chosen, warnings=warnings, inconclusive=inconclusive, nvtx=status)


# ---- nvtx (CPU only) --------------------------------------------------------------------------


def nvtx_rounds(trace: Trace, names: RangeNames = DEFAULT_NAMES) -> tuple[RoundTable, list[str]]:
    """Indexer and step ranges that start inside a round on the same thread; kernels/GPU time empty."""
    rounds, warnings = _round_set(trace, names)
    threads = sorted(rounds.threads)
    children = trace.range_columns_multi(
        names.domain, [names.step_range, names.indexer_range], gtids=threads, with_end=False
    )
    steps = _starts_only(*children[names.step_range])
    indexer = _starts_only(*children[names.indexer_range])
    n_steps = steps.count_starting_in(rounds.gtid, rounds.start, rounds.end)
    n_idx = indexer.count_starting_in(rounds.gtid, rounds.start, rounds.end)
    table = _table(trace, rounds.gtid, rounds.start, rounds.end, n_steps, n_idx, None, None, "nvtx")
    return table, warnings


# ---- eager and graph (kernels) ----------------------------------------------------------------


def eager_rounds(trace: Trace, names: RangeNames = DEFAULT_NAMES) -> tuple[RoundTable, list[str]]:
    """Kernels -> launching runtime call -> NVTX ranges on that thread enclosing the call."""
    return _kernel_rounds(trace, names, graph=False)


def graph_rounds(trace: Trace, names: RangeNames = DEFAULT_NAMES) -> tuple[RoundTable, list[str]]:
    """Replayed graph kernels -> capture-time node creation -> capture-time NVTX ranges (facts/nsight.md).

    Kernels launched outside graphs in the same report are attributed eagerly, so a report may mix both.
    """
    return _kernel_rounds(trace, names, graph=True)


def _kernel_pid(trace: Trace, alias: str = "k") -> str:
    """SQL for a kernel's pid; NULL when the export lacks globalPid (then joins use correlationId only)."""
    if trace.has("CUPTI_ACTIVITY_KIND_KERNEL", "globalPid"):
        return pid_of(f"{alias}.globalPid" if alias else "globalPid")
    return "NULL"


def runtime_table(trace: Trace) -> str:
    """Temp table (pid, cid) -> launching thread, time and API name, for the calls that launched kernels.

    Correlation ids are per process: they are matched on (pid, id) when kernels say which process they
    belong to.
    """
    name = "kit_rt"
    if name in trace.temp_tables:
        return name
    kpid = _kernel_pid(trace, "k")
    rpid = pid_of("r.globalTid") if kpid != "NULL" else "NULL"
    trace.con.execute(
        "CREATE TEMP TABLE kit_kcid (pid INTEGER, cid INTEGER, PRIMARY KEY (pid, cid)) WITHOUT ROWID"
    )
    trace.query(
        f"INSERT OR IGNORE INTO temp.kit_kcid SELECT {kpid}, k.correlationId "
        "FROM main.CUPTI_ACTIVITY_KIND_KERNEL k"
    )
    trace.con.execute(
        f"CREATE TEMP TABLE {name} (pid INTEGER, cid INTEGER, gtid INTEGER, start INTEGER, name_id INTEGER, "
        "PRIMARY KEY (pid, cid)) WITHOUT ROWID"
    )
    trace.query(
        f"INSERT OR IGNORE INTO temp.{name} SELECT {rpid}, r.correlationId, r.globalTid, r.start, r.nameId "
        "FROM main.CUPTI_ACTIVITY_KIND_RUNTIME r "
        f"WHERE EXISTS (SELECT 1 FROM temp.kit_kcid c WHERE c.pid IS {rpid} AND c.cid = r.correlationId)"
    )
    trace.temp_tables.add(name)
    return name


def _node_events(trace: Trace) -> tuple[dict[tuple, tuple[int, int]], dict[tuple, int]]:
    """Per graph node, keyed (pid or None, graphNodeId): its earliest event (thread, time) and the node it
    was cloned from. One scan of CUDA_GRAPH_NODE_EVENTS (capture-time rows only: small), cached."""
    if "node_events" in trace._cache:
        return trace._cache["node_events"]
    where, params = "", []
    if trace.has("CUDA_GRAPH_NODE_EVENTS", "nameId"):
        ids = [r[0] for r in trace.query("SELECT id FROM main.StringIds WHERE value LIKE '%node creat%'")]
        if ids:
            marks = ",".join("?" * len(ids))
            if trace.query(
                f"SELECT 1 FROM main.CUDA_GRAPH_NODE_EVENTS WHERE nameId IN ({marks}) LIMIT 1", tuple(ids)
            ):
                where, params = f"WHERE nameId IN ({marks})", ids
    per_pid = trace.has("CUPTI_ACTIVITY_KIND_KERNEL", "globalPid")
    # A node can have several events: nsys 2025.3 records an instantiated node's own creation (no original)
    # AND a row linking it to the captured node it was cloned from. Follow any link; the earliest event of
    # the node at the end of the chain is its capture-time creation.
    first: dict[tuple, tuple[int, int]] = {}
    original: dict[tuple, int] = {}
    for pid, node, orig, gtid, start in trace.query(
        f"SELECT {pid_of('globalTid')}, graphNodeId, originalGraphNodeId, globalTid, start "
        f"FROM main.CUDA_GRAPH_NODE_EVENTS {where} ORDER BY start",
        tuple(params),
    ):
        key = (pid if per_pid else None, node)
        first.setdefault(key, (gtid, start))
        if orig is not None:
            original.setdefault(key, orig)
    trace._cache["node_events"] = (first, original)
    return first, original


def _capture_point(trace: Trace, pid: int | None, node: int) -> tuple[int, int] | None:
    """(thread, time) of the capture-time creation of replayed node `node` of process `pid`: the chain
    replayed node -> originalGraphNodeId -> ... is followed to its end, guarding against cycles."""
    first, original = _node_events(trace)
    key = (pid, node)
    seen: set[tuple] = set()
    while key in original and key not in seen:
        seen.add(key)
        key = (key[0], original[key])
    return first[key] if key in first and key not in seen else None


def graph_roots(trace: Trace) -> tuple[str, int]:
    """Temp table (pid, replayed graphNodeId) -> creation event (thread, time) of the node it was captured as,
    for SQL over single rounds (the timeline). Returns the table and how many replayed nodes have no
    capture-time creation event in the report."""
    table = "kit_groot"
    if table in trace.temp_tables:
        return table, trace.temp_tables_info.get(table, 0)
    used = trace.query(
        f"SELECT DISTINCT {_kernel_pid(trace, 'k')}, k.graphNodeId FROM main.CUPTI_ACTIVITY_KIND_KERNEL k "
        "WHERE k.graphNodeId IS NOT NULL"
    )
    resolved, unresolved = [], 0
    for pid, node in used:
        point = _capture_point(trace, pid, node)
        if point is None:
            unresolved += 1
        else:
            resolved.append((pid, node, *point))
    trace.con.execute(
        f"CREATE TEMP TABLE {table} (pid INTEGER, node INTEGER, gtid INTEGER, start INTEGER, "
        "PRIMARY KEY (pid, node)) WITHOUT ROWID"
    )
    trace.con.executemany(f"INSERT OR IGNORE INTO temp.{table} VALUES (?, ?, ?, ?)", resolved)
    trace.temp_tables.add(table)
    trace.temp_tables_info[table] = unresolved
    return table, unresolved


def kernel_join(trace: Trace, graph: bool) -> tuple[str, str, str, int]:
    """SQL joining kernels `k` to their launch call `rt` (and, for graph replays, to the capture-time
    creation event `g` of their node), plus the expressions of each kernel's attribution point:
    (join, thread expr, time expr, replayed nodes without a capture-time event)."""
    rt = runtime_table(trace)
    join = f"JOIN temp.{rt} rt ON rt.cid = k.correlationId AND rt.pid IS {_kernel_pid(trace, 'k')}"
    if not graph:
        return join, "rt.gtid", "rt.start", 0
    roots, unresolved = graph_roots(trace)
    join += (
        f" LEFT JOIN temp.{roots} g "
        "ON k.graphNodeId IS NOT NULL AND g.pid IS rt.pid AND g.node = k.graphNodeId"
    )
    point_g = "COALESCE(CASE WHEN k.graphNodeId IS NULL THEN rt.gtid ELSE g.gtid END, -1)"
    point_t = "COALESCE(CASE WHEN k.graphNodeId IS NULL THEN rt.start ELSE g.start END, -1)"
    return join, point_g, point_t, unresolved


def _distinct_per_round(round_ix: np.ndarray, item_ix: np.ndarray, n_rounds: int) -> np.ndarray:
    """How many distinct items (e.g. capture-time indexer ranges) each round's kernels map to."""
    ok = (round_ix >= 0) & (item_ix >= 0)
    if not ok.any():
        return np.zeros(n_rounds, dtype=np.int64)
    span = int(item_ix.max()) + 1
    pairs = _distinct(round_ix[ok] * span + item_ix[ok])
    return np.bincount(pairs // span, minlength=n_rounds)


@dataclass
class _Calls:
    """Runtime API calls made on a round's thread inside the round: the launches kernels join to."""

    cid: np.ndarray
    proc: np.ndarray  # ordinal of the call's process in `pids` (0 when kernels do not say their process)
    gtid: np.ndarray
    start: np.ndarray
    round: np.ndarray
    pids: list[int] | None  # None: the kernel table lacks globalPid, kernels join on correlationId only

    def key(self) -> np.ndarray:
        """(process, correlationId) as one integer: correlation ids are per process (CUPTI: 32 bits)."""
        return (self.proc << 32) + self.cid


def _launch_name_filter(trace: Trace) -> str:
    """SQL keeping only runtime calls that can launch a kernel (every CUDA launch API, runtime or driver,
    plain or graph, has "Launch" in its name): half of a real report's runtime rows are other calls
    (cuKernelGetName alone matches every cudaLaunchKernel), and each row not fetched is time saved."""
    if not trace.has("CUPTI_ACTIVITY_KIND_RUNTIME", "nameId"):
        return ""
    ids = [r[0] for r in trace.query("SELECT id FROM main.StringIds WHERE value LIKE '%Launch%'")]
    return f" AND nameId IN ({','.join(map(str, ids))})" if ids else ""


def _calls_in_rounds(trace: Trace, rounds: RangeSet) -> _Calls:
    """One scan of CUPTI_ACTIVITY_KIND_RUNTIME restricted to the rounds' threads and time span (cheap
    filters on the raw columns; the export has no index to seek with), then the round of each call by
    searchsorted. Nothing is materialised: a temp table keyed by id cost more than the whole scan."""
    threads = sorted(rounds.threads)
    thread = trace.ordinal_sql("globalTid", threads)
    launch = _launch_name_filter(trace)
    cid, start, *ordinal = trace.scan_columns(
        ["correlationId", "start", *([thread] if thread else [])],
        "CUPTI_ACTIVITY_KIND_RUNTIME",
        f"globalTid IN ({','.join(map(str, threads))}) AND correlationId IS NOT NULL "
        f"AND start BETWEEN {int(rounds.start.min())} AND {int(rounds.end.max())}{launch}",
    )
    gtid = np.asarray(threads, dtype=np.int64)[ordinal[0]] if ordinal else np.full(len(cid), threads[0])
    ri = rounds.enclosing(gtid, start)
    inside = ri >= 0
    cid, gtid, start, ri = cid[inside], gtid[inside], start[inside], ri[inside]
    if not trace.has("CUPTI_ACTIVITY_KIND_KERNEL", "globalPid"):
        return _Calls(cid, np.zeros(len(cid), dtype=np.int64), gtid, start, ri, None)
    pid = (gtid >> 24) & 0xFFFFFF
    pids = [int(p) for p in _distinct(pid)]
    proc = np.searchsorted(np.asarray(pids, dtype=np.int64), pid)
    return _Calls(cid, proc, gtid, start, ri, pids)


def _kernels_of(trace: Trace, calls: _Calls, graph: bool) -> tuple[np.ndarray, ...]:
    """(call index, start, duration, graphNodeId or -1) of the kernels launched by `calls`: one scan of
    the kernel table, pre-filtered to the calls' correlation ids (their span when many) and processes,
    joined in numpy."""
    if not len(calls.cid):
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, empty
    if len(calls.cid) <= IN_LIST_MAX:  # CUDA graphs: a few launch calls per round
        where = f"correlationId IN ({','.join(map(str, _distinct(calls.cid).tolist()))})"
    else:
        where = f"correlationId BETWEEN {int(calls.cid.min())} AND {int(calls.cid.max())}"
    exprs = {"cid": "correlationId", "start": "start", "dur": "end - start"}
    if calls.pids is not None:
        kpid = _kernel_pid(trace, "")
        where += f" AND {kpid} IN ({','.join(map(str, calls.pids))})"
        ordinal = trace.ordinal_sql(kpid, calls.pids)
        if ordinal:
            exprs["proc"] = ordinal
    if graph:
        exprs["node"] = "COALESCE(graphNodeId, -1)"
    got = trace.scan_columns(list(exprs.values()), "CUPTI_ACTIVITY_KIND_KERNEL", where)
    cols = dict(zip(exprs, got, strict=True))
    key = (cols["proc"] << 32) + cols["cid"] if "proc" in cols else cols["cid"]
    node = cols.get("node", np.full(len(key), -1, dtype=np.int64))
    call_keys = calls.key()
    order = np.argsort(call_keys, kind="stable")  # calls come in time order: nearly sorted, cheap
    sorted_keys = call_keys[order]
    pos = np.minimum(np.searchsorted(sorted_keys, key), len(order) - 1)
    hit = sorted_keys[pos] == key
    return order[pos[hit]], cols["start"][hit], cols["dur"][hit], node[hit]


def _graph_points(
    trace: Trace, calls: _Calls, call: np.ndarray, node: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int]:
    """Attribution point (thread, time) of each kernel: its launch call, or for a graph replay the
    capture-time creation of its node (-1, -1 when the report lacks it), resolved once per distinct node.
    Also returns how many distinct replayed nodes have no capture-time creation event."""
    ag, at = calls.gtid[call], calls.start[call]
    replay = node >= 0
    if not replay.any():
        return ag, at, 0
    nodes, inverse = np.unique(node[replay], return_inverse=True)
    proc = calls.proc[call[replay]]
    pairs = np.arange(len(nodes))
    if proc.any():  # several processes (node ids restart in each): distinct (process, node) pairs
        pairs, inverse = np.unique(proc * len(nodes) + inverse, return_inverse=True)
    points = [
        _capture_point(trace, None if calls.pids is None else calls.pids[p], int(nodes[n])) or (-1, -1)
        for p, n in zip((pairs // len(nodes)).tolist(), (pairs % len(nodes)).tolist(), strict=True)
    ]
    pg, pt = np.array(points, dtype=np.int64).reshape(-1, 2).T
    ag, at = ag.copy(), at.copy()
    ag[replay], at[replay] = pg[inverse], pt[inverse]
    return ag, at, int((pg < 0).sum())


def _kernel_rounds(trace: Trace, names: RangeNames, graph: bool) -> tuple[RoundTable, list[str]]:
    method = "graph" if graph else "eager"
    rounds, warnings = _round_set(trace, names)
    if not len(rounds):
        return _empty_table(method), warnings
    calls = _calls_in_rounds(trace, rounds)
    call, ks, dur, node = _kernels_of(trace, calls, graph)
    # Round of a kernel: the round enclosing its launch call. Indexer/step: the range enclosing its
    # attribution point (launch call, or the capture-time creation of its graph node).
    ri = calls.round[call]
    if graph:
        ag, at, unresolved = _graph_points(trace, calls, call, node)
    else:
        ag, at, unresolved = calls.gtid[call], calls.start[call], 0
    ke = ks + dur
    point_threads = [int(g) for g in _distinct(ag) if g >= 0]
    children = trace.range_columns_multi(
        names.domain, [names.step_range, names.indexer_range], gtids=point_threads
    )
    indexer = RangeSet.build(*children[names.indexer_range])
    steps = RangeSet.build(*children[names.step_range])
    ii = indexer.enclosing(ag, at)
    si = steps.enclosing(ag, at)
    n = len(rounds)
    has_kernels = np.bincount(ri, minlength=n) > 0
    is_idx = ii >= 0
    launches = _distinct_per_round(ri, ii, n)
    forwards = _distinct_per_round(ri, si, n)
    kernels = np.bincount(ri[is_idx], minlength=n)
    gpu = np.bincount(ri[is_idx], weights=dur[is_idx], minlength=n).astype(np.int64)
    first_k = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    last_k = np.zeros(n, dtype=np.int64)
    np.minimum.at(first_k, ri, ks)
    np.maximum.at(last_k, ri, ke)
    span = np.where(has_kernels, last_k - first_k, 0)
    lost = int((ag < 0).sum())
    if graph and (unresolved or lost):
        warnings.append(
            f"{lost} kernel(s) in rounds replay graph nodes without a capture-time creation event in the "
            f"report ({unresolved} node(s); capture before the profile started?): they are not attributed"
        )
    empty = int((~has_kernels).sum())
    if empty:
        warnings.append(
            f"{empty} {names.round_range!r} range(s) launched no kernels (graph capture or warm-up) and were "
            f"left out of the {method} count"
        )
    keep = has_kernels
    table = _table(
        trace,
        rounds.gtid[keep],
        rounds.start[keep],
        rounds.end[keep],
        forwards[keep],
        launches[keep],
        kernels[keep],
        gpu[keep],
        method,
        span[keep],
    )
    return table, warnings


# ---- classifier (no NVTX) ---------------------------------------------------------------------


def matches_kernel(name: str, patterns: Sequence[str]) -> bool:
    """The classifier's name rule in Python (for one name at a time, e.g. a timeline): a pattern is a
    case-insensitive substring, or with a leading '=' the whole name."""
    low = name.lower()
    return any(low == p[1:].lower() if p.startswith("=") else p.lower() in low for p in patterns)


def _name_ids(trace: Trace, patterns: Sequence[str]) -> list[int]:
    """StringIds matching any pattern (matches_kernel's rule), looked up once per pattern."""
    ids: set[int] = set()
    for pat in patterns:
        if pat.startswith("="):
            sql, arg = "SELECT id FROM main.StringIds WHERE lower(value) = lower(?)", pat[1:]
        else:
            sql, arg = "SELECT id FROM main.StringIds WHERE instr(lower(value), lower(?)) > 0", pat
        ids.update(r[0] for r in trace.query(sql, (arg,)))
    return sorted(ids)


def _name_flag(trace: Trace, table: str, patterns: Sequence[str]) -> str:
    """SQL flag (1/0) of a kernel `k` whose shortName or demangledName matches: a temp table of ids."""
    trace.con.execute(f"DROP TABLE IF EXISTS temp.{table}")
    trace.con.execute(f"CREATE TEMP TABLE {table} (id INTEGER PRIMARY KEY)")
    trace.con.executemany(f"INSERT INTO temp.{table} VALUES (?)", [(i,) for i in _name_ids(trace, patterns)])
    demangled = (
        f" OR k.demangledName IN (SELECT id FROM temp.{table})"
        if trace.has("CUPTI_ACTIVITY_KIND_KERNEL", "demangledName")
        else ""
    )
    return f"CASE WHEN k.shortName IN (SELECT id FROM temp.{table}){demangled} THEN 1 ELSE 0 END"


@dataclass
class _Launches:
    """Per graph launch (one cudaGraphLaunch call of one process), in (pid, correlationId) order."""

    gtid: np.ndarray
    n_kernels: np.ndarray
    idx_kernels: np.ndarray  # kernels matched by the indexer patterns
    anchors: np.ndarray  # indexer kernels that are one per indexer call (the logits kernel)
    groups: np.ndarray  # runs of indexer kernels (fallback count when there are no anchors)
    forwards: np.ndarray  # model forwards: token-embedding lookups
    gpu_ns: np.ndarray
    start: np.ndarray
    end: np.ndarray


def _graph_launches(
    trace: Trace,
    patterns: Sequence[str],
    anchors: Sequence[str],
    forward_kernels: Sequence[str],
    max_gap: int,
) -> _Launches | None:
    """One query over the kernels that cudaGraphLaunch calls replayed, counted per launch in numpy;
    None when the report has no graph launch or its launches ran no kernels."""
    launch_ids = [
        r[0] for r in trace.query("SELECT id FROM main.StringIds WHERE value LIKE 'cudaGraphLaunch%'")
    ]
    if not launch_ids:
        return None
    is_idx = _name_flag(trace, "kit_names", patterns)
    is_anchor = _name_flag(trace, "kit_anchors", anchors)
    is_fwd = _name_flag(trace, "kit_forwards", forward_kernels)
    rt = runtime_table(trace)
    kpid = _kernel_pid(trace, "k")
    gtid, cid, ks, ke, f_idx, f_anchor, f_fwd = trace.concat_columns(
        ["rt.gtid", "rt.cid", "k.start", "k.end", is_idx, is_anchor, is_fwd],
        f"FROM main.CUPTI_ACTIVITY_KIND_KERNEL k "
        f"JOIN temp.{rt} rt ON rt.cid = k.correlationId AND rt.pid IS {kpid} "
        f"WHERE rt.name_id IN ({','.join('?' * len(launch_ids))})",
        launch_ids,
    )
    if not len(ks):
        return None
    pid = (gtid >> 24) & 0xFFFFFF
    order = np.lexsort((ks, cid, pid))
    gtid, cid, ks, ke, pid = gtid[order], cid[order], ks[order], ke[order], pid[order]
    idx = f_idx[order] > 0
    anchor = idx & (f_anchor[order] > 0)  # an anchor counts only where the indexer patterns match too
    fwd = f_fwd[order] > 0
    new_launch = np.ones(len(ks), dtype=bool)
    new_launch[1:] = (cid[1:] != cid[:-1]) | (pid[1:] != pid[:-1])
    lid = np.cumsum(new_launch) - 1
    first = np.flatnonzero(new_launch)
    n = len(first)
    # Gap grouping: consecutive indexer kernels (at most max_gap others between) form one call.
    pos = np.arange(len(ks)) - first[lid]
    idx_l, idx_p = lid[idx], pos[idx]
    new_group = np.ones(len(idx_l), dtype=bool)
    new_group[1:] = (idx_l[1:] != idx_l[:-1]) | (idx_p[1:] - idx_p[:-1] - 1 > max_gap)
    return _Launches(
        gtid=gtid[first],
        n_kernels=np.bincount(lid, minlength=n),
        idx_kernels=np.bincount(idx_l, minlength=n),
        anchors=np.bincount(lid[anchor], minlength=n),
        groups=np.bincount(idx_l[new_group], minlength=n),
        forwards=np.bincount(lid[fwd], minlength=n),
        gpu_ns=np.bincount(idx_l, weights=(ke - ks)[idx], minlength=n).astype(np.int64),
        start=np.minimum.reduceat(ks, first),
        end=np.maximum.reduceat(ke, first),
    )


def _draft_graph(launches: _Launches, graph_kernels: int | None) -> tuple[np.ndarray, list[str], str | None]:
    """Which launches replay the draft loop: (mask, warnings, inconclusive reason).

    Graph kinds are told apart by kernels per launch (one kind per captured graph; batch-size variants of
    one graph usually share it). Without NVTX the draft loop is recognised by what the bug cannot change:
    it is the only graph that runs the model more than once per launch (num_steps - 1 forwards, counted as
    token-embedding lookups); the target-verify and draft-extend graphs run one forward. Indexer counts
    cannot pick it: they are the quantity under test and differ between bug and fix.
    """
    holds = launches.idx_kernels > 0
    warnings: list[str] = []
    if graph_kernels is not None:
        keep = holds & (launches.n_kernels == graph_kernels)
        reason = f"classifier: no graph launch of {graph_kernels} kernels holds indexer kernels"
        return keep, warnings, None if keep.any() else reason
    kinds = sorted({int(x) for x in launches.n_kernels[holds]})
    fwd = {k: int(np.median(launches.forwards[holds & (launches.n_kernels == k)])) for k in kinds}
    multi = [k for k in kinds if fwd[k] > 1]
    described = ", ".join(f"{k} kernels/{fwd[k]} forward(s)" for k in kinds[:8])
    if len(kinds) <= 1:
        if kinds and fwd[kinds[0]] <= 1 and launches.forwards.any():
            warnings.append(
                f"classifier: the only graph holding indexer kernels ({described}) runs at most one model "
                "forward per launch: it may be a target-verify graph, not the draft loop"
            )
        return holds, warnings, None
    if not multi:
        reason = (
            f"classifier: {len(kinds)} kinds of graph launches hold indexer kernels ({described}) and "
            "none runs several model forwards (token-embedding lookups); without NVTX the draft-loop graph "
            "cannot be told from verify/extend graphs: pass graph_kernels=N"
        )
        return holds, warnings, reason
    keep = holds & np.isin(launches.n_kernels, multi)
    left = sorted(set(kinds) - set(multi))
    warnings.append(
        f"classifier: draft-loop graph = the launches running several model forwards "
        f"({', '.join(f'{k} kernels/{fwd[k]} forwards' for k in multi)}); left out "
        f"{int((holds & ~keep).sum())} launch(es) of one-forward graphs with indexer kernels "
        f"({', '.join(f'{k} kernels' for k in left)}: target verify / draft extend)"
    )
    if len({fwd[k] for k in multi}) > 1:
        warnings.append("classifier: draft-loop graphs with different forward counts: check graph_kernels")
    return keep, warnings, None


def classifier_rounds(
    trace: Trace,
    patterns: tuple[str, ...] = DEFAULT_INDEXER_KERNELS,
    *,
    max_gap: int = 4,
    graph_kernels: int | None = None,
    anchors: tuple[str, ...] = DEFAULT_INDEXER_ANCHORS,
    forward_kernels: tuple[str, ...] = DEFAULT_FORWARD_KERNELS,
) -> tuple[RoundTable, list[str], str | None]:
    """No NVTX: rounds = replays of the draft-loop CUDA graph (see _draft_graph; `graph_kernels` picks it
    by kernel count instead), indexer calls = the `anchors` kernels in it (one logits kernel per call:
    robust to whatever interleaves with the call), or, when the report has none, runs of `patterns`
    kernels with at most `max_gap` others inside one call. indexer_kernels counts every `patterns` match."""
    if not patterns:
        raise KitError("the classifier needs at least one indexer kernel name")
    warnings = [
        "classifier: no NVTX; indexer launches inferred from kernel names "
        f"({', '.join(patterns)}) and rounds from CUDA-graph launches"
    ]
    launches = None
    if trace.has_runtime:
        launches = _graph_launches(trace, patterns, anchors, forward_kernels, max_gap)
    if launches is None:
        has_launch = trace.has_runtime and trace.query(
            "SELECT 1 FROM main.StringIds WHERE value LIKE 'cudaGraphLaunch%' LIMIT 1"
        )
        reason = (
            "classifier: graph launches ran no kernels in the report"
            if has_launch
            else "classifier: no cudaGraphLaunch calls to delimit rounds (an eager run needs NVTX ranges)"
        )
        return _empty_table("classifier"), warnings, reason
    keep, more, inconclusive = _draft_graph(launches, graph_kernels)
    warnings += more
    if launches.anchors[keep].any():
        counts = launches.anchors
    else:
        counts = launches.groups
        if keep.any():
            warnings.append(
                f"classifier: no indexer anchor kernel ({', '.join(anchors)}) in the rounds: indexer calls "
                f"counted as runs of indexer kernels (at most {max_gap} other kernels inside one call)"
            )
    forwards = launches.forwards[keep] if launches.forwards[keep].any() else None
    warnings.append("classifier: round_ns is the GPU span of the graph launch's kernels")
    span = (launches.end - launches.start)[keep]
    table = _table(
        trace,
        launches.gtid[keep],
        launches.start[keep],
        launches.end[keep],
        forwards,
        counts[keep],
        launches.idx_kernels[keep],
        launches.gpu_ns[keep],
        "classifier",
        span,
    )
    return table, warnings, inconclusive


# ---- output -----------------------------------------------------------------------------------


def rows_to_csv(rows: Sequence[dict]) -> str:
    """rounds.csv text: ROUND_COLUMNS, empty cells for what a method cannot know (None)."""
    if isinstance(rows, RoundTable):  # by column, one %-format per row: ~2x faster than csv.writer
        n = len(rows)
        specs, live = [], []
        for c in ROUND_COLUMNS:
            values = rows.column(c)
            nones = values.count(None)
            if n and nones == n:  # a column the method cannot know: inline empty cells
                specs.append("")
                continue
            specs.append("%s")
            live.append(["" if v is None else v for v in values] if nones else values)
        fmt = ",".join(specs)
        body = [fmt % row for row in zip(*live, strict=True)]
        return "\n".join([",".join(ROUND_COLUMNS), *body]) + "\n"
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(ROUND_COLUMNS)
    writer.writerows([r.get(c) for c in ROUND_COLUMNS] for r in rows)
    return buf.getvalue()
