"""scripts/h200_sglang.sh's call on the GPU host: `kit host sglang OUT MODE [DEADLINE_S]`.

The driver sets the host up (nvtx, nsys, the JIT caches, PYTHONPATH); the rest is here and in
kit.pipeline.host_builds (shared with kit host task), where tests reach it: which staged folder goes to
which store, the install with each build's checks, the checkpoint, the
deadline each batch gets, the NVTX-free classifier and the indexer placement beside each analysed run, the
tarballs that come back, and the noise mode's two batches. What the driver ran as kit commands runs here in
this process, its JSON in the same file as before (kit batch through kit.pipeline.host.batch); the smoke
test, which imports one build, and the placement script run in processes of their own.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kit.errors import EXIT, KitError, UsageError, exit_code
from kit.pipeline import host, host_reports
from kit.pipeline.host_builds import (
    HostCall,
    HostDirs,
    json_to,
    notebooks_ready,
)

MODES = tuple(
    "receive install warm grid profiles part-a part-b perturbation latest eager graph steps3 noise".split()
)
GRID = "h200_pr29654"  # data/matrices/h200_pr29654.yaml: the PR's grid (data/results/h200-pr29654/)
EARLIER = "h200_sglang"  # data/matrices/h200_sglang.yaml: the earlier grids (data/results/h200-sglang/)
# The grid's modes: a server's last cells, its stop, the report export and the analyses follow the last
# start, so they get less time to start cells in.
GRID_MODES = ("grid", "profiles", "part-a", "part-b", "perturbation", "latest")
NOISE_ID = "ctx4096-s5-graph-cuda"  # the cell the noise mode repeats
SQLITE_MAX = 15 << 20  # a returned file holds 16 MiB


def default_deadline(mode: str) -> float:
    """The seconds a call starts cells in, unless told: the grid's modes 360, the others 540."""
    return 360.0 if mode in GRID_MODES else 540.0


def gains_tag(gains: Sequence[str]) -> str:
    """The suffix of a checkpoint with other gains (its folder, batches and files): -attn_out-5.5."""
    return "-" + "_".join(gains).replace("=", "-") if gains else ""


def check_gains(gains: Sequence[str]) -> None:
    """Refuse a gain make-checkpoint would refuse, before anything runs (and names folders after it)."""
    for g in gains:
        name, _, value = g.partition("=")
        try:
            float(value)
        except ValueError:
            name = ""
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise UsageError(f"CKPT_GAINS: {g!r} is not NAME=NUMBER (e.g. attn_out=5.5)", param="--gains")


def sqlite_fixtures(tgz: Path, runs: Path, batch: str, limit: int = SQLITE_MAX) -> Path | None:
    """The two smallest contexts' SQLite exports of a batch (4k, then 16k cells, by name) as analysis
    fixtures: only if they fit what comes back. None when there are none or they do not fit."""
    cells = sorted(
        p
        for ctx in ("ctx4096", "ctx16384")
        for p in (runs / batch).glob(f"*-{ctx}-*-cuda/profile.sqlite")
        if p.exists()
    )[:2]
    tgz.unlink(missing_ok=True)
    if not cells:
        return None
    with tarfile.open(tgz, "w:gz", dereference=True) as tar:
        for p in cells:
            tar.add(p, arcname=str(p.relative_to(runs)))
    if tgz.stat().st_size > limit:
        tgz.unlink()
        return None
    return tgz


