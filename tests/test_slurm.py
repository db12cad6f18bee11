"""`kit batch --executor slurm` against a real single-node Slurm cluster (slurmctld + slurmd + munged).

The cluster is Debian's slurm-wlm, started by scripts/slurm-cluster.sh in a temporary folder for this test
session and stopped afterwards. Outside CI a machine where it cannot start (not root, no apt) skips; in CI
it must run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kit.paths import REPO

SCRIPT = REPO / "scripts" / "slurm-cluster.sh"
MATRIX = {
    "batch": "slurm",
    "axes": {"arm": ["bug", "fix"], "context_len": [2560], "num_steps": [3]},
    "params": {"num_requests": 1, "max_new_tokens": 8},
}


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A running cluster; yields the environment that points sbatch/squeue at it."""
    state = tmp_path_factory.mktemp("slurm")
    res = subprocess.run(["bash", str(SCRIPT), "start", str(state)], capture_output=True, text=True)
    if res.returncode != 0:
        if res.returncode == 3 and os.environ.get("CI", "").lower() != "true":
            pytest.skip(f"no Slurm here: {res.stderr.strip()}")
        pytest.fail(f"slurm-cluster.sh start failed ({res.returncode}): {res.stderr.strip()[-2000:]}")
    env = {**os.environ, "SLURM_CONF": str(state / "slurm.conf")}
    try:
        yield env
    finally:
        subprocess.run(["scancel", "--user", str(os.getuid())], env=env, capture_output=True)
        subprocess.run(["bash", str(SCRIPT), "stop", str(state)], capture_output=True)


def _batch(tmp_path: Path, env: dict[str, str], *extra: str) -> subprocess.Popen:
    matrix = tmp_path / "m.yaml"
    matrix.write_text(json.dumps(MATRIX))  # JSON is YAML
    cmd = [sys.executable, "-m", "kit.cli", "batch", str(matrix), "--executor", "slurm", "-j", "2"]
    cmd += ["--out", str(tmp_path / "runs"), "--no-progress", *extra]
    return subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _jobs(env: dict[str, str]) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


@pytest.mark.nsys
def test_two_cells_through_sbatch_then_resume_after_a_cancelled_job(
    tmp_path: Path, slurm: dict[str, str], require_nsys: str
) -> None:
    proc = _batch(tmp_path, slurm)
    deadline = time.monotonic() + 60
    while len(jobs := _jobs(slurm)) < 2:  # both cells queued at once (-j 2)
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.2)
    subprocess.run(["scancel", jobs[0]], env=slurm, check=True)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2, out  # a cell that failed to run (kit.errors.EXIT "error")
    assert "1 failed" in out and f"job {jobs[0]}" in out, out
    batch = tmp_path / "runs" / "slurm"
    done = [p for p in batch.glob("mini-*") if (p / "verdict.json").is_file()]
    assert len(done) == 1, out  # the other cell's job ran to the end and was collected

    again = _batch(tmp_path, slurm, "--resume")
    out2, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out2
    assert "1 run, 1 already complete, 0 failed" in out2, out2
    for arm, expected in (("bug", 2), ("fix", 1)):
        verdict = json.loads((batch / f"mini-{arm}-ctx2560-s3-eager-cpu" / "verdict.json").read_text())
        assert verdict["passed"] and set(verdict["launches_per_round"]) == {expected}
    assert list(batch.glob("mini-*.failed-*"))  # the cancelled attempt, set aside, not deleted
    assert (batch / "report.html").is_file()
