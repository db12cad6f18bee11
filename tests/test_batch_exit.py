"""`kit batch`'s exit codes (kit.errors.EXIT), Ctrl-C (one line, exit 130, every process stopped, cut cells
marked), and the folders it refuses (--out naming a file, a --batch that is a run)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_batch import FakeError, FakeNotebooks, _matrix

from kit import rundir
from kit.cli import main as kit_main
from kit.errors import KitError
from kit.pipeline import batch as kb
from kit.pipeline import matrix, notebooks
from kit.pipeline.matrix import Build


class Verdicts(FakeNotebooks):
    """FakeNotebooks whose 02_analyze writes `status` for the arms named, and whose 03_compare writes
    `gate` as the comparison's gate failures."""

    def __init__(self, status: dict[str, str] | None = None, gate: list[str] | None = None) -> None:
        super().__init__()
        self.status, self.gate = status or {}, gate or []

    def __call__(
        self,
        name: str,
        output: Path,
        parameters: dict[str, Any],
        cwd: Path | None = None,
        build: Build | None = None,
    ) -> Path:
        out = super().__call__(name, output, parameters, cwd, build)
        if name == "02_analyze":
            path = Path(parameters["run_dir"]) / "verdict.json"
            v = json.loads(path.read_text())
            path.unlink()
            rundir.write_json(path, {**v, "status": self.status.get(v["arm"], "pass")})
        elif name == "03_compare":
            path = Path(parameters["out_dir"]) / "comparison.json"
            path.unlink()
            rundir.write_json(path, {"gate_failures": self.gate})
        return out


def _run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake: FakeNotebooks, arms: list[str]
) -> kb.BatchResult:
    monkeypatch.setattr(notebooks, "execute", fake)
    monkeypatch.setattr(matrix, "check_cells", lambda m: None)
    return kb.run_batch(_matrix(tmp_path, arms), tmp_path / "runs", progress=False)


@pytest.mark.parametrize(
    "fake,code",
    [
        (Verdicts(), 0),
        (Verdicts(gate=["greedy outputs differ"]), 1),  # a gate that failed is a failed check
        (Verdicts(status={"fix": "fail"}), 1),  # so is a verdict that failed
        (Verdicts(status={"bug": "inconclusive"}), 3),  # an inconclusive verdict: incomplete
    ],
)
def test_exit_code_follows_the_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake: Verdicts, code: int
) -> None:
    assert _run(tmp_path, monkeypatch, fake, ["bug", "fix"]).exit_code == code


def test_a_failed_check_outranks_a_failed_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = Verdicts(status={"fix": "fail"})
    fake.fail = {"mini-off-ctx2560-s3-eager-cpu"}
    res = _run(tmp_path, monkeypatch, fake, ["off", "bug", "fix"])
    assert res.failures and res.checks_failed == ["mini-fix-ctx2560-s3-eager-cpu"] and res.exit_code == 1


def test_out_naming_a_file_and_a_batch_that_is_a_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Issue 14.6 and 14.9: one line each, nothing created."""
    (tmp_path / "afile").write_text("")
    assert kit_main(["batch", "demo", "--out", str(tmp_path / "afile")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "afile is a file, not a folder" in err
    run = tmp_path / "runs" / "b" / "r1"
    run.mkdir(parents=True)
    (run / "params.json").write_text("{}")
    assert kit_main(["batch", "demo", "--out", str(tmp_path / "runs" / "b"), "--batch", "r1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "r1 is a run directory (it holds params.json)" in err
    assert sorted(p.name for p in run.iterdir()) == ["params.json"]


def test_run_refuses_an_out_file_and_a_batch_that_is_a_run(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    args = ["run", "--arm", "fix", "--context-len", "2560", "--num-steps", "3", "--max-new-tokens", "4"]
    (tmp_path / "afile").write_text("")
    assert kit_main([*args, "--out", str(tmp_path / "afile")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a file, not a folder" in err
    run = tmp_path / "b" / "r1"
    run.mkdir(parents=True)
    (run / "params.json").write_text("{}")
    assert kit_main([*args, "--out", str(tmp_path / "b"), "--batch", "r1"]) == 2
    assert "is a run directory" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == ["params.json"]


def test_run_ids_name_num_steps() -> None:
    rid = rundir.new_run_id({"backend": "mini", "arm": "fix", "context_len": 4096, "num_steps": 3})
    assert rid.startswith("mini-fix-ctx4096-s3-")
    assert rundir.new_run_id({"arm": "bug"}).startswith("run-bug-ctx0-2")


# ---------------------------------------------------------------- Ctrl-C


class Blocking(FakeNotebooks):
    """The first 01_profile runs until the batch is interrupted, then fails as a kernel that took SIGINT
    does (after making its run dir, as run_profile would)."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()

    def __call__(
        self,
        name: str,
        output: Path,
        parameters: dict[str, Any],
        cwd: Path | None = None,
        build: Build | None = None,
    ) -> Path:
        if name == "01_profile" and not self.started.is_set():
            self.started.set()
            rundir.create_run_dir(Path(parameters["runs_root"]), parameters["batch"], parameters["run_id"])
            deadline = time.monotonic() + 30
            while not notebooks.INTERRUPTED.is_set() and time.monotonic() < deadline:
                time.sleep(0.01)
            raise FakeError("KeyboardInterrupt", "")
        return super().__call__(name, output, parameters, cwd, build)


