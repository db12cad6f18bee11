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
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from html import unescape
from pathlib import Path

import pytest

from kit.paths import REPO

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

KINETO_CPU = REPO / "tests" / "fixtures" / "kineto" / "mini_cpu_bug.trace.json.gz"  # the mini under torch


def _report_without(kind: str, names: tuple[str, ...] | None) -> Callable[[Path], None]:
    """prepare: {W}/cut.sqlite ({B}'s export) or {W}/cut.trace.json.gz (the mini engine's real Kineto trace)
    without the ranges `names` (Kineto: every range of the kit when None)."""

    def prepare(ws: Path) -> None:
        if kind == "sqlite":
            from nsys_helpers import drop_ranges

            (name,) = names or ()
            drop_ranges(ws / "runs" / "t1" / "B" / "profile.sqlite", ws / "cut.sqlite", name)
        else:
            from kineto_synth import drop_ranges

            drop_ranges(KINETO_CPU, ws / "cut.trace.json.gz", names)

    return prepare


def _empty_kineto(ws: Path) -> None:
    (ws / "empty.json").write_text('{"traceEvents": []}')


def _eager_gpu_kineto_without_ranges(ws: Path) -> None:
    from kineto_synth import sglang_like, write_trace

    write_trace(ws / "gpu.json", [sglang_like("bug", 5, 2, ranges=False)])


def _round_left_open(ws: Path) -> None:
    """{W}/cut.sqlite: {B}'s export whose last draft round never closed, as in the report of a run that was
    stopped inside a round (what nsys writes for an interrupted `kit run`)."""
    import sqlite3

    from kit.trace.registry import open_trace

    src = ws / "runs" / "t1" / "B" / "profile.sqlite"
    shutil.copy(src, ws / "cut.sqlite")
    with open_trace(src) as t:
        last = int(t.range_columns("pr29654", "draft_round")[1].max())
    with sqlite3.connect(ws / "cut.sqlite") as con:
        assert con.execute("UPDATE NVTX_EVENTS SET end = NULL WHERE start = ?", (last,)).rowcount == 1


def _wait_for(what: str, ready: Callable[[], bool], proc: subprocess.Popen) -> None:
    """Poll until `ready` (an event in the run, not a guessed delay); fail if the run ends first."""
    deadline = time.monotonic() + 120
    while not ready():
        assert proc.poll() is None, f"kit run ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within 120 s"
        time.sleep(0.001)


