"""scripts/h200_mutants.sh's call on the GPU host: `kit host mutants OUT STEP [ARG...]`.

The mutation suite on real sglang (data/matrices/h200_mutants.yaml; kit batch runs and judges it,
kit.pipeline.mutant_cells). The driver sets the host up (nvtx, nsys, the JIT caches, PYTHONPATH); the steps
are here, where tests reach them:
  build [NAME...]        each mutant's wheel from the staged 0.5.14 wheel (kit build --patch), installed into
                         its own folder beside the bug's and the fix's, kit verify'd (results/verify/)
  base MODE              bug, fix and off (MODE: graph | eager, a mode of the matrix)
  suite MODE [NAME...]   those and the mutants (default: the registry's plan for MODE), one batch
  mutants MODE [NAME...] the mutants, with bug and off (their judge's reference) where not yet run
  compare                the batch's judgements in the suite's layout (results/comparisons/MODE/WORKLOAD/
                         NAME/, refused/NAME.txt, crashed/NAME-MODE.txt), then scripts/mutants.py h200
Every batch is one folder, results/runs/mutants/ (resumed: a finished or killed cell is not run again),
and starts cells while `min_run_s` remain before the call's deadline. OUT gets the log, the facts,
results.tgz (results/ without the runs), runs.tgz (the runs without reports or traces) and the JIT caches.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kit.errors import EXIT, KitError, UsageError
from kit.paths import MATRICES, REPO
from kit.pipeline import host
from kit.proc import run_logged

STEPS = ("build", "base", "suite", "mutants", "compare")
MODES = ("graph", "eager")
MATRIX = "h200_mutants"  # data/matrices/h200_mutants.yaml
BATCH = "mutants"  # one batch folder for every step and mode, as the committed results hold it
WORKLOADS = ("same-target", "moving-target")  # the suite's; issue 32's set adds any-slot
TABLE = REPO / "scripts" / "mutants.py"  # `mutants.py h200 RESULTS`: judge_folder and the table


@dataclass(frozen=True)
class MutantDirs:
    """The host's folders (the matrix names /tmp's; `tmp` elsewhere in tests, KIT_HOST_TMP)."""

    tmp: Path = Path("/tmp")

    @property
    def target(self) -> Path:  # every 0.5.14 build, each in sglang-<version>/, beside deps/ and wheels/
        return self.tmp / "kit-sgl"

    @property
    def builds(self) -> Path:  # kit build --patch's output, one folder per mutant
        return self.tmp / "kit-mutant-builds"

    @property
    def results(self) -> Path:  # what results.tgz brings back; the runs inside, as committed
        return self.tmp / "kit-mutant-results"

    @property
    def runs(self) -> Path:
        return self.results / "runs"

    def matrix(self) -> str:
        """The matrix to run: the shipped one, or on another `tmp` a copy naming its folders."""
        if self.tmp == Path("/tmp"):
            return MATRIX
        path = self.tmp / f"{MATRIX}.yaml"
        path.write_text((MATRICES / f"{MATRIX}.yaml").read_text().replace("/tmp/", f"{self.tmp}/"))
        return str(path)


def build_wheel(patch: Path, out: Path, cache: Path) -> dict:
    """`kit build --patch` in this process: the mutant's wheel from the staged 0.5.14 wheel in `cache`."""
    from kit.sglang_src.build import build_patched_wheel
    from kit.sglang_src.releases import BASELINE

    return build_patched_wheel(BASELINE, out, cache, patch=patch)


def install_cmd(wheel: Path, target: Path, pip_args: Sequence[str] = ()) -> list[str]:
    """pip install --target: the wheel alone (its dependencies are the staged 0.5.14 closure's)."""
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile"]
    return [*pip, *pip_args, "--target", str(target), str(wheel)]


