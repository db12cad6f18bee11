"""Per-draft-round attribution of indexer launches, by NVTX nesting or through the kernels' launches.

Methods, in order of trust:
  graph       a replayed kernel -> its graph node -> the node it was cloned from, to the end of the chain
              -> that node's capture-time creation event -> the capture-time NVTX ranges on its thread
              (inside a CUDA graph NVTX exists only at capture time); the round is the `draft_round` range
              enclosing the kernel's graph-launch call
  eager       kernel -> its launching runtime call (correlation id) -> the NVTX ranges on the same thread
              enclosing the call
  replay      eager, plus rounds whose draft loop is a CUDA-graph replay the report cannot lead back to
              capture time (a PyTorch-profiler trace): their indexer calls counted by kernel name inside the
              round (kit.analysis.replay)
  nvtx        CPU only: indexer/step ranges that start inside a round on the same thread (no kernels)
  classifier  no NVTX: kit.analysis.classifier
A round's indexer launches are the distinct indexer ranges its kernels are attributed to. Rounds counted
from ranges that all read 0 are judged only where the report holds an indexer range somewhere (the rule and
why: kit.analysis.verdict); a name that matches nothing is inconclusive, naming the ranges present.

The kernel methods read each big table once: the launch calls on the rounds' threads within their span,
then the kernels of those calls, joined on (process, correlation id) in numpy; graph nodes are resolved
once per node. Everything is asked of the trace source (kit.trace.source), never of its tables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kit.analysis.classifier import DEFAULT_INDEXER_KERNELS, classifier_rounds
from kit.analysis.replay import ReplayCounts, replay_counts
from kit.analysis.rounds import (
    DEFAULT_NAMES,
    RangeNames,
    RangeSet,
    RoundTable,
    empty_table,
    make_table,
    round_set,
)
from kit.errors import TraceError, UsageError
from kit.trace.source import NvtxStatus, TraceSource, distinct

METHODS = ("auto", "nvtx", "eager", "graph", "replay", "classifier")


@dataclass
class Attribution:
    """Rows plus everything the verdict must say about how they were obtained."""

    rows: RoundTable
    method: str
    warnings: list[str] = field(default_factory=list)
    inconclusive: str | None = None
    nvtx: NvtxStatus | None = None


def choose_method(trace: TraceSource, names: RangeNames = DEFAULT_NAMES) -> str:
    """graph if replayed kernels name their graph node, else replay if they lead only to their graph launch,
    else eager if kernels exist, else nvtx; classifier when the report has kernels but no range of the
    domain."""
    status = trace.nvtx_status(names.domain)
    if status.has_ranges:
        if trace.has_runtime and trace.has_graph_replays:
            return "graph"
        if trace.has_runtime and trace.has_kernels:
            return "replay" if trace.has_unlinked_graph_replays else "eager"
        return "nvtx"
    if trace.has_kernels:
        return "classifier"
    return "nvtx"


def attribute(
    trace: TraceSource,
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
        raise UsageError(f"unknown attribution method {method!r}: use one of {', '.join(METHODS)}")
    status = trace.nvtx_status(names.domain)
    chosen = choose_method(trace, names) if method == "auto" else method
    if chosen in ("eager", "graph", "replay", "classifier") and not trace.has_kernels:
        raise TraceError(
            f"method {chosen!r} needs CUDA kernels, but {trace.path} has no CUPTI_ACTIVITY_KIND_KERNEL rows",
            path=trace.path,
        )
    if chosen in ("eager", "graph", "replay") and not trace.has_runtime:
        raise TraceError(
            f"method {chosen!r} needs CUPTI_ACTIVITY_KIND_RUNTIME rows, which {trace.path} lacks",
            path=trace.path,
        )
    if chosen == "graph" and not trace.has_graph_nodes:
        raise TraceError(
            "method 'graph' needs CUDA_GRAPH_NODE_EVENTS (profile with --cuda-graph-trace=node)",
            path=trace.path,
        )

    warnings: list[str] = list(trace.warnings)
    inconclusive = None
    by_name = 0  # rounds whose indexer calls were counted by kernel name, not by indexer ranges
    if chosen == "nvtx":
        rows, more = nvtx_rounds(trace, names)
    elif chosen == "eager":
        rows, more = eager_rounds(trace, names)
    elif chosen == "graph":
        rows, more = graph_rounds(trace, names)
    elif chosen == "replay":
        rows, more, by_name = replay_rounds(
            trace, names, indexer_kernels or DEFAULT_INDEXER_KERNELS, max_gap=max_gap
        )
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
            f"no ranges of domain {names.domain!r} in {where} "
            f"(domains present: {', '.join(trace.domains()) or 'none'}); {trace.ranges_hint}"
        )
    elif (
        chosen in ("replay", "classifier")
        and inconclusive is None
        and (unknown := _unknown_indexer_kernels(trace, indexer_kernels or DEFAULT_INDEXER_KERNELS))
    ):
        inconclusive = unknown
    elif not len(rows) and inconclusive is None:
        inconclusive = (
            f"no {names.round_range!r} rounds found (method {chosen}); {present_ranges(trace, names.domain)}"
        )
    elif chosen == "nvtx" and inconclusive is None and not any(rows.column("draft_forwards")):
        inconclusive = (
            f"no {names.step_range!r} range inside any {names.round_range!r}: either the rounds are "
            "CUDA-graph replays, whose draft steps and indexer calls run on the GPU, and the report has no "
            "kernels to count them by (profile GPU activity: nsys --trace=cuda, or the PyTorch profiler's "
            f"CUDA activity), or the range name matches none; {present_ranges(trace, names.domain)}"
        )
    elif (
        chosen != "classifier"
        and inconclusive is None
        and not by_name
        and not any(rows.column("indexer_launches"))
        and not trace.has_range(names.domain, names.indexer_range)
    ):
        inconclusive = (
            f"no {names.indexer_range!r} range anywhere in the report, so 0 launches per round cannot be "
            "told from indexer ranges that were never recorded (or a range name that matches none); "
            f"{present_ranges(trace, names.domain)}"
        )
    n_pids = len(set(rows.column("pid")))
    if n_pids > 1:
        warnings.append(f"{n_pids} processes (TP ranks): rounds are counted per pid, see columns proc/pid")
    return Attribution(rows=rows, method=chosen, warnings=warnings, inconclusive=inconclusive, nvtx=status)


def present_ranges(trace: TraceSource, domain: str) -> str:
    """The ranges of `domain` the report does hold, for a message about names that matched none."""
    found = trace.range_names(domain)
    listed = ", ".join(f"{n} x {c}" for n, c in found.items())
    return f"ranges of domain {domain!r} in the report: {listed or 'none'}"


# ---- nvtx (CPU only) --------------------------------------------------------------------------


def nvtx_rounds(trace: TraceSource, names: RangeNames = DEFAULT_NAMES) -> tuple[RoundTable, list[str]]:
    """Indexer and step ranges that start inside a round on the same thread; kernels/GPU time empty."""
    rounds, warnings = round_set(trace, names)
    threads = sorted(rounds.threads)
    children = trace.range_columns_multi(
        names.domain, [names.step_range, names.indexer_range], gtids=threads, with_end=False
    )
    steps = RangeSet.starts_only(*children[names.step_range])
    indexer = RangeSet.starts_only(*children[names.indexer_range])
    n_steps = steps.count_starting_in(rounds.gtid, rounds.start, rounds.end)
    n_idx = indexer.count_starting_in(rounds.gtid, rounds.start, rounds.end)
    table = make_table(trace, rounds.gtid, rounds.start, rounds.end, n_steps, n_idx, None, None, "nvtx")
    return table, warnings


# ---- eager and graph (kernels) ----------------------------------------------------------------


def eager_rounds(trace: TraceSource, names: RangeNames = DEFAULT_NAMES) -> tuple[RoundTable, list[str]]:
    """Kernels -> launching runtime call -> NVTX ranges on that thread enclosing the call."""
    return _kernel_rounds(trace, names, graph=False)


def graph_rounds(trace: TraceSource, names: RangeNames = DEFAULT_NAMES) -> tuple[RoundTable, list[str]]:
    """Replayed graph kernels -> capture-time node creation -> capture-time NVTX ranges.

    Kernels launched outside graphs in the same report are attributed eagerly, so a report may mix both.
    """
    return _kernel_rounds(trace, names, graph=True)


def replay_rounds(
    trace: TraceSource,
    names: RangeNames = DEFAULT_NAMES,
    indexer_kernels: tuple[str, ...] = DEFAULT_INDEXER_KERNELS,
    max_gap: int = 4,
) -> tuple[RoundTable, list[str], int]:
    """Eager attribution, plus each round's graph replays counted by kernel name (kit.analysis.replay);
    also how many rounds ran such replays (their count needs no indexer range)."""
    seen: list[ReplayCounts] = []

    def replayed(calls: _Calls, n: int) -> ReplayCounts:
        seen.append(
            replay_counts(
                trace, n, calls.key(), calls.round, calls.pids, patterns=indexer_kernels, max_gap=max_gap
            )
        )
        return seen[-1]

    rows, warnings = _kernel_rounds(trace, names, graph=False, replayed=replayed)
    return rows, warnings, sum(int((c.replays > 0).sum()) for c in seen)


def _unknown_indexer_kernels(trace: TraceSource, patterns: tuple[str, ...]) -> str | None:
    """Methods that count the indexer by kernel name read an indexer whose kernels they do not know as 0
    launches. The target's verify runs the indexer every round, so a trace with no kernel of those names
    anywhere has an indexer the table does not know: inconclusive, not 0."""
    if not trace.has_kernels or trace.kernel_name_ids(patterns):
        return None
    return (
        f"no kernel in the trace is named like the indexer's ({', '.join(patterns)}): an indexer whose "
        "kernels the table does not know would read as 0 launches per round (the mini engine's torch "
        "indexer, for one: run it with --indexer-impl sglang); nothing is judged"
    )


@dataclass
class _Calls:
    """Runtime API calls made on a round's thread inside the round: the launches kernels join to."""

    cid: np.ndarray
    proc: np.ndarray  # ordinal of the call's process in `pids` (0 when kernels do not say their process)
    gtid: np.ndarray
    start: np.ndarray
    round: np.ndarray
    pids: list[int] | None  # None: kernels do not say their process, they join on correlationId only

    def key(self) -> np.ndarray:
        """(process, correlationId) as one integer: correlation ids are per process (CUPTI: 32 bits)."""
        return (self.proc << 32) + self.cid


