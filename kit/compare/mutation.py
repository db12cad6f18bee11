"""The mutation suite: every wrong fix of PR #29654 (kit.sglang_src.mutants) run beside bug, fix and off on
the task workloads, each compared with bug (off as the control) through the gate, and the gate's checks
that kill it. A mutant survives when no check fails; the fix and off must pass.

On CPU the mini engine runs every cell in one profiled process (kit.backends.mini.cells), under nsys; the
same classification reads real-sglang comparisons (scripts/h200_mutants.sh).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from kit import provenance
from kit.analysis.analyze import analyze
from kit.compare.gate import CHECKS, gate_checks, gate_failures
from kit.compare.runs import COMPARISON, compared_run, comparison, placed
from kit.errors import InputError
from kit.rundir import new_folder, write_json
from kit.sglang_src.mutants import MUTANTS
from kit.task.workload import WORKLOADS

# The CPU suite's workloads (its committed results hold these two; a cell of any other task workload that
# is present is compared and judged all the same).
CPU_WORKLOADS = ("same-target", "moving-target")

# Table columns: the checks that can kill a mutant, in the order, then the one this suite added.
KILLERS = ("launches", "acceptance", "accuracy", "tokens", "share_model")
LABELS = {
    "launches": "launches",
    "acceptance": "acceptance beyond the noise floor",
    "accuracy": "answer accuracy",
    "tokens": "tokens",
    "share_model": "share model",
}
OLD_GATE = tuple(k for k in KILLERS if k != "share_model")  # the gate before the suite strengthened it
STOPS = ("crash", "preflight")  # kills before the gate: sglang died starting the build, the kit refused it
ARMS = ("off", "bug", "fix")

# The CPU suite's cells: a context where the top-k matters (facts lie beyond the last index_topk tokens),
# three requests in one batch, enough tokens for a stale top-k to cost a round on moving-target.
CPU = {
    "backend": "mini",
    "model": "task",
    "context_len": 4096,
    "num_requests": 3,
    "max_new_tokens": 64,
    "num_steps": 5,
    "seed": 0,
}


def cell_id(candidate: str, workload: str) -> str:
    return f"{candidate}-{workload}"


def cpu_cells(settings: dict[str, Any] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """(run id, params) of every cell: off, bug, fix and each mutant (on the fix arm), per workload; then
    the same for the mutants run with the CUDA-graph runner's static batch (registry `cpu_static`), whose
    cells are `static-<candidate>-<workload>`."""
    base = {**CPU, **(settings or {})}
    static = [m for m, v in MUTANTS.items() if v.cpu_static is not None]
    out = []
    for prefix, extra, names in (("", {}, list(MUTANTS)), ("static-", {"static_batch": True}, static)):
        if not names:
            continue
        for w in CPU_WORKLOADS:
            out += [(prefix + cell_id(arm, w), {**base, **extra, "arm": arm, "workload": w}) for arm in ARMS]
            out += [
                (prefix + cell_id(m, w), {**base, **extra, "arm": "fix", "workload": w, "mutant": m})
                for m in names
            ]
    return out


def killed_by(result: dict[str, Any]) -> dict[str, list[str]]:
    """The gate's failures of one comparison, by the check that fails (KILLERS only, in order)."""
    checks = gate_checks(result)
    return {k: checks[k] for k in KILLERS if checks[k]}


def judge(comparisons: dict[str, dict[str, dict[str, Any]]], mode: str | None = None) -> list[dict[str, Any]]:
    """One row per candidate present (the fix, then each mutant): the checks that kill it on each workload,
    the union, and whether the gate before the share model would have."""
    names = [n for n in ("fix", *MUTANTS) if any(n in by for by in comparisons.values())]
    rows = []
    for name in names:
        per = {w: killed_by(by[name]) for w, by in comparisons.items() if name in by}
        killers = [k for k in KILLERS if any(k in f for f in per.values())]
        rows.append(
            {
                "candidate": name,
                "mode": mode,
                "kind": MUTANTS[name].kind if name in MUTANTS else None,
                "failures": {w: f for w, f in per.items() if f},
                "killed_by": killers,
                "killed_by_old_gate": [k for k in killers if k in OLD_GATE],
                "gate_failures": {w: gate_failures(by[name]) for w, by in comparisons.items() if name in by},
                "verdict": "killed" if killers else ("passes" if name == "fix" else "survived"),
            }
        )
    return rows


def stopped(name: str, mode: str, why: str, how: str) -> dict[str, Any]:
    """The row of a mutant that never reached the gate: the kit would not run it as a fix (`preflight`: kit
    verify does not call the build `fix`), or sglang died starting it (`crash`, e.g. in graph capture)."""
    return {
        "candidate": name,
        "mode": mode,
        "kind": MUTANTS[name].kind,
        "failures": {how: why},
        "killed_by": [how],
        "killed_by_old_gate": [how],
        "gate_failures": {},
        "verdict": "killed",
    }


