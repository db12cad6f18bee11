"""PR #29654's grid on real sglang (data/results/h200-pr29654): `kit batch` of the committed matrix
data/matrices/h200_pr29654.yaml. Per execution mode and context: each arm's launches per draft round, median
draft-step GPU time, accept length, tokens against 0.5.14's; the batch's comparison gate. Three batches:
the grid in one call with four servers sharing the GPU (runs/h200_pr29654), its mode `latest` (sglang
0.5.17 as upstream, runs/h200_pr29654-latest), and the same grid one server at a time in two parts with
each arm's unprofiled twins (parts/: the instrument's overhead, and what sharing the GPU changes).
Read-only over the committed folders: scripts/h200_pr29654_figures.py prints it and the rung below shows it.
"""

from __future__ import annotations

import csv
import json
import re
import statistics
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from kit.compare.equivalence import pooled_accept
from kit.paths import RESULTS
from kit.report.about import ARM_COLORS, context_label, describe_runs
from kit.report.published import published
from kit.report.rung import CONFIRMED, NOT_CONFIRMED, Batch, Plot, Rung, Table, rung
from kit.rundir import read_outputs

GRID_RESULTS = RESULTS / "h200-pr29654"
PARTS = GRID_RESULTS / "parts"  # one server at a time, two leases, with the unprofiled twins
BATCH = "h200_pr29654"
LATEST = "h200_pr29654-latest"  # the matrix's mode latest: sglang 0.5.17 as upstream
ARMS = ("bug", "fix", "off", "upstream")
_SERVER = re.compile(r"sglang-[a-z]+-s\d+-(graph|eager)-cuda(-noprofile)?-server(-\d+)?")
_CELL = re.compile(r"sglang-(?P<arm>[a-z]+)-ctx(?P<ctx>\d+)-s(?P<steps>\d+)-(?P<mode>graph|eager)-cuda")


def batch_dir(results: Path = GRID_RESULTS, batch: str = BATCH) -> Path:
    return Path(results) / "runs" / batch


def _arm(cell: Path) -> dict[str, Any]:
    """One profiled cell: launches per round (and what the arm expects), median step time, accept length."""
    verdict = json.loads((cell / "verdict.json").read_text())
    with open(cell / "rounds.csv") as f:
        table = list(csv.DictReader(f))
    steps = [float(r["step_gpu_ns"]) for r in table if r.get("step_gpu_ns")]
    indexer = [float(r["indexer_gpu_ns"]) for r in table if r.get("indexer_gpu_ns")]
    rows = read_outputs(cell / "outputs.jsonl")
    prov = json.loads((cell / "provenance.json").read_text())
    return {
        "build": (prov.get("sglang") or {}).get("sglang_version"),
        "launches": sorted(set(verdict["launches_per_round"])),
        "expected": verdict["expected_per_round"],
        "rounds": verdict["num_rounds"],
        "passed": verdict["passed"],
        "step_ms": statistics.median(steps) / 1e6 if steps else None,
        # the indexer kernels' own GPU time per round: what the fix removes, whatever the launch gaps
        "indexer_us": statistics.median(indexer) / 1e3 if indexer else None,
        "accept": pooled_accept(rows),
        "outputs": {r["prompt_id"]: r["output_ids"] for r in rows},
    }


