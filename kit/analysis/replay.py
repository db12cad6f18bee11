"""Draft rounds run as CUDA-graph replays that the trace cannot lead back to capture time.

A PyTorch-profiler (Kineto) trace ties every replayed kernel to its cudaGraphLaunch call (the correlation
id; newer Kineto also writes `graph id` and `graph node id`) but records no graph-node creation, so the
capture-time ranges the nsys graph method joins against are out of reach. The round is still exact: the
`draft_round` range enclosing the graph-launch call. Inside it the indexer calls are counted as the
classifier counts them (kit.analysis.classifier): one anchor kernel -- the indexer's logits kernel -- per
call, or runs of indexer kernels where there is no anchor; model forwards as token-embedding lookups. So on
a round that is one replay of the draft-loop graph this method and the classifier agree by construction,
and unlike the classifier it needs no guess of which graph is the draft loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kit.analysis.classifier import (
    DEFAULT_FORWARD_KERNELS,
    DEFAULT_INDEXER_ANCHORS,
    DEFAULT_INDEXER_KERNELS,
    _graph_launches,
)
from kit.trace.source import TraceSource


@dataclass
class ReplayCounts:
    """Per round: what its graph replays ran, counted by kernel name."""

    launches: np.ndarray  # indexer calls
    forwards: np.ndarray  # model forwards (token-embedding lookups)
    kernels: np.ndarray  # indexer kernels
    gpu_ns: np.ndarray  # their GPU time
    replays: np.ndarray  # graph launches that ran kernels
    anchored: bool  # counted by anchor kernels (else by runs of indexer kernels)


def replay_counts(
    trace: TraceSource,
    n_rounds: int,
    call_key: np.ndarray,
    call_round: np.ndarray,
    pids: list[int] | None,
    *,
    patterns: Sequence[str] = DEFAULT_INDEXER_KERNELS,
    anchors: Sequence[str] = DEFAULT_INDEXER_ANCHORS,
    forward_kernels: Sequence[str] = DEFAULT_FORWARD_KERNELS,
    max_gap: int = 4,
) -> ReplayCounts:
    """Counts of the graph launches among the rounds' launch calls (`call_key`: process ordinal among
    `pids` << 32 | correlation id, `call_round`: the round of each call)."""
    zero = np.zeros(n_rounds, dtype=np.int64)
    launches = _graph_launches(trace, patterns, anchors, forward_kernels, max_gap)
    if launches is None or not len(call_key):
        return ReplayCounts(zero, zero, zero, zero, zero, True)
    proc = np.zeros(len(launches.pid), dtype=np.int64)
    if pids is not None:
        known = np.asarray(pids, dtype=np.int64)
        pos = np.minimum(np.searchsorted(known, launches.pid), len(known) - 1)
        proc = np.where(known[pos] == launches.pid, pos, -1)
    key = (proc << 32) + launches.cid
    order = np.argsort(call_key, kind="stable")
    at = np.minimum(np.searchsorted(call_key[order], key), len(order) - 1)
    hit = (call_key[order][at] == key) & (proc >= 0)
    ri = call_round[order[at[hit]]]
    anchored = bool(launches.anchors[hit].any())
    calls = launches.anchors if anchored else launches.groups

    def per_round(values: np.ndarray) -> np.ndarray:
        return np.bincount(ri, weights=values[hit], minlength=n_rounds).astype(np.int64)

    return ReplayCounts(
        launches=per_round(calls),
        forwards=per_round(launches.forwards),
        kernels=per_round(launches.idx_kernels),
        gpu_ns=per_round(launches.gpu_ns),
        replays=np.bincount(ri, minlength=n_rounds),
        anchored=anchored,
    )