def expected(name: str, where: str, mode: str | None = None) -> set[str]:
    """What must kill a mutant: on "cpu", or on "h200" in `mode` (graph / eager)."""
    m = MUTANTS[name]
    if where == "cpu":
        return set(m.cpu_static or ()) if mode == "static" else set(m.cpu)
    want = m.h200.get(mode or "graph", m.h200["graph"])  # a refused build has no mode
    return {want} if isinstance(want, str) else set(want)


def as_expected(suite: dict[str, Any], where: str) -> bool:
    """Every mutant killed by exactly the checks the registry names (a survivor only where it names none),
    the fix with no gate failure at all, and the off control passing."""
    for r in suite["rows"]:
        if r["candidate"] == "fix":
            if any(r["gate_failures"].values()):
                return False
        elif set(r["killed_by"]) != expected(r["candidate"], where, r.get("mode")):
            return False
    return all(v["passes"] for v in (suite.get("off") or {}).values())


def inert_where(suite: dict[str, Any]) -> dict[str, list[str]]:
    """Each mutant's modes where nothing killed it (the mistake is inert there), for every mutant that some
    other mode of the same suite kills; a mutant no mode kills is not listed (see survivors)."""
    out: dict[str, list[str]] = {}
    for name in MUTANTS:
        rows = [r for r in suite["rows"] if r["candidate"] == name]
        if any(r["verdict"] == "killed" for r in rows):
            spared = [r.get("mode") or "eager" for r in rows if r["verdict"] != "killed"]
            if spared:
                out[name] = spared
    return out


def survivors(suite: dict[str, Any]) -> list[str]:
    """Mutants present in the suite that no mode kills."""
    names = {r["candidate"] for r in suite["rows"]} & set(MUTANTS)
    return [
        n
        for n in MUTANTS
        if n in names and not any(r["verdict"] == "killed" for r in suite["rows"] if r["candidate"] == n)
    ]


def off_checks(
    comparisons: dict[str, dict[str, dict[str, Any]]], controls: dict[str, Path]
) -> dict[str, Any]:
    """The off control passes: its own verdict (every step computes its top-k), its tokens equal bug's,
    and its verify rounds match the share model's per-step prediction; read from the fix's comparison
    (its control) and the control's verdict.json (`controls`: workload -> the control's run directory)."""
    out = {}
    for w, by in comparisons.items():
        fix = by.get("fix")
        if fix is None or fix.get("control") is None:
            continue
        verdict = json.loads((controls[w] / "verdict.json").read_text())["status"]
        noise = (fix.get("noise") or {}).get("control") or {}
        model = fix.get("share_model") or {}
        status = model["by_workload"][w]["status"].get("control") if model.get("checked") else None
        same = bool(noise) and noise["identical"] == noise["requests"]
        out[w] = {
            "verdict": verdict,
            "tokens_equal_bug": same,
            "share_model": status,
            "passes": verdict == "pass" and same and status in ("matches", None),
        }
    return out


def judge_folder(folder: Path) -> dict[str, Any]:
    """Real-sglang results (scripts/h200_mutants.sh): comparisons/<mode>/<workload>/<candidate>/,
    refused/<mutant>.txt and crashed/<mutant>-<mode>.txt -> rows per mode, the off control, written to
    folder/suite.json. The runs a comparison names are found beside it (kit.compare.runs.compared_run)."""
    folder = Path(folder)
    rows, off, settings = [], {}, None
    for mode in ("graph", "eager"):
        comparisons: dict[str, dict[str, dict[str, Any]]] = {}
        files: dict[str, Path] = {}  # workload -> the fix's comparison.json
        for f in sorted((folder / "comparisons" / mode).glob("*/*/comparison.json")):
            comparisons.setdefault(f.parent.parent.name, {})[f.parent.name] = json.loads(f.read_text())
            if f.parent.name == "fix":
                files[f.parent.parent.name] = f
        if not comparisons:
            continue
        rows += judge(comparisons, mode)
        controls = {
            w: compared_run(f, "control") for w, f in files.items() if comparisons[w]["fix"].get("control")
        }
        off.update({f"{w} ({mode})": v for w, v in off_checks(comparisons, controls).items()})
        if files and settings is None:
            settings = _settings(compared_run(next(iter(files.values())), "b"))
    for f in sorted((folder / "crashed").glob("*.txt")):
        name, _, mode = f.stem.rpartition("-")
        rows.append(stopped(name, mode, f.read_text().strip(), "crash"))
    for f in sorted((folder / "refused").glob("*.txt")):
        rows.append(stopped(f.stem, "-", f.read_text().strip(), "preflight"))
    if not any(r["candidate"] == "fix" for r in rows):
        raise InputError(
            f"{folder} holds no comparison of the fix (comparisons/<mode>/<workload>/fix/comparison.json): "
            "run scripts/h200_mutants.sh OUT compare and unpack its results.tgz there",
            path=folder,
        )
    suite = {"settings": settings or {}, "rows": rows, "off": off}
    (folder / "suite.json").write_text(json.dumps(suite, indent=2) + "\n")
    return suite