@dataclass
class MutantsCall(host.CallLog):
    """One call of scripts/h200_mutants.sh: `mode` is the step, run with `args`; what comes back in `out`."""

    args: tuple[str, ...]
    clock: host.Clock
    dirs: MutantDirs
    jobs: int = 1
    min_run_s: float = 150.0
    workloads: tuple[str, ...] = WORKLOADS
    pip_args: tuple[str, ...] = ()
    runner: str = "plain"

    def pack(self) -> None:
        """results.tgz (without the runs) and runs.tgz (no reports or traces); refreshed as a batch runs."""
        res = self.dirs.results
        host.pack(self.out / "results.tgz", res, tuple(p.name for p in res.iterdir() if p.name != "runs"))
        host.pack(self.out / "runs.tgz", self.dirs.runs)

    # --- build

    def build(self, names: Sequence[str]) -> int:
        """Each mutant built, installed and verified; exit 2 when one could not be built or installed, 0
        else (a build kit verify does not call `fix` is the kit's refusal: the batch records it as a kill)."""
        from kit.pipeline.mutant_section import version
        from kit.sglang_src.mutants import MUTANTS, mutant
        from kit.sglang_src.releases import BASELINE

        d, verify = self.dirs, self.dirs.results / "verify"
        verify.mkdir(parents=True, exist_ok=True)
        wheels = sorted((d.target / "wheels").glob(f"sglang-{BASELINE}-cp312-*.whl"))
        if not wheels:
            raise UsageError(
                f"no staged sglang {BASELINE} wheel in {d.target / 'wheels'}: install the staged closure "
                "first",
                param="build",
            )
        cache = wheels[-1].parent
        rc = 0
        for name in names or list(MUTANTS):
            ver = version(name)
            folder = d.target / f"sglang-{ver}"
            if not (folder / f"sglang-{ver}.dist-info").is_dir():
                built = d.builds / name
                if not (built / "manifest.json").is_file():
                    res = verify / f"{name}.build.json"  # kit build's JSON (or its error), this build's alone
                    try:
                        res.write_text(json.dumps(build_wheel(mutant(name).patch, built, cache), indent=1))
                    except KitError as exc:
                        res.write_text(f"error: {exc}\n")
                        self.say(f"build {name} failed: {exc}")
                        rc = EXIT["error"]
                        continue
                cmd = install_cmd(next(built.glob("*.whl"), built / "missing.whl"), folder, self.pip_args)
                if run_logged(cmd, self.log):
                    self.say(f"install {name} failed")
                    rc = EXIT["error"]
                    continue
            self.verify(name, folder / "sglang", verify / f"{name}.json")
        return rc

    def verify(self, name: str, sglang: Path, res: Path) -> None:
        """kit verify of one installed build, its JSON in `res`, one line in the log."""
        from kit.sglang_src.verify import detect_state

        try:
            found = detect_state(sglang)
        except KitError as exc:
            res.write_text(f"error: {exc}\n")
            self.say(f"{name}: kit verify: error: {exc}")
            return
        res.write_text(json.dumps(found, indent=1, default=str) + "\n")
        self.say(f"{name} {found['version']} {found['state']} {found['carrier']}")

    # --- the batches

    def overrides(self, names: Sequence[str], base: bool, mutants: bool) -> tuple[str, ...]:
        """--set for one step: the workloads, which mutants (the registry's plan when none are named), and
        for the mutants alone the arms their judge needs (bug, off)."""
        sets = [f"workload={json.dumps(list(self.workloads))}"]
        if not mutants:
            sets.append("mutants=[]")
        elif names:
            sets.append(f"mutants={json.dumps(list(names))}")
        if not base:
            sets.append('arm=["bug", "off"]')
        return tuple(sets)

    def batch(self, mode: str, names: Sequence[str], base: bool, mutants: bool) -> int:
        """One batch of the matrix's `mode`, resumed, starting cells while min_run_s remain."""
        text = self.out / f"batch-{self.mode}-{mode}.txt"
        text.unlink(missing_ok=True)
        left = max(0.0, self.clock.left() - self.min_run_s)
        sets = self.overrides(names, base, mutants)
        call = host.BatchCall(
            self.dirs.matrix(), mode, self.dirs.runs, left, BATCH, sets, self.runner, self.jobs
        )
        rc = host.batch(call, text, self.pack)
        self.say(text.read_text(errors="replace").rstrip())
        self.say(f"kit batch {MATRIX} --mode {mode} {shlex.join(sets)}: exit {rc} ({host.BATCH_EXITS})")
        host.jit_pack(self.out, self.log)
        return rc

    def compare(self) -> int:
        """Every judgement of the batch, each mode, into the suite's layout; then the table (its exit code:
        0 every mutant as the registry expects, 1 not, 2 no comparison of the fix)."""
        from kit.pipeline.matrix import load
        from kit.pipeline.mutant_cells import place
        from kit.sglang_src.mutants import MUTANTS

        every = {"workload": list(self.workloads), "mutants": list(MUTANTS)}  # any a step ran
        for mode in MODES:
            m = load(self.dirs.matrix(), mode, every)
            for line in place(m, self.dirs.runs / BATCH, self.dirs.results):
                self.say(line)
        table = self.out / "mutants-table.txt"
        table.unlink(missing_ok=True)
        rc = run_logged([sys.executable, str(TABLE), "h200", str(self.dirs.results)], table)
        self.say(table.read_text(errors="replace").rstrip())
        return rc

    def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        self.dirs.runs.mkdir(parents=True, exist_ok=True)
        step, args = self.mode, self.args
        if step == "build":
            rc = self.build(args)
        elif step == "compare":
            rc = self.compare()
        else:
            mode, names = args[0], args[1:]
            rc = self.batch(mode, names, base=step != "mutants", mutants=step != "base")
        self.pack()
        return rc