def cells(results: Path = GRID_RESULTS, batch_name: str = BATCH) -> list[dict[str, Any]]:
    """One row per (mode, context): the arms that ran it, their figures, and the batch's bug-vs-fix gate."""
    batch = batch_dir(results, batch_name)
    found: dict[tuple[str, int, int], dict[str, Path]] = {}
    for cell in batch.iterdir():
        m = _CELL.fullmatch(cell.name)
        if m and (cell / "verdict.json").is_file():
            key = (m["mode"], int(m["ctx"]), int(m["steps"]))
            found.setdefault(key, {})[m["arm"]] = cell
    out = []
    for (mode, ctx, steps), by_arm in sorted(found.items(), key=lambda kv: (kv[0][0] != "graph", kv[0][1])):
        arms = {a: _arm(by_arm[a]) for a in ARMS if a in by_arm}
        bug = arms.get("bug")
        for s in arms.values():
            s["tokens_equal_bug"] = None if bug is None or s is bug else s["outputs"] == bug["outputs"]
        cmp_file = batch / f"compare-sglang-ctx{ctx}-s{steps}-{mode}-cuda" / "comparison.json"
        cmp = json.loads(cmp_file.read_text()) if cmp_file.is_file() else None
        out.append(
            {
                "mode": mode,
                "context_len": ctx,
                "num_steps": steps,
                "arms": arms,
                "gate_failures": None if cmp is None else cmp["gate_failures"],
                "bug_over_fix": None if cmp is None else cmp["draft_step_ratio_a_over_b"],
            }
        )
    return out


def overheads(results: Path = PARTS) -> list[dict[str, Any]]:
    """Each profiled cell's decode-round time (client side, prompt 0) with the instrument and without."""
    out = []
    for f in sorted(batch_dir(results).glob("overhead-*/overhead.json")):
        o = json.loads(f.read_text())
        m = _CELL.fullmatch(o["profiled"])
        if m is None:
            continue
        w, d = o["window"], o["decode"]
        out.append(
            {
                "arm": m["arm"],
                "context_len": int(m["ctx"]),
                "window_ms": (w["profiled"]["ms_per_round"], w["unprofiled"]["ms_per_round"]),
                "window_ratio": w["ratio_per_round"],
                "decode_ms": (d["profiled"]["ms_per_round"], d["unprofiled"]["ms_per_round"]),
                "decode_ratio": d["ratio_per_round"],
                "rounds": (w["profiled"]["rounds"], d["profiled"]["rounds"]),
            }
        )
    return sorted(out, key=lambda r: (r["context_len"], ARMS.index(r["arm"])))


def servers(results: Path = GRID_RESULTS, batch_name: str = BATCH) -> list[dict[str, Any]]:
    """Each server start in the order it ran (a shared server's folder, a retry's `-server-N`, and a cell that
    started its own): its start-up and wall seconds, its cells' own seconds, how long it waited for its turn
    on a shared GPU, and the gap from the previous server's end on the same GPU (the batch's work between
    two servers; negative where servers ran side by side; None on a new machine, a later lease)."""
    from datetime import datetime

    out = []
    for d in batch_dir(results, batch_name).iterdir():
        prov_file = d / "provenance.json"
        if not (_SERVER.fullmatch(d.name) or _CELL.match(d.name)) or not prov_file.is_file():
            continue
        prov = json.loads(prov_file.read_text())
        run = prov.get("run") or {}
        if "startup_s" not in run or run.get("server_dir"):  # a shared server's cell: its server is listed
            continue
        cells = prov.get("cells") or [run]  # what the server recorded of each cell it ran
        out.append(
            {
                "server": d.name,
                "gpu": (prov.get("gpu") or {}).get("uuid"),
                "start": datetime.fromisoformat(prov["start"]),
                "end": datetime.fromisoformat(prov["end"]),
                "startup_s": run.get("startup_s"),
                "wall_s": run.get("wall_s"),
                "cells_s": round(sum(c.get("cell_s") or 0 for c in cells), 1),
                "gpu_wait_s": run.get("gpu_wait_s"),
            }
        )
    out.sort(key=lambda s: s["start"])
    for prev, s in zip([None, *out], out, strict=False):
        same = prev is not None and prev["gpu"] == s["gpu"]
        s["gap_s"] = (s["start"] - prev["end"]).total_seconds() if same else None
    return out


