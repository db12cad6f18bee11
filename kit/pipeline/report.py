"""What the report shows, as data and figures: this batch's runs, the committed H200 evidence, and what
each set of runs ran on (engine, device, model, Nsight Systems), read from the runs' own provenance."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from kit.compare.equivalence import _pooled_accept
from kit.compare.runs import load_run, summarize
from kit.paths import PUBLISHED, REPO, RESULTS
from kit.pipeline.matrix import AXIS_DEFAULTS, group_id
from kit.rundir import RunDir, is_complete, read_json

H200_RATIOS = RESULTS / "h200" / "ratios.csv"
SGLANG_H200_RATIOS = RESULTS / "h200-sglang" / "ratios.csv"
SGLANG_H200_COLUMNS = {
    "checkpoint": "checkpoint",
    "mode": "mode",
    "num_steps": "steps",
    "context_len": "context",
    "launches_bug": "launches/round 0.5.14",
    "launches_fix": "launches/round patched",
    "step_ms_bug": "draft step ms 0.5.14",
    "step_ms_fix": "draft step ms patched",
    "ratio_bug_over_fix": "bug/fix",
    "accept_bug": "accept 0.5.14",
    "accept_fix": "accept patched",
    "outputs_identical": "outputs identical",
    "logprob_median_abs_diff": "median |logprob diff|",
    "logprob_max_abs_diff": "max |logprob diff|",
}
# Result sets of the real-sglang rung, newest first, by the generated checkpoint's attention gain: with the
# first runs' gain (attn_out 5.5) attention decided some tokens at near-ties, so their outputs could not
# match (data/results/h200-sglang/README.md).
SGLANG_H200_SETS = {
    "attn_out 3.5": SGLANG_H200_RATIOS,
    "attn_out 5.5 (first runs)": SGLANG_H200_RATIOS.parent / "v1" / "ratios.csv",
}
ARM_COLORS = {"off": "#8172b2", "bug": "#c44e52", "fix": "#55a868", "upstream": "#4c72b0"}
# ratios.csv written before the indexer columns existed: every such run was the mini engine's torch
# indexer with num_steps 5 (data/results/h200/README.md, provenance).
H200_DEFAULTS = {"indexer_impl": "torch", "indexer_path": "dense", "num_steps": 5}
H200_LINE_KEYS = ["mode", "preset", "indexer_impl", "indexer_path", "num_steps", "requests"]
H200_STYLE = {("torch", "dense"): "--", ("sglang", "paged"): "-", ("sglang", "ragged"): ":"}
BASIS = {"gpu": "GPU time", "wall": "NVTX wall time"}


def context_label(n: Any) -> str:
    """4096 -> "4k", 524288 -> "512k"; other lengths as digits."""
    if n is None or pd.isna(n):
        return "-"
    n = int(n)
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else f"{n:,}"


def shown(path: Path) -> str:
    """A path as a reader finds it: relative to the repository when inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


# ------------------------------------------------------------------------------ what a set of runs ran on


def _version(nsys: str | None) -> str:
    return (nsys or "").split("-")[0]


