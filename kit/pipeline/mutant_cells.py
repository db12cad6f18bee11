"""The mutation suite inside `kit batch`: wrong fixes of the PR run as the fix arm, each judged by the gate.

A matrix's `mutants:` section (read by kit.pipeline.mutant_section) names how a mutant's build is found,
never which mutants there are: the list is the registry's (kit.sglang_src.mutants, "one table drives
everything"), its H200 plan per mode (CUDA graphs for every mutant, including those the kit must refuse;
eager where the registry predicts another outcome), unless the section's `names:` or `--set mutants=NAMES`
picks some (`--set mutants=[]`: none):

    mutants:
      arm: fix                     # the arm each mutant is run as (default fix): kit run's preflight included
      pythonpath: [/tmp/kit-sgl/sglang-{version}, /tmp/kit-sgl/deps, /tmp/kit-sgl/fallback]

`{version}` is the mutant's build, 0.5.14+<label> (kit build --patch, kit.sglang_src.build.local_label).
Every profiled cell of that arm gets one cell per mutant beside it: the same parameters (its run records
arm fix, so the kit checks the build as it checks the fix), its own build, and its name where the arm's
goes in the run id and the server folder (sglang-no-clear-same-target-ctx65536-s5-graph-cuda). It shares
the cell's group, so it is judged against that group's bug cell with the off cell as the control:
compare-<its run id>/ holds the comparison (`kit compare BUG MUTANT --control OFF`) and judged.json.

A mutant is killed by a gate that fails it, by the kit refusing its build as a fix (preflight: kit verify
not `fix`), or by sglang dying as it starts (graph capture included); it survives when the gate passes it.
A survivor is the batch's failed check (exit 1); a kill is what the suite expects, so a suite where every
mutant dies and the fix and off pass exits 0. The mutant cells' own verdicts are not checks (a wrong fix's
launches are expected to be wrong), a kill's failed run is not a failure of the batch, and --resume does
not run a killed mutant again (its failure is its result). Such a batch writes no report (04_report pairs
runs by their recorded arm and would read a mutant as the fix); its table is scripts/mutants.py h200 over
the layout `place` writes (kit host mutants OUT compare).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kit import rundir
from kit.errors import KitError
from kit.pipeline.matrix import Matrix
from kit.pipeline.mutant_section import mode_of

if TYPE_CHECKING:
    from kit.pipeline.stages import StageResult  # stages imports the matrix, which imports this lazily

JUDGED = "judged.json"
REFUSED = "BuildStateError"  # kit run's preflight: the build is not the fix the arm needs
CRASH = "exited during start-up"  # kit.backends.sglang.http's StartupError for a server that died


def kill_cause(run_dir: Path) -> tuple[str, str] | None:
    """("preflight" | "crash", the line that says why) for a mutant run that failed as a kill, else None:
    the kit refused the build as the arm's (its BuildStateError), or sglang exited while starting (the
    last error line of its server log, as the committed results' crashed/ files hold)."""
    try:
        err = rundir.read_json(rundir.RunDir(run_dir).error)
    except KitError:
        return None
    message = str(err.get("message") or "")
    if err.get("error") == REFUSED or "cannot run on the installed sglang" in message:
        return "preflight", message
    if CRASH not in message:
        return None
    found = re.search(r"see (\S+): ", message)
    log = Path(found[1]) if found else rundir.RunDir(run_dir).server_log
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    errors = [ln for ln in lines if "Error" in ln and "Ignore import" not in ln]
    return "crash", (errors[-1].strip() if errors else message)