def sharing(shared: Path = GRID_RESULTS, alone: Path = PARTS) -> list[dict[str, Any]]:
    """Each cell's median draft-step and indexer GPU time with four servers on the GPU (taking turns to
    measure) beside the same cell run one server at a time: what sharing the GPU does to the timings."""
    one = {(r["mode"], r["context_len"]): r["arms"] for r in cells(alone)}
    out = []
    for r in cells(shared):
        for arm, s in r["arms"].items():
            a = one.get((r["mode"], r["context_len"]), {}).get(arm)
            if a is None or not s["step_ms"] or not a["step_ms"]:
                continue
            out.append(
                {
                    "mode": r["mode"],
                    "context_len": r["context_len"],
                    "arm": arm,
                    "step_ms": (s["step_ms"], a["step_ms"]),
                    "step_ratio": s["step_ms"] / a["step_ms"],
                    "indexer_us": (s["indexer_us"], a["indexer_us"]),
                }
            )
    return out


def batch_seconds(results: Path = GRID_RESULTS) -> list[str]:
    """The batch's own closing line of each call (`Batch ...: N cells: ... (S s)`), from the host logs."""
    lines = []
    for log in sorted((Path(results) / "logs").glob("batch-*.txt")):
        text = log.read_text().splitlines()
        lines += [f"{log.name}: {ln.split(': ', 1)[1]}" for ln in text if ln.startswith("Batch ")]
    return lines


def device_time(results: Path = GRID_RESULTS) -> dict[int, dict[str, tuple[float, int]]]:
    """Per lease, the device seconds each kind of call held (the step's first word: receive, install,
    part-a, ...; the first call's share includes the machine's start) and how many calls, from the device
    tool's own figures in logs/device_calls.json (held_s counts from the lease's start)."""
    calls = json.loads((Path(results) / "logs" / "device_calls.json").read_text())["calls"]
    out: dict[int, dict[str, tuple[float, int]]] = {}
    last: dict[int, float] = {}
    for c in calls:
        lease = int(c.get("lease", 1))
        kind = c["step"].split()[0].rstrip(",:")
        held, n = out.setdefault(lease, {}).get(kind, (0.0, 0))
        out[lease][kind] = (held + c["held_s"] - last.get(lease, 0.0), n + 1)
        last[lease] = c["held_s"]
    return out


def classifier_checks(results: Path = GRID_RESULTS, batch_name: str = BATCH) -> list[dict[str, Any]]:
    """Each graph cell the NVTX-free kernel classifier counted again on the host (RUN/classifier), beside
    the NVTX count: two methods over one report. Eager cells have no graph launches to delimit rounds."""
    out = []
    for v in sorted(batch_dir(results, batch_name).glob("sglang-*-graph-cuda/classifier/verdict.json")):
        c, n = json.loads(v.read_text()), json.loads((v.parents[1] / "verdict.json").read_text())
        out.append(
            {
                "cell": v.parents[1].name,
                "status": c["status"],
                "classifier": sorted(set(c["launches_per_round"])),
                "nvtx": sorted(set(n["launches_per_round"])),
                "rounds": c["num_rounds"],
            }
        )
    return out


def placements(results: Path = GRID_RESULTS, batch_name: str = BATCH) -> dict[str, list[str]]:
    """Where in the round the indexer ran, per nsys report (placement.txt beside each server's or one-cell
    run's report, scripts/indexer_placement.py): the range lines, without the report's host path."""
    out = {}
    for p in sorted(batch_dir(results, batch_name).glob("*/placement.txt")):
        lines = [ln.strip() for ln in p.read_text().splitlines() if ln.startswith(" ")]
        out[p.parent.name] = lines
    return out


