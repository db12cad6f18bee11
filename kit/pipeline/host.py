"""What the H200 drivers (scripts/h200_*.sh) do on the GPU host around `kit batch`, where tests reach it.

The drivers only set the host up (nvtx, nsys, PYTHONPATH, JIT caches); the rest is here: the host's facts
file, the small-file tarball that comes back from the host (refreshed while a batch runs, so a call cut off
by the device's own limit still returns what finished), one deadline shared by the batches of a call, and
the mini evidence's modes (scripts/h200_evidence.sh), with the sglang-kernels check and its torch fallback.
Real sglang's modes (scripts/h200_sglang.sh) are kit.pipeline.host_sglang, the task steps
(scripts/h200_task.sh, h200_upstream.sh) kit.pipeline.host_task, and the mutation suite's steps
(scripts/h200_mutants.sh) kit.pipeline.host_mutants, on these.
"""

from __future__ import annotations

import datetime
import fnmatch
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kit import provenance, rundir
from kit.errors import KitError, UsageError, exit_code
from kit.proc import run_logged

if TYPE_CHECKING:
    from kit.pipeline.matrix import Build, Matrix

# What never comes back from the host: nsys reports and their exports, Kineto traces (16 MiB a file returns)
REPORTS = ("*.nsys-rep", "*.sqlite", "*.qdstrm", "*.trace.json.gz", "torch_traces")
PACK_EVERY_S = 20.0  # how often a running batch's tarball is refreshed
BATCH_EXITS = "0 done, 1 a failed check, 2 a failure, 3 cells left for the next call"
HOST_TMP = Path("/tmp")  # where the matrices' host folders are (builds:, params.model_path)


def facts(path: Path, lines: Iterable[str] = ()) -> Path:
    """The host's facts beside a call's results: GPU, torch, python, the kit's commit, `lines`, the date."""
    gpu = provenance.gpu_info()
    rows = [", ".join(gpu[k] for k in ("name", "driver", "memory", "uuid")) if gpu else "no GPU (nvidia-smi)"]
    try:
        import torch

        rows.append(f"torch {torch.__version__} cuda {torch.version.cuda} python {platform.python_version()}")
    except ImportError:
        rows.append(f"torch not importable, python {platform.python_version()}")
    rows.append(f"kit git sha: {provenance.git_sha() or 'unset'}")
    rows += [*lines, datetime.datetime.now(datetime.UTC).strftime("%a %b %d %H:%M:%S UTC %Y")]
    rundir.folder(path.parent, "what comes back from the host")  # the call's first write: one line if refused
    path.write_text("\n".join(rows) + "\n")
    return path


def pack(tgz: Path, root: Path, names: Sequence[str] = (".",), exclude: Sequence[str] = REPORTS) -> Path:
    """`root`'s entries matching `names` (glob patterns; "." all of it) into `tgz`, leaving out what matches
    `exclude` (by name, at any depth). Written beside and renamed: a reader never sees half a tarball."""
    if names == (".",):
        members = [root] if root.is_dir() else []
    else:
        members = sorted(p for p in root.iterdir() if any(fnmatch.fnmatch(p.name, n) for n in names))

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        name = info.name.rsplit("/", 1)[-1]
        return None if any(fnmatch.fnmatch(name, x) for x in exclude) else info

    tgz.parent.mkdir(parents=True, exist_ok=True)
    part = tgz.with_name(f".{tgz.name}.part")
    with tarfile.open(part, "w:gz") as tar:
        for m in members:
            tar.add(m, arcname="." if m == root else m.name, filter=keep)
    part.replace(tgz)
    return tgz


@dataclass(frozen=True)
class Clock:
    """One deadline for everything a call runs: each batch gets what is left of it, never a fresh one."""

    deadline_s: float
    start: float

    @classmethod
    def starting_now(cls, deadline_s: float) -> Clock:
        if deadline_s < 0:
            raise UsageError(f"the deadline must be >= 0 seconds, got {deadline_s:g}", param="DEADLINE_S")
        return cls(deadline_s, time.monotonic())

    def left(self) -> float:
        return max(0.0, self.deadline_s - (time.monotonic() - self.start))


@dataclass(frozen=True)
class BatchCall:
    """One `kit batch` of a driver's call: always resumed, per-cell lines instead of a bar."""

    matrix: str
    mode: str | None
    runs: Path
    deadline_s: float
    batch: str | None = None
    overrides: tuple[str, ...] = ()  # --set KEY=VALUE
    runner: str = "plain"
    jobs: int = 1  # -j: servers at once
    tmp: Path = HOST_TMP  # the host's folder for /tmp's, which the matrices name (KIT_HOST_TMP in tests)

    def args(self) -> list[str]:
        """The same call as a command line, for the log."""
        mode = ["--mode", self.mode] if self.mode else []
        name = ["--batch", self.batch] if self.batch else []
        sets = [x for kv in self.overrides for x in ("--set", kv)]
        return [self.matrix, *mode, *name, "--runner", self.runner, "--out", str(self.runs), "--resume"] + [
            "-j",
            str(self.jobs),
            "--deadline",
            f"{self.deadline_s:.0f}",
            *sets,
        ]


