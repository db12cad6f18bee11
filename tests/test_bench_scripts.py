"""Benchmarks and provenance must never report a comparison they did not make, or another repository's sha."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from kit.paths import REPO


def test_gpu_bench_refuses_when_nsys_offers_no_baseline_report(tmp_path: Path) -> None:
    """nsys 2025.3 rejects `nvtxkernsum`; a script that fell back to it timed an error and printed 0.2x."""
    fake = tmp_path / "nsys"
    fake.write_text(
        "#!/bin/sh\n"
        "[ \"$1 $2\" = 'stats --help-reports' ] && echo 'cuda_gpu_trace nvtx_sum' && exit 0\n"
        "exit 1\n"
    )
    fake.chmod(0o755)
    env = {**os.environ, "KIT_NSYS": str(fake), "KIT_GIT_SHA": "abc"}
    res = subprocess.run(
        ["bash", str(REPO / "scripts" / "bench_analysis_gpu.sh"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert res.returncode == 1
    assert "neither nvtx_kern_sum nor nvtxkernsum" in res.stderr
    assert (
        not (tmp_path / "out" / "bench_analysis_gpu.md").exists()
        or "x |" not in (tmp_path / "out" / "bench_analysis_gpu.md").read_text()
    )


def test_git_sha_of_a_copy_inside_another_repository_is_unknown(tmp_path: Path) -> None:
    """A tree copied without .git into another repository must not report that repository's commit."""
    outer = tmp_path / "outer"
    outer.mkdir()
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(outer),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "x",
        ],
        check=True,
    )
    copy = outer / "kit-copy"
    shutil.copytree(REPO / "kit", copy / "kit", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "KIT_GIT_SHA"}
    out = subprocess.run(
        [sys.executable, "-c", "from kit.provenance import git_sha; print(git_sha())"],
        cwd=copy,
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert out.stdout.strip() == "None"
