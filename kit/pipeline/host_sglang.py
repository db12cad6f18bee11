"""scripts/h200_sglang.sh's call on the GPU host: `kit host sglang OUT MODE [DEADLINE_S]`.

The driver sets the host up (nvtx, nsys, the JIT caches, PYTHONPATH); the rest is here, where tests reach
it: which staged folder goes to which store, the install with each build's checks, the checkpoint, the
deadline each batch gets, the NVTX-free classifier and the indexer placement beside each analysed run, the
tarballs that come back, and the noise mode's two batches. What the driver ran as kit commands runs here in
this process, its JSON in the same file as before (kit batch through kit.pipeline.host.batch); the smoke
test, which imports one build, and the placement script run in processes of their own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kit.errors import EXIT, KitError, UsageError, exit_code
from kit.paths import DATA, REPO
from kit.pipeline import host
from kit.proc import run_logged
from kit.sglang_src.releases import BASELINE, PATCHED, RELEASES

MODES = tuple("receive install warm grid part-a part-b perturbation latest eager graph steps3 noise".split())
GRID = "h200_pr29654"  # data/matrices/h200_pr29654.yaml: the PR's grid (data/results/h200-pr29654/)
EARLIER = "h200_sglang"  # data/matrices/h200_sglang.yaml: the earlier grids (data/results/h200-sglang/)
# The grid's modes: a server's last cells, its stop, the report export and the analyses follow the last
# start, so they get less time to start cells in.
GRID_MODES = ("grid", "part-a", "part-b", "perturbation", "latest")
NOISE_ID = "ctx4096-s5-graph-cuda"  # the cell the noise mode repeats
PLACEMENT = REPO / "scripts" / "indexer_placement.py"
SQLITE_MAX = 15 << 20  # a returned file holds 16 MiB
NOTEBOOK_MODULES = "papermill, ipykernel, nbconvert"  # what the notebooks runner imports
SMOKE = [sys.executable, "-m", "kit.sglang_src.stage_smoke"]  # a build's imports and a kernel of each
CARRIED = re.compile(r"[-_]\d+$")  # a per-call copy `kit stage carry` made: .stage-3, .stage16_0


def default_deadline(mode: str) -> float:
    """The seconds a call starts cells in, unless told: the grid's modes 360, the others 540."""
    return 360.0 if mode in GRID_MODES else 540.0


def later_releases() -> tuple[str, ...]:
    """The releases after the bug's with an H200 stage of their own (data/stage/sglang-V-h200.json):
    0.5.16 and 0.5.17, each received and installed into folders of their own (HostDirs)."""
    return tuple(
        v
        for v, r in RELEASES.items()
        if v != BASELINE and r.wheel and (DATA / "stage" / f"sglang-{v}-h200.json").is_file()
    )


def short(version: str) -> str:
    """A later release's folder suffix, as the matrices and the staged folders name it: 0.5.16 -> 16."""
    return version.rsplit(".", 1)[-1]


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


@dataclass(frozen=True)
class HostDirs:
    """The host's folders the matrices name (builds:, params.model_path); `tmp` is /tmp on the host."""

    tmp: Path = Path("/tmp")
    site: Path = Path("/tmp/kit-site")  # the nvtx wheel (h200_task_settings.sh)

    @property
    def store(self) -> Path:
        return self.tmp / "kit-stage"

    @property
    def target(self) -> Path:
        return self.tmp / "kit-sgl"

    @property
    def store_nb(self) -> Path:
        return self.tmp / "kit-stage-nb"

    @property
    def target_nb(self) -> Path:
        return self.tmp / "kit-nb"

    @property
    def runs(self) -> Path:
        return self.tmp / "kit-sgl-runs"

    def ckpt(self, tag: str = "") -> Path:
        return self.tmp / f"kit-ckpt{tag}"

    def later_store(self, version: str) -> Path:
        return self.tmp / f"kit-stage{short(version)}"

    def later_target(self, version: str) -> Path:
        return self.tmp / f"kit-sgl{short(version)}"

    def build_target(self, version: str) -> Path:
        """Where `version`'s build is installed: a later release in its own folder, 0.5.14's two together."""
        return self.later_target(version) if version in later_releases() else self.target

    def store_for(self, folder: str) -> Path | None:
        """The store a staged folder's parts go to: .stageNN[_K] a later release's (NN: its short name),
        .stage-nb* the notebooks', .stage-jit* none (jit_restore keeps those), any other .stage* 0.5.14's."""
        if folder.startswith(".stage-jit"):
            return None
        if folder.startswith(".stage-nb"):
            return self.store_nb
        for v in later_releases():
            if re.fullmatch(rf"\.stage{short(v)}(_.*)?", folder):
                return self.later_store(v)
        return self.store

    def pythonpath(self, version: str) -> str:
        """One build's folders (never two), as h200_task_settings.sh's `use` puts them."""
        t = self.build_target(version)
        return os.pathsep.join(
            map(str, (self.site, t / f"sglang-{version}", t / "deps", REPO, t / "fallback"))
        )


