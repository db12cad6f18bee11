"""The NVTX-free attribution: draft rounds and indexer launches recognised from kernel names alone.

Rounds are the replays of the draft-loop CUDA graph, recognised as the graph that runs the model more than
once per launch (token-embedding lookups; `graph_kernels` picks it by kernel count instead); indexer
launches are the anchor kernels in it (the indexer's logits kernel, one per call). Kernel names are
matched by kit.trace.source.matches_kernel's rule; the default names are the releases' (kit.sglang_src).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kit.analysis.rounds import RoundTable, empty_table, make_table
from kit.errors import UsageError
from kit.sglang_src import releases
from kit.trace.source import TraceSource

DEFAULT_INDEXER_KERNELS = releases.INDEXER_KERNELS
DEFAULT_INDEXER_ANCHORS = releases.INDEXER_ANCHORS
DEFAULT_FORWARD_KERNELS = releases.FORWARD_KERNELS


@dataclass
class _Launches:
    """Per graph launch (one graph-launch call of one process), in (pid, correlationId) order."""

    gtid: np.ndarray
    pid: np.ndarray  # process of the launch call
    cid: np.ndarray  # its correlation id
    n_kernels: np.ndarray
    idx_kernels: np.ndarray  # kernels matched by the indexer patterns
    anchors: np.ndarray  # indexer kernels that are one per indexer call (the logits kernel)
    groups: np.ndarray  # runs of indexer kernels (fallback count when there are no anchors)
    forwards: np.ndarray  # model forwards: token-embedding lookups
    gpu_ns: np.ndarray
    start: np.ndarray
    end: np.ndarray


def kernel_name_flag(
    trace: TraceSource, names: np.ndarray, alt: np.ndarray, patterns: Sequence[str]
) -> np.ndarray:
    """True for kernels whose name or alternative name matches a pattern."""
    ids = np.asarray(trace.kernel_name_ids(patterns), dtype=np.int64)
    return np.isin(names, ids) | np.isin(alt, ids)


def _graph_launches(
    trace: TraceSource,
    patterns: Sequence[str],
    anchors: Sequence[str],
    forward_kernels: Sequence[str],
    max_gap: int,
) -> _Launches | None:
    """The kernels graph launches replayed, counted per launch in numpy; None when the report has no graph
    launch or its launches ran no kernels."""
    k = trace.graph_launch_kernels()
    if k is None or not len(k.start):
        return None
    f_idx = kernel_name_flag(trace, k.name, k.alt_name, patterns)
    f_anchor = kernel_name_flag(trace, k.name, k.alt_name, anchors)
    f_fwd = kernel_name_flag(trace, k.name, k.alt_name, forward_kernels)
    gtid, cid, ks, ke = k.gtid, k.cid, k.start, k.end
    pid, _ = trace.pid_tid(gtid)
    order = np.lexsort((ks, cid, pid))
    gtid, cid, ks, ke, pid = gtid[order], cid[order], ks[order], ke[order], pid[order]
    idx = f_idx[order]
    anchor = idx & f_anchor[order]  # an anchor counts only where the indexer patterns match too
    fwd = f_fwd[order]
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
        pid=pid[first],
        cid=cid[first],
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
        keep = launches.n_kernels == graph_kernels
        reason = f"classifier: no graph launch of {graph_kernels} kernels"
        return keep, warnings, None if keep.any() else reason
    every = sorted({int(x) for x in launches.n_kernels})
    fwd = {k: int(np.median(launches.forwards[launches.n_kernels == k])) for k in every}
    multi = [k for k in every if fwd[k] > 1]
    if multi and not (holds & np.isin(launches.n_kernels, multi)).any():
        # a release whose draft loop reuses the target's top-k (0.5.15+): its graph runs no indexer at all
        keep = np.isin(launches.n_kernels, multi)
        warnings.append(
            f"classifier: draft-loop graph = the launches running several model forwards "
            f"({', '.join(f'{k} kernels/{fwd[k]} forwards' for k in multi)}); it holds no indexer kernel: "
            "0 indexer launches per round"
        )
        return keep, warnings, None
    kinds = sorted({int(x) for x in launches.n_kernels[holds]})
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
    trace: TraceSource,
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
        raise UsageError("the classifier needs at least one indexer kernel name")
    warnings = [
        "classifier: no NVTX; indexer launches inferred from kernel names "
        f"({', '.join(patterns)}) and rounds from CUDA-graph launches"
    ]
    launches = None
    if trace.has_runtime:
        launches = _graph_launches(trace, patterns, anchors, forward_kernels, max_gap)
    if launches is None:
        reason = (
            "classifier: graph launches ran no kernels in the report"
            if trace.has_runtime and trace.has_graph_launch_calls()
            else "classifier: no cudaGraphLaunch calls to delimit rounds (an eager run needs NVTX ranges)"
        )
        return empty_table(), warnings, reason
    keep, more, inconclusive = _draft_graph(launches, graph_kernels)
    warnings += more
    if launches.anchors[keep].any():
        counts = launches.anchors
    else:
        counts = launches.groups
        if launches.idx_kernels[keep].any():
            warnings.append(
                f"classifier: no indexer anchor kernel ({', '.join(anchors)}) in the rounds: indexer calls "
                f"counted as runs of indexer kernels (at most {max_gap} other kernels inside one call)"
            )
    forwards = launches.forwards[keep] if launches.forwards[keep].any() else None
    warnings.append("classifier: round_ns is the GPU span of the graph launch's kernels")
    span = (launches.end - launches.start)[keep]
    table = make_table(
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
