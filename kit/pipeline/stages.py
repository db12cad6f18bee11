"""The batch-level stages: a comparison with its gate per bug/fix pair, the instrument's overhead per
unprofiled cell and its profiled twin, then one report for the batch. (The mutants' judgements, a
comparison with the gate per wrong fix: kit.pipeline.mutant_cells.)

A stage's earlier output is set aside (`*.superseded-<n>`), never overwritten, when something new makes it
stale; with nothing new it is skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit import rundir
from kit.compare.runs import COMPARISON, fresh_dir, write_comparison
from kit.errors import InputError
from kit.paths import unique_path
from kit.pipeline import notebooks
from kit.pipeline.cell import is_complete, one_line, profiled, record_failure
from kit.pipeline.matrix import AXIS_DEFAULTS, Cell, Matrix, group_id
from kit.pipeline.overhead import OVERHEAD, write_overhead

BATCH_STAGE_FILES = ("executed-04_report.ipynb", "report.html", "report_plots.png")


@dataclass
class StageResult:
    name: str
    status: str  # done | skipped | failed
    path: str
    message: str = ""
    gate: list[str] | None = None
    verdict: str | None = None  # a mutant's judgement: killed | survived (kit.pipeline.mutant_cells)
    cell: str | None = None  # the run id a mutant's judgement is about


def pairs(m: Matrix) -> dict[str, tuple[Cell, Cell]]:
    """group -> (bug cell, fix cell): cells that differ only by arm (per context length, steps, device...)."""
    groups = arm_cells(m)
    return {g: (arms["bug"], arms["fix"]) for g, arms in groups.items() if "bug" in arms and "fix" in arms}


def controls(m: Matrix) -> dict[str, Cell]:
    """group -> its off cell: a second run of the bug's computation on the patched build (the noise floor
    for the bug/fix comparison)."""
    return {g: arms["off"] for g, arms in arm_cells(m).items() if "off" in arms}


def arm_cells(m: Matrix) -> dict[str, dict[str, Cell]]:
    """group -> arm -> cell. Profiled cells only: an unprofiled one has no verdict to compare (its twin is
    in twins()); no mutant: it is run as an arm, but judged on its own (kit.pipeline.mutant_cells)."""
    groups: dict[str, dict[str, Cell]] = {}
    for c in m.cells:
        if profiled(c) and not c.mutant:
            groups.setdefault(c.group, {})[c.params["arm"]] = c
    return groups


def twins(m: Matrix) -> list[tuple[Cell, Cell]]:
    """(profiled cell, unprofiled cell) pairs: the same cell with and without nsys and the probes."""
    by_id = {c.run_id: c for c in m.cells if profiled(c)}
    out = []
    for c in m.cells:
        twin = by_id.get(c.run_id.removesuffix("-noprofile")) if not profiled(c) else None
        if twin is not None:
            out.append((twin, c))
    return out


def compare_notebook(a: Path, b: Path, out: Path, control: Path | None) -> None:
    """03_compare: the two runs side by side and the gate, into out/comparison.json."""
    given = {"run_a": str(a), "run_b": str(b), "out_dir": str(out)}
    if control is not None:
        given["control"] = str(control)
    notebooks.execute("03_compare", out / "executed-03_compare.ipynb", given)


def compare_plain(a: Path, b: Path, out: Path, control: Path | None) -> None:
    """What 03_compare writes, without Jupyter: `kit compare A B --control C --out OUT`."""
    write_comparison(a, b, out, control)


COMPARES = {"notebooks": compare_notebook, "plain": compare_plain}


def gate_failures(out: Path) -> list[str] | None:
    path = out / COMPARISON
    return json.loads(path.read_text()).get("gate_failures") if path.is_file() else None


def run_compares(m: Matrix, batch_dir: Path, rerun: set[str], runner: str = "notebooks") -> list[StageResult]:
    """One comparison per bug/fix pair, against the group's off run as its control (`kit compare
    --control`) where the matrix has one, once every run it needs is complete; redone when any of them is
    new. A pair whose control did not complete is not compared: without it the gate could only fail."""
    results = []
    offs = controls(m)
    for group, (bug, fix) in pairs(m).items():
        a, b = batch_dir / bug.run_id, batch_dir / fix.run_id
        control = batch_dir / offs[group].run_id if group in offs else None
        out, name = batch_dir / f"compare-{group}", f"compare {group}"
        needed = [a, b] + ([control] if control is not None else [])
        if not all(rundir.is_complete(r) for r in needed):
            what = "a run of the pair" + (" or its control" if control is not None else "")
            late = not all(r.exists() for r in needed)
            why = f"{what} did not start (deadline)" if late else f"{what} failed"
            results.append(StageResult(name, "skipped", str(out), why))
            continue
        used = {r.name for r in needed}
        if (out / COMPARISON).is_file() and not (used & rerun):
            results.append(StageResult(name, "skipped", str(out), "already compared", gate_failures(out)))
            continue
        fresh_dir(out)  # an earlier comparison is set aside, never overwritten
        try:
            COMPARES[runner](a, b, out, control)
        except Exception as exc:
            nb = out / "executed-03_compare.ipynb"
            stage = "03_compare" if runner == "notebooks" else "compare"
            record_failure(out, stage, exc, nb if nb.exists() else None)
            results.append(StageResult(name, "failed", str(out), one_line(exc)))
            continue
        results.append(StageResult(name, "done", str(out), gate=gate_failures(out)))
    return results


def run_overheads(m: Matrix, batch_dir: Path, rerun: set[str]) -> list[StageResult]:
    """The instrument's overhead for every unprofiled cell whose profiled twin is complete too; redone
    when either run is new."""
    results = []
    for with_, without in twins(m):
        a, b = batch_dir / with_.run_id, batch_dir / without.run_id
        out, name = batch_dir / f"overhead-{with_.run_id}", f"overhead {with_.run_id}"
        if not (a.exists() and is_complete(with_, a) and b.exists() and is_complete(without, b)):
            results.append(StageResult(name, "skipped", str(out), "a run of the pair is not complete"))
            continue
        if (out / OVERHEAD).is_file() and not rundir.failed(out) and not ({a.name, b.name} & rerun):
            results.append(StageResult(name, "skipped", str(out), "already measured"))
            continue
        try:
            res = write_overhead(a, b, out)
        except Exception as exc:
            record_failure(out, "overhead", exc, None)
            results.append(StageResult(name, "failed", str(out), one_line(exc)))
            continue
        ratios = {k: res[k]["ratio_per_round"] for k in ("window", "decode") if res[k]["ratio_per_round"]}
        if not ratios:  # never a blank 'done': a pair that yields no ratio says why
            why = "no decode round timed in both runs (prompt 0 streamed fewer than 2 chunks)"
            record_failure(out, "overhead", InputError(why), None)
            results.append(StageResult(name, "failed", str(out), why))
            continue
        text = ", ".join(f"{k} {r}x" for k, r in ratios.items())
        results.append(
            StageResult(name, "done", str(out), f"decode round with/without the instrument: {text}")
        )
    return results


def run_group(params: dict[str, Any]) -> str:
    """The group of a run as its params.json recorded it (Cell.group: the runs that differ only by arm, which
    the batch compares), the axes a run does not record at their defaults (an sglang run records no device):
    the pairing the report's ladder is handed (kit.report.ladder), since the report cannot import the
    matrix."""
    return group_id({**AXIS_DEFAULTS, **params})


def run_report(batch_dir: Path, anything_new: bool, runner: str = "notebooks") -> StageResult:
    """04_report once for the whole batch, plus a self-contained HTML page; an older report is kept aside."""
    html = batch_dir / "report.html"
    if runner != "notebooks":
        return StageResult(
            "report", "skipped", str(html), "the report is a notebook: kit batch --runner notebooks"
        )
    # matplotlib, pandas and nbconvert: only when there is something to report
    from kit.report import page
    from kit.report.this_batch import batch_runs

    if not batch_runs(batch_dir):
        return StageResult("report", "skipped", str(html), "no completed runs to report")
    if html.is_file() and not anything_new:
        return StageResult("report", "skipped", str(html), "nothing new since the last report")
    old = [batch_dir / name for name in BATCH_STAGE_FILES if (batch_dir / name).exists()]
    if old:
        aside = unique_path(batch_dir / "superseded", numbered=True)
        aside.mkdir()
        for p in old:
            p.rename(aside / p.name)
    nb = batch_dir / "executed-04_report.ipynb"
    try:
        executed = notebooks.execute("04_report", nb, {"batch_dir": str(batch_dir)})
        page.export_html(executed, html, title=f"PR #29654 evidence report: batch {batch_dir.name}")
    except Exception as exc:
        return StageResult("report", "failed", str(nb), one_line(exc))
    return StageResult("report", "done", str(html))