def _json_to(path: Path, what: object) -> None:
    """A step's result as the kit command printed it (JSON), or its error's one line."""
    text = f"error: {what}" if isinstance(what, Exception) else json.dumps(what, indent=1, default=str)
    path.write_text(text + "\n")


def _run_to(cmd: list[str], path: Path, env: dict[str, str], timeout: float, err: Path) -> int:
    """`cmd`'s stdout in `path` and its stderr in `err`, both replaced; its exit code (124 at `timeout`, as
    timeout(1) says it). Through kit.proc's runner: a timeout or Ctrl-C stops its whole process tree."""
    for p in (path, err):
        p.unlink(missing_ok=True)
    try:
        return run_logged(cmd, path, env, timeout=timeout, err=err)
    except subprocess.TimeoutExpired:
        return 124


def notebooks_ready(env: dict[str, str] | None = None) -> str | None:
    """papermill's version when the notebooks runner's modules import (here or with `env`), else None."""
    code = f"import {NOTEBOOK_MODULES}; print(papermill.__version__)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    return r.stdout.strip() if r.returncode == 0 else None


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
class SglangCall:
    """One call of scripts/h200_sglang.sh: `mode` on the host's folders `dirs`, what comes back in `out`."""

    out: Path
    mode: str
    clock: host.Clock
    dirs: HostDirs = field(default_factory=HostDirs)
    jobs: int = 1
    gains: tuple[str, ...] = ()
    runner: str = "plain"
    status: int = 0

    @property
    def tag(self) -> str:
        return gains_tag(self.gains)

    @property
    def ckpt(self) -> Path:
        return self.dirs.ckpt(self.tag)

    @property
    def log(self) -> Path:
        return self.out / f"log-{self.mode}{self.tag}.txt"

    def say(self, text: str) -> None:
        host.say(self.log, text)

    def pack(self) -> None:
        """The runs' small files (kit host pack); refreshed while a batch runs."""
        host.pack(self.out / f"results-{self.mode}{self.tag}.tgz", self.dirs.runs)

    def jit_pack(self) -> None:
        """The JIT caches into OUT/jit-stage (kit.pipeline.host.jit_pack), with no server running."""
        host.jit_pack(self.out, self.log)

    # --- receive, install

    def receive(self, here: Path) -> int:
        """Every staged folder that travelled with this call into its store (HostDirs.store_for). A per-call
        folder received (`kit stage carry`'s PREFIX-K or PREFIX_K) is removed, so no later call checks it
        again; a whole pack (.stage, .stage16) stays, since it may be the only copy. A refused one stays,
        and the call exits 2."""
        from kit.sglang_src import stage

        rc = 0
        for d in sorted(here.glob(".stage*")):
            to = self.dirs.store_for(d.name)
            if to is None or not (d / "manifest.json").is_file():
                continue
            try:
                have = stage.receive(d, to)["have"]
            except KitError as exc:
                print(f"{d.name} -> {to}: error: {exc}", file=sys.stderr)
                rc = 2
                continue
            if CARRIED.search(d.name):
                shutil.rmtree(d)
            print(f'{d.name} -> {to}: "have": {have}')
        return rc

    def install_stage(self, store: Path, target: Path, name: str, beside: Path | None = None) -> bool:
        """`kit stage install STORE TARGET [--beside]`, its result in OUT/NAME; its error printed when it
        fails. `beside`: the install holding the wheels a later stage left out (kit stage pack --beside)."""
        from kit.sglang_src import stage

        try:
            _json_to(self.out / name, stage.install(store, target, beside=beside))
        except KitError as exc:
            _json_to(self.out / name, exc)
            print(f"kit stage install {store}: error: {exc}")
            return False
        return True

    def check_build(self, version: str, folder: Path) -> None:
        """Smoke test (the build on PYTHONPATH), kit verify and kit probe-check of one installed build."""
        from kit.probe.check import choose
        from kit.sglang_src.verify import detect_state

        f = version.replace("+", "-")  # no '+' in what comes back (the device tool refuses such names)
        env = dict(os.environ, PYTHONPATH=self.dirs.pythonpath(version))
        rc = _run_to(SMOKE, self.out / f"smoke-{f}.json", env, timeout=300, err=self.out / f"smoke-{f}.err")
        print(f"smoke {version} rc={rc}")
        try:
            found = detect_state(folder / "sglang")
        except KitError as exc:
            found = {"state": f"not read: {exc}"}
        _json_to(self.out / f"verify-{f}.json", found)
        try:
            choice = choose(folder / "sglang")
            checked = choice.report if choice.target_set else choice.as_json()
            print(f"kit probe-check: {choice.describe()}")
        except KitError as exc:
            checked = exc
        _json_to(self.out / f"probe-check-{f}.json", checked)
        print(f"{version}: state {found['state']}")

    def checkpoint(self) -> bool:
        """The generated checkpoint (with CKPT_GAINS' gains), made once (kit make-checkpoint)."""
        from kit.checkpoint import make_checkpoint

        if (self.ckpt / "kit-checkpoint.json").is_file():
            return True
        res = self.out / f"checkpoint{self.tag}.json"
        gains = {name: float(value) for name, _, value in (g.partition("=") for g in self.gains)}
        try:
            _json_to(res, make_checkpoint(self.ckpt, gains=gains))
        except KitError as exc:
            _json_to(res, exc)
            print(f"kit make-checkpoint {self.ckpt}: error: {exc}")
            return False
        return True

    def install(self) -> int:
        """Join and install what has been received, check each build, write the checkpoint. Exit 2 (an error,
        never a verdict) when a store is missing or an install fails (what it printed shown), or the
        checkpoint fails."""
        from kit.sglang_src import stage

        d = self.dirs
        try:
            print(json.dumps(stage.status(d.store), indent=1))
        except KitError as exc:
            print(f"kit stage status {d.store}: error: {exc}")
            return EXIT["error"]
        if not self.install_stage(d.store, d.target, "install.json"):
            return EXIT["error"]
        for version in (BASELINE, PATCHED):
            self.check_build(version, d.target / f"sglang-{version}")
        for version in later_releases():
            if not (d.later_store(version) / "manifest.json").is_file():
                continue
            target = d.later_target(version)
            if not self.install_stage(
                d.later_store(version), target, f"install{short(version)}.json", d.target
            ):
                return EXIT["error"]
            self.check_build(version, target / f"sglang-{version}")
        if (d.store_nb / "manifest.json").is_file():
            if not self.install_stage(d.store_nb, d.target_nb, "install-nb.json"):
                return EXIT["error"]
            paths = (d.site, d.target_nb / "deps", d.target / "deps", REPO, d.target / "fallback")
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, paths)))
            version = notebooks_ready(env)
            print(
                f"notebooks runner ready: papermill {version}" if version else "notebooks runner: not ready"
            )
        folders = [d.target, *(d.later_target(v) for v in later_releases()), d.target_nb]
        sizes = [str(p) for t in folders if t.is_dir() for p in sorted(t.iterdir())]
        du = subprocess.run(["du", "-sh", *sizes], capture_output=True, text=True) if sizes else None
        (self.out / "install-sizes.txt").write_text(du.stdout if du else "")
        print(du.stdout if du else "", end="")
        if not self.checkpoint():
            return EXIT["error"]
        print("checkpoint ok")
        return 0

    # --- the batches

    def classify(self, batch: str) -> None:
        """Beside each analysed run of `batch`: the NVTX-free classifier's count (graph runs only: eager has
        no graph launches to delimit the rounds), and once per report the indexer's placement."""
        from kit.analysis.analyze import analyze

        for run in sorted((self.dirs.runs / batch).glob("*-cuda")):
            if not (run / "verdict.json").is_file():
                continue
            if run.name.endswith("-graph-cuda") and not (run / "classifier").exists():
                try:
                    verdict = analyze(run, run / "classifier", method="classifier")
                    why = None if verdict["status"] == "pass" else verdict["meaning"]
                except KitError as exc:
                    why = str(exc)
                if why:
                    with open(self.log, "a") as f:
                        f.write(f"kit analyze {run} --method classifier: {why}\n")
                    self.say(f"classifier {run.name}: failed, see {self.log}")
            report = run / "profile.sqlite"
            if not report.exists():
                continue
            report = report.resolve()  # a shared server's cells link to one report: one placement
            placement = report.parent / "placement.txt"
            if not placement.exists():
                with open(placement, "w") as f, open(self.log, "a") as err:
                    subprocess.run([sys.executable, str(PLACEMENT), str(report)], stdout=f, stderr=err)

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
            _json_to(res, found)
            rc = (
                EXIT["fail"] if found["verdict"] == "beyond_noise" or found["params_differ"] else EXIT["pass"]
            )
        except KitError as exc:
            _json_to(res, exc)
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

    def run(self, here: Path) -> int:
        """The mode; its exit code: receive's or install's own, else the last batch's that was not 0
        (1 a failed check, 2 a failure, 3 cells left), 2 when the checkpoint could not be made."""
        self.out.mkdir(parents=True, exist_ok=True)
        self.dirs.runs.mkdir(parents=True, exist_ok=True)
        if self.mode == "receive":
            return self.receive(here)
        if self.mode == "install":
            return self.install()
        if not self.checkpoint():
            return EXIT["error"]
        self.batches()
        fixtures = self.fixture_batch()
        if fixtures:
            sqlite_fixtures(self.out / f"sqlite-{self.mode}{self.tag}.tgz", self.dirs.runs, fixtures)
        return self.status


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
    nsys = os.environ.get("KIT_NSYS") or shutil.which("nsys")
    version = host.version([nsys, "--version"]) if nsys else "nsys: not found"
    host.facts(out / f"host-{mode}{tag}.txt", [version, f"kit batch runner: {runner}"])
    call = SglangCall(out, mode, clock, dirs, jobs, tuple(gains), runner)
    return call.run(Path.cwd() if here is None else here)