def _ctrl_c_kit_run(when: str) -> Callable[[Path, list[str]], tuple[int, str]]:
    """drive: `kit run` (the row's argv, run id X in batch t2), a Ctrl-C as soon as the run directory exists
    (`when` "run dir") or once the engine was started ("engine"), then `kit analyze` of the run: it must have
    left error.json, and the analysis is the row's answer."""

    def drive(ws: Path, argv: list[str]) -> tuple[int, str]:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        run = ws / "runs" / "t2" / "X"
        proc = subprocess.Popen(
            argv, cwd=ws, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        try:
            _wait_for(when, run.exists if when == "run dir" else (run / "engine.log").exists, proc)
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 130, f"kit run exit {proc.returncode}, want 130\n{out[-2000:]}"
        assert (run / "error.json").is_file(), f"{sorted(p.name for p in run.iterdir())}: no error.json"
        return _run_case(["kit", "analyze", str(run)], ws)

    return drive


def _run_case(argv: list[str], ws: Path) -> tuple[int, str]:
    return run(argv_of(Case("-", tuple(argv), 0), ws), ws)


NOT_JUDGED = ("inconclusive",)
RUN_X = ("kit", "run", "--arm", "bug", "--batch", "t2", "--run-id", "X")
CASES += [
    Case(
        "D124",
        ("kit", "analyze", "{B}", "--indexer-range", "idx", "--out", "{W}/o"),
        3,
        (*NOT_JUDGED, "no 'idx' range anywhere in the report", "draft_round x 12", "indexer x "),
    ),
    *[
        Case(
            f"D27-{kind}-{arm}",
            ("kit", "analyze", f"{{W}}/cut.{ext}", "--arm", arm, "--num-steps", "5"),
            3,
            (*NOT_JUDGED, "no 'indexer' range anywhere in the report", "draft_round x ", "draft_extend x "),
            ("Traceback", "NOT reproduced", "FAILED", "confirmed"),
            prepare=_report_without(kind, ("indexer",)),
        )
        for kind, ext in (("sqlite", "sqlite"), ("kineto", "trace.json.gz"))
        for arm in ("bug", "fix", "upstream")
    ],
    Case(
        "D24",
        ("kit", "analyze", "{W}/empty.json", "--arm", "bug", "--num-steps", "5"),
        3,
        (*NOT_JUDGED, "no ranges of domain 'pr29654' in the report", "KIT_PROBE_SINK=torch"),
        prepare=_empty_kineto,
    ),
    Case(
        "D26",
        ("kit", "analyze", "{W}/cut.trace.json.gz", "--arm", "bug", "--num-steps", "5"),
        3,
        (*NOT_JUDGED, "no ranges of domain 'pr29654' in the report", "KIT_PROBE_SINK=torch"),
        prepare=_report_without("kineto", None),
    ),
    Case(
        "D26-gpu",
        ("kit", "analyze", "{W}/gpu.json", "--arm", "bug", "--num-steps", "5"),
        3,
        (*NOT_JUDGED, "an eager run needs NVTX ranges"),
        prepare=_eager_gpu_kineto_without_ranges,
    ),
    Case(
        "D9",
        ("kit", "run", "--arm", "bug", "--profiler", "torch", "--batch", "t2", "--run-id", "X"),
        3,
        (*NOT_JUDGED, "the run did not finish (profile stage: KeyboardInterrupt"),
        drive=_ctrl_c_kit_run("engine"),
    ),
    Case(
        "D8",
        RUN_X,
        3,
        (*NOT_JUDGED, "the run did not finish (profile stage: KeyboardInterrupt"),
        drive=_ctrl_c_kit_run("run dir"),
    ),
    Case(
        "D8-engine",
        RUN_X,
        3,
        (*NOT_JUDGED, "the run did not finish (profile stage: KeyboardInterrupt"),
        drive=_ctrl_c_kit_run("engine"),
    ),
    Case(
        "D7",
        ("kit", "analyze", "{W}/cut.sqlite", "--arm", "bug", "--num-steps", "5"),
        0,
        ("kit analyze: warning: 1 unclosed 'draft_round' range(s) (profile ended inside a round) left out",),
        prepare=_round_left_open,
    ),
]

# -- batches: the control, the lock, dry runs --


def _report_text(html: Path) -> str:
    """A report page as a reader sees it: its text, tags and inlined images left out."""
    text = re.sub(r"<(style|script)[^>]*>.*?</\1>", " ", html.read_text(), flags=re.S)
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", text)))


def _batch_and_report(ws: Path, argv: list[str]) -> tuple[int, str]:
    """The batch, then what its report.html says (the words of the row hold for both)."""
    rc, out = run(argv, ws, 900)
    html = ws / "runs" / "cpu_task" / "report.html"
    # the batch's own lines last: a failure shows the tail, and the page would push them out of it
    return rc, (_report_text(html) if html.is_file() else "(no report.html)") + "\n" + out


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
MUTANT_RUNS = REPO / "data" / "results" / "mutants" / "cpu" / "runs"
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
    Case(  # the gate says why: the committed stale-top-k mutant (CPU), its failing requests marked
        "I32-4",
        (
            "kit",
            "compare",
            *(str(MUTANT_RUNS / f"{n}-moving-target") for n in ("bug", "first-topk-kept")),
            "--control",
            str(MUTANT_RUNS / "off-moving-target"),
            "--gate",
            "--out",
            "{W}/cmp",
        ),
        1,
        (
            "GATE FAILED: moving-target: b (fix) takes other verify rounds",
            "moving-target: per request fails share model (the control's floors: share model 0 rounds, "
            "0 rounds off the walk)",
            "verify rounds (predicted)",
            "22 (23), 5 off*",
            "23 (24), 3 off*",
        ),
    ),
    Case(  # a pass stays short: one line per workload
        "I32-4-pass",
        ("kit", "compare", "{B}", "{F}", "--control", "{O}", "--gate"),
        0,
        (
            "unlabelled: 1 request, no per-request check failed; mean accept length bug",
            "share model not checked (not a task-checkpoint run)",
        ),
        absent=("Traceback", "verify rounds (predicted)"),
    ),
    Case(  # 03_compare says why too, under its gate
        "I32-4-notebook",
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
            "control",
            "{O}",
        ),
        0,
        ("GATE: PASS", "unlabelled: 1 request, no per-request check failed; mean accept length bug"),
        absent=("Error",),
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


def read_only(folder: str) -> Callable[[Path, list[str]], tuple[int, str]]:
    """A drive that runs the command with `{W}/<folder>` unwritable (made first if missing): as root (CI,
    where chmod stops nothing) a read-only bind mount in a private mount namespace that only the command
    sees, else chmod 555 for the command's time."""

    def drive(ws: Path, argv: list[str]) -> tuple[int, str]:
        target = ws / folder
        target.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            remount = 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && exec "$@"'
            return run(["unshare", "-m", "sh", "-c", remount, str(target), *argv], ws)
        mode = target.stat().st_mode
        target.chmod(0o555)
        try:
            return run(argv, ws)
        finally:
            target.chmod(mode)

    return drive


def unanalysed(key: str) -> Callable[[Path], None]:
    """The run `{key}` as `kit run` left it: its analysis removed (an analysed run is refused anyway)."""

    def prepare(ws: Path) -> None:
        for name in ("rounds.csv", "verdict.json", "timeline.png"):
            (ws / "runs" / "t1" / key / name).unlink(missing_ok=True)

    return prepare


def crc_corrupt_wheel(ws: Path) -> None:
    """An sglang wheel whose deepseek_nextn.py member has one byte flipped: the zip directory is intact,
    the member's CRC-32 is not (what a cut-short or bit-rotted download gives)."""
    import struct
    import zipfile

    wheel, member = ws / "sglang-0.5.14-py3-none-any.whl", "sglang/srt/models/deepseek_nextn.py"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("sglang/__init__.py", "")
        zf.writestr(
            member, "class DeepseekModelNextN:\n    def forward(self, x, forward_batch):\n        pass\n"
        )
        offset = zf.getinfo(member).header_offset
    data = bytearray(wheel.read_bytes())
    name_len, extra_len = struct.unpack("<HH", data[offset + 26 : offset + 30])
    data[offset + 30 + name_len + extra_len + 8] ^= 0xFF
    wheel.write_bytes(bytes(data))


def plain_checkpoint(ws: Path) -> None:
    """`kit make-checkpoint ckpt` without --task: a checkpoint sglang serves, not the task's."""
    rc, out = run([sys.executable, "-m", "kit.cli", "make-checkpoint", str(ws / "ckpt")], ws)
    assert rc == 0, out


def damaged_result_set(ws: Path) -> None:
    """A result set whose fix run's verdict.json is valid JSON of the wrong shape (a list): no check of the
    kit's foresees it, so it is the path every unforeseen exception takes."""
    for key in ("B", "F"):
        shutil.copytree(ws / "runs" / "t1" / key, ws / "set" / "runs" / "m" / key, symlinks=True)
    (ws / "set" / "runs" / "m" / "F" / "verdict.json").write_text("[]\n")


def unforeseen(ws: Path, argv: list[str]) -> tuple[int, str]:
    """The command with the user's cache in the workspace: the log its one line names must be there and
    hold the traceback."""
    import re

    rc, out = run(argv, ws, env={"XDG_CACHE_HOME": str(ws / "cache")})
    logs = re.findall(r"traceback is in (\S+\.log)", out)
    assert logs and Path(logs[0]).parent == ws / "cache" / "pr29654-kit" / "errors", out
    assert "Traceback (most recent call last)" in Path(logs[0]).read_text(), logs
    return rc, out


RO = ("cannot write", "--out")  # the one line: what cannot be written, and the option that fixes it
CASES += [
    Case("D37", ("kit", "analyze", "{B}", "--out", "{W}/ro/analysis"), 2, RO, drive=read_only("ro")),
    # the run's own folder read-only (no --out): the analysis goes beside the run by default
    Case("D38", ("kit", "analyze", "{B}"), 2, RO, prepare=unanalysed("B"), drive=read_only("runs/t1/B")),
    Case("D39", ("kit", "compare", "{B}", "{F}", "--out", "{W}/ro/cmp"), 2, RO, drive=read_only("ro")),
    Case("D41", ("kit", "run", "--arm", "bug", "--out", "{W}/ro"), 2, RO, drive=read_only("ro")),
    Case("D43", ("kit", "batch", "demo", "--out", "{W}/ro"), 2, RO, drive=read_only("ro")),
    Case("D45", ("kit", "demo", "--out", "{W}/ro"), 2, RO, drive=read_only("ro")),
    Case(
        "D94",
        ("kit", "verify", "{W}/sglang-0.5.14-py3-none-any.whl"),
        2,
        ("damaged wheel", "deepseek_nextn.py", "Bad CRC-32", "download or build it again"),
        prepare=crc_corrupt_wheel,
    ),
    Case(
        "D101",
        ("kit", "evidence", "{W}/empty"),
        2,
        ("not a result set", "no analysed run"),
        prepare=lambda ws: (ws / "empty").mkdir(),
    ),
    Case("D102", ("kit", "evidence", "{W}/nosuch"), 2, ("does not exist", "result set")),
    Case(
        "D103", ("kit", "evidence", "{W}/runs/t1"), 2, ("not a result set", "a batch folder", "report.html")
    ),
    Case(
        "D115",
        ("kit", "task-reference", "{W}/ckpt"),
        2,
        ("task.json not found", "kit make-checkpoint --task"),
        prepare=plain_checkpoint,
    ),
    Case(
        "unforeseen",
        ("kit", "evidence", "{W}/set"),
        2,
        ("kit evidence: error: TypeError", "unforeseen", "KIT_DEBUG=1"),
        prepare=damaged_result_set,
        drive=unforeseen,
    ),
    Case(  # the documented switch: the traceback on stderr, still one exit code
        "unforeseen-debug",
        ("kit", "evidence", "{W}/set"),
        2,
        ("Traceback (most recent call last)", "kit evidence: error: TypeError"),
        absent=(),
        prepare=damaged_result_set,
        env={"KIT_DEBUG": "1"},
    ),
]


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
