"""`kit batch`: cells through papermill, failure isolation, --resume, -j 2, and submitit's local executor.

The first group swaps the notebooks for a fake (fast: the batch's own bookkeeping); the second runs the real
notebooks on the mini backend under nsys with tiny cells.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

import kit
from kit import rundir
from kit.errors import BusyError, KitError
from kit.paths import REPO
from kit.pipeline import batch as kb
from kit.pipeline import matrix, notebooks
from kit.pipeline.executors import SlurmOptions
from kit.pipeline.matrix import Build
from kit.pipeline.summary import summary

TINY = {"num_steps": 3, "params": {"num_requests": 1, "max_new_tokens": 8}}


def _matrix(tmp_path: Path, arms: list[str], ctx: list[int] | None = None, name: str = "t") -> matrix.Matrix:
    axes = {"arm": arms, "context_len": ctx or [2560], "num_steps": [TINY["num_steps"]]}
    doc = {"batch": name, "axes": axes, "params": TINY["params"]}
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(doc))  # JSON is YAML
    return matrix.load(path)


# ---------------------------------------------------------------- fake notebooks: the batch's bookkeeping


class FakeError(Exception):
    """Shaped like papermill's PapermillExecutionError: the notebook's exception name and value."""

    def __init__(self, ename: str, evalue: str) -> None:
        super().__init__(f"\n---\n{ename}: {evalue}\nTraceback...")
        self.ename, self.evalue, self.traceback = ename, evalue, [f"\x1b[31m{ename}\x1b[0m: {evalue}"]


class FakeNotebooks:
    """Writes what each notebook would write, and counts executions; `fail` names the run ids that fail."""

    def __init__(self, fail: set[str] | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.given: list[tuple[str, dict[str, Any]]] = []  # each notebook's parameters, in call order
        self.fail = fail or set()
        self.before: dict[str, Any] = {}  # run id -> what happens as its 01_profile starts (another process)
        self.lock = threading.Lock()

    def __call__(
        self,
        name: str,
        output: Path,
        parameters: dict[str, Any],
        cwd: Path | None = None,
        build: Build | None = None,
    ) -> Path:
        key = (
            parameters.get("run_id")
            or Path(
                parameters.get("run_dir") or parameters.get("out_dir") or parameters.get("batch_dir")
            ).name
        )
        with self.lock:
            self.calls.append((name, key))
            self.given.append((name, dict(parameters)))
        if name == "01_profile" and key in self.before:
            self.before[key]()
        output = Path(output)
        output.parent.mkdir(parents=True, exist_ok=True)
        nb = new_notebook(cells=[new_code_cell("run()")])
        if name == "01_profile":
            if key in self.fail:
                nb.cells[0].outputs = [new_output("error", ename="KitError", evalue="x", traceback=["x"])]
                nbformat.write(nb, output)
                raise FakeError("KitError", f"invalid mini parameter for {key}")
            run_dir = rundir.create_run_dir(Path(parameters["runs_root"]), parameters["batch"], key)
            rundir.write_json(run_dir / "params.json", parameters)
            rundir.write_json(run_dir / "provenance.json", {"kit_version": kit.__version__})
        elif name == "02_analyze":
            run_dir = Path(parameters["run_dir"])
            arm = json.loads((run_dir / "params.json").read_text())["arm"]
            expected = 1 if arm == "fix" else 2
            rundir.write_json(
                run_dir / "verdict.json",
                {
                    "arm": arm,
                    "status": "pass",
                    "passed": True,
                    "launches_per_round": [expected],
                    "expected_per_round": expected,
                    "source": "fake",
                    "method": "fake",
                },
            )
        elif name == "03_compare":
            rundir.write_json(Path(parameters["out_dir"]) / "comparison.json", {"gate_failures": []})
        nbformat.write(nb, output)
        return output

    def count(self, name: str | None = None) -> int:
        return sum(1 for n, _ in self.calls if name is None or n == name)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNotebooks:
    nb = FakeNotebooks()
    monkeypatch.setattr(notebooks, "execute", nb)
    monkeypatch.setattr(matrix, "check_cells", lambda m: None)
    return nb


def test_cells_then_one_compare_per_pair_then_report(tmp_path: Path, fake: FakeNotebooks) -> None:
    m = _matrix(tmp_path, ["bug", "fix"], [2560, 4096])
    res = kb.run_batch(m, tmp_path / "runs", progress=False)
    assert res.exit_code == 0 and not res.failures
    assert fake.count("01_profile") == fake.count("02_analyze") == 4
    assert fake.count("03_compare") == 2 and fake.count("04_report") == 1
    batch = tmp_path / "runs" / "t"
    for c in m.cells:
        assert (batch / c.run_id / "executed-01_profile.ipynb").is_file()
        assert not (batch / f".{c.run_id}.01_profile.ipynb").exists()  # staged notebook moved in
    assert (batch / "compare-mini-ctx2560-s3-eager-cpu" / "comparison.json").is_file()
    assert (batch / "report.html").is_file() and (batch / "matrix.yaml").is_file()
    assert "gate PASS" in summary(res)


def test_failed_cell_is_isolated_and_listed(tmp_path: Path, fake: FakeNotebooks) -> None:
    m = _matrix(tmp_path, ["off", "bug", "fix"])
    fake.fail = {"mini-off-ctx2560-s3-eager-cpu"}
    res = kb.run_batch(m, tmp_path / "runs", progress=False)
    assert res.exit_code == 2  # a cell that failed to run is an error (EXIT), not a failed check
    [failed] = res.failures
    assert failed.run_id == "mini-off-ctx2560-s3-eager-cpu" and failed.stage == "01_profile"
    assert failed.message == "KitError: invalid mini parameter for mini-off-ctx2560-s3-eager-cpu"
    run_dir = tmp_path / "runs" / "t" / failed.run_id
    err = json.loads((run_dir / "error.json").read_text())
    assert err["stage"] == "01_profile" and err["error"] == "KitError" and "\x1b" not in err["log_tail"]
    assert (run_dir / "executed-01_profile.ipynb").is_file()
    # the pair's control (off) failed: no comparison, whose gate could only fail for want of it
    assert fake.count("02_analyze") == 2 and fake.count("03_compare") == 0 and fake.count("04_report") == 1
    [compare] = res.compares
    assert compare.status == "skipped" and compare.message == "a run of the pair or its control failed"
    text = summary(res)
    assert "FAILED (1):" in text and failed.run_id in text.split("FAILED (1):")[1]


def test_each_pair_is_compared_against_the_off_run_of_its_group(tmp_path: Path, fake: FakeNotebooks) -> None:
    """A36: a batch with an off arm gives each bug/fix pair its group's off run as the control (`kit compare
    --control`); without it the same-target acceptance gate can only fail ("no control run")."""
    m = _matrix(tmp_path, ["off", "bug", "fix"], [2560, 4096])
    res = kb.run_batch(m, tmp_path / "runs", progress=False)
    assert res.exit_code == 0, summary(res)
    batch = tmp_path / "runs" / "t"
    controls = {Path(g["out_dir"]).name: g.get("control") for n, g in fake.given if n == "03_compare"}
    assert controls == {
        f"compare-mini-ctx{n}-s3-eager-cpu": str(batch / f"mini-off-ctx{n}-s3-eager-cpu")
        for n in (2560, 4096)
    }


def test_existing_batch_is_refused_without_resume(tmp_path: Path, fake: FakeNotebooks) -> None:
    m = _matrix(tmp_path, ["fix"])
    kb.run_batch(m, tmp_path / "runs", progress=False)

    def written() -> dict[Path, int]:  # everything but the lock, whose holder each batch records
        return {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").rglob("*") if p.name != kb.BATCH_LOCK}

    before = written()
    n = len(fake.calls)
    with pytest.raises(KitError, match="already holds runs.*--resume") as exc:
        kb.run_batch(m, tmp_path / "runs", progress=False)
    assert len(str(exc.value).splitlines()) == 1
    assert len(fake.calls) == n
    assert written() == before


def test_resume_skips_complete_cells_and_sets_failed_ones_aside(tmp_path: Path, fake: FakeNotebooks) -> None:
    m = _matrix(tmp_path, ["bug", "fix"])
    bug, fix = (c.run_id for c in m.cells)
    fake.fail = {bug}
    assert kb.run_batch(m, tmp_path / "runs", progress=False).exit_code == 2  # errored cell
    fake.calls.clear()

    res = kb.run_batch(m, tmp_path / "runs", resume=True, progress=False)  # fails again
    assert [c.status for c in res.cells] == ["failed", "skipped"]
    assert fake.calls == [("01_profile", bug)]  # fix untouched; nothing new to compare or report
    batch = tmp_path / "runs" / "t"
    assert (batch / f"{bug}.failed-1" / "error.json").is_file()

    fake.fail, fake.calls[:] = set(), []
    res = kb.run_batch(m, tmp_path / "runs", resume=True, progress=False)
    assert res.exit_code == 0 and [c.status for c in res.cells] == ["done", "skipped"]
    assert fake.count("01_profile") == 1 and fake.count("02_analyze") == 1
    assert fake.count("03_compare") == 1 and fake.count("04_report") == 1
    assert (batch / f"{bug}.failed-2" / "error.json").is_file() and (batch / bug / "verdict.json").is_file()
    assert [p.name for p in res.set_aside] == [f"{bug}.failed-2"]
    assert (batch / "superseded-1" / "executed-04_report.ipynb").is_file()  # the old report, kept

    fake.calls.clear()
    res = kb.run_batch(m, tmp_path / "runs", resume=True, progress=False)
    assert fake.calls == [] and res.exit_code == 0 and res.report.status == "skipped"


HOLD = """
import sys
from pathlib import Path
from kit.pipeline import batch as kb
with kb.hold(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_second_batch_is_refused_while_another_holds_its_folder(
    tmp_path: Path, fake: FakeNotebooks
) -> None:
    """D84: while a batch holds its folder (another process here, between taking it and finishing), a second
    batch there, or its dry run, is refused in one line naming the holder's pid, before it reads or writes
    anything; the lock goes with its holder (killed here, no clean exit), so the next batch runs."""
    m = _matrix(tmp_path, ["bug", "fix"])
    batch = tmp_path / "runs" / "t"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(batch)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert holder.stdout.readline() == "held\n"  # the barrier: the folder is held from here on
        for attempt in (partial(kb.run_batch, progress=False), kb.dry_run):
            busy = f"in use by another kit batch \\(pid {holder.pid} on "
            with pytest.raises(BusyError, match=busy) as exc:
                attempt(m, tmp_path / "runs", resume=True)
            assert len(str(exc.value).splitlines()) == 1 and exc.value.holder.startswith(f"pid {holder.pid} ")
        assert fake.calls == [] and [p.name for p in batch.iterdir()] == [kb.BATCH_LOCK]
    finally:
        holder.kill()
        holder.wait()
    res = kb.run_batch(m, tmp_path / "runs", progress=False)  # the dead holder's lock blocks nothing
    assert res.exit_code == 0, summary(res)
    assert (batch / kb.BATCH_LOCK).read_text().startswith(f"pid {os.getpid()} on ")


@pytest.mark.parametrize("when", ["before its stage starts", "inside its stage"])
def test_a_run_dir_another_process_made_is_never_written(
    tmp_path: Path, fake: FakeNotebooks, when: str
) -> None:
    """D84: a run directory made under a cell's name by another process (a `kit run --batch` by hand, a
    batch that took no lock) after the plan is left exactly as it is: no error.json, no notebook moved in,
    no analysis; the cell fails saying so and the batch goes on."""
    m = _matrix(tmp_path, ["bug", "fix"])
    bug, fix = (c.run_id for c in m.cells)
    other = tmp_path / "runs" / "t" / fix

    def another_process() -> None:  # a finished run of its own
        other.mkdir()
        for name in ("params.json", "provenance.json", "verdict.json"):
            (other / name).write_text("{}")

    fake.before[bug if when == "before its stage starts" else fix] = another_process
    res = kb.run_batch(m, tmp_path / "runs", progress=False)
    assert sorted(p.name for p in other.iterdir()) == ["params.json", "provenance.json", "verdict.json"]
    assert [(c.run_id, c.status) for c in res.cells] == [(bug, "done"), (fix, "failed")]
    assert f"run directory {other} already exists" in res.cells[1].message and res.exit_code == 2
    assert ("02_analyze", fix) not in fake.calls
    assert f"{other}/error.json" not in summary(res)  # it names no record the cell did not write


@pytest.mark.parametrize(
    "bad,line",
    [
        ({"jobs": 0}, "-j must be >= 1, got 0"),
        ({"deadline_s": -1}, "--deadline must be >= 0 seconds, got -1"),
        ({"runner": "x"}, "unknown runner 'x'"),
        ({"executor": "x"}, "unknown executor 'x'"),
        ({"batch": "a b"}, "invalid batch name 'a b'"),
    ],
)
def test_a_dry_run_refuses_what_the_run_refuses(
    tmp_path: Path, fake: FakeNotebooks, bad: dict[str, Any], line: str
) -> None:
    """D76: the dry run makes the run's every check and fails with its line (kit batch --dry-run: exit 2)."""
    m = _matrix(tmp_path, ["bug", "fix"])
    said = []
    for attempt in (kb.dry_run, partial(kb.run_batch, progress=False)):
        with pytest.raises(KitError) as exc:
            attempt(m, tmp_path / "runs", **bad)
        said.append(str(exc.value))
    assert said[0] == said[1] and line in said[0]
    assert fake.calls == [] and not (tmp_path / "runs").exists()


def test_a_dry_run_plans_as_the_run_does_and_writes_nothing(tmp_path: Path, fake: FakeNotebooks) -> None:
    """An existing batch: refused without --resume (the run's line); with it, the complete cells are
    listed as skipped; nothing is written either way."""
    m = _matrix(tmp_path, ["bug", "fix"])
    kb.run_batch(m, tmp_path / "runs", progress=False)
    (tmp_path / "runs" / "t" / m.cells[0].run_id / "error.json").write_text("{}")  # a failed cell: rerun
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").rglob("*")}
    with pytest.raises(KitError, match="already holds runs.*--resume"):
        kb.dry_run(m, tmp_path / "runs")
    plan = kb.dry_run(m, tmp_path / "runs", resume=True)
    assert [c.run_id for c in plan.to_run] == [m.cells[0].run_id]
    assert [c.run_id for c in plan.complete] == [m.cells[1].run_id]
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").rglob("*")} == before


def test_resume_refuses_runs_of_another_kit_version(tmp_path: Path, fake: FakeNotebooks) -> None:
    m = _matrix(tmp_path, ["fix"])
    old = tmp_path / "runs" / "t" / m.cells[0].run_id
    old.mkdir(parents=True)
    (old / "provenance.json").write_text(json.dumps({"kit_version": "0.0.1"}))
    with pytest.raises(KitError, match=r"written by kit 0\.0\.1, this is kit") as exc:
        kb.run_batch(m, tmp_path / "runs", resume=True, progress=False)
    assert len(str(exc.value).splitlines()) == 1 and fake.calls == []


def test_parallel_workers_fake(tmp_path: Path, fake: FakeNotebooks) -> None:
    m = _matrix(tmp_path, ["off", "bug", "fix"], [2560, 4096])
    res = kb.run_batch(m, tmp_path / "runs", jobs=3, progress=False)
    assert res.exit_code == 0 and [c.run_id for c in res.cells] == [c.run_id for c in m.cells]
    assert fake.count("01_profile") == 6


def test_matrix_key_the_notebook_lacks_is_refused_before_running(
    tmp_path: Path, fake: FakeNotebooks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard against drift between the matrix schema and 01_profile's parameters cell (papermill
    would only warn, and the run would silently ignore the key): simulate a notebook without `seed`."""
    real = notebooks.declared
    monkeypatch.setattr(notebooks, "declared", lambda name: [n for n in real(name) if n != "seed"])
    path = tmp_path / "m.yaml"
    path.write_text("axes: {arm: [fix], context_len: [2560]}\nparams: {seed: 16}\n")
    with pytest.raises(KitError, match="'seed' is not a parameter of notebooks/01_profile.py"):
        kb.run_batch(matrix.load(path), tmp_path / "runs", progress=False)
    assert fake.calls == [] and not (tmp_path / "runs").exists()


def test_every_matrix_param_is_a_notebook_parameter() -> None:
    from kit.pipeline import matrix as km

    takes = notebooks.parameters("01_profile")
    assert set(km.PARAMS) <= takes


def test_slurm_without_slurm_is_a_clear_error(
    tmp_path: Path, fake: FakeNotebooks, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("submitit")
    monkeypatch.setenv("PATH", "/nonexistent")  # no srun
    with pytest.raises(KitError, match="--executor slurm"):
        kb.run_batch(_matrix(tmp_path, ["fix"]), tmp_path / "runs", executor="slurm", progress=False)
    assert fake.calls == [] and not (tmp_path / "runs" / "t").exists()


def test_cli_dry_run_validates_the_gpu_matrix(capsys: pytest.CaptureFixture) -> None:
    from kit.cli import build_parser

    p = build_parser()
    args = p.parse_args(["batch", "gpu_pr29654", "--dry-run"])
    with pytest.raises(KitError, match="config.json not found") as exc:  # what the run says here (exit 2)
        args.func(args)
    assert len(str(exc.value).splitlines()) == 1
    out = capsys.readouterr()  # the cells are listed first, also where this host cannot run them
    assert "4 cells" in out.out and "sglang-fix-ctx500000-s5-graph-cuda" in out.out


# ---------------------------------------------------------------- real notebooks, mini backend, nsys


class Counting:
    """The real notebooks.execute, counted; `break_arm`'s 01_profile gets a context_len only the notebook
    rejects (run_profile's validation, inside the kernel), so that cell fails for real."""

    def __init__(self, real: Any, break_arm: str | None = None) -> None:
        self.real, self.break_arm, self.calls = real, break_arm, []
        self.lock = threading.Lock()

    def __call__(
        self,
        name: str,
        output: Path,
        parameters: dict[str, Any],
        cwd: Path | None = None,
        build: Build | None = None,
    ) -> Path:
        with self.lock:
            self.calls.append(name)
        if name == "01_profile" and parameters.get("arm") == self.break_arm:
            parameters = {**parameters, "context_len": 1}
        return self.real(name, output, parameters, cwd, build)


@pytest.fixture(scope="module")
def real_batch(tmp_path_factory: pytest.TempPathFactory, require_nsys: str) -> dict[str, Any]:
    """One batch of three tiny cells with -j 2: `off` fails inside its notebook, bug and fix complete."""
    tmp = tmp_path_factory.mktemp("batch")
    m = _matrix(tmp, ["off", "bug", "fix"])
    counting = Counting(notebooks.execute, break_arm="off")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(notebooks, "execute", counting)
        res = kb.run_batch(m, tmp / "runs", jobs=2, progress=False)
    return {"matrix": m, "root": tmp / "runs", "result": res, "calls": counting.calls}


def _errors(nb_path: Path) -> list[dict]:
    nb = nbformat.read(nb_path, as_version=4)
    return [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]


@pytest.mark.nsys
def test_real_batch_j2_isolates_a_failing_cell(real_batch: dict[str, Any]) -> None:
    res, batch = real_batch["result"], real_batch["root"] / "t"
    assert res.exit_code == 2  # a cell that failed to run is an error (EXIT), not a failed check
    status = {c.run_id: c.status for c in res.cells}
    assert status == {
        "mini-off-ctx2560-s3-eager-cpu": "failed",
        "mini-bug-ctx2560-s3-eager-cpu": "done",
        "mini-fix-ctx2560-s3-eager-cpu": "done",
    }
    off = batch / "mini-off-ctx2560-s3-eager-cpu"
    err = json.loads((off / "error.json").read_text())
    assert err["stage"] == "01_profile" and err["error"] == "UsageError" and "context_len" in err["message"]
    executed = off / "executed-01_profile.ipynb"
    assert _errors(executed)  # executed up to the failing cell, the error kept in it
    assert not (off / "verdict.json").exists()
    for arm, expected in (("bug", 2), ("fix", 1)):
        run = batch / f"mini-{arm}-ctx2560-s3-eager-cpu"
        verdict = json.loads((run / "verdict.json").read_text())
        assert set(verdict["launches_per_round"]) == {expected} and verdict["status"] == "pass"
        for stage in ("01_profile", "02_analyze"):
            assert not _errors(run / f"executed-{stage}.ipynb"), stage
    # its control (off) failed: the pair waits for it (--resume) instead of a gate that could only fail
    assert not (batch / "compare-mini-ctx2560-s3-eager-cpu").exists()
    html = (batch / "report.html").read_text()
    assert "CONFIRMED" in html and "NOT CONFIRMED" not in html
    expected_calls = ["01_profile"] * 3 + ["02_analyze"] * 2 + ["04_report"]
    assert sorted(real_batch["calls"]) == sorted(expected_calls)


@pytest.mark.nsys
def test_real_resume_reruns_only_the_failed_cell(real_batch: dict[str, Any]) -> None:
    counting = Counting(notebooks.execute)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(notebooks, "execute", counting)
        res = kb.run_batch(real_batch["matrix"], real_batch["root"], resume=True, progress=False)
    assert res.exit_code == 0, summary(res)
    assert counting.calls == ["01_profile", "02_analyze", "03_compare", "04_report"]  # bug, fix: skipped
    batch = real_batch["root"] / "t"
    assert (batch / "mini-off-ctx2560-s3-eager-cpu.failed-1" / "error.json").is_file()
    assert (batch / "mini-off-ctx2560-s3-eager-cpu" / "verdict.json").is_file()
    # the real 03_compare, given the off run as its control (kit compare --control): the gate judges with it
    comparison = json.loads((batch / "compare-mini-ctx2560-s3-eager-cpu" / "comparison.json").read_text())
    assert comparison["control"]["run_dir"] == str(batch / "mini-off-ctx2560-s3-eager-cpu")
    assert comparison["gate_failures"] == [] and "gate_notes" in comparison


@pytest.mark.nsys
def test_one_cell_through_submitit_local_executor(tmp_path: Path, require_nsys: str) -> None:
    """--executor slurm's code path, with submitit's own LocalExecutor standing in for Slurm."""
    pytest.importorskip("submitit")
    m = _matrix(tmp_path, ["fix"])
    opts = SlurmOptions(time_min=10, cluster="local")
    res = kb.run_batch(m, tmp_path / "runs", executor="slurm", slurm=opts, progress=False)
    assert res.exit_code == 0, summary(res)
    run = tmp_path / "runs" / "t" / m.cells[0].run_id
    assert set(json.loads((run / "verdict.json").read_text())["launches_per_round"]) == {1}
    assert any((tmp_path / "runs" / "t" / ".submitit").rglob("*_result.pkl"))


def test_report_counts_a_set_aside_failure_once(tmp_path: Path) -> None:
    """A cell that failed after writing its verdict is renamed aside with its error.json; the report
    (like --resume) counts only complete runs, so the set-aside copy is not a second row."""
    from kit.report.this_batch import batch_runs

    good = tmp_path / "mini-fix-ctx4096"
    aside = tmp_path / "mini-fix-ctx4096.failed-1"
    for d in (good, aside):
        d.mkdir()
        (d / "verdict.json").write_text("{}")
    (aside / "error.json").write_text("{}")
    assert batch_runs(tmp_path) == [good]


# ---------------------------------------------------------------- --deadline and --resume after it


class SlowFake(FakeNotebooks):
    """Each 01_profile takes `seconds`, so that a deadline falls between two cells."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def __call__(
        self,
        name: str,
        output: Path,
        parameters: dict[str, Any],
        cwd: Path | None = None,
        build: Build | None = None,
    ) -> Path:
        if name == "01_profile":
            import time

            time.sleep(self.seconds)
        return super().__call__(name, output, parameters, cwd, build)


def test_deadline_starts_no_cell_after_it_and_resume_runs_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = SlowFake(2.0)
    monkeypatch.setattr(notebooks, "execute", slow)
    monkeypatch.setattr(matrix, "check_cells", lambda m: None)
    m = _matrix(tmp_path, ["bug", "fix"], [2560, 4096])
    res = kb.run_batch(m, tmp_path / "runs", progress=False, deadline_s=3.0)
    # pair by pair: the 2560 pair ran (the deadline passed during its fix cell, which was already running)
    assert [c.status for c in res.cells] == ["done", "not_started", "done", "not_started"]
    assert res.exit_code == kb.EXIT_INCOMPLETE == 3 and not res.failures
    batch = tmp_path / "runs" / "t"
    left = [c.run_id for c in res.not_started]
    assert left == ["mini-bug-ctx4096-s3-eager-cpu", "mini-fix-ctx4096-s3-eager-cpu"]
    assert not any((batch / r).exists() for r in left)  # nothing half-made: --resume simply runs them
    assert [s.status for s in res.compares] == ["done", "skipped"]
    assert "did not start" in res.compares[1].message and res.report.status == "done"
    text = summary(res)
    assert "2 not started" in text and "NOT STARTED (2)" in text and "--resume" in text

    slow.calls.clear()
    res = kb.run_batch(m, tmp_path / "runs", resume=True, progress=False, deadline_s=60)
    assert res.exit_code == 0 and [c.status for c in res.cells] == ["skipped", "done", "skipped", "done"]
    assert [n for n, _ in slow.calls] == ["01_profile", "02_analyze"] * 2 + ["03_compare", "04_report"]
    assert not res.set_aside  # cells the deadline left leave nothing to set aside


def test_deadline_zero_starts_nothing(tmp_path: Path, fake: FakeNotebooks) -> None:
    m = _matrix(tmp_path, ["bug", "fix"])
    res = kb.run_batch(m, tmp_path / "runs", progress=False, deadline_s=0)
    assert [c.status for c in res.cells] == ["not_started"] * 2 and res.exit_code == 3
    assert fake.calls == [] and res.report.status == "skipped"
    with pytest.raises(KitError, match="--deadline must be >= 0"):
        kb.run_batch(m, tmp_path / "runs2", progress=False, deadline_s=-1)


def test_cli_deadline_and_exit_code(
    tmp_path: Path, fake: FakeNotebooks, capsys: pytest.CaptureFixture
) -> None:
    from kit.cli import main as kit_main

    path = tmp_path / "m.yaml"
    path.write_text("batch: c\naxes: {arm: [bug, fix], context_len: [2560], num_steps: [3]}\n")
    rc = kit_main(["batch", str(path), "--out", str(tmp_path / "runs"), "--deadline", "0", "--no-progress"])
    assert rc == 3 and "NOT STARTED (2)" in capsys.readouterr().out
    rc = kit_main(["batch", str(path), "--out", str(tmp_path / "runs"), "--resume", "--no-progress"])
    assert rc == 0 and fake.count("01_profile") == 2


# ---------------------------------------------------------------- per-arm builds: each cell its own sglang


@pytest.fixture
def two_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Two fake builds, a DSA model config without a tokenizer (a cell stops right after the pre-flight),
    and an nsys that only answers --version (the pre-flight asks for it; nothing is profiled)."""
    import sys

    from fake_gpu_helpers import fake_build
    from sglang_run_helpers import GLM52_CONFIG, make_model

    nsys = tmp_path / "fake-nsys"
    nsys.write_text("#!/bin/sh\necho 'NVIDIA Nsight Systems version 2099.1.1'\n")
    nsys.chmod(0o755)
    monkeypatch.setenv("KIT_NSYS", str(nsys))
    fix_tree = fake_build(tmp_path / "sgl" / "sglang-0.5.14+pr29654", "fix")
    python = tmp_path / "python-with-fix"  # an interpreter whose environment holds the fix build
    python.write_text(
        f'#!/bin/sh\nPYTHONPATH={fix_tree}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    return {
        "model": make_model(tmp_path, GLM52_CONFIG),
        "bug": fake_build(tmp_path / "sgl" / "sglang-0.5.14", "bug"),
        "fix": fix_tree,
        "python": python,
    }


def _sglang_matrix(tmp_path: Path, model: Path, builds: dict[str, Any], name: str) -> matrix.Matrix:
    doc = {
        "batch": name,
        "axes": {
            "backend": ["sglang"],
            "arm": ["bug", "fix"],
            "context_len": [4096],
            "cuda_graph": [True],
            "device": ["cuda"],
        },
        "params": {
            "model_path": str(model),
            "num_requests": 1,
            "max_new_tokens": 32,
            "profile_skip": 1,
            "profile_steps": 2,
        },
        "builds": builds,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(doc))
    return matrix.load(path)


@pytest.mark.parametrize("runner", ["notebooks", "plain"])
def test_each_arm_runs_with_its_own_build(tmp_path: Path, two_builds: dict[str, Any], runner: str) -> None:
    """A bug cell and a fix cell of one batch, each in its build (pythonpath; python): the profile stage's
    pre-flight reads the sglang it can import by AST and passes the state guard for its own arm, then
    stops at the tokenizer this model lacks. Swapped, the guard refuses both, naming the build it found."""
    b = two_builds
    builds = {"bug": {"pythonpath": [str(b["bug"])]}, "fix": {"python": str(b["python"])}}
    res = kb.run_batch(
        _sglang_matrix(tmp_path, b["model"], builds, "own"), tmp_path / "runs", progress=False, runner=runner
    )
    for c in res.cells:
        assert c.status == "failed" and c.stage in ("01_profile", "profile"), c
        assert "cannot load the tokenizer" in c.message, c.message  # past the state guard
        err = json.loads((Path(c.run_dir) / "error.json").read_text())
        assert "cannot load the tokenizer" in err["message"]

    swapped = {"bug": {"pythonpath": [str(b["fix"])]}, "fix": {"pythonpath": [str(b["bug"])]}}
    res = kb.run_batch(
        _sglang_matrix(tmp_path, b["model"], swapped, "swapped"),
        tmp_path / "runs",
        progress=False,
        runner=runner,
    )
    bug, fix = res.cells
    assert "arm 'bug' cannot run on the installed sglang 0.5.14 (state fix" in bug.message, bug.message
    assert f"{b['fix']}/sglang" in bug.message
    assert "arm 'fix' cannot run on the installed sglang 0.5.14 (state bug" in fix.message, fix.message
    assert f"{b['bug']}/sglang" in fix.message


def test_missing_build_is_refused_before_anything_runs(tmp_path: Path, fake: FakeNotebooks) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(
        "axes: {arm: [bug, fix], context_len: [2560]}\n"
        f"builds: {{fix: {{pythonpath: [{tmp_path / 'nowhere'}]}},"
        " upstream: {python: /no/python}}\n"
    )
    m = matrix.load(path)
    assert m.cells[1].build == Build((str(tmp_path / "nowhere"),)) and m.cells[0].build is None
    with pytest.raises(KitError, match=r"builds\.fix: pythonpath folder .*nowhere not found"):
        kb.run_batch(m, tmp_path / "runs", progress=False)
    assert fake.calls == [] and not (tmp_path / "runs").exists()  # upstream has no cell: not checked


@pytest.mark.nsys
def test_plain_runner_runs_a_real_cell(tmp_path: Path, require_nsys: str) -> None:
    """--runner plain: the same two stages as processes (no Jupyter), the plain comparison, no report."""
    m = _matrix(tmp_path, ["bug", "fix"])
    res = kb.run_batch(m, tmp_path / "runs", progress=False, runner="plain", jobs=2)
    assert res.exit_code == 0, summary(res)
    batch = tmp_path / "runs" / "t"
    for arm, expected in (("bug", 2), ("fix", 1)):
        run = batch / f"mini-{arm}-ctx2560-s3-eager-cpu"
        assert set(json.loads((run / "verdict.json").read_text())["launches_per_round"]) == {expected}
        assert (run / "cell.log").is_file() and not list(run.glob("executed-*.ipynb"))
        params = json.loads((run / "params.json").read_text())
        assert params["num_requests"] == 1 and params["max_new_tokens"] == 8  # the matrix's, as 01_profile
    comparison = json.loads((batch / "compare-mini-ctx2560-s3-eager-cpu" / "comparison.json").read_text())
    assert comparison["gate_failures"] == [] and res.compares[0].gate == []
    assert res.report.status == "skipped" and "notebooks" in res.report.message