def relocated(m: Matrix, tmp: Path) -> Matrix:
    """The matrix with its host folders under `tmp` instead of /tmp (its builds' folders, a model_path
    there): a host whose folders are elsewhere (the tests' temporary one) runs the committed matrix."""
    if tmp == HOST_TMP:
        return m

    def moved(value: Any) -> Any:
        if isinstance(value, str) and (value == str(HOST_TMP) or value.startswith(f"{HOST_TMP}/")):
            return str(tmp) + value[len(str(HOST_TMP)) :]
        return value

    def build(b: Build | None) -> Build | None:
        return None if b is None else replace(b, pythonpath=tuple(map(moved, b.pythonpath)))

    cells = [
        replace(c, params={k: moved(v) for k, v in c.params.items()}, build=build(c.build)) for c in m.cells
    ]
    builds = {arm: b for arm, b in ((a, build(b)) for a, b in m.builds.items()) if b is not None}
    return replace(m, cells=cells, builds=builds, params={k: moved(v) for k, v in m.params.items()})


def say(log: Path, text: str) -> None:
    """A line for the call's output and its log (what `| tee -a LOG` did in the drivers)."""
    print(text, flush=True)
    with open(log, "a") as f:
        f.write(text + "\n")


@dataclass
class CallLog:
    """What every kit host call has, so its log and `say` are written once: results in `out`, its log
    log-MODE[TAG].txt there (`mode`: the call's mode or step)."""

    out: Path
    mode: str

    @property
    def tag(self) -> str:
        """A suffix of the call's files and folders (kit host sglang's other gains); none here."""
        return ""

    @property
    def log(self) -> Path:
        return self.out / f"log-{self.mode}{self.tag}.txt"

    def say(self, text: str) -> None:
        say(self.log, text)


def batch(call: BatchCall, log: Path, refresh: Callable[[], object], every_s: float = PACK_EVERY_S) -> int:
    """`kit batch` in this process, what it prints in `log`, `refresh` called every `every_s` while it runs
    (a thread) and once after. Returns its exit code; an error the kit names is its one line in `log`, exit
    2. Ctrl-C is the batch's own (it stops its cells and marks them) and goes on up."""
    from kit.pipeline.batch import run_batch
    from kit.pipeline.matrix import load, parse_overrides
    from kit.pipeline.summary import summary

    stop = threading.Event()

    def packer() -> None:
        while not stop.wait(every_s):
            refresh()

    thread = threading.Thread(target=packer, name="kit-host-pack", daemon=True)
    thread.start()
    try:
        with open(log, "a") as f, redirect_stdout(f), redirect_stderr(f):
            print(f"kit batch {shlex.join(call.args())}", flush=True)
            try:
                m = relocated(load(call.matrix, call.mode, parse_overrides(call.overrides)), call.tmp)
                res = run_batch(
                    m,
                    call.runs,
                    batch=call.batch,
                    resume=True,
                    runner=call.runner,
                    jobs=call.jobs,
                    deadline_s=call.deadline_s,
                    progress=False,
                )
            except KitError as exc:
                print(f"kit batch: error: {exc}", flush=True)
                return exit_code(exc)
            print(summary(res), flush=True)
            return res.exit_code
    finally:
        stop.set()
        thread.join()
        refresh()


def jit_pack(out: Path, log: Path) -> None:
    """The JIT caches into OUT/jit-stage (scripts/jit_cache.sh, their home), with no server running (a cache
    taken while a server compiles could hold a half-written kernel)."""
    from kit.paths import REPO

    script = REPO / "scripts" / "jit_cache.sh"
    cmd = ["bash", "-c", f'source "{script}" && jit_pack "$1"', "jit_pack", str(out)]
    if subprocess.run(cmd, stdin=subprocess.DEVNULL).returncode:
        say(log, "jit_pack: failed (the JIT caches do not come back this call)")


# --- scripts/h200_evidence.sh: the mini backend on CUDA (data/matrices/h200_mini.yaml, data/results/h200/)

EVIDENCE_MODES = ("fixtures", "graph", "eager", "batch4", "glm5", "kernels")
KERNEL_VARIANTS = ("base", "b4", "ragged", "s3", "glm5", "control")
KERNEL_LINES = ("kernels", "warm", "graph", "timing", "indexer_impl")  # kernel_check's lines worth a log


def evidence_deadline(mode: str) -> float:
    """The default seconds of a call: the kernels window starts with a check of up to half of it."""
    return 320.0 if mode == "kernels" else 540.0