def _calls_in_rounds(trace: TraceSource, rounds: RangeSet) -> _Calls:
    """The launch calls on the rounds' threads within their span (one scan), then the round of each call
    by searchsorted."""
    cid, start, gtid = trace.launch_calls(
        sorted(rounds.threads), int(rounds.start.min()), int(rounds.end.max())
    )
    ri = rounds.enclosing(gtid, start)
    inside = ri >= 0
    cid, gtid, start, ri = cid[inside], gtid[inside], start[inside], ri[inside]
    if not trace.kernels_have_pid:
        return _Calls(cid, np.zeros(len(cid), dtype=np.int64), gtid, start, ri, None)
    pid, _ = trace.pid_tid(gtid)
    pids = [int(p) for p in distinct(pid)]
    proc = np.searchsorted(np.asarray(pids, dtype=np.int64), pid)
    return _Calls(cid, proc, gtid, start, ri, pids)


def _kernels_of(trace: TraceSource, calls: _Calls, graph: bool) -> tuple[np.ndarray, ...]:
    """(call index, start, duration, graph node or -1) of the kernels launched by `calls`: one scan of the
    kernels, joined to the calls in numpy."""
    if not len(calls.cid):
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, empty
    k = trace.kernels_of(calls.cid, calls.pids, graph)
    key = (k.proc << 32) + k.cid if k.proc is not None else k.cid
    node = k.node if k.node is not None else np.full(len(key), -1, dtype=np.int64)
    call_keys = calls.key()
    order = np.argsort(call_keys, kind="stable")  # calls come in time order: nearly sorted, cheap
    sorted_keys = call_keys[order]
    pos = np.minimum(np.searchsorted(sorted_keys, key), len(order) - 1)
    hit = sorted_keys[pos] == key
    return order[pos[hit]], k.start[hit], k.dur[hit], node[hit]


