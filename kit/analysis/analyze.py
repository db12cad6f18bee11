"""The analyze stage: a run directory (or a bare report) -> rounds.csv + verdict.json, and a timeline.

Function of the run directory like every stage: reads params.json and the profile, writes two new
files, never overwrites (pass another out dir to re-analyze).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from kit.analysis.rounds import (
    DEFAULT_INDEXER_KERNELS,
    DEFAULT_NAMES,
    RangeNames,
    RangeSet,
    RoundTable,
    attribute,
    kernel_join,
    matches_kernel,
    rows_to_csv,
)
from kit.analysis.verdict import make_verdict
from kit.errors import KitError, TraceError
from kit.probe import ranges as nvtx_ranges
from kit.probe import target_topk_warning
from kit.probe.targets import WINDOW_END, WINDOW_START
from kit.rundir import read_json, write_new
from kit.trace.sqlite import Trace, open_trace

REPORT_NAMES = ("profile.sqlite", "profile.nsys-rep", "recorder.sqlite")
# params.json may come from either backend's notebook; accept their spellings.
_NUM_STEPS_KEYS = ("num_steps", "speculative_num_steps")
_CONTEXT_KEYS = ("context_len", "input_len")


def find_report(run_dir: Path) -> Path:
    """profile.sqlite, else profile.nsys-rep (exported on open), else recorder.sqlite."""
    for name in REPORT_NAMES:
        candidate = Path(run_dir) / name
        if candidate.exists():
            return candidate
    raise KitError(
        f"{run_dir} holds no profile.sqlite, profile.nsys-rep or recorder.sqlite: was the run profiled?"
    )


def _first(params: dict, keys: tuple[str, ...]) -> Any:
    for key in keys:
        if params.get(key) is not None:
            return params[key]
    return None


def _resolve(
    target: Path, arm: str | None, num_steps: int | None, context_len: int | None, index_topk: int | None
) -> tuple[Path, dict, Path, bool]:
    """(report, settings, default out dir, is a kit run dir)."""
    if target.is_dir():
        params = read_json(target / "params.json")
        settings = {
            "arm": arm if arm is not None else params.get("arm"),
            "num_steps": num_steps if num_steps is not None else _first(params, _NUM_STEPS_KEYS),
            "context_len": context_len if context_len is not None else _first(params, _CONTEXT_KEYS),
            "index_topk": index_topk if index_topk is not None else params.get("index_topk"),
            "backend": params.get("backend", "mini"),
            "window": params.get("profile_window_ordinal"),  # one cell of a multi-cell sglang server
            "target_topk": params.get("target_topk"),
        }
        missing = [k for k in ("arm", "num_steps") if settings[k] is None]
        if missing:
            raise KitError(f"{target}/params.json lacks {' and '.join(missing)}: pass them as options")
        return find_report(target), settings, target, True
    if not target.exists():
        raise KitError(f"{target} not found: pass a run directory or a .sqlite/.nsys-rep report")
    missing = [f"--{k.replace('_', '-')}" for k, v in (("arm", arm), ("num_steps", num_steps)) if v is None]
    if missing:
        raise KitError(
            f"analyzing a bare report ({target.name}) needs {' and '.join(missing)} (no params.json)"
        )
    settings = {
        "arm": arm,
        "num_steps": num_steps,
        "context_len": context_len,
        "index_topk": index_topk,
        "backend": "mini",
        "window": None,
        "target_topk": None,
    }
    return target, settings, target.parent, False


def analyze(
    target: Path | str,
    out_dir: Path | str | None = None,
    *,
    arm: str | None = None,
    num_steps: int | None = None,
    context_len: int | None = None,
    index_topk: int | None = None,
    method: str = "auto",
    domain: str = nvtx_ranges.DOMAIN,
    indexer_range: str = nvtx_ranges.INDEXER,
    round_range: str = nvtx_ranges.ROUND,
    step_range: str = nvtx_ranges.STEP,
    indexer_kernels: tuple[str, ...] | None = None,
    graph_kernels: int | None = None,
) -> dict:
    """Attribute indexer launches to draft rounds and judge them; returns the verdict dict."""
    t0 = time.perf_counter()
    target = Path(target)
    report, settings, default_out, is_run = _resolve(target, arm, num_steps, context_len, index_topk)
    out = Path(out_dir) if out_dir is not None else default_out
    out.mkdir(parents=True, exist_ok=True)
    for name in ("rounds.csv", "verdict.json"):
        if (out / name).exists():
            raise KitError(
                f"{out / name} already exists: pass another out dir (analyses are never overwritten)"
            )
    names = RangeNames(
        domain=domain, round_range=round_range, step_range=step_range, indexer_range=indexer_range
    )
    with open_trace(report) as trace:
        att = attribute(
            trace,
            method,
            names,
            indexer_kernels=indexer_kernels,
            graph_kernels=graph_kernels,
            expect_nvtx=is_run,
        )
        rows, before = _window_rounds(trace, names.domain, att.rows, settings["window"])
        if before and settings["window"] is not None:
            att.warnings.append(
                f"{before} draft round(s) outside this cell's profile window (window {settings['window']} of "
                "its server's report: other cells, warm-up requests, skipped decode steps) left out"
            )
        elif before:
            att.warnings.append(
                f"{before} draft round(s) before the profile window's start mark (sglang's and the kit's "
                "warm-up requests, skipped decode steps: the report starts at CUDA-graph capture) left out"
            )
        if settings["target_topk"]:
            att.warnings.append(target_topk_warning(settings["target_topk"]))
        att.rows = rows
        verdict = make_verdict(
            att.rows,
            settings["arm"],
            int(settings["num_steps"]),
            context_len=None if settings["context_len"] is None else int(settings["context_len"]),
            index_topk=2048 if settings["index_topk"] is None else int(settings["index_topk"]),
            source=trace.source,
            method=att.method,
            extra_warnings=att.warnings,
            inconclusive_reason=att.inconclusive,
            backend=settings["backend"],
        )
        verdict["method_requested"] = method
        verdict["ranges"] = {
            "domain": domain,
            "round": round_range,
            "step": step_range,
            "indexer": indexer_range,
        }
        verdict["report"] = trace.describe()
        verdict["nvtx_dropped"] = bool(att.nvtx and att.nvtx.dropped)
    write_new(out / "rounds.csv", rows_to_csv(att.rows))
    verdict["analysis_s"] = round(time.perf_counter() - t0, 3)
    write_new(out / "verdict.json", verdict_json(verdict))
    return verdict


def _window_rounds(
    trace: Trace, domain: str, rows: RoundTable, window: int | None = None
) -> tuple[RoundTable, int]:
    """Rounds from the profile window's start on. With CUDA graphs the probe starts the capture at graph
    capture, so the report also holds the warm-up requests' rounds (other contexts, other latencies);
    the probe marks where sglang's /start_profile window begins. No mark (eager, mini): all rounds.

    `window` n (a cell of a server that ran several, whose report holds every cell's window): only the
    rounds inside the n-th window, from each thread's n-th start mark to its first end mark after it
    (the earliest start and the latest end over the ranks' threads)."""
    if not len(rows) or not trace.has("NVTX_EVENTS"):
        return rows, 0
    table = trace.materialize(domain, WINDOW_START)
    end = None
    if window is None:
        start = trace.con.execute(f"SELECT MIN(start) FROM temp.{table}").fetchone()[0]
    else:
        start, end = _nth_window(trace, domain, table, window)
    if start is None:
        return rows, 0
    keep = [i for i, t in enumerate(rows.column("start_ns")) if t >= start and (end is None or t < end)]
    if len(keep) == len(rows):
        return rows, 0
    cols = {c: [v[i] for i in keep] for c, v in rows.columns.items()}
    return RoundTable(cols), len(rows) - len(keep)


def _nth_window(trace: Trace, domain: str, starts_table: str, n: int) -> tuple[int, int | None]:
    """(start, end) of the n-th profile window (1-based). A thread without an end mark after its n-th start
    ends the window at its next start, or never (end None)."""
    ends_table = trace.materialize(domain, WINDOW_END)
    starts: dict[int, list[int]] = {}
    for gtid, t in trace.con.execute(f"SELECT gtid, start FROM temp.{starts_table} ORDER BY start"):
        starts.setdefault(gtid, []).append(t)
    ends: dict[int, list[int]] = {}
    for gtid, t in trace.con.execute(f"SELECT gtid, start FROM temp.{ends_table} ORDER BY start"):
        ends.setdefault(gtid, []).append(t)
    nth = {g: ts[n - 1] for g, ts in starts.items() if len(ts) >= n}
    if not nth:
        most = max((len(ts) for ts in starts.values()), default=0)
        raise TraceError(
            f"{trace.path}: the run opened profile window {n}, but the report marks {most} window start(s)"
        )
    closing = [
        next((t for t in ends.get(g, ()) if t >= s), starts[g][n] if len(starts[g]) > n else None)
        for g, s in nth.items()
    ]
    return min(nth.values()), None if None in closing else max(closing)


def verdict_json(verdict: dict) -> str:
    """JSON like rundir.write_json (indent 2), but the per-round list on one line: a million-range report
    has ~10^5 rounds, which the indenting (pure-Python) encoder takes half a second to spell out."""
    marker = "__kit_launches_per_round__"
    text = json.dumps({**verdict, "launches_per_round": marker}, indent=2, default=str)
    return text.replace(f'"{marker}"', json.dumps(verdict["launches_per_round"])) + "\n"


# ---- timeline ---------------------------------------------------------------------------------


def timeline_png(
    run_dir_or_trace: Path | str | Trace,
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
        raise KitError(f"{out_png} already exists: refusing to overwrite it (choose another file name)")
    if isinstance(run_dir_or_trace, Trace):
        return _draw(run_dir_or_trace, out_png, round_index, proc, method, names, indexer_kernels)
    src = Path(run_dir_or_trace)
    report = find_report(src) if src.is_dir() else src
    with open_trace(report) as trace:
        return _draw(trace, out_png, round_index, proc, method, names, indexer_kernels)


def _round_kernels(
    trace: Trace,
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
    join, point_g, point_t, _ = kernel_join(trace, method == "graph")
    found = trace.query(
        f"SELECT k.start, k.end, COALESCE(s.value, ''), {point_g}, {point_t} "
        f"FROM main.CUPTI_ACTIVITY_KIND_KERNEL k {join} LEFT JOIN main.StringIds s ON s.id = k.shortName "
        "WHERE rt.gtid = ? AND rt.start >= ? AND rt.start < ? ORDER BY k.start",
        (gtid, start, end),
    )
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


def _draw(
    trace: Trace,
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
        raise KitError(
            f"{trace.path}: no round {round_index} of process {proc} to draw ({len(att.rows)} rounds, "
            f"method {att.method})"
        )
    start, end = row["start_ns"], row["start_ns"] + row["round_ns"]
    rounds = trace.materialize(names.domain, names.round_range)
    found = trace.query(
        f"SELECT gtid FROM temp.{rounds} WHERE start = ? AND {trace.tid_expr('gtid')} IS ?",
        (start, row["tid"]),
    )
    gtid = found[0][0] if found else None
    lanes: list[tuple[str, list[tuple[int, int]], str]] = [(names.round_range, [(start, end)], "tab:blue")]
    for label, name, colour in (
        (names.step_range, names.step_range, "tab:green"),
        ("indexer", names.indexer_range, "tab:red"),
    ):
        table = trace.materialize(names.domain, name)
        spans = trace.query(
            f"SELECT start, COALESCE(end, ?) FROM temp.{table} "
            "WHERE gtid IS ? AND start >= ? AND start < ? ORDER BY start",
            (end, gtid, start, end),
        )
        lanes.append((label, spans, colour))
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
        raise KitError(f"{out_png} already exists: refusing to overwrite it") from None
    finally:
        tmp.unlink()
    return out_png
