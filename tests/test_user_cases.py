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

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
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
