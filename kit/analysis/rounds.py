"""The round table (one row per draft round) and the range sets the attributions count with.

Ranges come out of a trace source as numpy columns and nesting is a searchsorted per thread, so a
million-range report needs no Python object per range. Counting is per process (TP rank): rows carry
pid and `proc`, the process ordinal by pid, and rounds are numbered per process in time order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from kit.probe import ranges as nvtx_ranges
from kit.trace.source import TraceSource, distinct

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


@dataclass(frozen=True)
class RangeNames:
    """Which NVTX domain and range names mean round / step / indexer (our probes' names by default)."""

    domain: str = nvtx_ranges.DOMAIN
    round_range: str = nvtx_ranges.ROUND
    step_range: str = nvtx_ranges.STEP
    indexer_range: str = nvtx_ranges.INDEXER


DEFAULT_NAMES = RangeNames()


class RoundTable(Sequence):
    """Rows stored by column (a million-range report yields a hundred thousand rounds); indexing gives a
    row dict."""

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

    def subset(self, keep: list[int]) -> RoundTable:
        """The rows at these indices, in this order."""
        return RoundTable({c: [v[i] for i in keep] for c, v in self.columns.items()})


def empty_table() -> RoundTable:
    return RoundTable({c: [] for c in ROUND_COLUMNS})


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
        if not (one_thread and np.all(start[1:] >= start[:-1])):  # reports are usually in start order
            order = np.lexsort((start, gtid))
            gtid, start, end = gtid[order], start[order], end[order]
        uniq, first, counts = np.unique(gtid, return_index=True, return_counts=True)
        threads = {int(g): slice(int(f), int(f + c)) for g, f, c in zip(uniq, first, counts, strict=True)}
        return cls(gtid, start, end, threads)

    @classmethod
    def starts_only(cls, gtid: np.ndarray, start: np.ndarray, _end: object = None) -> RangeSet:
        """A RangeSet for counting starts only (ends not fetched: they cost a column of the scan)."""
        return cls.build(gtid, start, np.full(len(start), -1, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.start)

    def count_starting_in(self, gtid: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """For each (thread, [lo, hi)): how many of these ranges start inside it on that thread."""
        out = np.zeros(len(lo), dtype=np.int64)
        for g in distinct(gtid):
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
        for g in distinct(gtid):
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


def round_set(trace: TraceSource, names: RangeNames) -> tuple[RangeSet, list[str]]:
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


def make_table(
    trace: TraceSource,
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
    """Number rounds per process in time order and compute the derived columns; None where the method
    cannot know a column."""
    pid, tid = trace.pid_tid(rounds_gtid)
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