@rung(7)
def pr_grid_h200(batch: Batch) -> Rung | None:
    """The PR's grid on real sglang, one `kit batch` of data/matrices/h200_pr29654.yaml through the notebooks:
    launches per round and draft-step time per context, beside the PR's own points (another machine)."""
    if not batch_dir().is_dir():
        return None
    rows = cells()
    graph = [r for r in rows if r["mode"] == "graph"]
    if not graph:
        return None
    runs = sorted(p for p in batch_dir().glob("sglang-*-cuda") if (p / "verdict.json").is_file())
    about = describe_runs(runs)
    about["model"] = (
        f"{about['model']}: the generated DSA + MTP checkpoint (`kit make-checkpoint`, random weights; its "
        "draft is always accepted, so outputs here check tokens, not the draft's quality: the task rung does)"
    )
    about["files"] = "data/results/h200-pr29654/ (README.md, runs/h200_pr29654/, logs/)"
    launches_ok = all(s["launches"] == [s["expected"]] for r in rows for s in r["arms"].values())
    same = all(s["tokens_equal_bug"] is not False for r in rows for s in r["arms"].values())
    gates = [r["gate_failures"] for r in rows if r["gate_failures"] is not None]
    passed = bool(gates) and not any(gates)
    ctx = [r["context_len"] for r in graph]
    ratios = [r["bug_over_fix"] for r in graph if r["bug_over_fix"]]
    arms = sorted({a for r in rows for a in r["arms"]}, key=ARMS.index)
    expected = ", ".join(
        f"{a} {'/'.join(str(n) for n in sorted({r['arms'][a]['expected'] for r in rows if a in r['arms']}))}"
        for a in arms
    )
    claim = (
        f"{', '.join(arms)} in one batch, CUDA graphs at {', '.join(context_label(c) for c in ctx)}: "
        f"indexer launches per draft round as each arm expects in every cell ({expected}), "
        f"greedy tokens equal 0.5.14's, gate {'PASS' if passed else 'FAIL'} at every context; draft step "
        f"{min(ratios):.2f}x to {max(ratios):.2f}x faster with the fix"
        + (", growing with the context" if ratios == sorted(ratios) else "")
    )
    table = []
    for r in rows:
        for arm, s in r["arms"].items():
            table.append(
                {
                    "mode": r["mode"],
                    "context": context_label(r["context_len"]),
                    "arm": arm,
                    "launches/round (expected)": f"{s['launches']} ({s['expected']}) x {s['rounds']}",
                    "draft step GPU ms (median)": round(s["step_ms"], 4),
                    "indexer GPU us/round (median)": round(s["indexer_us"] or 0.0, 1),
                    "accept length": round(s["accept"], 2),
                    "tokens = 0.5.14": "-" if s["tokens_equal_bug"] is None else s["tokens_equal_bug"],
                    "0.5.14 / fix": f"{r['bug_over_fix']:.2f}x" if arm == "fix" and r["bug_over_fix"] else "",
                }
            )
    over = pd.DataFrame(
        [
            {
                "arm": o["arm"],
                "context": context_label(o["context_len"]),
                "window ms/round, with / without": f"{o['window_ms'][0]:.2f} / {o['window_ms'][1]:.2f}",
                "window ratio": o["window_ratio"],
                "whole decode ms/round, with / without": f"{o['decode_ms'][0]:.2f} / {o['decode_ms'][1]:.2f}",
                "decode ratio": o["decode_ratio"],
            }
            for o in (overheads() if batch_dir(PARTS).is_dir() else [])
        ]
    )
    latest = pd.DataFrame(
        [
            {
                "context": context_label(r["context_len"]),
                "arm": arm,
                "build": s["build"],
                "launches/round (expected)": f"{s['launches']} ({s['expected']}) x {s['rounds']}",
                "draft step GPU ms (median)": round(s["step_ms"], 4),
                "tokens = 0.5.14": "-" if s["tokens_equal_bug"] is None else s["tokens_equal_bug"],
                "gate": ""
                if arm != "bug" or r["gate_failures"] is None
                else ("PASS" if not r["gate_failures"] else "FAIL"),
            }
            for r in (cells(batch_name=LATEST) if batch_dir(batch=LATEST).is_dir() else [])
            for arm, s in r["arms"].items()
        ]
    )
    share = sharing() if batch_dir(PARTS).is_dir() else []
    graph_share = [x["step_ratio"] for x in share if x["mode"] == "graph"]
    share_lo, share_hi = (min(graph_share), max(graph_share)) if graph_share else (float("nan"),) * 2
    shared = pd.DataFrame(
        [
            {
                "mode": x["mode"],
                "context": context_label(x["context_len"]),
                "arm": x["arm"],
                "four at once": round(x["step_ms"][0], 4),
                "one at a time": round(x["step_ms"][1], 4),
                "ratio": round(x["step_ratio"], 2),
            }
            for x in share
        ]
    )
    pub = published()
    builds = {a: s["build"] for r in rows for a, s in r["arms"].items()}
    named = ", ".join(f"{a} ({builds[a]})" for a in arms)

    def draw(fig: Figure) -> None:
        ax = fig.subplots()
        for arm in arms:
            pts = [(r["context_len"], r["arms"][arm]["step_ms"]) for r in graph if arm in r["arms"]]
            ax.plot(*zip(*pts, strict=True), marker="o", color=ARM_COLORS.get(arm), label=arm)
        for p in pub["per_draft_step_ms"]:
            for arm in ("bug", "fix"):
                if p.get(arm):
                    ax.scatter(
                        p["input_tokens"],
                        p[arm],
                        marker="x",
                        s=60,
                        color=ARM_COLORS.get(arm),
                        label=f"PR, {arm} ({pub['setup']['hardware']}, {pub['setup']['model']})",
                    )
        ax.set(
            xlabel="input tokens",
            ylabel="draft step, GPU ms (median)",
            title="Draft-step GPU time vs context, real sglang on one H200 (x: the PR's, another machine)",
        )
        ax.legend(fontsize=8, loc="upper left")

    return Rung(
        key="pr-grid-h200",
        title=f"The PR's grid on real sglang: {', '.join(arms)} at {context_label(min(ctx))}-"
        f"{context_label(max(ctx))} input tokens in one papermill batch",
        scope=f"real sglang {named}, one `kit batch`, one NVIDIA H200 (committed results)"
        + ("; sglang 0.5.17 beside 0.5.14 and the fix (mode latest)" if len(latest) else ""),
        status=CONFIRMED if launches_ok and same and passed else NOT_CONFIRMED,
        claim=claim,
        about=about,
        note=(
            "One `kit batch -j 4` call ran the grid: four servers started side by side on the GPU and took "
            "turns to measure (one nsys report per server, a profile window per cell); every cell went "
            "through the shipped notebooks under papermill. With CUDA graphs its timings match the same grid "
            f"run one server at a time on earlier leases within {share_lo:.2f}x-{share_hi:.2f}x (table "
            "below); eager steps do not (a launch-bound span: the GPU waits on Python's launches, which "
            "other servers' start-up slows), so the eager bug/fix ratio is not the fix's gain; the indexer's "
            "own GPU time per round is. Overhead (from the one-at-a-time runs): prompt 0's decode rounds "
            "timed by the client with and without nsys and the probes; one sample each, and two runs of one "
            "computation (bug, off) differ by as much as the instrument does, so read these as a bound. "
            "sglang 0.5.16 and 0.5.17 (upstream) run no indexer in the draft loop: they seed it from the "
            "draft-extend forward, where their one indexer call per round now sits, so their draft step is "
            "not comparable with the fix's. Printed by scripts/h200_pr29654_figures.py."
        ),
        tables=[
            Table("Per mode, context and arm", pd.DataFrame(table)),
            Table("sglang 0.5.17, the newest release on the H200's torch (mode latest, same lease)", latest),
            Table("Four servers sharing the GPU vs one at a time (median draft-step GPU ms)", shared),
            Table("The instrument's overhead (client side, prompt 0; the one-at-a-time runs)", over),
        ],
        plots=[Plot("Draft-step GPU time vs context", "data/results/h200-pr29654/runs/", draw=draw)],
    )
