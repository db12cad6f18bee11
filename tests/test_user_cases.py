"""A stranger's first try, as one executable table: each row is a command a new user ran on a fresh clone,
the exit code the README's table promises for it, and the words the answer must (and must not) hold.

Run the whole list with `pytest tests/test_user_cases.py`, one row with `-k D124`. The ids are those of the
new-user trial of b3e44e1 (2026-12-03); every row here answered wrongly there (a silent wrong verdict, a
traceback with exit 1, or an exit code the table does not give).

The rows run in a workspace: a copy of four mini runs made once per session under nsys (`{B}` bug, `{F}`
fix, `{O}` off, `{REP}` a second bug run, each analysed), with `{W}` the workspace itself. A row's
`prepare` changes its copy first; a row whose command cannot be one argv (a race, a Ctrl-C at a chosen
moment) gives a `drive` that runs it and returns (exit code, output).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from html import unescape
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RUNS = {"B": "bug", "F": "fix", "O": "off", "REP": "bug"}


@dataclass(frozen=True)
class Case:
    """One row: `argv` (`kit ...` runs the kit's CLI in this interpreter), what it must exit with, the
    words its stdout + stderr must hold, and those it must not (by default: no traceback)."""

    id: str
    argv: tuple[str, ...]
    rc: int
    words: tuple[str, ...] = ()
    absent: tuple[str, ...] = ("Traceback",)
    prepare: Callable[[Path], None] | None = None
    drive: Callable[[Path, list[str]], tuple[int, str]] | None = None
    timeout: int = 300
    env: dict[str, str] = field(default_factory=dict)


def argv_of(case: Case, ws: Path) -> list[str]:
    """The row's command with its placeholders filled for workspace `ws`."""
    names = {k: str(ws / "runs" / "t1" / k) for k in RUNS} | {"W": str(ws)}
    out = [a.format(**names) for a in case.argv]
    if out and out[0] == "kit":
        out = [sys.executable, "-m", "kit.cli", *out[1:]]
    elif out and out[0] == "papermill":
        out = [str(Path(sys.executable).parent / "papermill"), *out[1:]]
    return out


def run(argv: list[str], ws: Path, timeout: int = 300, env: dict[str, str] | None = None) -> tuple[int, str]:
    """The command in `ws`, with the repository importable: its exit code and stdout + stderr."""
    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.run(argv, cwd=ws, capture_output=True, text=True, timeout=timeout, env=full)
    return proc.returncode, proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------------------------
# the rows (grouped as the trial's table is: A the README's commands, B papermill, D bad input)

CASES: list[Case] = []

# -- verdicts: analysis and trace sources (ranges that match nothing, interrupted runs) --

# -- batches: the control, the lock, dry runs --


def _report_text(html: Path) -> str:
    """A report page as a reader sees it: its text, tags and inlined images left out."""
    text = re.sub(r"<(style|script)[^>]*>.*?</\1>", " ", html.read_text(), flags=re.S)
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", text)))


def _batch_and_report(ws: Path, argv: list[str]) -> tuple[int, str]:
    """The batch, then what its report.html says (the words of the row hold for both)."""
    rc, out = run(argv, ws, 900)
    html = ws / "runs" / "cpu_task" / "report.html"
    return rc, out + ("\n" + _report_text(html) if html.is_file() else "\n(no report.html)")


def _held(ws: Path, argv: list[str]) -> tuple[int, str]:
    """A batch is running in runs/race (this process holds its folder as one does: an flock on its
    .batch.lock naming its pid); a second `kit batch` there must be refused before it touches anything."""
    batch = ws / "runs" / "race"
    batch.mkdir(parents=True)
    with open(batch / ".batch.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write(f"pid {os.getpid()} on this host, since the test began")
        lock.flush()
        rc, out = run(argv, ws)
        left = sorted(p.name for p in batch.iterdir())
    assert left == [".batch.lock"], f"the second batch wrote into the first one's folder: {left}\n{out}"
    assert f"(pid {os.getpid()} on this host" in out, out
    return rc, out


CASES += [
    # A README command (cpu_task's off/bug/fix x 2 workloads; its 4k cells only, --set narrowing the
    # context axis: the same command at half the time). Every gate judged against the off control.
    Case(
        "A36",
        ("kit", "batch", "cpu_task", "-j", "2", "--set", "context_len=4096", "--no-progress"),
        0,
        (
            "compare mini-same-target-ctx4096-s5-eager-cpu: done  gate PASS",
            "compare mini-moving-target-ctx4096-s5-eager-cpu: done  gate PASS",
            "this run: mini engine on CPU: CONFIRMED (under Nsight Systems)",
            "the task checkpoint (128 keys, seed 0, made in memory)",
        ),
        ("Traceback", "no control run", "NOT CONFIRMED", "gate FAIL", "mini preset default (random weights)"),
        drive=_batch_and_report,
        timeout=900,
    ),
    # Two batches in one folder: the second is refused, naming the first; nothing of the first's touched.
    Case(
        "D84",
        ("kit", "batch", "demo", "--batch", "race", "--no-progress"),
        2,
        ("kit batch: error: batch folder", "is in use by another kit batch (pid", "nothing was touched"),
        drive=_held,
    ),
    # A dry run makes the run's checks: -j 0 refused with the run's own line.
    Case(
        "D76",
        ("kit", "batch", "demo", "-j", "0", "--dry-run"),
        2,
        ("kit batch: error: -j must be >= 1, got 0",),
    ),
    # ... and the run's check of the batch folder: runs already there need --resume.
    Case(
        "D76-2",
        ("kit", "batch", "demo", "--dry-run"),
        2,
        ("kit batch: error: batch directory", "already holds runs (mini-bug-ctx4096", "use --resume"),
        prepare=lambda ws: shutil.copytree(
            ws / "runs" / "t1" / "B", ws / "runs" / "demo" / "mini-bug-ctx4096"
        ),
    ),
]

# -- compare, noise, run parameters, notebooks' parameters --

# -- errors: unwritable folders, damaged inputs, unforeseen failures --


# ---------------------------------------------------------------------------------------------------
# the harness


@pytest.fixture(scope="session")
def base_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four analysed mini runs under nsys, made once: bug, fix, off and a second bug run."""
    from nsys_helpers import nsys_or_skip

    nsys_or_skip()
    ws = tmp_path_factory.mktemp("user-cases")
    for key, arm in RUNS.items():
        rc, out = run(
            [sys.executable, "-m", "kit.cli", "run", "--arm", arm, "--batch", "t1", "--run-id", key], ws
        )
        assert rc == 0, out
        rc, out = run([sys.executable, "-m", "kit.cli", "analyze", str(ws / "runs" / "t1" / key)], ws)
        assert rc == 0, out
    return ws


@pytest.mark.nsys
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_strangers_case(case: Case, base_workspace: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(base_workspace, ws, symlinks=True)
    if case.prepare is not None:
        case.prepare(ws)
    argv = argv_of(case, ws)
    if case.drive is not None:
        rc, out = case.drive(ws, argv)
    else:
        rc, out = run(argv, ws, case.timeout, case.env)
    assert rc == case.rc, f"{case.id}: exit {rc}, want {case.rc}\n{out[-3000:]}"
    for w in case.words:
        assert w in out, f"{case.id}: {w!r} missing from\n{out[-3000:]}"
    for w in case.absent:
        assert w not in out, f"{case.id}: {w!r} present in\n{out[-3000:]}"