@dataclass
class SglangCall(HostCall):
    """One call of scripts/h200_sglang.sh: `mode` on the host's folders `dirs`, what comes back in `out`;
    `gains`: a checkpoint with other weight gains (CKPT_GAINS), in folders and batches of its own."""

    gains: tuple[str, ...] = ()

    @property
    def tag(self) -> str:
        return gains_tag(self.gains)

    @property
    def ckpt(self) -> Path:
        return self.dirs.ckpt(self.tag)

    def pack(self) -> None:
        """The runs' small files (kit host pack); refreshed while a batch runs."""
        host.pack(self.out / f"results-{self.mode}{self.tag}.tgz", self.dirs.runs)

    def checkpoint(self) -> bool:
        """The generated checkpoint (with CKPT_GAINS' gains), made once (kit make-checkpoint)."""
        from kit.checkpoint import make_checkpoint

        if (self.ckpt / "kit-checkpoint.json").is_file():
            return True
        res = self.out / f"checkpoint{self.tag}.json"
        gains = {name: float(value) for name, _, value in (g.partition("=") for g in self.gains)}
        try:
            json_to(res, make_checkpoint(self.ckpt, gains=gains))
        except KitError as exc:
            json_to(res, exc)
            print(f"kit make-checkpoint {self.ckpt}: error: {exc}")
            return False
        return True

    # --- the batches

    def batch(self, matrix: str, mode: str | None, name: str) -> int:
        """One grid of a matrix into batch `name`, resumed, within what is left of the call's deadline;
        then the classifier and placements, the tarball and the JIT caches (the batch is over: no server
        compiling)."""
        text = self.out / f"batch-{mode or self.mode}{self.tag}.txt"
        text.unlink(missing_ok=True)
        sets = (f"model_path={self.ckpt}",) if self.gains else ()
        call = host.BatchCall(
            matrix, mode, self.dirs.runs, self.clock.left(), name, sets, self.runner, self.jobs
        )
        rc = host.batch(call, text, self.pack)
        self.classify(name)
        self.pack()
        self.jit_pack()
        self.say(text.read_text(errors="replace").rstrip())
        how = f" --mode {mode}" if mode else ""
        self.say(f"kit batch {matrix}{how} ({self.runner}): exit {rc} ({host.BATCH_EXITS})")
        if rc:
            self.status = rc
        return rc

    def batches(self) -> None:
        """The mode's batches (after the checkpoint)."""
        m, t = self.mode, self.tag
        if m == "warm":  # set-up, not evidence: its own batch
            self.batch(GRID, "warm", f"{GRID}-warm{t}")
        elif m == "grid":
            self.batch(GRID, None, f"{GRID}{t}")
        elif m in ("part-a", "part-b", "perturbation"):
            self.batch(GRID, m, f"{GRID}{t}")
        elif m == "latest":
            self.batch(GRID, "latest", f"{GRID}-latest{t}")
        elif m in ("eager", "graph", "steps3"):
            self.batch(EARLIER, m, f"{EARLIER}-{m}{t}")
        elif m == "noise":
            self.noise()
        elif m == "profiles":
            self.profiles()

    def profiles(
        self,
        arms: Sequence[str] = host_reports.ARMS,
        limit: int = host_reports.LIMIT,
        rounds: int = host_reports.ROUNDS,
    ) -> None:
        """The 4k graph reports of bug, fix and 0.5.16 with their trimmed exports, for committing
        (kit.pipeline.host_reports): the grid's when they fit together, else (or on a host that ran no grid)
        each cell again on a server of its own (the matrix's mode profiles, its own batch), whose report
        holds that one window. `arms`, `limit`, `rounds`: host_reports.gather's, so a test can narrow them
        to its fixtures."""

        def gather(batch: str) -> dict:
            return host_reports.gather(self.out, self.dirs.runs / batch, arms, limit=limit, rounds=rounds)

        grid = self.dirs.runs / f"{GRID}{self.tag}"
        try:
            got = None if host_reports.unanalysed(grid, arms) else gather(grid.name)
            if got is None or not got["included"]:
                self.say(f"profiles: the grid's reports stay ({got['why']})" if got else "profiles: no grid")
                self.batch(GRID, "profiles", f"{GRID}-profiles{self.tag}")
                got = gather(f"{GRID}-profiles{self.tag}")
        except KitError as exc:
            self.say(f"profiles: error: {exc}")
            self.status = exit_code(exc)
            return
        what = "with their reports" if got["included"] else f"without their reports ({got['why']})"
        self.say(f"profiles: {', '.join(arms)} at 4k {what}, {got['total_bytes']:,} bytes")

    def noise(self) -> None:
        """graph's 4k pair where missing (finished runs are kept), a second bug run, then `kit noise`."""
        from kit.compare.noise import compare_with_noise

        pair, repeat = f"{EARLIER}-graph{self.tag}", f"{EARLIER}-noise{self.tag}"
        self.batch(EARLIER, "graph-4k", pair)
        self.batch(EARLIER, "noise", repeat)
        runs = self.dirs.runs
        cells = (runs / pair / f"sglang-bug-{NOISE_ID}", runs / pair / f"sglang-fix-{NOISE_ID}")
        res = self.out / f"noise{self.tag}.json"
        try:
            found = compare_with_noise(*cells, runs / repeat / f"sglang-bug-{NOISE_ID}")
            json_to(res, found)
            rc = (
                EXIT["fail"] if found["verdict"] == "beyond_noise" or found["params_differ"] else EXIT["pass"]
            )
        except KitError as exc:
            json_to(res, exc)
            rc = exit_code(exc)
        self.say(f"kit noise rc={rc} (verdict in {res})")

    def fixture_batch(self) -> str | None:
        """The batch whose smallest cells' SQLite exports come back as fixtures (None: no such mode)."""
        if self.mode in ("grid", "part-a", "part-b"):
            return f"{GRID}{self.tag}"
        if self.mode == "latest":
            return f"{GRID}-latest{self.tag}"
        if self.mode in ("eager", "graph", "steps3"):
            return f"{EARLIER}-{self.mode}{self.tag}"
        return None

    def work(self) -> None:
        """The mode's batches, then the smallest cells' SQLite exports when they fit what comes back."""
        self.batches()
        fixtures = self.fixture_batch()
        if fixtures:
            sqlite_fixtures(self.out / f"sqlite-{self.mode}{self.tag}.tgz", self.dirs.runs, fixtures)


def sglang(
    out: Path,
    mode: str,
    deadline_s: float | None,
    dirs: HostDirs,
    jobs: int = 1,
    gains: Sequence[str] = (),
    here: Path | None = None,
) -> int:
    """scripts/h200_sglang.sh's call: the host's facts, then the mode (SglangCall.run)."""
    if mode not in MODES:
        raise UsageError(f"unknown mode {mode!r}; allowed: {', '.join(MODES)}", param="MODE")
    if jobs < 1:
        raise UsageError(f"JOBS must be >= 1, got {jobs}", param="-j")
    check_gains(gains)
    clock = host.Clock.starting_now(default_deadline(mode) if deadline_s is None else deadline_s)
    runner = "notebooks" if notebooks_ready() else "plain"
    tag = gains_tag(gains)
    host.host_facts(out / f"host-{mode}{tag}.txt", [f"kit batch runner: {runner}"])
    call = SglangCall(out, mode, clock, dirs, jobs=jobs, runner=runner, gains=tuple(gains))
    return call.run(Path.cwd() if here is None else here)
