"""The report's evidence ladder, strongest first: each rung is one registered function that says what ran
(engine, device, model, Nsight Systems, where the files are), its headline, its tables and its figures.

A new rung is one function decorated with `@rung(rank)` returning a `Rung` (or None when its data is
absent); the report shows every rung in rank order, so nothing else needs to change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from kit.errors import InputError
from kit.pipeline import report

CONFIRMED, NOT_CONFIRMED, NO_RUNS = "CONFIRMED", "NOT CONFIRMED", "NO RUNS"


@dataclass
class Table:
    title: str
    frame: pd.DataFrame
    note: str = ""


@dataclass
class Plot:
    """A figure drawn by `draw` (or a PNG already on disk), with its units in the axes and its source."""

    title: str
    source: str
    draw: Callable[[Figure], None] | None = None
    png: Path | None = None
    size: tuple[float, float] = (12.5, 4.2)
    save_as: Path | None = None


@dataclass
class Rung:
    key: str
    title: str
    scope: str  # what ran, in a few words: the headline starts with it
    status: str  # CONFIRMED..., NOT CONFIRMED..., NO RUNS, or "" for a section that is not evidence
    claim: str  # the rest of the headline, after the status
    about: dict[str, str]  # engine, device, model, Nsight, files
    note: str = ""  # markdown: how to read this rung
    tables: list[Table] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)

    @property
    def headline(self) -> str:
        return ": ".join(part for part in (self.scope, self.status, self.claim) if part)


RUNGS: list[tuple[int, Callable[[Path], Rung | None]]] = []


def rung(rank: int) -> Callable[[Callable[[Path], Rung | None]], Callable[[Path], Rung | None]]:
    """Register a rung: `rank` orders the ladder (lower = stronger evidence, shown first)."""

    def register(fn: Callable[[Path], Rung | None]) -> Callable[[Path], Rung | None]:
        RUNGS.append((rank, fn))
        RUNGS.sort(key=lambda item: item[0])
        return fn

    return register


def ladder(batch: Path) -> list[Rung]:
    """Every rung with data, strongest first; `batch` is this batch's directory."""
    if not Path(batch).is_dir():
        raise InputError(
            f"batch folder {batch} not found: name a folder kit batch wrote (runs/<batch>), or leave "
            "batch_dir empty for the newest analysed run's",
            path=batch,
        )
    return [r for _, fn in RUNGS if (r := fn(Path(batch))) is not None]


def _span(values: pd.Series) -> str:
    lo, hi = float(values.min()), float(values.max())
    return f"{lo:.2f}x" if round(lo, 2) == round(hi, 2) else f"{lo:.2f}x-{hi:.2f}x"


def _launch_claim(bug: pd.Series, fix: pd.Series, steps: pd.Series) -> tuple[bool, str]:
    """Did every row show num_steps - 1 launches per round unpatched and 1 patched?"""
    ok = bool(((bug == steps - 1) & (fix == 1)).all())
    per_steps = ", ".join(f"{s - 1} at {s} steps" for s in sorted(set(steps.astype(int)), reverse=True))
    return ok, f"num_steps - 1 indexer launches per draft round unpatched ({per_steps}), 1 with the fix"