def _settings(run: Path) -> dict[str, Any]:
    p = json.loads((run / "params.json").read_text())
    keys = (
        "backend",
        "context_len",
        "num_requests",
        "concurrency",
        "max_new_tokens",
        "num_steps",
        "cuda_graph",
    )
    return {k: p.get(k) for k in keys}


def run_cpu(out: Path, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The CPU suite into `out` (a new folder): runs/ (the cells, one nsys session), comparisons/, and
    suite.json (the rows, the off control, settings, timings, provenance). Returns what it wrote."""
    from kit.backends.mini.cells import run_cells

    out = new_folder(Path(out), "the suite's runs")
    cells = cpu_cells(settings)
    t0 = time.perf_counter()
    dirs = dict(zip((c[0] for c in cells), run_cells(cells, out, "runs", "suite"), strict=True))
    t_run = time.perf_counter() - t0
    for d in dirs.values():
        analyze(d)
    rows, off = [], {}
    for mode, comparisons in compare_cells(dirs).items():
        folder = out / ("comparisons" if mode == "eager" else f"comparisons-{mode}")
        for w, by in comparisons.items():
            for name, res in by.items():
                where = _fresh(folder / w / name)
                write_json(where / COMPARISON, placed(res, where))
        rows += judge(comparisons, mode)
        off.update({f"{w} ({mode})": v for w, v in off_checks(comparisons, cpu_controls(dirs, mode)).items()})
    suite = {
        "settings": {**CPU, **(settings or {})},
        "cells": {k: str(v.relative_to(out)) for k, v in dirs.items()},
        "rows": rows,
        "off": off,
        "seconds": {"cells": round(t_run, 1), "total": round(time.perf_counter() - t0, 1)},
        "provenance": provenance.collect("mini", "mutants", _nsys_version(dirs)),
    }
    write_json(out / "suite.json", suite)
    return suite


def compare_cells(dirs: dict[str, Path]) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """mode (eager, static) -> workload -> candidate -> its comparison with bug, off as the control, for
    the CPU cells present in `dirs` (run id -> run directory, as cpu_cells names them)."""
    out: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    for mode, prefix in (("eager", ""), ("static", "static-")):
        for w in WORKLOADS:
            for name in ("fix", *MUTANTS):
                if prefix + cell_id(name, w) not in dirs:
                    continue
                cell = [dirs[prefix + cell_id(n, w)] for n in ("bug", name, "off")]
                out.setdefault(mode, {}).setdefault(w, {})[name] = comparison(*cell, task_spec=None)
    return out


def cpu_controls(dirs: dict[str, Path], mode: str) -> dict[str, Path]:
    """workload -> the off cell that controls `mode`'s comparisons, among the CPU cells in `dirs`."""
    prefix = "" if mode == "eager" else "static-"
    return {w: dirs[prefix + cell_id("off", w)] for w in WORKLOADS if prefix + cell_id("off", w) in dirs}


def _fresh(path: Path) -> Path:
    return new_folder(path, "the comparisons")


def _nsys_version(dirs: dict[str, Path]) -> str | None:
    prov = next(iter(dirs.values())) / "provenance.json"
    return json.loads(prov.read_text()).get("nsys_version") if prov.is_file() else None


def table(suite: dict[str, Any]) -> str:
    """mutant -> killed by (one column per check, x where it fails), as the README and the report show."""
    modes = any(r.get("mode") for r in suite["rows"])
    cols = (*KILLERS, *(k for k in STOPS if any(k in r["killed_by"] for r in suite["rows"])))
    head = f"{'candidate':<21} " + (f"{'mode':<9} " if modes else "") + f"{'kind':<13} "
    lines = [head + " ".join(f"{k:<10}" for k in cols) + " verdict"]
    for r in suite["rows"]:
        marks = " ".join(f"{'x' if k in r['killed_by'] else '.':<10}" for k in cols)
        verdict = r["verdict"]
        if verdict == "killed" and not r["killed_by_old_gate"]:
            verdict += " (the gate before the share model let it pass)"
        why = MUTANTS[r["candidate"]].why_cpu if r["candidate"] in MUTANTS else ""
        if verdict == "survived" and why and r.get("mode") in (None, "eager"):
            verdict += f": {why}"
        mode = f"{r.get('mode') or '-':<9} " if modes else ""
        lines.append(f"{r['candidate']:<21} {mode}{r['kind'] or '-':<13} {marks} {verdict}")
    for w, v in (suite.get("off") or {}).items():
        lines.append(
            f"off control, {w}: {'passes' if v['passes'] else 'FAILS'} (verdict {v['verdict']}, tokens equal "
            f"bug's: {v['tokens_equal_bug']}, share model: {v['share_model']})"
        )
    return "\n".join(lines)


__all__ = [
    "CHECKS",
    "CPU",
    "KILLERS",
    "LABELS",
    "STOPS",
    "as_expected",
    "compare_cells",
    "cpu_cells",
    "cpu_controls",
    "inert_where",
    "judge",
    "run_cpu",
    "survivors",
    "table",
]
