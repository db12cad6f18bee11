"""`kit batch`: cells through papermill, failure isolation, --resume, -j 2, and submitit's local executor.

The first group swaps the notebooks for a fake (fast: the batch's own bookkeeping); the second runs the real
notebooks on the mini backend under nsys with tiny cells.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

import kit
from kit import rundir
from kit.errors import KitError
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
        self.fail = fail or set()
        self.lock = threading.Lock()

    def __call__(self, name: str, output: Path, parameters: dict[str, Any], cwd: Path | None = None,
                 build: Build | None = None) -> Path:
        key = parameters.get("run_id") or Path(parameters.get("run_dir") or parameters.get("out_dir")
                                                or parameters.get("batch_dir")).name
        with self.lock:
            self.calls.append((name, key))
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
            rundir.write_json(run_dir / "verdict.json", {
                "arm": arm, "status": "pass", "passed": True, "launches_per_round": [expected],
                "expected_per_round": expected, "source": "fake", "method": "fake"})
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
    assert res.exit_code == 1
    [failed] = res.failures
    assert failed.run_id == "mini-off-ctx2560-s3-eager-cpu" and failed.stage == "01_profile"
    assert failed.message == "KitError: invalid mini parameter for mini-off-ctx2560-s3-eager-cpu"
    run_dir = tmp_path / "runs" / "t" / failed.run_id
    err = json.loads((run_dir / "error.json").read_text())
    assert err["stage"] == "01_profile" and err["error"] == "KitError" and "\x1b" not in err["log_tail"]
    assert (run_dir / "executed-01_profile.ipynb").is_file()
    assert fake.count("02_analyze") == 2 and fake.count("03_compare") == 1 and fake.count("04_report") == 1
    text = summary(res)
    assert "FAILED (1):" in text and failed.run_id in text.split("FAILED (1):")[1]


def test_existing_batch_is_refused_without_resume(tmp_path: Path, fake: FakeNotebooks) -> None:
    m = _matrix(tmp_path, ["fix"])
    kb.run_batch(m, tmp_path / "runs", progress=False)
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").rglob("*")}
    n = len(fake.calls)
    with pytest.raises(KitError, match="already holds runs.*--resume") as exc:
        kb.run_batch(m, tmp_path / "runs", progress=False)
    assert len(str(exc.value).splitlines()) == 1
    assert len(fake.calls) == n
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").rglob("*")} == before


def test_resume_skips_complete_cells_and_sets_failed_ones_aside(tmp_path: Path, fake: FakeNotebooks) -> None:
    m = _matrix(tmp_path, ["bug", "fix"])
    bug, fix = (c.run_id for c in m.cells)
    fake.fail = {bug}
    assert kb.run_batch(m, tmp_path / "runs", progress=False).exit_code == 1
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
    real = notebooks.parameters
    monkeypatch.setattr(notebooks, "parameters", lambda name: real(name) - {"seed"})
    path = tmp_path / "m.yaml"
    path.write_text("axes: {arm: [fix], context_len: [2560]}\nparams: {seed: 16}\n")
    with pytest.raises(KitError, match="'seed' is not a parameter of notebooks/01_profile.py"):
        kb.run_batch(matrix.load(path), tmp_path / "runs", progress=False)
    assert fake.calls == [] and not (tmp_path / "runs").exists()


def test_every_matrix_param_is_a_notebook_parameter() -> None:
    from kit.pipeline import matrix as km
    takes = notebooks.parameters("01_profile")
    assert set(km.PARAMS) <= takes


def test_slurm_without_slurm_is_a_clear_error(tmp_path: Path, fake: FakeNotebooks,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("submitit")
    monkeypatch.setenv("PATH", "/nonexistent")  # no srun
    with pytest.raises(KitError, match="--executor slurm"):
        kb.run_batch(_matrix(tmp_path, ["fix"]), tmp_path / "runs", executor="slurm", progress=False)
    assert fake.calls == [] and not (tmp_path / "runs" / "t").exists()


def test_cli_dry_run_validates_the_gpu_matrix(capsys: pytest.CaptureFixture) -> None:
    from kit.cli import build_parser

    p = build_parser()
    args = p.parse_args(["batch", "gpu_pr29654", "--dry-run"])
    assert args.func(args) == 0
    out = capsys.readouterr()
    assert "4 cells" in out.out and "sglang-fix-ctx500000-s5-graph-cuda" in out.out
    assert "cannot run here" in out.err


# ---------------------------------------------------------------- real notebooks, mini backend, nsys

class Counting:
    """The real notebooks.execute, counted; `break_arm`'s 01_profile gets a context_len only the notebook
    rejects (run_profile's validation, inside the kernel), so that cell fails for real."""

    def __init__(self, real: Any, break_arm: str | None = None) -> None:
        self.real, self.break_arm, self.calls = real, break_arm, []
        self.lock = threading.Lock()

    def __call__(self, name: str, output: Path, parameters: dict[str, Any], cwd: Path | None = None,
                 build: Build | None = None) -> Path:
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
    assert res.exit_code == 1
    status = {c.run_id: c.status for c in res.cells}
    assert status == {"mini-off-ctx2560-s3-eager-cpu": "failed", "mini-bug-ctx2560-s3-eager-cpu": "done",
                      "mini-fix-ctx2560-s3-eager-cpu": "done"}
    off = batch / "mini-off-ctx2560-s3-eager-cpu"
    err = json.loads((off / "error.json").read_text())
    assert err["stage"] == "01_profile" and err["error"] == "KitError" and "context_len" in err["message"]
    executed = off / "executed-01_profile.ipynb"
    assert _errors(executed)  # executed up to the failing cell, the error kept in it
    assert not (off / "verdict.json").exists()
    for arm, expected in (("bug", 2), ("fix", 1)):
        run = batch / f"mini-{arm}-ctx2560-s3-eager-cpu"
        verdict = json.loads((run / "verdict.json").read_text())
        assert set(verdict["launches_per_round"]) == {expected} and verdict["status"] == "pass"
        for stage in ("01_profile", "02_analyze"):
            assert not _errors(run / f"executed-{stage}.ipynb"), stage
    assert (batch / "compare-mini-ctx2560-s3-eager-cpu" / "comparison.json").is_file()
    html = (batch / "report.html").read_text()
    assert "CONFIRMED" in html and "NOT CONFIRMED" not in html
    expected_calls = ["01_profile"] * 3 + ["02_analyze"] * 2 + ["03_compare", "04_report"]
    assert sorted(real_batch["calls"]) == sorted(expected_calls)


@pytest.mark.nsys
def test_real_resume_reruns_only_the_failed_cell(real_batch: dict[str, Any]) -> None:
    counting = Counting(notebooks.execute)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(notebooks, "execute", counting)
        res = kb.run_batch(real_batch["matrix"], real_batch["root"], resume=True, progress=False)
    assert res.exit_code == 0, summary(res)
    assert counting.calls == ["01_profile", "02_analyze", "04_report"]  # bug, fix and their compare: skipped
    batch = real_batch["root"] / "t"
    assert (batch / "mini-off-ctx2560-s3-eager-cpu.failed-1" / "error.json").is_file()
    assert (batch / "mini-off-ctx2560-s3-eager-cpu" / "verdict.json").is_file()


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
    from kit.pipeline import report
    good = tmp_path / "mini-fix-ctx4096"
    aside = tmp_path / "mini-fix-ctx4096.failed-1"
    for d in (good, aside):
        d.mkdir()
        (d / "verdict.json").write_text("{}")
    (aside / "error.json").write_text("{}")
    assert report.batch_runs(tmp_path) == [good]
