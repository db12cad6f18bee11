"""Where in a decode round the indexer runs: its launches counted inside each kind of probe range.

The verdict counts launches inside draft rounds only. A release that moved the indexer out of the draft
loop (sglang 0.5.15+ seeds it from the draft-extend forward) shows 0 there, and a reviewer then asks where
the call went. Each range of a kind (draft_round, draft_extend, verify) gets the indexer calls whose
launch call sits inside it on its thread: graph launches by the anchor kernels they replay (one logits
kernel per indexer call), eager code by the probe's own `indexer` ranges nested in it.
"""

from __future__ import annotations

from collections import Counter
from functools import partial

import numpy as np

from kit.analysis.classifier import kernel_name_flag
from kit.probe.ranges import DOMAIN
from kit.sglang_src import releases
from kit.trace.source import TraceSource

KINDS = ("draft_round", "draft_extend", "verify")
NOT_RECORDED = -1  # a range inside which the report holds no launch call at all


def _anchor_launches(trace: TraceSource, anchors: tuple[str, ...], patterns: tuple[str, ...]) -> Counter:
    """(gtid, correlation id) of each graph launch -> the anchor kernels it replayed."""
    glk = trace.graph_launch_kernels() if trace.has_runtime else None
    if glk is None or not len(glk.cid):
        return Counter()
    flag = partial(kernel_name_flag, trace, glk.name, glk.alt_name)
    hit = flag(anchors) & flag(patterns)  # an anchor counts only where the indexer patterns match too
    return Counter(zip(glk.gtid[hit].tolist(), glk.cid[hit].tolist(), strict=True))


def indexer_placement(
    trace: TraceSource,
    kinds: tuple[str, ...] = KINDS,
    anchors: tuple[str, ...] = releases.INDEXER_ANCHORS,
    patterns: tuple[str, ...] = releases.INDEXER_KERNELS,
) -> dict[str, dict[int, int]]:
    """{range kind: {indexer calls in one range: how many ranges}} over the whole report (every window,
    warm-up included), the calls being graph-replayed anchor kernels plus eager `indexer` ranges. A range
    with no launch call recorded inside (nsys traced CUDA only in its capture windows) is not a 0: its key
    is NOT_RECORDED."""
    names = [*kinds, "indexer"]
    cols = trace.range_columns_multi(DOMAIN, names)
    ig, ia, _ = cols["indexer"]
    launched = _anchor_launches(trace, anchors, patterns)
    calls: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # per thread: its launch calls' (start, count)
    for gt in {int(x) for k in kinds for x in cols[k][0]}:
        cid, start, _ = trace.launch_calls([gt], 0, np.iinfo(np.int64).max)
        order = np.argsort(start, kind="stable")
        counts = np.array([launched.get((gt, c), 0) for c in cid[order].tolist()], dtype=np.int64)
        calls[gt] = (start[order], counts)
    out: dict[str, dict[int, int]] = {}
    for kind in kinds:
        g, start, end = cols[kind]
        per: Counter = Counter()
        stops = (end if end is not None else start).tolist()
        for gt, a, b in zip(g.tolist(), start.tolist(), stops, strict=True):
            if b < 0:  # open at the report's end
                continue
            eager = int(((ig == gt) & (ia >= a) & (ia <= b)).sum())
            at, counts = calls[gt]
            lo, hi = np.searchsorted(at, a, "left"), np.searchsorted(at, b, "right")
            if not eager and lo == hi:
                per[NOT_RECORDED] += 1
                continue
            per[eager + int(counts[lo:hi].sum())] += 1
        out[kind] = dict(sorted(per.items()))
    return out