def judge(m: Matrix, batch_dir: Path, rerun: set[str], runner: str = "notebooks") -> list[StageResult]:
    """One judgement per mutant cell (StageResults with verdict killed | survived), against its group's
    bug cell with the off cell as the control; the comparison redone when any of its runs is new."""
    from kit.compare.mutation import killed_by
    from kit.compare.runs import COMPARISON, fresh_dir
    from kit.pipeline import stages
    from kit.pipeline.cell import one_line, record_failure

    results = []
    refs = stages.arm_cells(m)
    for c in (c for c in m.cells if c.mutant):
        out, name = batch_dir / f"compare-{c.run_id}", f"mutant {c.mutant} ({c.group})"
        run = batch_dir / c.run_id
        bug, off = (refs.get(c.group, {}).get(a) for a in ("bug", "off"))
        if rundir.failed(run):
            cause = kill_cause(run)
            if cause is None:
                why = f"its run failed, not as a kill: see {run}/error.json"
                results.append(stages.StageResult(name, "failed", str(run), why, cell=c.run_id))
                continue
            out.mkdir(parents=True, exist_ok=True)
            by, why = cause
            record = {"mutant": c.mutant, "run": c.run_id, "verdict": "killed", "by": by, "why": why}
            _write(out / JUDGED, record)
            text = f"killed: {by}: {why}"
            results.append(stages.StageResult(name, "done", str(out), text, None, "killed", c.run_id))
            continue
        needed = [run] + [batch_dir / r.run_id for r in (bug, off) if r is not None]
        if bug is None or off is None or not all(rundir.is_complete(r) for r in needed):
            why = (
                "the matrix has no bug and off cell for it"
                if bug is None or off is None
                else ("its run, or the bug or off run, is not complete")
            )
            results.append(stages.StageResult(name, "skipped", str(out), why, cell=c.run_id))
            continue
        if not ((out / COMPARISON).is_file() and not ({r.name for r in needed} & rerun)):
            fresh_dir(out)
            try:
                stages.COMPARES[runner](needed[1], run, out, needed[2])
            except Exception as exc:
                record_failure(out, "compare", exc, None)
                results.append(stages.StageResult(name, "failed", str(out), one_line(exc), cell=c.run_id))
                continue
        gate = stages.gate_failures(out) or []
        verdict = "killed" if gate else "survived"
        by = ", ".join(killed_by(json.loads((out / COMPARISON).read_text()))) or "; ".join(gate)
        _write(out / JUDGED, {"mutant": c.mutant, "run": c.run_id, "verdict": verdict, "by": by})
        why = f"killed by the gate: {by}" if gate else "SURVIVED: the gate passes this wrong fix"
        results.append(stages.StageResult(name, "done", str(out), why, gate, verdict, c.run_id))
    return results


def holds_suite(m: Matrix, batch_dir: Path) -> bool:
    """Whether the batch is a mutation suite (mutant cells now, or judged ones from an earlier step): its
    runs record the fix's arm, so the batch report, which pairs arms, would read a mutant as the fix."""
    return any(c.mutant for c in m.cells) or any(batch_dir.glob(f"compare-*/{JUDGED}"))


def _write(path: Path, what: dict[str, Any]) -> None:
    """A judgement, derived from the runs: written again when they are judged again."""
    path.write_text(json.dumps(what, indent=1) + "\n")


def place(m: Matrix, batch_dir: Path, res: Path) -> list[str]:
    """The batch's judgements in the suite's layout (kit.compare.mutation.judge_folder reads it): each
    comparison of the fix and of a mutant as res/comparisons/MODE/WORKLOAD/NAME/comparison.json (its runs
    found from there; a different earlier one set aside), each kill the kit refused as refused/NAME.txt,
    each start-up death as crashed/NAME-MODE.txt. Returns one line per file written."""
    from kit.compare.runs import COMPARISON, fresh_dir, placed

    done = []
    for c in m.cells:
        if c.mutant is None and c.params["arm"] != "fix":
            continue
        where = f"compare-{c.run_id}" if c.mutant else f"compare-{c.group}"
        src = batch_dir / where / (JUDGED if c.mutant else COMPARISON)
        if not src.is_file():
            continue
        judged = json.loads(src.read_text()) if c.mutant else {"by": "gate"}
        mode, workload = mode_of(c.params), c.params.get("workload") or "-"
        if judged["by"] in ("preflight", "crash"):
            dest = res / ("refused" if judged["by"] == "preflight" else "crashed")
            f = dest / (f"{c.mutant}.txt" if judged["by"] == "preflight" else f"{c.mutant}-{mode}.txt")
            dest.mkdir(parents=True, exist_ok=True)
            f.write_text(judged["why"] + "\n")
            done.append(f"{judged['by']} {c.mutant} {mode}: {f}")
            continue
        comparison = json.loads((batch_dir / where / COMPARISON).read_text())
        dest = res / "comparisons" / mode / workload / c.name
        old = dest / COMPARISON
        text = json.dumps(placed(comparison, dest), indent=1, default=str) + "\n"
        if old.is_file() and old.read_text() == text:
            continue
        fresh_dir(dest)
        old.write_text(text)
        done.append(f"compare {mode} {workload} {c.name}: {old}")
    return done
