"""A recorded absolute path is provenance, never an input: every reader of the committed result sets and
every figures script runs with its opens, stats and listings watched (tests/open_audit.py), and none may
touch anything outside the repository and this test's own folder (the interpreter's install aside).

The committed files name the host paths they ran at (`/tmp/cpu-suite/...`, `/tmp/kit-task`): on the machine
that made them those paths may still exist, which is how a reader falling back to them once passed there and
failed everywhere else. Here HOME and TMPDIR point into the test's folder, so a cache or temporary file is
allowed, and any other path is reported with the reader that reached for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kit.paths import REPO

TESTS = REPO / "tests"
RESULTS = REPO / "data" / "results"
FIGURES = (
    "h200_kineto_figures.py",
    "h200_pr29654_figures.py",
    "h200_sglang_figures.py",
    "h200_task_figures.py",
    "h200_tp_figures.py",
    "mutants.py",
)

# Every in-process reader, over every committed result set: the report's rungs, the evidence readers, `kit
# evidence`, the mutation judge, and every committed comparison judged again from the runs it names (kit
# compare, the gate, the share model). Writers get copies under WORK.
READERS = r"""
import json, shutil, sys
from pathlib import Path
from kit.compare import mutation
from kit.compare.runs import compared_run, comparison
from kit.paths import RESULTS
from kit.pipeline.stages import run_group
from kit.report import evidence, kineto, pr_grid, sglang_task, tensor_parallel
from kit.report.ladder import ladder

work = Path(sys.argv[1])
batch = work / "empty-batch"
batch.mkdir()
assert len(ladder(batch, run_group)) >= 7
sglang_task.cells(), sglang_task.gates(), sglang_task.controls(), sglang_task.checkpoint()
pr_grid.cells(), pr_grid.servers(), pr_grid.sharing(), pr_grid.overheads()
pr_grid.classifier_checks(), pr_grid.placements(), pr_grid.device_time()
kineto.agreement(kineto.cells()), kineto.long_window()
tensor_parallel.ratios(tensor_parallel.cells()), tensor_parallel.run_facts()
shutil.copytree(RESULTS / "h200", work / "h200", symlinks=True)
evidence.write_tables(work / "h200")
shutil.copytree(RESULTS / "mutants" / "h200", work / "mutants-h200", symlinks=True)
mutation.judge_folder(work / "mutants-h200")
n = 0
for f in sorted(RESULTS.rglob("comparison.json")):
    named = json.loads(f.read_text())
    sides = [compared_run(f, s) for s in ("a", "b", "control") if named.get(s)]
    comparison(*sides, allow_mismatch=True)
    n += 1
print("compared", n)
"""


def _audited(tmp_path: Path, argv: list[str]) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run `argv` (a script and its arguments) under the audit; its result and the paths it reached."""
    log, home, tmp = tmp_path / "reached.log", tmp_path / "home", tmp_path / "tmp"
    home.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)
    boot = (
        "import sys, runpy, open_audit; "
        f"open_audit.install({str(log)!r}, {[str(REPO), str(tmp_path)]!r}); "
        "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    env = {
        **os.environ,
        # scripts/ first, as `python scripts/X.py` has it (runpy.run_path does not add it)
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO / "scripts"), str(REPO)]),
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "MPLCONFIGDIR": str(home / "mpl"),
    }
    res = subprocess.run(
        [sys.executable, "-c", boot, *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    reached = sorted(set(log.read_text().splitlines())) if log.exists() else []
    return res, reached


@pytest.mark.parametrize("script", FIGURES)
def test_a_figures_script_reads_only_the_repository(script: str, tmp_path: Path) -> None:
    res, reached = _audited(tmp_path, [str(REPO / "scripts" / script)])
    assert res.returncode == 0, res.stderr[-2000:]
    assert reached == [], f"{script} reached outside the repository: {reached[:20]}"


def test_every_reader_reads_only_the_repository(tmp_path: Path) -> None:
    driver = tmp_path / "readers.py"
    driver.write_text(READERS)
    work = tmp_path / "work"
    work.mkdir()
    res, reached = _audited(tmp_path, [str(driver), str(work)])
    assert res.returncode == 0, res.stderr[-3000:]
    n = len(list(RESULTS.rglob("comparison.json")))
    assert f"compared {n}" in res.stdout and n >= 100
    assert reached == [], f"a reader reached outside the repository: {reached[:20]}"


def test_the_audit_catches_a_reader_that_opens_a_recorded_host_path(tmp_path: Path) -> None:
    """The check can fail: a reader that looks up a comparison's recorded run_dir is reported."""
    f = RESULTS / "mutants" / "cpu" / "comparisons" / "same-target" / "fix" / "comparison.json"
    host = json.loads(f.read_text())["b"]["run_dir"]
    assert host.startswith("/tmp/")  # where the suite ran: provenance, never an input
    driver = tmp_path / "naive.py"
    driver.write_text(
        "import json, sys\nfrom pathlib import Path\n"
        f"run = Path(json.loads(Path({str(f)!r}).read_text())['b']['run_dir'])\n"
        "print((run / 'params.json').is_file())\n"
    )
    res, reached = _audited(tmp_path, [str(driver)])
    assert res.returncode == 0, res.stderr
    assert f"stat {host}/params.json" in reached
