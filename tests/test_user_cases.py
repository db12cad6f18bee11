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


def _kit_run(ws: Path, *args: str) -> None:
    """One more mini run in the workspace (under nsys), as a user makes it; `analyze` after `--analyze`."""
    analyze = args[-1] == "--analyze"
    args = args[:-1] if analyze else args
    rc, out = run([sys.executable, "-m", "kit.cli", "run", "--batch", "t1", *args], ws)
    assert rc == 0, out
    if analyze:
        rid = args[args.index("--run-id") + 1]
        rc, out = run([sys.executable, "-m", "kit.cli", "analyze", str(ws / "runs" / "t1" / rid)], ws)
        assert rc == 0, out


def _matrix_topk2(ws: Path) -> None:
    (ws / "topk2.yaml").write_text(
        "axes:\n  arm: [bug, fix]\n  context_len: [4096]\nparams:\n  eagle_topk: 2\n"
    )


NB = REPO / "notebooks"
CASES += [
    Case(
        "D107",
        ("kit", "noise", "{B}", "{W}/runs/t1/F8k", "{REP}"),
        2,
        ("A and B differ in context_len (A 4096, B 8192)", "--allow-mismatch"),
        prepare=lambda ws: _kit_run(ws, "--arm", "fix", "--context-len", "8192", "--run-id", "F8k"),
    ),
    Case(
        "D108",
        ("kit", "noise", "{B}", "{F}", "{W}/runs/t1/R3"),
        2,
        ("A and repeat differ in num_steps (A 5, repeat 3)",),
        prepare=lambda ws: _kit_run(ws, "--arm", "bug", "--num-steps", "3", "--run-id", "R3"),
    ),
    Case("D61", ("kit", "run", "--arm", "fix", "--eagle-topk", "2"), 2, ("eagle_topk=2", "self.topk == 1")),
    Case(
        "D61-batch",
        ("kit", "batch", "{W}/topk2.yaml", "--batch", "topk2"),
        2,
        ("cell mini-bug-ctx4096-s5-eager-cpu: eagle_topk=2 with arm bug", "self.topk == 1"),
        prepare=_matrix_topk2,
    ),
    Case(
        "D32",
        ("kit", "compare", "{B}", "{W}/runs/t1/T", "--gate"),
        0,
        ('"draft_step_ratio_a_over_b": null', "WARNING: TIMING NOT COMPARED: draft steps timed by two"),
        prepare=lambda ws: _kit_run(ws, "--arm", "fix", "--profiler", "torch", "--run-id", "T", "--analyze"),
    ),
    Case(  # papermill exits 1 for a failed cell (its own code); the cell's error is the kit's one line
        "B6",
        ("papermill", str(NB / "01_profile.ipynb"), "{W}/out.ipynb", "-p", "contxt_len", "8192"),
        1,
        ("UsageError: unknown key 'contxt_len'", "did you mean 'context_len'?", "allowed: backend, arm,"),
        absent=(),
    ),
    Case(  # out_dir made where missing, as kit compare --out (was: FileNotFoundError)
        "B10",
        (
            "papermill",
            str(NB / "03_compare.ipynb"),
            "{W}/out.ipynb",
            "--log-output",
            "-p",
            "run_a",
            "{B}",
            "-p",
            "run_b",
            "{F}",
            "-p",
            "out_dir",
            "{W}/new/cmp",
        ),
        0,
        ("GATE: PASS", "wrote", "new/cmp/comparison.json"),
        absent=("Error",),
    ),
    Case(
        "B10-report",
        ("papermill", str(NB / "04_report.ipynb"), "{W}/out.ipynb", "-p", "batch_dir", "{W}/runs/nosuch"),
        1,
        ("InputError: batch folder", "runs/nosuch not found"),
        absent=("FileNotFoundError",),
    ),
]

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