def _graph_points(
    trace: TraceSource, calls: _Calls, call: np.ndarray, node: np.ndarray
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
        trace.capture_point(None if calls.pids is None else calls.pids[p], int(nodes[n])) or (-1, -1)
        for p, n in zip((pairs // len(nodes)).tolist(), (pairs % len(nodes)).tolist(), strict=True)
    ]
    pg, pt = np.array(points, dtype=np.int64).reshape(-1, 2).T
    ag, at = ag.copy(), at.copy()
    ag[replay], at[replay] = pg[inverse], pt[inverse]
    return ag, at, int((pg < 0).sum())


def _distinct_per_round(round_ix: np.ndarray, item_ix: np.ndarray, n_rounds: int) -> np.ndarray:
    """How many distinct items (e.g. capture-time indexer ranges) each round's kernels map to."""
    ok = (round_ix >= 0) & (item_ix >= 0)
    if not ok.any():
        return np.zeros(n_rounds, dtype=np.int64)
    span = int(item_ix.max()) + 1
    pairs = distinct(round_ix[ok] * span + item_ix[ok])
    return np.bincount(pairs // span, minlength=n_rounds)


def _kernel_rounds(
    trace: TraceSource,
    names: RangeNames,
    graph: bool,
    replayed: Callable[[_Calls, int], ReplayCounts] | None = None,
) -> tuple[RoundTable, list[str]]:
    method = "graph" if graph else "replay" if replayed is not None else "eager"
    rounds, warnings = round_set(trace, names)
    if not len(rounds):
        return empty_table(), warnings
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
    point_threads = [int(g) for g in distinct(ag) if g >= 0]
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
    if replayed is not None:
        counts = replayed(calls, n)
        launches, forwards = launches + counts.launches, forwards + counts.forwards
        kernels, gpu = kernels + counts.kernels, gpu + counts.gpu_ns
        if counts.replays.any():
            warnings.append(
                f"{int((counts.replays > 0).sum())} round(s) ran as CUDA-graph replays the trace cannot lead "
                "back to capture time: their indexer calls are counted by kernel name "
                f"({'one anchor kernel per call' if counts.anchored else 'runs of indexer kernels'})"
            )
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
    table = make_table(
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