def describe_runs(run_dirs: Iterable[Path]) -> dict[str, str]:
    """engine, device, model and Nsight Systems of a set of run directories, from their params.json and
    provenance.json (what the runs recorded, not what anyone remembers), plus `short`: e.g. "mini engine
    on CPU"."""
    params, provs = [], []
    for path in run_dirs:
        run = RunDir(Path(path))
        params.append(run.read_params() if run.params.is_file() else {})
        provs.append(read_json(run.provenance) if run.provenance.is_file() else {})
    backends = sorted(
        {p.get("backend") or q.get("backend") or "?" for p, q in zip(params, provs, strict=True)}
    )
    gpus = sorted({f"{q['gpu'].get('count', 1)}x {q['gpu']['name']}" for q in provs if q.get("gpu")})
    device = ", ".join(gpus) if gpus else "CPU"
    graphs = {bool(p.get("cuda_graph")) for p in params}
    modes = " and ".join(m for m, on in (("eager", False), ("CUDA graphs", True)) if on in graphs)
    engines, models, names = [], [], {"mini": "mini engine"}
    if "mini" in backends:
        engines.append("the kit's mini engine (a model of sglang 0.5.14's EAGLE-MTP draft loop, not sglang)")
        mini = [(p, q) for p, q in zip(params, provs, strict=True) if p.get("backend") == "mini"]
        presets = sorted({p.get("preset") or "default" for p, _ in mini if p.get("model") != "task"})
        if presets:
            models.append(f"mini preset {', '.join(presets)} (random weights)")
        tasks = sorted({_task_checkpoint(q) for p, q in mini if p.get("model") == "task"})
        if tasks:
            models.append(
                f"the task checkpoint ({'; '.join(tasks)}): it answers a lookup through its sparse "
                "attention, so its answers depend on the indexer's selection"
            )
    if "sglang" in backends:
        by_arm: dict[str, set[str]] = {}
        for q in provs:
            version = ((q.get("sglang") or {}).get("state") or {}).get("version")
            if version:
                by_arm.setdefault(q.get("arm", "?"), set()).add(version)
        builds = " vs ".join(f"{', '.join(sorted(v))} ({arm})" for arm, v in sorted(by_arm.items()))
        engines.append(f"sglang's own server: {builds or 'version not recorded'}")
        distinct = dict.fromkeys(", ".join(sorted(v)) for _, v in sorted(by_arm.items()))  # off shares fix's
        names["sglang"] = "sglang " + " vs ".join(distinct)
        archs = sorted({a for q in provs for a in (q.get("model") or {}).get("architectures", [])})
        models.append(", ".join(archs) or "model not recorded")
    measured = [q.get("measured_under_nsight") for q in provs]
    versions = sorted({_version(q.get("nsys_version")) for q in provs if q.get("measured_under_nsight")})
    if measured and all(measured):
        nsight = "Nsight Systems " + ", ".join(versions)
    elif any(measured):
        nsight = f"Nsight Systems {', '.join(versions)} for some runs; the others NOT measured under Nsight"
    else:
        nsight = "NOT measured under Nsight Systems (the kit's in-process NVTX recorder)"
    short = " + ".join(names.get(b, b) for b in backends) + f" on {device}"
    return {
        "engine": "; ".join(engines) or ", ".join(backends),
        "device": f"{device}, {modes}" if modes else device,
        "model": "; ".join(models) or "-",
        "Nsight": nsight,
        "short": short,
    }


def _task_checkpoint(prov: dict[str, Any]) -> str:
    """A mini task run's checkpoint as its provenance recorded it: keys, seed, and where it came from."""
    task = (prov.get("engine") or {}).get("task") or {}
    if not task:
        return "not recorded"
    source = str(task.get("source") or "?")
    where = "made in memory" if source.startswith("made in memory") else source
    return f"{task.get('n_keys', '?')} keys, seed {task.get('seed', '?')}, {where}"


# ------------------------------------------------------------------------------------- this batch's runs


def batch_runs(batch_dir: Path) -> list[Path]:
    """Completed run directories of a batch, in name order (set-aside failures are not counted twice)."""
    return sorted(p for p in Path(batch_dir).iterdir() if p.is_dir() and is_complete(p))


def group_of(params: dict[str, Any]) -> str:
    """The batch group of a run (kit.pipeline.matrix.group_id): the runs that differ only by arm, which the
    batch compares with each other (context, workload, steps, graphs, device, ...)."""
    return group_id({**AXIS_DEFAULTS, **params})


def _answers(accuracy: dict[str, dict[str, Any]] | None) -> str | None:
    """'right/requests' over the run's scored requests (task runs); None where no request has an answer."""
    if not accuracy:
        return None
    right, asked = sum(w["correct"] for w in accuracy.values()), sum(w["requests"] for w in accuracy.values())
    return f"{right}/{asked}"


def summary_table(batch_dir: Path) -> pd.DataFrame:
    """One row per completed run. The accept length is pooled over the run's requests (total tokens / total
    verify rounds), as the engine reports it and as `kit compare` pools it; summarize() averages the
    per-request ratios instead, which weighs a short request like a long one."""
    rows = []
    for run_dir in batch_runs(batch_dir):
        run = load_run(run_dir)
        s = summarize(run)
        accept = _pooled_accept(run["outputs"])
        rows.append(
            {
                "group": group_of(run["params"]),
                "workload": run["params"].get("workload"),
                "arm": s["arm"],
                "context_len": s["context_len"],
                "steps": run["params"].get("num_steps"),
                "status": s["status"],
                "launches/round": ",".join(map(str, s["launches_per_round"])),
                "expected": s["expected_per_round"],
                "rounds": s["num_rounds"],
                "indexer GPU ms/round": s["indexer_gpu_ms_per_round"],
                "draft step ms (median)": s["draft_step_ms"]["median"],
                "p10": s["draft_step_ms"]["p10"],
                "p90": s["draft_step_ms"]["p90"],
                "basis": s["draft_step_basis"],
                "accept length": round(accept, 4) if accept is not None else None,
                "answers right": _answers(s["accuracy"]),
                "source": s["source"],
                "method": s["method"],
                "run": run_dir.name,
            }
        )
    return pd.DataFrame(rows)


