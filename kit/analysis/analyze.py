"""The analyze stage: a run directory (or a bare report) -> rounds.csv + verdict.json.

Function of the run directory like every stage: reads params.json and the profile, writes two new
files, never overwrites (pass another out dir, or `force` to move the earlier analysis aside). A run that
did not finish is never a pass (kit.analysis.completeness). The timeline plot: kit.analysis.timeline.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kit.analysis import completeness
from kit.analysis.attribution import attribute
from kit.analysis.rounds import RangeNames, RoundTable, empty_table
from kit.analysis.rounds_csv import rows_to_csv
from kit.analysis.verdict import make_verdict
from kit.errors import ExistsError, InputError, TraceError, UsageError
from kit.paths import unique_path
from kit.probe import classifier_only_warning, target_topk_warning
from kit.probe import ranges as nvtx_ranges
from kit.probe.targets import WINDOW_END, WINDOW_START
from kit.rundir import RunDir, check_folder, write_new
from kit.trace.registry import file_kind, open_trace
from kit.trace.source import TraceSource

# params.json may come from either backend's notebook; accept their spellings.
_NUM_STEPS_KEYS = ("num_steps", "speculative_num_steps")
_CONTEXT_KEYS = ("context_len", "input_len")


def find_report(run_dir: Path) -> Path:
    """profile.sqlite, else profile.nsys-rep (exported on open), else recorder.sqlite, else the PyTorch
    profiler's profile.trace.json.gz."""
    reports = RunDir(Path(run_dir)).reports()
    for candidate in reports:
        if candidate.exists():
            return candidate
    *names, kineto = [p.name for p in reports]
    raise InputError(
        f"{run_dir} holds no {', '.join(names[:-1])} or {names[-1]} (nor a PyTorch-profiler {kineto}): "
        "was the run profiled?",
        path=run_dir,
    )


def _run_report(run_dir: Path) -> Path | None:
    """find_report, or None for a run that did not finish (its error.json says so) and left no report."""
    try:
        return find_report(run_dir)
    except InputError:
        if completeness.failure(RunDir(run_dir)) is None:
            raise
        return None


def _first(params: dict, keys: tuple[str, ...]) -> Any:
    for key in keys:
        if params.get(key) is not None:
            return params[key]
    return None


def _resolve(
    target: Path, arm: str | None, num_steps: int | None, context_len: int | None, index_topk: int | None
) -> tuple[Path, dict, Path, dict | None]:
    """(report, settings, default out dir, the run's params.json or None for a bare report)."""
    if target.is_dir():
        params = RunDir(target).read_params()
        settings = {
            "arm": arm if arm is not None else params.get("arm"),
            "num_steps": num_steps if num_steps is not None else _first(params, _NUM_STEPS_KEYS),
            "context_len": context_len if context_len is not None else _first(params, _CONTEXT_KEYS),
            "index_topk": index_topk if index_topk is not None else params.get("index_topk"),
            "backend": params.get("backend", "mini"),
            # one cell of a multi-cell sglang server's shared nsys report (a torch cell has its own trace)
            "window": None if params.get("profiler") == "torch" else params.get("profile_window_ordinal"),
            "target_topk": params.get("target_topk"),
            "classifier_only": bool(params.get("classifier_only")),
        }
        missing = [k for k in ("arm", "num_steps") if settings[k] is None]
        if missing:
            raise UsageError(f"{target}/params.json lacks {' and '.join(missing)}: pass them as options")
        return _run_report(target), settings, target, params
    if not target.exists():
        raise InputError(
            f"{target} not found: pass a run directory or a .sqlite/.nsys-rep/.json[.gz] report", path=target
        )
    if file_kind(target) is None:  # the file first: junk is refused as junk, not asked for --arm
        open_trace(target)  # raises the one-line error that names what a report is
    missing = [f"--{k.replace('_', '-')}" for k, v in (("arm", arm), ("num_steps", num_steps)) if v is None]
    if missing:
        raise UsageError(
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
        "classifier_only": False,
    }
    return target, settings, target.parent, None