@rung(5)
def real_sglang_task_h200(batch: Path) -> Rung | None:
    """sglang 0.5.14, the patched build and the off control on the retrieval-task checkpoint (answers that
    depend on the indexer's selection, a draft that misses): the strongest evidence of equivalence."""
    from kit.pipeline import task_evidence as te

    if not (te.TASK_RESULTS / "runs" / "task").is_dir():
        return None
    cells, gates, controls = te.cells(), te.gates(), te.controls()
    task = te.TASK_RESULTS / "runs" / "task"
    about = report.describe_runs(sorted(p for a in te.ARMS for p in task.glob(f"{a}-ctx*")))
    ck = te.checkpoint()
    about["model"] = (
        f"{about['model']}: the task checkpoint (`kit make-checkpoint --task`, {ck['task']['n_keys']} keys, "
        "DeepSeek-V3.2 layout): it answers a lookup through its sparse attention, and its draft misses on "
        "purpose"
    )
    about["files"] = "data/results/h200-sglang-task/ (README.md, runs/task/, comparisons/)"
    right = sum(c["accuracy"] == 1.0 for c in cells)
    same = all(c["tokens_equal_bug"] for c in cells if c["arm"] != "bug")
    passed = all(not g["gate_failures"] for g in gates)
    launches_ok = all(c["launches"] == ([1] if c["arm"] == "fix" else [4]) for c in cells)
    moving = [g["mean"] for g in gates if g["workload"] == "moving-target"]
    claim = (
        f"all answers right in {right}/{len(cells)} cells (3 arms x 4k, 64k, 500k x 2 workloads, 8 requests, "
        f"2 in flight), tokens identical to 0.5.14 for the fix and the off control, the gate passes every "
        f"cell; sharing the top-k costs the draft nothing on same-target and {-max(moving):.2f} to "
        f"{-min(moving):.2f} accepted tokens per verify round on moving-target; a wrong target top-k answers "
        f"{max((c['accuracy'] for c in controls), default=0):.0%}"
    )
    by = {(c["context_len"], c["workload"], c["arm"]): c for c in cells}
    rows = []
    for g in gates:
        key = (g["context_len"], g["workload"])
        bug, fix, off = (by[(*key, a)] for a in te.ARMS)
        ci = g["interval"]
        rows.append(
            {
                "context": report.context_label(g["context_len"]),
                "workload": g["workload"],
                "accuracy bug / fix / off": " / ".join(f"{c['accuracy']:.2f}" for c in (bug, fix, off)),
                "tokens = 0.5.14 (fix, off)": f"{fix['tokens_equal_bug']}, {off['tokens_equal_bug']}",
                "accept bug / fix / off": f"{bug['accept']:.2f} / {fix['accept']:.2f} / {off['accept']:.2f}",
                "fix - bug per request, 95% t": f"{g['mean']:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}]"
                if ci
                else "-",
                "noise floor (off)": g["noise_floor"],
                "launches/round bug, fix, off": f"{bug['launches']}, {fix['launches']}, {off['launches']}",
                "draft step GPU ms bug / fix": f"{bug['step_ms']:.3f} / {fix['step_ms']:.3f}",
                "gate": "PASS" if not g["gate_failures"] else "FAIL",
            }
        )
    return Rung(
        key="real-sglang-task-h200",
        title="Real sglang on a task whose answers depend on the indexer: 0.5.14, patched, off on one H200",
        scope="real sglang 0.5.14 vs patched on the task checkpoint, one NVIDIA H200 (committed results)",
        status=CONFIRMED if right == len(cells) and same and passed and launches_ok else NOT_CONFIRMED,
        claim=claim,
        about=about,
        note=(
            "Same-target: consecutive draft steps need facts the indexer selects together, so sharing step "
            "0's top-k should cost nothing, and the gate checks it against the off control (the patched "
            "build recomputing every step, as 0.5.14 does). Moving-target: every hop needs another group of "
            "facts, so a shared top-k misses the next one; that cost is reported with its interval, not "
            "gated. The control run replaces the target indexer's selection by the last 2,048 tokens. "
            "Printed by scripts/h200_task_figures.py from the same files."
        ),
        tables=[Table("Per context and workload (8 requests each)", pd.DataFrame(rows))],
    )