@dataclass
class Evidence(CallLog):
    """One call of scripts/h200_evidence.sh: `mode`'s batches of h200_mini into `runs`, results in `out`."""

    runs: Path
    clock: Clock
    indexer_impl: str | None = None
    status: int = 0

    def pack(self) -> None:
        """The runs' small files (reports stay on the host, except the fixtures' tarball)."""
        pack(
            self.out / f"results-{self.mode}.tgz",
            self.runs,
            (f"h200_mini-{self.mode}*", "kernel-check.*"),
            exclude=("*.nsys-rep", "*.sqlite"),
        )

    def batch(self, mode: str, name: str | None = None, overrides: Sequence[str] = ()) -> int:
        """One mode of the matrix, resumed, within what is left of the call's deadline."""
        text = self.out / f"batch-{mode}.txt"
        text.unlink(missing_ok=True)
        call = BatchCall("h200_mini", mode, self.runs, self.clock.left(), name, tuple(overrides))
        rc = batch(call, text, self.pack)
        self.say(text.read_text(errors="replace").rstrip())
        self.say(f"kit batch --mode {mode}: exit {rc} ({BATCH_EXITS})")
        if rc:
            self.status = rc
        return rc

    def kernels(self) -> None:
        """sglang's kernels in the mini engine, one variant after the other; if kernel_check fails, the torch
        indexer (batches ...-torch-fallback) and no ragged variant (it needs sglang's kernels)."""
        check_s = self.clock.deadline_s / 2
        jit = os.environ.get("DG_JIT_CACHE_DIR", "unset")
        self.say(f"kernel-check (limit {check_s:.0f}s, DG_JIT_CACHE_DIR={jit})")
        text, js = self.out / "kernel-check.txt", self.out / "kernel-check.json"
        cmd = [sys.executable, "-m", "kit.backends.mini.kernel_check", "--json", str(js)]
        text.unlink(missing_ok=True)
        try:
            rc = run_logged([*cmd, "--budget-s", f"{check_s:.0f}"], text, timeout=check_s)
        except subprocess.TimeoutExpired:
            rc = 124  # as timeout(1) says it
        fallback = rc != 0
        if fallback:
            with open(text, "a") as f:
                f.write(f"kernel-check rc={rc}: the runs fall back to indexer_impl=torch ")
                f.write("(batches -torch-fallback)\n")
        lines = text.read_text(errors="replace").splitlines()
        wanted = [ln for ln in lines if ln.startswith(KERNEL_LINES) or "Error" in ln]
        self.say("\n".join(wanted[-25:]))
        self.runs.mkdir(parents=True, exist_ok=True)
        for f in (text, js):
            if f.is_file():
                shutil.copy(f, self.runs / f.name)
        for v in KERNEL_VARIANTS:
            if fallback and v == "ragged":
                self.say("skip kernels-ragged: it needs sglang's kernels")
                continue
            name = f"h200_mini-kernels-{v}" + ("-torch-fallback" if fallback and v != "control" else "")
            self.batch(f"kernels-{v}", name, ["indexer_impl=torch"] if fallback else [])

    def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        self.runs.mkdir(parents=True, exist_ok=True)
        if self.mode == "kernels":
            self.kernels()
        else:
            self.batch(
                self.mode, overrides=[f"indexer_impl={self.indexer_impl}"] if self.indexer_impl else []
            )
        if self.mode == "fixtures":
            pack(self.out / "fixtures.tgz", self.runs, ("h200_mini-fixtures",), exclude=("*.nsys-rep",))
        return self.status


def evidence(out: Path, mode: str, deadline_s: float | None, runs: Path, indexer_impl: str | None) -> int:
    """scripts/h200_evidence.sh's call: the host's facts, then the mode's batches; its exit code is the last
    batch's that was not 0 (kit.errors.EXIT: 1 a failed check, 2 a failure, 3 cells left)."""
    if mode not in EVIDENCE_MODES:
        raise UsageError(f"unknown mode {mode!r}; allowed: {', '.join(EVIDENCE_MODES)}", param="MODE")
    clock = Clock.starting_now(evidence_deadline(mode) if deadline_s is None else deadline_s)
    facts(out / f"host-{mode}.txt", [f"nsys: {nsys_version() or 'not found'}"])
    return Evidence(out, mode, runs, clock, indexer_impl).run()


def nsys_version() -> str | None:
    """What the host's nsys (KIT_NSYS, else the one on PATH) says its version is; None without one."""
    nsys = os.environ.get("KIT_NSYS") or shutil.which("nsys")
    return version([nsys, "--version"]) if nsys else None


def host_facts(path: Path, lines: Iterable[str] = ()) -> Path:
    """The facts file of kit host sglang, task and mutants, written alike: what nsys --version says (or
    "nsys: not found"), then `lines`."""
    return facts(path, [nsys_version() or "nsys: not found", *lines])


def version(cmd: list[str]) -> str:
    """What `cmd` (a --version call) prints, or "unknown": the facts file is written either way."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