def test_ctrl_c_stops_the_running_cell_and_starts_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = Blocking()
    main = threading.main_thread().ident

    def press_ctrl_c() -> None:
        fake.started.wait(30)
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=press_ctrl_c, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path, monkeypatch, fake, ["bug", "fix"])
    batch = tmp_path / "runs" / "t"
    err = json.loads((batch / "mini-bug-ctx2560-s3-eager-cpu" / "error.json").read_text())
    assert err["stage"] == "01_profile" and err["error"] == "KeyboardInterrupt"
    assert not (batch / "mini-fix-ctx2560-s3-eager-cpu").exists()  # never started: --resume runs it
    assert fake.count("02_analyze") == fake.count("03_compare") == fake.count("04_report") == 0
    # the next batch in this process starts uninterrupted
    (tmp_path / "again").mkdir()
    res = _run(tmp_path / "again", monkeypatch, FakeNotebooks(), ["fix"])
    assert res.exit_code == 0


def _left(pid: int, root: Path) -> list[str]:
    """Processes the batch `pid` left: kernels it started (their JPY_PARENT_PID) and anything whose
    command line names a path under `root` (the engine, nsys, a plain stage)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if state != "Z" and (f"JPY_PARENT_PID={pid}".encode() in env or str(root) in cmd):
            found.append(f"{entry}: {cmd}")
    return found


@pytest.mark.nsys
@pytest.mark.parametrize("runner", ["notebooks", "plain"])
def test_real_ctrl_c_ends_the_batch_in_one_line(tmp_path: Path, require_nsys: str, runner: str) -> None:
    """Issue 14.6: Ctrl-C (SIGINT to the batch's process group, as a terminal sends it) while a cell's
    engine runs: one line, exit 130, no process left, the cell marked with error.json."""
    doc = {
        "batch": "c",
        "axes": {"arm": ["bug", "fix"], "context_len": [16384], "num_steps": [3]},
        "params": {"num_requests": 2, "max_new_tokens": 1024},
    }
    path = tmp_path / "m.yaml"
    path.write_text(json.dumps(doc))
    root = tmp_path / "runs"
    cmd = [
        sys.executable,
        "-m",
        "kit.cli",
        "batch",
        str(path),
        "--out",
        str(root),
        "--no-progress",
        "--runner",
        runner,
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while not list(root.glob("c/*/engine.log")) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        time.sleep(1.0)  # the engine is running
        assert proc.poll() is None, proc.communicate()
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["kit batch: interrupted"], err
    assert _left(proc.pid, root) == []
    cell = root / "c" / "mini-bug-ctx16384-s3-eager-cpu"
    assert json.loads((cell / "error.json").read_text())["error"] == "KeyboardInterrupt"
    assert not (root / "c" / "mini-fix-ctx16384-s3-eager-cpu").exists()
    if runner == "notebooks":  # the kernel's own output went to its log, not the terminal
        assert (cell / "executed-01_profile.kernel.log").is_file()
    with pytest.raises(KitError, match="already holds runs"):
        kb.run_batch(matrix.load(path), root, progress=False, runner=runner)