ANALYSIS_FILES = ("rounds", "verdict", "timeline")  # RunDir properties: what one analysis writes


def set_aside(out: RunDir) -> Path | None:
    """Move an earlier analysis (rounds.csv, verdict.json, timeline.png) into a new
    `analysis.superseded[-N]` folder beside them; nothing is deleted. None when there was none."""
    old = [getattr(out, name) for name in ANALYSIS_FILES if getattr(out, name).exists()]
    if not old:
        return None
    aside = unique_path(out.path / "analysis.superseded")
    aside.mkdir()
    for path in old:
        path.rename(aside / path.name)
    return aside


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
    force: bool = False,
) -> dict:
    """Attribute indexer launches to draft rounds and judge them; returns the verdict dict.

    force: an earlier analysis in the out dir is moved aside (set_aside) instead of refused."""
    t0 = time.perf_counter()
    target = Path(target)
    report, settings, default_out, params = _resolve(target, arm, num_steps, context_len, index_topk)
    out = RunDir(check_folder(Path(out_dir) if out_dir is not None else default_out, "the analysis"))
    for path in (out.rounds, out.verdict):
        if path.exists() and not force:
            raise ExistsError(
                f"{path} already exists: pass another out dir (--out), or --force to move the earlier "
                "analysis aside (analyses are never overwritten)",
                path=path,
            )
    out.path.mkdir(parents=True, exist_ok=True)
    names = RangeNames(
        domain=domain, round_range=round_range, step_range=step_range, indexer_range=indexer_range
    )
    # a classifier-only run has no probe ranges to count from
    chosen = "classifier" if settings["classifier_only"] and method == "auto" else method
    trace, unread = _open_report(report, target, params)
    described, dropped = None, False
    if trace is None:
        rows, verdict = empty_table(), _unfinished_verdict(target, settings, params or {}, unread)
    else:
        with trace:
            rows, verdict, dropped = _judge(
                trace, target, settings, params, names, chosen, indexer_kernels, graph_kernels
            )
            described = trace.describe()
    verdict["method_requested"] = method
    verdict["ranges"] = {"domain": domain, "round": round_range, "step": step_range, "indexer": indexer_range}
    verdict["report"] = described
    verdict["nvtx_dropped"] = dropped
    aside = set_aside(out) if force else None  # only now: a failed analysis leaves the earlier one in place
    if aside is not None:
        verdict["warnings"].append(f"the earlier analysis was moved to {aside.name}/ (--force)")
    write_new(out.rounds, rows_to_csv(rows))
    verdict["analysis_s"] = round(time.perf_counter() - t0, 3)
    write_new(out.verdict, verdict_json(verdict))
    return verdict


def _open_report(
    report: Path | None, target: Path, params: dict | None
) -> tuple[TraceSource | None, str | None]:
    """(the opened report, None), or (None, why) for a run that did not finish and left no report the kit
    can read (Ctrl-C before the profiler wrote one, a report cut short): that run is judged by its own
    record, inconclusive, instead of refused as a damaged input. A finished run's bad report is an error."""
    if report is None:
        return None, f"the run left no profile report ({', '.join(p.name for p in RunDir(target).reports())})"
    try:
        return open_trace(report), None
    except TraceError as exc:
        if params is None or completeness.failure(RunDir(target)) is None:
            raise
        return None, f"its report cannot be read ({exc})"


def _unfinished_verdict(target: Path, settings: dict, params: dict, unread: str | None) -> dict:
    """The verdict of a run that stopped before its profiler left a readable report: inconclusive, with
    the run's own record (error.json) as the reason."""
    reason = completeness.failure(RunDir(target))
    return _verdict([], settings, _source_of(params), "none", [f"nothing was counted: {unread}"], reason)


def _verdict(
    rows: Sequence[dict], settings: dict, source: str, method: str, warnings: list[str], reason: str | None
) -> dict:
    """make_verdict with the settings _resolve gathered."""
    return make_verdict(
        rows,
        settings["arm"],
        int(settings["num_steps"]),
        context_len=None if settings["context_len"] is None else int(settings["context_len"]),
        index_topk=2048 if settings["index_topk"] is None else int(settings["index_topk"]),
        source=source,
        method=method,
        extra_warnings=warnings,
        inconclusive_reason=reason,
        backend=settings["backend"],
    )