def check(step: str, args: Sequence[str], jobs: int, min_run_s: float, workloads: Sequence[str]) -> None:
    """Everything a call can get wrong, before anything runs: one line each (exit 2)."""
    from kit.pipeline.mutant_section import names_given

    if step not in STEPS:
        raise UsageError(f"unknown step {step!r}; allowed: {', '.join(STEPS)}", param="STEP")
    if step in ("base", "suite", "mutants"):
        if not args or args[0] not in MODES:
            got = repr(args[0]) if args else "none"
            raise UsageError(f"{step} MODE: one of {', '.join(MODES)}, got {got}", param="MODE")
        if step == "base" and len(args) > 1:
            raise UsageError("base MODE takes no mutant names (suite or mutants do)", param="NAME")
        names = args[1:]
    elif step == "compare" and args:
        raise UsageError(f"compare takes no arguments, got {' '.join(args)}", param="ARG")
    else:
        names = args
    names_given(list(names), "NAME")
    if jobs < 1:
        raise UsageError(f"JOBS must be >= 1, got {jobs}", param="-j")
    if min_run_s < 0:
        raise UsageError(f"MIN_RUN_S must be >= 0 seconds, got {min_run_s:g}", param="--min-run")
    if not workloads:
        raise UsageError("WORKLOADS names no workload", param="--workloads")


def mutants(
    out: Path,
    step: str,
    args: Sequence[str],
    deadline_s: float,
    dirs: MutantDirs,
    jobs: int = 1,
    min_run_s: float = 150.0,
    workloads: Sequence[str] = WORKLOADS,
    pip_args: Sequence[str] = (),
) -> int:
    """scripts/h200_mutants.sh's call: the checks, the host's facts, then the step (MutantsCall.run)."""
    from kit.pipeline.host_sglang import notebooks_ready

    check(step, args, jobs, min_run_s, workloads)
    clock = host.Clock.starting_now(deadline_s)
    runner = "notebooks" if step not in ("build", "compare") and notebooks_ready() else "plain"
    host.host_facts(out / f"host-{step}.txt", [f"jobs: {jobs}", f"kit batch runner: {runner}"])
    call = MutantsCall(
        out, step, tuple(args), clock, dirs, jobs, min_run_s, tuple(workloads), tuple(pip_args), runner
    )
    return call.run()
