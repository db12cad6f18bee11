"""The timeline plot: one draft round drawn as lanes (round, draft steps, indexer ranges, GPU kernels),
counted the way the attribution counts it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from kit.analysis.analyze import find_report
from kit.analysis.attribution import attribute
from kit.analysis.classifier import DEFAULT_INDEXER_KERNELS
from kit.analysis.rounds import DEFAULT_NAMES, RangeNames, RangeSet
from kit.errors import ExistsError, UsageError
from kit.trace.registry import open_trace
from kit.trace.source import TraceSource, matches_kernel


def timeline_png(
    run_dir_or_trace: Path | str | TraceSource,
    out_png: Path | str,
    round_index: int = 1,
    *,
    proc: int = 0,
    method: str = "auto",
    names: RangeNames = DEFAULT_NAMES,
    indexer_kernels: tuple[str, ...] = DEFAULT_INDEXER_KERNELS,
) -> Path:
    """Draw one draft round (round / draft steps / indexer ranges, and GPU kernels when present)."""
    out_png = Path(out_png)
    if out_png.exists():
        raise ExistsError(
            f"{out_png} already exists: refusing to overwrite it (choose another file name)", path=out_png
        )
    if isinstance(run_dir_or_trace, TraceSource):
        return _draw(run_dir_or_trace, out_png, round_index, proc, method, names, indexer_kernels)
    src = Path(run_dir_or_trace)
    report = find_report(src) if src.is_dir() else src
    with open_trace(report) as trace:
        return _draw(trace, out_png, round_index, proc, method, names, indexer_kernels)


def _round_kernels(
    trace: TraceSource,
    method: str,
    names: RangeNames,
    indexer_kernels: tuple[str, ...],
    gtid: int | None,
    start: int,
    end: int,
) -> list[tuple[int, int, bool]]:
    """(start, end, is indexer) of the kernels launched by the round's thread inside the round: for the
    eager/graph methods "indexer" means attributed to an indexer range the way the counts were made,
    otherwise it means matched by name."""
    if not (trace.has_kernels and trace.has_runtime) or gtid is None:
        return []
    found = trace.round_kernels(gtid, start, end, method == "graph")
    if not found:
        return []
    if method in ("eager", "graph"):
        ag = np.array([r[3] for r in found], dtype=np.int64)
        at = np.array([r[4] for r in found], dtype=np.int64)
        threads = sorted({int(g) for g in ag if g >= 0})
        indexer = RangeSet.build(*trace.range_columns(names.domain, names.indexer_range, gtids=threads))
        flags = (indexer.enclosing(ag, at) >= 0).tolist()
    else:
        flags = [matches_kernel(r[2], indexer_kernels) for r in found]
    return [(r[0], r[1], f) for r, f in zip(found, flags, strict=True)]


def _spans(trace: TraceSource, domain: str, name: str, gtid: int | None, start: int, end: int) -> list:
    """(start, end) of the ranges `name` on thread `gtid` starting in [start, end), by start; an unclosed
    range ends at `end`."""
    if gtid is None:
        return []
    _, s, e = trace.range_columns(domain, name, gtids=[gtid])
    inside = (s >= start) & (s < end)
    s, e = s[inside], e[inside]
    order = np.argsort(s, kind="stable")
    return [(a, b if b >= 0 else end) for a, b in zip(s[order].tolist(), e[order].tolist(), strict=True)]


def _draw(
    trace: TraceSource,
    out_png: Path,
    round_index: int,
    proc: int,
    method: str,
    names: RangeNames,
    indexer_kernels: tuple[str, ...],
) -> Path:
    att = attribute(trace, method, names)
    row = next((r for r in att.rows if r["round"] == round_index and r["proc"] == proc), None)
    if row is None:
        raise UsageError(
            f"{trace.path}: no round {round_index} of process {proc} to draw ({len(att.rows)} rounds, "
            f"method {att.method})"
        )
    start, end = row["start_ns"], row["start_ns"] + row["round_ns"]
    g, s, _ = trace.range_columns(names.domain, names.round_range)
    match = g[(s == start) & (trace.pid_tid(g)[1] == row["tid"])]
    gtid = int(match.min()) if len(match) else None
    lanes: list[tuple[str, list[tuple[int, int]], str]] = [(names.round_range, [(start, end)], "tab:blue")]
    for label, name, colour in (
        (names.step_range, names.step_range, "tab:green"),
        ("indexer", names.indexer_range, "tab:red"),
    ):
        lanes.append((label, _spans(trace, names.domain, name, gtid, start, end), colour))
    kernels = _round_kernels(trace, att.method, names, indexer_kernels, gtid, start, end)
    if att.method == "graph":  # NVTX inside a CUDA graph exists only at capture time: no lanes at replay
        lanes = lanes[:1]

    from matplotlib.figure import Figure  # no pyplot: leaves the caller's backend (e.g. inline) alone

    n_lanes = len(lanes) + (1 if kernels else 0)
    fig = Figure(figsize=(11, 1.4 + 0.6 * n_lanes))
    ax = fig.subplots()
    us = 1e-3
    labels = []
    for y, (label, spans, colour) in enumerate(lanes):
        ax.broken_barh(
            [((s - start) * us, max(e - s, 1) * us) for s, e in spans], (y - 0.35, 0.7), color=colour
        )
        labels.append(f"{label} ({len(spans)})")
    if kernels:
        y = len(lanes)
        ax.broken_barh(
            [((s - start) * us, max(e - s, 1) * us) for s, e, idx in kernels if not idx],
            (y - 0.35, 0.7),
            color="0.6",
        )
        ax.broken_barh(
            [((s - start) * us, max(e - s, 1) * us) for s, e, idx in kernels if idx],
            (y - 0.35, 0.7),
            color="tab:red",
        )
        how = "from capture-time indexer ranges" if att.method == "graph" else "indexer"
        labels.append(f"GPU kernels ({sum(k[2] for k in kernels)} {how} / {len(kernels)})")
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("µs from round start")
    forwards = "?" if row["draft_forwards"] is None else row["draft_forwards"]
    ax.set_title(
        f"draft round {round_index} (process {proc}, pid {row['pid']}): {row['indexer_launches']} indexer "
        f"launch(es), {forwards} draft forward(s)\nmethod {att.method}, source {trace.source}",
        fontsize=10,
    )
    fig.tight_layout()
    tmp = out_png.with_name(f".{out_png.name}.tmp{os.getpid()}.png")
    fig.savefig(tmp, dpi=110)
    try:
        os.link(tmp, out_png)
    except FileExistsError:
        raise ExistsError(f"{out_png} already exists: refusing to overwrite it", path=out_png) from None
    finally:
        tmp.unlink()
    return out_png