def outputs_identical(batch_dir: Path) -> dict[str, bool]:
    """Per group (group_of: the runs that differ only by arm, so one context and one workload): are all
    arms' greedy outputs identical to each other? Runs of two workloads or contexts had other prompts."""
    by_group: dict[str, list[list[Any]]] = {}
    for run_dir in batch_runs(batch_dir):
        run = load_run(run_dir)
        by_group.setdefault(group_of(run["params"]), []).append(
            [o["output_ids"] for o in sorted(run["outputs"], key=lambda o: o["prompt_id"])]
        )
    return {group: all(o == outs[0] for o in outs) for group, outs in by_group.items()}


def spreads_overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two (p10, p90) ranges share any value: a ratio of medians inside that is noise."""
    return a[0] <= b[1] and b[0] <= a[1]


def draft_step_pairs(table: pd.DataFrame) -> pd.DataFrame:
    """Per group with a bug and a fix run: each arm's draft-step median and its per-round p10-p90 (from
    summarize()), the ratio of medians bug/fix, and whether it is within noise: the two arms' p10-p90
    spreads overlap, so round-to-round variation (a loaded machine) covers the difference."""
    rows = []
    for group, runs in table.groupby("group", sort=False):
        arms = {r["arm"]: r for _, r in runs.iterrows()}
        bug, fix = arms.get("bug"), arms.get("fix")
        if bug is None or fix is None or pd.isna(bug["draft step ms (median)"]):
            continue
        if pd.isna(fix["draft step ms (median)"]) or not fix["draft step ms (median)"]:
            continue
        spread_bug, spread_fix = (bug["p10"], bug["p90"]), (fix["p10"], fix["p90"])
        within = spreads_overlap(spread_bug, spread_fix)
        rows.append(
            {
                "group": group,
                "context_len": bug["context_len"],
                "workload": bug.get("workload"),
                "bug ms": bug["draft step ms (median)"],
                "bug p10-p90": spread_bug,
                "fix ms": fix["draft step ms (median)"],
                "fix p10-p90": spread_fix,
                "ratio": round(float(bug["draft step ms (median)"] / fix["draft step ms (median)"]), 2),
                "within noise": within,
            }
        )
    return pd.DataFrame(rows)


def verdict_line(table: pd.DataFrame, identical: dict[str, bool]) -> str:
    if table.empty:
        return "NO RUNS: nothing to report"
    fix = table[table["arm"].isin(["fix", "upstream"])]
    bug = table[table["arm"] == "bug"]
    ok_fix = not fix.empty and (fix["status"] == "pass").all()
    ok_bug = bug.empty or (bug["status"] == "pass").all()
    same = all(identical.values())
    measured = "under Nsight Systems" if (table["source"] == "nsys").all() else "NOT all under Nsight"
    if ok_fix and ok_bug and same:
        return (
            f"CONFIRMED ({measured}): fix = 1 indexer launch per draft round, bug = num_steps-1, "
            "outputs identical"
        )
    parts = [] if ok_fix else ["fix arm does not show 1 launch/round"]
    parts += [] if ok_bug else ["bug arm did not reproduce"]
    parts += [] if same else ["outputs differ"]
    return "NOT CONFIRMED: " + "; ".join(parts)


CROWDED_BARS = 8  # more bars than this on one axis: values overlap, so the table beside the plot has them


def _bar_labels(table: pd.DataFrame) -> list[str]:
    """arm and context per bar; with the attribution method where those alone repeat (a batch with graph
    and eager cells of one context)."""
    sep = " " if len(table) > CROWDED_BARS else "\n"  # rotated when crowded: one line each
    labels = [f"{r.arm}{sep}{context_label(r.context_len)}" for r in table.itertuples()]
    if len(set(labels)) < len(labels) and "method" in table:
        labels = [f"{label} {m}" for label, m in zip(labels, table["method"], strict=True)]
    return labels


def _label_bars(ax: Axes, bars: Any, texts: list[str]) -> None:
    if len(texts) <= CROWDED_BARS:
        ax.bar_label(bars, texts, padding=2, fontsize=8)
    ax.margins(y=0.18)  # room above the tallest bar for its value


def plot_batch(table: pd.DataFrame, fig: Figure, scope: str) -> None:
    """This batch's runs, one bar per run: launches per round (against what the arm must show), the
    draft-step median with its p10-p90 range, and the pooled accept length; each bar carries its value.
    `scope` names what ran (e.g. "mini engine on CPU"); times are on this rung's own axis only."""
    launch_ax, step_ax, accept_ax = fig.subplots(1, 3)
    x = range(len(table))
    colors = [ARM_COLORS.get(a, "grey") for a in table["arm"]]
    launches = [max((int(v) for v in str(s).split(",") if v), default=0) for s in table["launches/round"]]
    bars = launch_ax.bar(x, launches, color=colors)
    _label_bars(
        launch_ax, bars, [f"{n} (expected {e})" for n, e in zip(launches, table["expected"], strict=True)]
    )
    launch_ax.set(ylabel="indexer launches per draft round", title="Indexer launches per draft round")
    median = pd.to_numeric(table["draft step ms (median)"], errors="coerce")
    low = (median - pd.to_numeric(table["p10"], errors="coerce")).clip(lower=0).fillna(0)
    high = (pd.to_numeric(table["p90"], errors="coerce") - median).clip(lower=0).fillna(0)
    bars = step_ax.bar(x, median.fillna(0), color=colors, yerr=[low, high], capsize=3, ecolor="#444")
    _label_bars(step_ax, bars, ["-" if pd.isna(m) else f"{m:.3g} ms" for m in median])
    basis = ", ".join(sorted({BASIS.get(b, str(b)) for b in table["basis"]}))
    step_ax.set(ylabel=f"draft step, ms ({basis})", title="Draft step: median, whiskers p10-p90")
    accept = pd.to_numeric(table["accept length"], errors="coerce")
    bars = accept_ax.bar(x, accept.fillna(0), color=colors)
    _label_bars(accept_ax, bars, ["-" if pd.isna(a) else f"{a:.3f}" for a in accept])
    accept_ax.set(ylabel="tokens per verify round", title="Accept length (pooled over requests)")
    turn = 90 if len(table) > CROWDED_BARS else 0
    for ax in (launch_ax, step_ax, accept_ax):
        ax.set_xticks(list(x), _bar_labels(table), fontsize=8, rotation=turn)
    fig.suptitle(f"This batch: {scope}", fontsize=11)


