"""What fills an nsys report: rows per table, and the CUDA runtime calls recorded outside the probe's ranges.

Why: the reports a reviewer should open did not shrink when their window went from 10 draft steps to 3
(issue 33 item 6). A report holds everything from the first cudaProfilerStart (graph capture) to its stop,
so its size follows the time collected, not the steps analysed; this says where its rows come from."""

from __future__ import annotations

import bisect
from collections import Counter
from pathlib import Path
from typing import Any

from kit.probe import ranges as nr
from kit.trace.sqlite import connect_ro, table_columns

PROBE_RANGES = (nr.ROUND, nr.STEP, nr.INDEXER, nr.EXTEND, nr.VERIFY, nr.PREFILL, nr.GRAPH_CAPTURE)
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"


def _union(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def composition(path: Path, top: int = 8) -> dict[str, Any]:
    """Rows of the `top` largest tables; the runtime calls' span (s); how many start inside a probe range
    (nr: rounds, steps, verify, extend, prefill, capture) and the most frequent outside; the longest time
    with no probe range open (s)."""
    con = connect_ro(Path(path))
    tables = sorted(table_columns(con))
    rows = {t: con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}
    out: dict[str, Any] = {
        "tables": dict(sorted(((t, n) for t, n in rows.items() if n), key=lambda x: (-x[1], x[0]))[:top])
    }
    if not rows.get(RUNTIME):
        return out
    names = dict(con.execute("SELECT id, value FROM StringIds"))
    marks = ",".join("?" * len(PROBE_RANGES))
    spans = _union(
        [
            (s, e)
            for s, e in con.execute(
                f"SELECT n.start, n.end FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId "
                f"WHERE s.value IN ({marks}) AND n.end IS NOT NULL",
                PROBE_RANGES,
            )
        ]
    )
    starts = [s for s, _ in spans]
    calls = list(con.execute(f'SELECT start, end, nameId FROM "{RUNTIME}" ORDER BY start'))
    outside: Counter[str] = Counter()
    for s, _, name in calls:
        i = bisect.bisect_right(starts, s) - 1
        if i < 0 or s > spans[i][1]:
            outside[names.get(name, str(name))] += 1
    first, last = calls[0][0], max(e for _, e, _ in calls)
    gaps, since = [], first  # since: where the last probe range (clipped to the calls' span) ended
    for s, e in spans:
        if e > since and s < last:
            gaps.append(max(0, s - since))
            since = min(e, last)
    gaps.append(last - since)
    out.update(
        {
            "runtime_calls": len(calls),
            "span_s": round((last - first) / 1e9, 3),
            "outside_probe_ranges": sum(outside.values()),
            "outside_top": dict(outside.most_common(5)),
            "longest_gap_s": round(max(gaps, default=0) / 1e9, 3),
        }
    )
    return out