@rung(7)
def pr_grid_h200(batch: Path) -> Rung | None:
    """The PR's grid on real sglang, one `kit batch` of data/matrices/h200_pr29654.yaml through the notebooks:
    launches per round and draft-step time per context, beside the PR's own points (another machine)."""
    from kit.pipeline import grid_evidence as ge

    if not ge.batch_dir().is_dir():
        return None
    rows = ge.cells()
    graph = [r for r in rows if r["mode"] == "graph"]
    if not graph:
        return None
    runs = sorted(p for p in ge.batch_dir().glob("sglang-*-cuda") if (p / "verdict.json").is_file())
    about = report.describe_runs(runs)
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
    arms = sorted({a for r in rows for a in r["arms"]}, key=ge.ARMS.index)
    expected = ", ".join(
        f"{a} {'/'.join(str(n) for n in sorted({r['arms'][a]['expected'] for r in rows if a in r['arms']}))}"
        for a in arms
    )
    claim = (
        f"{', '.join(arms)} in one batch, CUDA graphs at {', '.join(report.context_label(c) for c in ctx)}: "
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
                    "context": report.context_label(r["context_len"]),
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
                "context": report.context_label(o["context_len"]),
                "window ms/round, with / without": f"{o['window_ms'][0]:.2f} / {o['window_ms'][1]:.2f}",
                "window ratio": o["window_ratio"],
                "whole decode ms/round, with / without": f"{o['decode_ms'][0]:.2f} / {o['decode_ms'][1]:.2f}",
                "decode ratio": o["decode_ratio"],
            }
            for o in (ge.overheads() if ge.batch_dir(ge.PARTS).is_dir() else [])
        ]
    )
    latest = pd.DataFrame(
        [
            {
                "context": report.context_label(r["context_len"]),
                "arm": arm,
                "build": s["build"],
                "launches/round (expected)": f"{s['launches']} ({s['expected']}) x {s['rounds']}",
                "draft step GPU ms (median)": round(s["step_ms"], 4),
                "tokens = 0.5.14": "-" if s["tokens_equal_bug"] is None else s["tokens_equal_bug"],
                "gate": ""
                if arm != "bug" or r["gate_failures"] is None
                else ("PASS" if not r["gate_failures"] else "FAIL"),
            }
            for r in (ge.cells(batch_name=ge.LATEST) if ge.batch_dir(batch=ge.LATEST).is_dir() else [])
            for arm, s in r["arms"].items()
        ]
    )
    share = ge.sharing() if ge.batch_dir(ge.PARTS).is_dir() else []
    graph_share = [x["step_ratio"] for x in share if x["mode"] == "graph"]
    share_lo, share_hi = (min(graph_share), max(graph_share)) if graph_share else (float("nan"),) * 2
    shared = pd.DataFrame(
        [
            {
                "mode": x["mode"],
                "context": report.context_label(x["context_len"]),
                "arm": x["arm"],
                "four at once": round(x["step_ms"][0], 4),
                "one at a time": round(x["step_ms"][1], 4),
                "ratio": round(x["step_ratio"], 2),
            }
            for x in share
        ]
    )
    pub = report.published()
    builds = {a: s["build"] for r in rows for a, s in r["arms"].items()}
    named = ", ".join(f"{a} ({builds[a]})" for a in arms)

    def draw(fig: Figure) -> None:
        ax = fig.subplots()
        for arm in arms:
            pts = [(r["context_len"], r["arms"][arm]["step_ms"]) for r in graph if arm in r["arms"]]
            ax.plot(*zip(*pts, strict=True), marker="o", color=report.ARM_COLORS.get(arm), label=arm)
        for p in pub["per_draft_step_ms"]:
            for arm in ("bug", "fix"):
                if p.get(arm):
                    ax.scatter(
                        p["input_tokens"],
                        p[arm],
                        marker="x",
                        s=60,
                        color=report.ARM_COLORS.get(arm),
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
        title=f"The PR's grid on real sglang: {', '.join(arms)} at {report.context_label(min(ctx))}-"
        f"{report.context_label(max(ctx))} input tokens in one papermill batch",
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


@rung(40)
def mutation_suite(batch: Path) -> Rung | None:
    """Wrong fixes of PR #29654 (kit.sglang_src.mutants) run beside bug, fix and off: which gate check kills
    each. Evidence about the gate rather than the fix (the gate rejects wrong fixes, so its passes above
    mean something), shown after the evidence about the fix."""
    import json

    from kit.compare import mutation
    from kit.paths import RESULTS

    folder = RESULTS / "mutants"
    loaded = {
        n: json.loads((folder / n / "suite.json").read_text())
        for n in ("cpu", "h200")
        if (folder / n / "suite.json").is_file()
    }
    if "cpu" not in loaded:
        return None
    cpu = loaded["cpu"]
    about = report.describe_runs(p for c in cpu["cells"].values() if (p := folder / "cpu" / c).is_dir())
    about["model"] = "the task checkpoint made in memory (seed 0), 4k context, both task workloads"
    about["files"] = "data/results/mutants/ (README.md, cpu/suite.json, cpu/runs/, cpu/comparisons/)"
    rows = [r for r in cpu["rows"] if r["candidate"] != "fix"]
    names = list(dict.fromkeys(r["candidate"] for r in rows))
    lost = mutation.survivors(cpu)
    late = [
        n
        for n in names
        if not any(r["killed_by_old_gate"] for r in rows if r["candidate"] == n and r["verdict"] == "killed")
        and n not in lost
    ]
    claim = f"the gate kills {len(names) - len(lost)} of {len(names)} wrong fixes on CPU"
    if lost:
        claim += f" ({', '.join(lost)} survived)"
    inert = mutation.inert_where(cpu)
    if inert:
        claim += " (" + "; ".join(f"{n} lives only in {'/'.join(m)} mode" for n, m in inert.items())
        claim += (
            ": there each round's spec_info is fresh, so it is the fix; the CUDA-graph runner's static "
            "batch kills it)"
        )
    if late:
        claim += f"; {', '.join(late)} only since the gate checks the task's share model"
    claim += "; the fix and the off control pass"
    h200 = loaded.get("h200")
    if h200 is None:
        claim += "; not yet run on real sglang (recipe: data/results/mutants/README.md)"
    else:
        names = {r["candidate"] for r in h200["rows"]} - {"fix"}
        lost = mutation.survivors(h200)
        inert = "; ".join(f"{n} in {'/'.join(m)}" for n, m in mutation.inert_where(h200).items())
        claim += (
            f". On one H200 with real sglang 0.5.14: {len(names) - len(lost)} of {len(names)} killed"
            + (f" ({', '.join(lost)} survived)" if lost else "")
            + (f"; each lives only where its mistake is inert ({inert})" if inert else "")
            + "; the fix and off pass with CUDA graphs and in eager mode"
        )
        about["files"] += ", h200/suite.json, h200/runs/, h200/comparisons/"
        cells = sorted(v.parent for v in (folder / "h200" / "runs" / "mutants").glob("*-ctx*/verdict.json"))
        gpu = report.describe_runs(cells)
        about["model"] += f"; on the H200 the task checkpoint at {h200['settings']['context_len']} tokens"
        about["engine"] += "; on the GPU, sglang's own server: 0.5.14, the kit's fix and each mutant's build"
        about["device"] = f"{about['device']} (mini engine); {gpu['device']} (sglang)"
        about["Nsight"] = f"{about['Nsight']} (CPU); {gpu['Nsight']} (H200)"
        about["short"] = f"{about['short']} + real sglang 0.5.14 and the mutants' builds on {gpu['device']}"

    stops = [
        k for k in mutation.STOPS if any(k in r["killed_by"] for v in loaded.values() for r in v["rows"])
    ]

    def frame(suite: dict) -> pd.DataFrame:
        cols = [*mutation.KILLERS, *stops]
        out = []
        for r in suite["rows"]:
            row = {"candidate": r["candidate"], "kind": r["kind"] or "-", "mode": r.get("mode") or "eager"}
            row.update({k.replace("_", " "): "x" if k in r["killed_by"] else "" for k in cols})
            out.append({**row, "verdict": r["verdict"]})
        return pd.DataFrame(out)

    tables = [Table("CPU (mini engine, eager, under Nsight Systems): mutant -> killed by", frame(cpu))]
    if "h200" in loaded:
        tables.append(
            Table(
                "Real sglang 0.5.14 on one H200 (CUDA graphs and eager, under Nsight Systems 2025.3.1): "
                "mutant -> killed by ('crash': sglang died starting the build)",
                frame(loaded["h200"]),
            )
        )
    return Rung(
        key="mutation-suite",
        title="Wrong fixes must fail: the mutation suite",
        scope=f"{len(names)} wrong fixes of PR #29654 on the task workloads (committed results)",
        status=CONFIRMED if all(mutation.as_expected(v, k) for k, v in loaded.items()) else NOT_CONFIRMED,
        claim=claim,
        about=about,
        note=(
            "Each mutant is a patch against sglang 0.5.14 (kit/sglang_src/patches/mutants/) and the same "
            "mistake in the mini engine, compared with 0.5.14 (the bug) with the off control, through the "
            "gate. 'share model': the verify rounds each request must take when the later draft steps share "
            "the round's first top-k, derived from the task (kit/compare/share_model.py); it catches a stale "
            "top-k that keeps one launch per round and the same-target acceptance. Printed by "
            "scripts/mutants.py."
        ),
        tables=tables,
    )


@rung(10)
def real_sglang_h200(batch: Path) -> Rung | None:
    """sglang 0.5.14 (PyPI) vs the kit's patched build, in sglang's own server on one H200."""
    table = report.sglang_h200_table()
    if table is None:
        return None
    about = report.describe_runs(report.sglang_h200_runs())
    about["model"] = (
        f"{about['model']}: a DSA + MTP checkpoint generated by `kit make-checkpoint` (DeepSeek-V3.2 "
        "layout, 2 layers + 1 MTP layer, random weights; no weights can be downloaded on that host)"
    )
    about["files"] = "data/results/h200-sglang/ (README.md, ratios.csv, runs/; first runs in v1/)"
    launches_ok, launches = _launch_claim(
        table["launches/round 0.5.14"], table["launches/round patched"], table["steps"]
    )
    current = table[table["checkpoint"] == next(iter(report.SGLANG_H200_SETS))]
    same = int(current["outputs identical"].sum())
    confirmed = launches_ok and not current.empty and same == len(current)
    claim = (
        f"{launches} in all {len(table)} configurations (eager and CUDA graphs, "
        f"{report.context_label(table['context'].min())}-{report.context_label(table['context'].max())}); "
        f"greedy outputs identical in {same}/{len(current)} pairs on the current checkpoint; "
        f"draft step {_span(table['bug/fix'])} faster with the fix (GPU time)"
    )
    keys = {"checkpoint": table["checkpoint"], "mode": table["mode"], "steps": table["steps"]}
    keys["context"] = [report.context_label(c) for c in table["context"]]
    launches_table = pd.DataFrame(
        {
            **keys,
            "launches/round 0.5.14": table["launches/round 0.5.14"],
            "launches/round patched": table["launches/round patched"],
            "draft step GPU ms 0.5.14": table["draft step ms 0.5.14"],
            "draft step GPU ms patched": table["draft step ms patched"],
            "0.5.14 / patched": table["bug/fix"],
        }
    )
    outputs_table = pd.DataFrame(
        {
            **keys,
            "accept length 0.5.14": table["accept 0.5.14"],
            "accept length patched": table["accept patched"],
            "greedy outputs identical": table["outputs identical"],
            "median |logprob diff|, nats": table["median |logprob diff|"],
            "max |logprob diff|, nats": table["max |logprob diff|"],
        }
    )
    return Rung(
        key="real-sglang-h200",
        title="Real sglang on one GPU: sglang 0.5.14 vs the patched build on one H200",
        scope="real sglang 0.5.14 on one NVIDIA H200 (committed results)",
        status=CONFIRMED if confirmed else NOT_CONFIRMED,
        claim=claim,
        about=about,
        note=(
            "Eager rows are counted through NVTX (kernel -> runtime call -> range), CUDA-graph rows through "
            "the graph node each replayed kernel was captured as. The current checkpoint (attn_out 3.5) "
            "keeps every greedy choice away from a tie; on the first runs' checkpoint (attn_out 5.5) "
            "attention picked 7% of the tokens at near-ties, where the two builds' outputs split, so "
            "those rows count launches and time only. Logprob differences were recorded for the current "
            "set only ('-': not recorded)."
        ),
        tables=[
            Table("Indexer launches per draft round and draft-step GPU time (median)", launches_table),
            Table("Outputs: accept length, greedy tokens and target logprobs", outputs_table),
        ],
        plots=[
            Plot(
                "Draft-step GPU time per configuration",
                "data/results/h200-sglang/ratios.csv and v1/ratios.csv",
                draw=lambda fig: report.plot_sglang_h200(table, fig.subplots()),
                size=(12.5, 4.0),
            )
        ],
    )


@rung(15)
def tensor_parallel_h200(batch: Path) -> Rung | None:
    """The TP 4 step (every rank counted, a rank that disagrees fails the cell), so far only as its TP 1 dry
    run on one H200: no 4-GPU machine has been lent."""
    from kit.pipeline import tp_evidence as tpe

    rows = tpe.cells(tpe.DRY_RUN)
    if not rows:
        return None
    facts = tpe.run_facts(tpe.DRY_RUN)
    tp = sorted({r["tp_size"] for r in rows})
    about = report.describe_runs(tpe.DRY_RUN / "task" / r["name"] for r in rows)
    about["model"] += ": the task checkpoint, as in the task rung"
    about["files"] = "data/results/h200-tp4/ (README.md, tp1-dry-run/)"
    passed = sum(r["verdict"] == "pass" for r in rows)
    right = sum(bool(r["summary"]) and r["summary"]["accuracy"] == 1.0 for r in rows)
    same = all(r["tokens_equal_bug"] for r in rows if r["arm"] != "bug")  # the claim: equal across arms
    # beside the task rung's TP 1 cells: told, not gated (TP > 1 may round differently and still be right)
    alone = sum(bool(r["tokens_equal_tp1_alone"]) for r in rows)
    speed = ", ".join(
        f"{'/'.join(f'{v:.2f}x' for v in x['per_rank'])} at {report.context_label(x['context_len'])} "
        f"{x['workload']}"
        for x in tpe.ratios(rows)
    )
    claim = (
        f"{passed}/{len(rows)} cells pass with every rank holding the arm's count, answers right in "
        f"{right}/{len(rows)}, tokens {'equal' if same else 'NOT equal'} across arms (and to the task rung's "
        f"TP 1 cells in {alone}/{len(rows)}), draft step faster with the fix by {speed}; "
        "TP 4 NOT RUN: no 4-GPU machine has been lent"
    )
    table = pd.DataFrame(
        [
            {
                "cell": r["name"],
                "ended": r["ended"],
                "answers right": (
                    f"{round(r['summary']['accuracy'] * r['summary']['n'])}/{r['summary']['n']}"
                    if r["summary"]
                    else "-"
                ),
                "verdict": r["verdict"] or "-",
                "ranks (pid: launches x rounds)": "; ".join(
                    f"{k['pid']}: {'/'.join(sorted(k['observed_counts']))} x {k['rounds']}"
                    for k in r["ranks"]
                ),
                "draft step GPU ms per rank": ", ".join(f"{k['step_ms']:.3f}" for k in r["ranks"]),
                "tokens = bug": "-" if r["tokens_equal_bug"] is None else r["tokens_equal_bug"],
                "tokens = task rung (TP 1 alone)": r["tokens_equal_tp1_alone"],
            }
            for r in rows
        ]
    )
    shared = "both servers shared the GPU" if facts["shared_gpu"] else "each server had the GPU to itself"
    return Rung(
        key="tensor-parallel-h200",
        title="Tensor parallel: the TP 4 step, run so far only at TP 1 on one H200",
        scope=f"real sglang 0.5.14 vs patched, the TP 4 step at TP {', '.join(map(str, tp))} on one NVIDIA "
        "H200 (committed results)",
        status=CONFIRMED if passed == len(rows) and right == len(rows) and same else NOT_CONFIRMED,
        claim=claim,
        about=about,
        note=(
            "sglang 0.5.14 replicates the DSA indexer on every TP rank, so each rank runs its own draft loop "
            "and its own indexer launches; one nsys report per server holds every rank's process and each "
            f"cell's verdict holds every rank to the arm's count. Only the TP 1 path has run ({shared}): "
            "the per-rank accounting with one rank, not yet with four. Printed by scripts/h200_tp_figures.py."
        ),
        tables=[Table("Per cell: every rank's launches per draft round and draft-step time", table)],
    )


@rung(20)
def mini_engine_h200(batch: Path) -> Rung | None:
    """The kit's mini engine on one H200 at DeepSeek-V3.2 / GLM-5 shapes, committed."""
    ratios = report.h200_ratios()
    if ratios is None:
        return None
    about = report.describe_runs(report.h200_runs())
    about["model"] += "; shapes of DeepSeek-V3.2 (dsv32) and GLM-5 (glm5)"
    about["files"] = "data/results/h200/ (README.md, ratios.csv, summary.csv, runs/)"
    launches_ok, launches = _launch_claim(ratios["launches_bug"], ratios["launches_fix"], ratios["num_steps"])
    same = int(ratios["outputs_identical"].sum())
    graph = ratios[ratios["latency_basis"] == "gpu"]
    claim = (
        f"{launches} in all {len(ratios)} pairs (CUDA graphs and eager, torch stand-in and sglang's indexer "
        f"kernels, {report.context_label(ratios['context_len'].min())}-"
        f"{report.context_label(ratios['context_len'].max())}); greedy outputs identical in "
        f"{same}/{len(ratios)}; draft step {_span(graph['ratio_bug_over_fix'])} faster with the fix "
        "(GPU time, CUDA graphs)"
    )
    return Rung(
        key="mini-engine-h200",
        title="The mini engine on one GPU: NVIDIA H200",
        scope="mini engine on one NVIDIA H200 (committed results)",
        status=CONFIRMED if launches_ok and same == len(ratios) else NOT_CONFIRMED,
        claim=claim,
        about=about,
        note=(
            "`indexer` says which lightning indexer ran: the kit's torch stand-in, or sglang's own kernels "
            "(deep_gemm's fp8 paged logits, the decode path sglang takes for draft steps; the ragged "
            "extend kernel as a counterfactual; sgl_kernel's top-k). With CUDA graphs the draft loop is "
            "replayed as one graph, as sglang does, and times are GPU spans; eager times are NVTX wall "
            "time, bound by kernel launches, so they are shown apart."
        ),
        tables=[
            Table(
                "CUDA graphs: launches per draft round and draft-step GPU time (median)",
                report.h200_table(ratios),
            ),
            Table(
                "Eager: launches per draft round and draft-step wall time (median)",
                report.h200_table(ratios, "wall"),
            ),
        ],
        plots=[
            Plot(
                "bug / fix draft-step GPU time against context length",
                "data/results/h200/ratios.csv; the PR's point: data/pr29654_published.yaml",
                draw=lambda fig: report.plot_h200(ratios, fig.subplots()),
                size=(12.5, 4.6),
            )
        ],
    )


@rung(25)
def kineto_h200(batch: Path) -> Rung | None:
    """The same verdict from PyTorch-profiler (Kineto) traces as from Nsight, on one H200, committed."""
    from kit.pipeline import kineto_evidence as ke

    rows = ke.cells()
    if not rows:
        return None
    same = ke.agreement(rows)
    real = ke.cells(ke.SGLANG)  # real sglang's /start_profile trace beside nsys on one cell
    real_same = ke.agreement(real)
    long = ke.long_window()  # the benchmark's whole trace: a verdict of its own, timed on CPU
    about = report.describe_runs(
        [ke.FOLDER / "runs" / r["name"] for r in rows] + [ke.SGLANG / r["name"] for r in real]
    )
    about["model"] += "; the mini engine with sglang's indexer kernels, DeepSeek-V3.2 shapes, 8k context"
    about["files"] = (
        "data/results/h200-kineto/ (README.md, runs/, sglang/, long/); trimmed traces in "
        "tests/fixtures/kineto/; data/bench_kineto.md"
    )
    torch_run = next(r for r in rows if r["profiler"] == "torch")["provenance"]
    about["Nsight"] = (
        f"Nsight Systems for the nsys cells; the torch cells under torch.profiler (CPU + CUDA), torch "
        f"{torch_run['torch']['version']}"
    )
    pairs = ", ".join(f"{a} {m}" for (a, m), ok in sorted(same.items()) if ok)
    claim = (
        f"on the mini engine the torch-profiler verdicts equal the Nsight ones round by round in "
        f"{sum(same.values())} of {len(same)} pairs ({pairs}); under CUDA graphs the replayed kernels are "
        "counted by name inside each draft_round range, and the no-range classifier agrees"
    )
    if real:
        versions = sorted({r["provenance"]["sglang"]["sglang_version"] for r in real})
        torch_launches = {(r["arm"], r["mode"]): r["launches"] for r in real if r["profiler"] == "torch"}
        got = "; ".join(
            f"{a} {m} {'equal' if ok else 'DIFFERENT'} ({sorted(set(torch_launches[a, m]))} per round)"
            for (a, m), ok in sorted(real_same.items())
        )
        claim = (
            f"real sglang ({', '.join(versions)}) under its own /start_profile against nsys on the same "
            f"cell, round by round in {sum(real_same.values())} of {len(real_same)} pairs: {got}; {claim}"
        )
    table = pd.DataFrame(
        [
            {
                "cell": f"{where}{r['name']}",
                "engine": r["indexer"] if where else f"mini ({r['indexer']} indexer)",
                "profiler": r["profiler"],
                "arm": r["arm"],
                "graphs": r["mode"],
                "method": r["method"],
                "launches / round": ", ".join(map(str, sorted(set(r["launches"])))),
                "rounds": len(r["launches"]),
                "verdict": r["status"],
            }
            for where, group in (("sglang/", real), ("long/", [long] if long else []), ("", rows))
            for r in group
        ]
    )
    agree = {**same, **{("sglang " + a, m): ok for (a, m), ok in real_same.items()}}
    speed = ""
    if long and long["bench"]:
        b, mb = long["bench"], long["trace"]["bytes_uncompressed"] / 1e6
        hta = "failed" if b["hta_error"] else f"took {b['hta_s']:.1f} s"
        speed = (
            f" A whole trace sglang wrote ({mb:.0f} MB, a {len(long['launches'])}-round window, "
            f"{b['status']}) became a verdict in {b['kit_s']:.1f} s on 2 CPU cores; HolisticTraceAnalysis's "
            f"load of it {hta} (data/bench_kineto.md)."
        )
    return Rung(
        key="kineto-h200",
        title="Without Nsight: PyTorch-profiler (Kineto) traces on one H200",
        scope="real sglang and the mini engine on one NVIDIA H200 under torch.profiler and under nsys "
        "(committed results)",
        status=CONFIRMED if agree and all(agree.values()) else NOT_CONFIRMED,
        claim=claim,
        about=about,
        note=(
            "For users who cannot run nsys: the probe's ranges become record_function ranges, kernels join "
            "their launch by correlation id (eager), and a CUDA-graph replay is counted inside the "
            "draft_round range enclosing its cudaGraphLaunch, since torch 2.11's Kineto writes no graph "
            "node ids. A trace whose kernels match none of the indexer's names is inconclusive, not 0."
            + speed
        ),
        tables=[Table("Per cell: method and indexer launches per draft round", table)],
    )


@rung(30)
def this_batch(batch: Path) -> Rung:
    """This batch's own runs, whatever they ran on (the demo: the mini engine on CPU)."""
    table = report.summary_table(batch)
    runs = report.batch_runs(batch)
    about = report.describe_runs(runs) if runs else {"short": "no completed runs"}
    about["files"] = (
        f"{report.shown(batch)}/ (one folder per run: verdict.json, rounds.csv, outputs.jsonl, ...)"
    )
    identical = report.outputs_identical(batch)
    status, _, claim = report.verdict_line(table, identical).partition(": ")
    if table.empty:
        return Rung(
            "this-batch", f"This batch: {batch.name}", f"this run: {about['short']}", status, claim, about
        )
    pairs = report.draft_step_pairs(table)
    claim += _ratio_claim(pairs)
    shown = pd.DataFrame(
        {
            "run": table["run"],
            "arm": table["arm"],
            "context": [
                _cell_label(c, w) for c, w in zip(table["context_len"], table["workload"], strict=True)
            ],
            "steps": table["steps"],
            "launches/round (expected)": [
                f"{n} ({e})" for n, e in zip(table["launches/round"], table["expected"], strict=True)
            ],
            "rounds": table["rounds"],
            "verdict": table["status"],
            "draft step ms, median": table["draft step ms (median)"],
            "p10-p90 ms": [_spread(a, b) for a, b in zip(table["p10"], table["p90"], strict=True)],
            "accept length": table["accept length"],
            **({"answers right": table["answers right"]} if table["answers right"].notna().any() else {}),
            "outputs identical across arms": [identical.get(g) for g in table["group"]],
        }
    )
    tables = [Table("One row per run", shown)]
    if not pairs.empty:
        tables.append(
            Table(
                "Draft step, bug vs fix: each arm's median and its per-round spread",
                pd.DataFrame(
                    {
                        "context": [
                            _cell_label(c, w)
                            for c, w in zip(pairs["context_len"], pairs["workload"], strict=True)
                        ],
                        "bug ms, median": pairs["bug ms"],
                        "bug p10-p90 ms": [_spread(*s) for s in pairs["bug p10-p90"]],
                        "fix ms, median": pairs["fix ms"],
                        "fix p10-p90 ms": [_spread(*s) for s in pairs["fix p10-p90"]],
                        "bug/fix": [f"{r:.2f}x" for r in pairs["ratio"]],
                        "noise": [
                            "within noise: spreads overlap" if w else "beyond noise"
                            for w in pairs["within noise"]
                        ],
                    }
                ),
                note="A ratio is within noise when the two arms' p10-p90 draft-step ranges overlap: the "
                "rounds of one run vary by more than the arms differ (a loaded machine does this), so the "
                "ratio of medians says nothing about the fix.",
            )
        )
    basis = ", ".join(sorted({report.BASIS.get(b, str(b)) for b in table["basis"]}))
    how = ", ".join(sorted(set(table["method"])))
    plots = [
        Plot(
            "This batch, one bar per run",
            f"{report.shown(batch)}/*/verdict.json, rounds.csv, outputs.jsonl",
            draw=lambda fig: report.plot_batch(table, fig, about["short"]),
            size=(12.5, 3.9),
            save_as=batch / "report_plots.png",
        )
    ]
    plots += [
        Plot(
            f"One draft round on the timeline: {run.name}",
            f"{report.shown(run)}/timeline.png, drawn from the run's profile report",
            png=run / "timeline.png",
        )
        for run in runs
        if (run / "timeline.png").is_file()
    ]
    return Rung(
        key="this-batch",
        title=f"This batch's own runs: {batch.name}",
        scope=f"this run: {about['short']}",
        status=status,
        claim=claim,
        about=about,
        note=(
            f"Launches counted by `{how}` from each run's report; draft-step times are {basis} per draft "
            "forward, medians over the draft rounds; accept length = completion tokens / verify rounds, "
            "pooled over the run's requests. These times belong to this machine only: they are never "
            "drawn beside the GPU figures above or the PR's."
        ),
        tables=tables,
        plots=plots,
    )


def _cell_label(context_len: Any, workload: Any) -> str:
    """ "4k", or "4k same-target" where the batch has a workload axis."""
    ctx = report.context_label(context_len)
    return f"{ctx} {workload}" if isinstance(workload, str) and workload else ctx


def _spread(p10: Any, p90: Any) -> str:
    return f"{p10:.3g}-{p90:.3g}" if pd.notna(p10) and pd.notna(p90) else "-"


def _ratio_claim(pairs: pd.DataFrame) -> str:
    """The headline's draft-step ratio bug/fix, each one within the arms' per-round noise said so."""
    if pairs.empty:
        return ""
    labels = [_cell_label(c, w) for c, w in zip(pairs["context_len"], pairs["workload"], strict=True)]
    within = pairs["within noise"].astype(bool)
    out = []
    if (~within).any():
        out.append(f"draft step bug/fix {_span(pairs['ratio'][~within])} beyond the per-round noise")
    if within.any():
        which = ", ".join(
            f"{r:.2f}x at {lb}" for r, lb, w in zip(pairs["ratio"], labels, within, strict=True) if w
        )
        out.append(f"draft step bug/fix {which} within noise (the arms' p10-p90 draft-step spreads overlap)")
    return "; " + "; ".join(out)


def published_figures() -> Rung:
    """The PR's own figures: not a rung (nothing here was measured by the kit), shown last and apart."""
    pub = report.published()
    setup = pub["setup"]
    spec = setup["speculative"]
    rows = [
        {
            "input tokens": f"~{p['input_tokens'] // 1000}k" if p.get("approx") else p["input_tokens"],
            "draft step ms, bug": p.get("bug"),
            "draft step ms, fix": p.get("fix"),
            "bug / fix": p.get("speedup"),
            "note": p.get("note", ""),
        }
        for p in pub["per_draft_step_ms"]
    ]
    acc = pub["accept_length"]
    return Rung(
        key="published",
        title="The PR's own figures: another machine and model",
        scope="the PR's figures, another machine and model (not measured by this kit)",
        status="",
        claim=f"{setup['model']} on {setup['hardware']}; accept length {acc['bug']} -> {acc['fix']}",
        about={
            "engine": "sglang with PR #29654, as its author ran it",
            "device": setup["hardware"],
            "model": setup["model"],
            "speculative": f"EAGLE {spec['num_steps']}/{spec['eagle_topk']}/{spec['num_draft_tokens']}",
            "files": f"{report.shown(report.PUBLISHED)} ({pub['source']})",
        },
        note=(
            "Measured by the PR's author on another machine and model, so listed here and never drawn beside "
            "this kit's CPU times; the H200 ratio plot above marks the one published ratio as such."
        ),
        tables=[Table("Per draft step, as published", pd.DataFrame(rows))],
    )