# ------------------------------------------------------------------- committed evidence: the mini engine


def h200_ratios() -> pd.DataFrame | None:
    """The committed H200 evidence (data/results/h200): bug vs fix per mode, indexer, steps and batch."""
    if not H200_RATIOS.is_file():
        return None
    ratios = pd.read_csv(H200_RATIOS)
    for col, default in H200_DEFAULTS.items():
        if col not in ratios:
            ratios[col] = default
    return ratios


def h200_indexer_label(impl: str, path: str) -> str:
    """Which indexer a row measured, in words: the torch stand-in or sglang's own kernels (which path)."""
    if impl == "sglang":
        return f"sglang kernels, {path}"
    return "torch stand-in" if impl == "torch" else f"{impl} ({path})"


def h200_table(ratios: pd.DataFrame, basis: str = "gpu") -> pd.DataFrame:
    """The rows of one latency basis (gpu: CUDA graphs; wall: eager) for display, in words: which indexer
    ran beside each bug/fix pair, and only the columns every row has."""
    rows = ratios[ratios["latency_basis"] == basis]
    indexer = [
        h200_indexer_label(i, p) for i, p in zip(rows["indexer_impl"], rows["indexer_path"], strict=True)
    ]
    return pd.DataFrame(
        {
            "mode": rows["mode"],
            "indexer": indexer,
            "preset": rows["preset"],
            "steps": rows["num_steps"],
            "batch": rows["requests"],
            "context": [context_label(c) for c in rows["context_len"]],
            "launches/round bug → fix": [
                f"{b} → {f}" for b, f in zip(rows["launches_bug"], rows["launches_fix"], strict=True)
            ],
            "draft step ms bug": rows["step_ms_bug"],
            "draft step ms fix": rows["step_ms_fix"],
            "bug/fix": rows["ratio_bug_over_fix"],
            "accept length bug = fix": rows["accept_bug"] == rows["accept_fix"],
            "outputs identical": rows["outputs_identical"],
        }
    ).reset_index(drop=True)


