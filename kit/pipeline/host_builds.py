"""What every real-sglang call on the GPU host shares (kit host sglang, kit host task): the host's folders,
receiving the staged parts, installing and checking each build, the JIT caches, the classifier beside each
analysed run. kit.pipeline.host_sglang (scripts/h200_sglang.sh) and kit.pipeline.host_task
(scripts/h200_task.sh, h200_upstream.sh) are calls on this base; they differ in their checkpoint, their
runs root and their batches.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from kit.errors import EXIT, KitError
from kit.paths import DATA, REPO
from kit.pipeline import host
from kit.proc import run_logged
from kit.sglang_src.releases import BASELINE, PATCHED, RELEASES

PLACEMENT = REPO / "scripts" / "indexer_placement.py"
NOTEBOOK_MODULES = "papermill, ipykernel, nbconvert"  # what the notebooks runner imports
SMOKE = [sys.executable, "-m", "kit.sglang_src.stage_smoke"]  # a build's imports and a kernel of each
CARRIED = re.compile(r"[-_]\d+$")  # a per-call copy `kit stage carry` made: .stage-3, .stage16_0


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

    @property
    def task_ckpt(self) -> Path:
        """The task checkpoint (kit make-checkpoint --task): the task runs' model."""
        return self.tmp / "kit-task"

    @property
    def task_runs(self) -> Path:
        return self.tmp / "kit-task-runs"

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
        """One build's folders (never two) on PYTHONPATH: the nvtx wheel's, the build, its deps, the kit."""
        t = self.build_target(version)
        return os.pathsep.join(
            map(str, (self.site, t / f"sglang-{version}", t / "deps", REPO, t / "fallback"))
        )


def json_to(path: Path, what: object) -> None:
    """A step's result as the kit command printed it (JSON), or its error's one line."""
    text = f"error: {what}" if isinstance(what, Exception) else json.dumps(what, indent=1, default=str)
    path.write_text(text + "\n")


def run_to(cmd: list[str], path: Path, env: dict[str, str], timeout: float, err: Path) -> int:
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


@dataclass
class HostCall(host.CallLog):
    """One call of a real-sglang driver: `mode` on the host's folders `dirs`, what comes back in `out`. A
    subclass names its checkpoint (`checkpoint`), its runs root (`runs`) and its batches."""

    clock: host.Clock
    dirs: HostDirs = field(default_factory=HostDirs)
    jobs: int = 1
    runner: str = "plain"
    status: int = 0

    @property
    def runs(self) -> Path:
        return self.dirs.runs

    def checkpoint(self) -> bool:
        """The call's checkpoint, made once; False (its error printed) when it cannot be made."""
        raise NotImplementedError

    def work(self) -> None:
        """The mode's batches (after the checkpoint); a failure's code goes in `status`."""
        raise NotImplementedError

    def run(self, here: Path) -> int:
        """The mode; its exit code: receive's or install's own, else the last batch's that was not 0
        (1 a failed check, 2 a failure, 3 cells left for the next call), 2 without the checkpoint."""
        self.out.mkdir(parents=True, exist_ok=True)
        self.runs.mkdir(parents=True, exist_ok=True)
        if self.mode == "receive":
            return self.receive(here)
        if self.mode == "install":
            return self.install()
        if not self.checkpoint():
            return EXIT["error"]
        self.work()
        return self.status

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
            json_to(self.out / name, stage.install(store, target, beside=beside))
        except KitError as exc:
            json_to(self.out / name, exc)
            print(f"kit stage install {store}: error: {exc}")
            return False
        return True

    def check_build(self, version: str, folder: Path) -> None:
        """Smoke test (the build on PYTHONPATH), kit verify and kit probe-check of one installed build."""
        from kit.probe.check import choose
        from kit.sglang_src.verify import detect_state

        f = version.replace("+", "-")  # no '+' in what comes back (the device tool refuses such names)
        env = dict(os.environ, PYTHONPATH=self.dirs.pythonpath(version))
        rc = run_to(SMOKE, self.out / f"smoke-{f}.json", env, timeout=300, err=self.out / f"smoke-{f}.err")
        print(f"smoke {version} rc={rc}")
        try:
            found = detect_state(folder / "sglang")
        except KitError as exc:
            found = {"state": f"not read: {exc}"}
        json_to(self.out / f"verify-{f}.json", found)
        try:
            choice = choose(folder / "sglang")
            checked = choice.report if choice.target_set else choice.as_json()
            print(f"kit probe-check: {choice.describe()}")
        except KitError as exc:
            checked = exc
        json_to(self.out / f"probe-check-{f}.json", checked)
        print(f"{version}: state {found['state']}")

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

    def classify(self, batch: str, placements: bool = True) -> None:
        """Beside each analysed run of `batch`: the NVTX-free classifier's count (graph runs only: eager has
        no graph launches to delimit the rounds), and (`placements`) once per report
        the indexer's placement."""
        from kit.analysis.analyze import analyze

        for run in sorted((self.runs / batch).glob("*-cuda")):
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
            if not placements or not report.exists():
                continue
            report = report.resolve()  # a shared server's cells link to one report: one placement
            placement = report.parent / "placement.txt"
            if not placement.exists():
                with open(placement, "w") as f, open(self.log, "a") as err:
                    subprocess.run([sys.executable, str(PLACEMENT), str(report)], stdout=f, stderr=err)