def _source_of(params: dict) -> str:
    """The report format a run's parameters make (what its verdict names when no report is left)."""
    if params.get("profiler") == "torch":
        return "kineto"
    return "recorder" if params.get("nvtx_sink") == "recorder" else "nsys"


def _judge(
    trace: TraceSource,
    target: Path,
    settings: dict,
    params: dict | None,
    names: RangeNames,
    method: str,
    indexer_kernels: tuple[str, ...] | None,
    graph_kernels: int | None,
) -> tuple[RoundTable, dict, bool]:
    """(the round table, the verdict, whether NVTX was dropped) of an opened report."""
    att = attribute(
        trace,
        method,
        names,
        indexer_kernels=indexer_kernels,
        graph_kernels=graph_kernels,
        expect_nvtx=params is not None,
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
    if settings["classifier_only"]:
        att.warnings.append(classifier_only_warning())
    att.rows = rows
    reason = att.inconclusive
    if params is not None:
        done = completeness.check(RunDir(target), params, rows.column("pid") if len(rows) else [])
        reason, more = done.reasons(reason)
        att.warnings += more
    verdict = _verdict(rows, settings, trace.source, att.method, att.warnings, reason)
    return rows, verdict, bool(att.nvtx and att.nvtx.dropped)


def _window_rounds(
    trace: TraceSource, domain: str, rows: RoundTable, window: int | None = None
) -> tuple[RoundTable, int]:
    """Rounds from the profile window's start on. With CUDA graphs the probe starts the capture at graph
    capture, so the report also holds the warm-up requests' rounds (other contexts, other latencies);
    the probe marks where sglang's /start_profile window begins. No mark (eager, mini): all rounds.
    A recorder file is never cut (the mark bounds what Nsight captured).

    `window` n (a cell of a server that ran several, whose report holds every cell's window): only the
    rounds inside the n-th window, from each thread's n-th start mark to its first end mark after it
    (the earliest start and the latest end over the ranks' threads)."""
    if not len(rows) or trace.source == "recorder":
        return rows, 0
    marks = trace.range_columns_multi(domain, [WINDOW_START, WINDOW_END], with_end=False)
    g_start, starts, _ = marks[WINDOW_START]
    end = None
    if window is not None:
        g_end, ends, _ = marks[WINDOW_END]
        opened, closed = zip(g_start, starts, strict=True), zip(g_end, ends, strict=True)
        start, end = _nth_window(trace, list(opened), list(closed), window)
    elif len(starts):
        start = int(starts.min())
    else:
        return rows, 0
    keep = [i for i, t in enumerate(rows.column("start_ns")) if t >= start and (end is None or t < end)]
    if len(keep) == len(rows):
        return rows, 0
    return rows.subset(keep), len(rows) - len(keep)


def _nth_window(
    trace: TraceSource, start_marks: list[tuple], end_marks: list[tuple], n: int
) -> tuple[int, int | None]:
    """(start, end) of the n-th profile window (1-based), from (thread, time) marks. A thread without an
    end mark after its n-th start ends the window at its next start, or never (end None)."""
    starts: dict[int, list[int]] = {}
    for g, t in sorted(start_marks, key=lambda m: m[1]):
        starts.setdefault(int(g), []).append(int(t))
    ends: dict[int, list[int]] = {}
    for g, t in sorted(end_marks, key=lambda m: m[1]):
        ends.setdefault(int(g), []).append(int(t))
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
    has a hundred thousand rounds, which the indenting (pure-Python) encoder is slow to spell out."""
    marker = "__kit_launches_per_round__"
    text = json.dumps({**verdict, "launches_per_round": marker}, indent=2, default=str)
    return text.replace(f'"{marker}"', json.dumps(verdict["launches_per_round"])) + "\n"