def plot_h200(ratios: pd.DataFrame, ax: Axes) -> None:
    """bug/fix draft-step ratio vs context on the H200, one line per mode and indexer, beside the PR's
    published point (a ratio of GPU times on another machine and model, marked so). Torch stand-in
    dashed, sglang's paged (decode) kernels solid, ragged dotted; the legend sits beside the axes."""
    graph = ratios[ratios["latency_basis"] == "gpu"]
    for key, grp in graph.groupby(H200_LINE_KEYS):
        mode, preset, impl, path, steps, requests = key
        grp = grp.sort_values("context_len")
        ax.plot(
            grp["context_len"],
            grp["ratio_bug_over_fix"],
            marker="o",
            ls=H200_STYLE.get((impl, path), "-."),
            label=f"{mode}: {preset}, batch {requests}, {steps} steps, {h200_indexer_label(impl, path)}",
        )
    pub = published()
    for p in pub["per_draft_step_ms"]:
        if p.get("speedup"):
            ax.plot(
                p["input_tokens"],
                p["speedup"],
                "*",
                ms=14,
                color="k",
                label=f"the PR's figure: {pub['setup']['model']}, {pub['setup']['hardware']} (not this GPU)",
            )
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set(
        xlabel="input tokens (log scale)",
        ylabel="draft step GPU time, bug / fix (ratio)",
        title="What the fix buys per draft step on one H200 (mini engine, CUDA graphs)",
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


# ------------------------------------------------------------------------ committed evidence: real sglang


def sglang_h200_table() -> pd.DataFrame | None:
    """The real-sglang rung (data/results/h200-sglang): the 0.5.14 wheel vs the kit's patched build running
    in sglang itself on one H200, one row per result set, mode, steps and context; its README says how to
    read the outputs."""
    sets = [pd.read_csv(p).assign(checkpoint=label) for label, p in SGLANG_H200_SETS.items() if p.is_file()]
    if not sets:
        return None
    ratios = pd.concat(sets, ignore_index=True).reindex(columns=list(SGLANG_H200_COLUMNS))
    return ratios.rename(columns=SGLANG_H200_COLUMNS)


def sglang_h200_runs() -> list[Path]:
    """The run directories behind the real-sglang rung (both result sets)."""
    return sorted(p.parent for s in SGLANG_H200_SETS.values() for p in s.parent.glob("runs/*/*/params.json"))


def plot_sglang_h200(table: pd.DataFrame, ax: Axes) -> None:
    """Draft-step GPU time per configuration, sglang 0.5.14 beside the patched build, values on the bars."""
    labels = [
        f"{r.mode}, {r.steps} steps\n{context_label(r.context)}\n{r.checkpoint.split(' (')[0]}"
        for r in table.itertuples()
    ]
    x = pd.Series(range(len(table)), dtype=float)
    for offset, col, arm, name in (
        (-0.2, "draft step ms 0.5.14", "bug", "sglang 0.5.14"),
        (0.2, "draft step ms patched", "fix", "0.5.14+pr29654"),
    ):
        bars = ax.bar(x + offset, table[col], width=0.4, color=ARM_COLORS[arm], label=name)
        ax.bar_label(bars, [f"{v:.3f}" for v in table[col]], padding=2, fontsize=7)
    ax.set_yscale("log")
    ax.margins(y=0.15)
    ax.set_xticks(list(x), labels, fontsize=8)
    ax.set(ylabel="draft step, GPU ms (median, log scale)", title="Draft-step GPU time in sglang, one H200")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def h200_runs() -> list[Path]:
    """The run directories behind the mini-engine H200 rung."""
    return sorted(p.parent for p in H200_RATIOS.parent.glob("runs/*/*/params.json"))


def published() -> dict[str, Any]:
    """The PR's own figures (data/pr29654_published.yaml): another machine and model, never measured here."""
    return yaml.safe_load(PUBLISHED.read_text())
