"""scripts/h200_task.sh's and h200_upstream.sh's call on the GPU host: `kit host task OUT STEP [DEADLINE_S]`.

The drivers set the host up (nvtx, nsys, the JIT caches, PYTHONPATH); the rest is here, where tests reach
it. receive and install are kit host sglang's (kit.pipeline.host_builds), with the task checkpoint; every
other step is one or two modes of data/matrices/h200_task.yaml run by `kit batch` (resumed, within what is
left of the call's deadline, -j servers at once), then what the earlier bash driver did beside each run: a
line per cell (answers, acceptance), the NVTX-free classifier, each Kineto trace's classifier analysis and
trimmed copy, the long window's whole trace in pieces, the runs' tarball and the JIT caches.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from kit.errors import EXIT, KitError, UsageError
from kit.paths import REPO
from kit.pipeline import host
from kit.pipeline.host_builds import HostCall, HostDirs, json_to, notebooks_ready
from kit.proc import run_logged

MATRIX = "h200_task"  # data/matrices/h200_task.yaml
ARMS_BATCH = "h200_task"  # bug, fix and off run into the base grid's batch, which compares them
TRIM = REPO / "tests" / "fixtures" / "kineto" / "make_fixtures.py"  # a Kineto trace cut to a fixture
PIECE = 15 << 20  # a file that comes back holds 16 MiB: a whole trace comes back in pieces of 15
TRACE = "profile.trace.json.gz"  # a cell's Kineto trace (kit run --profiler torch)


@dataclass(frozen=True)
class Step:
    """What a step runs: the matrix's `modes` in turn (into `batch`; None: each mode's own), no cell
    starting within `margin_s` of the deadline; with -j > 1 each server's KV pool capped for a context of
    `shared_context` tokens (shared_gpu_args); `classify`: the NVTX-free classifier beside each run."""

    modes: tuple[str, ...]
    batch: str | None = None
    margin_s: float = 180.0  # a server's last cells, its stop, the report export and analyses follow
    shared_context: int | None = None
    classify: bool = False


STEPS: dict[str, Step] = {
    "bug": Step(("bug",), ARMS_BATCH),
    "fix": Step(("fix",), ARMS_BATCH),
    "off": Step(("off",), ARMS_BATCH),
    # a 500k cell, then the stop and export of a server whose report holds six windows, the analyses,
    # compares and report: 180 s left an H100's call past the device's 600 s (converted-2026-12-05-h100-arms)
    "arms": Step(("arms",), ARMS_BATCH, margin_s=300.0, shared_context=524288),
    "control": Step(("control",)),
    "kineto": Step(("kineto", "kineto-long"), margin_s=150.0, shared_context=2 * 65536),
    "tp4": Step(("tp4",), margin_s=300.0, shared_context=524288),
    "upstream": Step(("upstream",), classify=True),
}
ALL_STEPS = ("receive", "install", *STEPS)
DEFAULT_DEADLINE_S = 540.0


def shared_gpu_args(extra_args: list[str], context: int) -> list[str]:
    """The server flags of several servers on one GPU: the KV pool capped at 4 x `context` tokens with
    --mem-fraction-static 0.9 instead of 60% of the memory, which a second server starting beside the first
    would not find (data/matrices/h200_pr29654.yaml's comment). Prompts, decoding and graphs unchanged."""
    swap = {
        "--context-length": f"--context-length={context}",
        "--mem-fraction-static": "--mem-fraction-static=0.9",
    }
    out = [swap.get(a.split("=", 1)[0], a) for a in extra_args if not a.startswith("--max-total-tokens")]
    return [*out, f"--max-total-tokens={4 * context}"]


def cell_line(cell: Path) -> str | None:
    """A cell's answers and acceptance in one line (what the bash driver printed), None without outputs."""
    path = cell / "outputs.jsonl"
    if not path.is_file():
        return None
    rows = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    if not rows:
        return f"{cell.name}: no rows"
    correct = sum(r.get("correct") is True for r in rows) / len(rows)
    accept = [r["accept_length"] for r in rows if "accept_length" in r] or [0.0]
    return f"{cell.name}: {len(rows)} rows, correct {correct:.2f}, accept {min(accept):.2f}-{max(accept):.2f}"


def split_file(path: Path, prefix: Path, size: int = PIECE) -> list[Path]:
    """`path` in pieces of `size` bytes named PREFIX.00, PREFIX.01, ... (split -d): `cat` joins them."""
    pieces = []
    with open(path, "rb") as f:
        while chunk := f.read(size):
            piece = prefix.with_name(f"{prefix.name}.{len(pieces):02d}")
            piece.write_bytes(chunk)
            pieces.append(piece)
    return pieces


@dataclass
class TaskCall(HostCall):
    """One call of scripts/h200_task.sh or h200_upstream.sh: `mode` is the step; `tp` the tp4 step's
    ranks (TP=1: its dry run on one GPU, batch h200_task-tp1)."""

    tp: int = 4

    @property
    def runs(self) -> Path:
        return self.dirs.task_runs

    @property
    def ckpt(self) -> Path:
        return self.dirs.task_ckpt

    def pack(self) -> None:
        """The runs' small files (kit host pack); refreshed while a batch runs."""
        host.pack(self.out / f"runs-{self.mode}.tgz", self.runs)

    def checkpoint(self) -> bool:
        """The task checkpoint (kit make-checkpoint --task), made once; its self-check in the log."""
        from kit.task import make_task_checkpoint

        made = self.ckpt / "kit-checkpoint.json"
        if not made.is_file():
            try:
                json_to(self.out / "checkpoint.json", make_task_checkpoint(self.ckpt))
            except KitError as exc:
                json_to(self.out / "checkpoint.json", exc)
                print(f"kit make-checkpoint {self.ckpt} --task: error: {exc}")
                return False
        m = json.loads(made.read_text())
        targets = {k: v for k, v in m.get("self_check", {}).items() if "target" in k}
        self.say(f"task {m.get('task_checkpoint')} reference_match {m.get('reference_match')} {targets}")
        return True

    def overrides(self, step: Step) -> tuple[str, ...]:
        """The step's --set: the tp4 step's ranks; with -j > 1 the capped KV pools."""
        sets = [f"tp_size={self.tp}"] if self.mode == "tp4" else []
        if self.jobs > 1 and step.shared_context:
            from kit.pipeline.matrix import load

            args = load(MATRIX, step.modes[0]).params["extra_args"]
            sets.append(f"extra_args={json.dumps(shared_gpu_args(args, step.shared_context))}")
        return tuple(sets)

    def batch_name(self, step: Step, mode: str) -> str:
        if self.mode == "tp4":
            return f"{MATRIX}-tp{self.tp}"
        return step.batch or f"{MATRIX}-{mode}"

    def batch(self, mode: str | None, name: str, deadline_s: float, sets: tuple[str, ...]) -> int:
        """One mode of the matrix into batch `name`, resumed; its output in the log, its exit code."""
        text = self.out / f"batch-{mode or 'compare'}.txt"
        text.unlink(missing_ok=True)
        call = host.BatchCall(
            MATRIX, mode, self.runs, deadline_s, name, sets, self.runner, self.jobs, self.dirs.tmp
        )
        rc = host.batch(call, text, self.pack)
        self.say(text.read_text(errors="replace").rstrip())
        self.say(
            f"kit batch {MATRIX} --mode {mode or '(base)'} --batch {name}: exit {rc} ({host.BATCH_EXITS})"
        )
        return rc

    def kineto(self, batch: str) -> None:
        """Each Kineto trace of `batch`: the NVTX-free classifier's analysis (RUN/classifier) and a trimmed
        copy (make_fixtures.py --trim) that comes back (OUT/RUN_ID.trimmed.json.gz)."""
        from kit.analysis.analyze import analyze

        for cell in sorted((self.runs / batch).glob(f"*/{TRACE}")):
            run = cell.parent
            if not (run / "classifier").exists():
                try:
                    verdict = analyze(run, run / "classifier", method="classifier")
                    self.say(f"classifier {run.name}: {verdict['status']}")
                except KitError as exc:
                    self.say(f"classifier {run.name}: error: {exc}")
            trimmed = run / "trimmed" / "trace.json.gz"
            if not trimmed.is_file():
                trimmed.parent.mkdir(exist_ok=True)
                cmd = [sys.executable, str(TRIM), "--trim", str(cell), str(trimmed)]
                try:
                    rc = run_logged(cmd, run / "trimmed" / "make_fixtures.txt", timeout=600)
                except subprocess.TimeoutExpired:
                    rc = 124  # as timeout(1) says it
                self.say(f"trim {run.name}: rc={rc}, {cell.stat().st_size} bytes")
            if trimmed.is_file():
                shutil.copy(trimmed, self.out / f"{batch}.{run.name}.trimmed.json.gz")

    def after(self, step: Step, mode: str, batch: str) -> None:
        """What follows a mode's batch: a line per cell, the classifier, the Kineto traces, the long
        window's whole trace in pieces."""
        for run in sorted((self.runs / batch).iterdir()) if (self.runs / batch).is_dir() else []:
            line = cell_line(run)
            if line:
                self.say(line)
        if step.classify:
            self.classify(batch, placements=False)
        if mode.startswith("kineto"):
            self.kineto(batch)
        if mode == "kineto-long":
            for trace in sorted((self.runs / batch).glob(f"*/{TRACE}")):
                pieces = split_file(trace, self.out / f"{batch}.{trace.parent.name}.trace.json.gz")
                self.say(f"{trace.parent.name}: {trace.stat().st_size} bytes in {len(pieces)} pieces")

    def step(self) -> None:
        """The step's modes, each batch within what is left of the call's deadline less the margin; the
        arms' steps then compare each complete bug/fix pair with its off control (the base grid, no cell
        started)."""
        step = STEPS[self.mode]
        sets = self.overrides(step)
        for mode in step.modes:
            name = self.batch_name(step, mode)
            rc = self.batch(mode, name, max(0.0, self.clock.left() - step.margin_s), sets)
            if rc:
                self.status = rc
            self.after(step, mode, name)
        if step.batch == ARMS_BATCH:
            rc = self.batch(None, ARMS_BATCH, 0.0, ())
            if rc in (EXIT["fail"], EXIT["error"]):
                self.status = rc
            elif rc:  # cells of the grid not run (or not conclusive): this step's own are done
                self.say("compare: waits for the arms not run yet (steps bug, fix, off): batch-compare.txt")
        self.pack()
        self.jit_pack()

    def work(self) -> None:
        self.step()


def task(
    out: Path,
    step: str,
    deadline_s: float | None,
    dirs: HostDirs,
    jobs: int = 1,
    tp: int = 4,
    runner: str = "auto",
    here: Path | None = None,
) -> int:
    """The drivers' call: the arguments checked (one line, exit 2), the host's facts, then the step."""
    if step not in ALL_STEPS:
        raise UsageError(f"unknown step {step!r}; allowed: {', '.join(ALL_STEPS)}", param="STEP")
    if jobs < 1:
        raise UsageError(f"JOBS must be >= 1, got {jobs}", param="-j")
    if tp < 1:
        raise UsageError(f"TP must be >= 1, got {tp}", param="--tp")
    if runner not in ("auto", "plain", "notebooks"):
        raise UsageError(f"unknown runner {runner!r}; allowed: auto, plain, notebooks", param="--runner")
    clock = host.Clock.starting_now(DEFAULT_DEADLINE_S if deadline_s is None else deadline_s)
    if runner == "auto":
        runner = "notebooks" if notebooks_ready() else "plain"
    host.host_facts(out / f"host-{step}.txt", [f"kit batch runner: {runner}"])
    call = TaskCall(out, step, clock, dirs, jobs, runner, tp=tp)
    return call.run(Path.cwd() if here is None else here)
