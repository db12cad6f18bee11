"""`make demo`: the embedded default, executed as papermill notebooks, bug vs fix on the mini backend."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from kit import notebooks, report

DEMO_PARAMS = {
    "backend": "mini",
    "context_len": 4096,
    "num_steps": 5,
    "num_requests": 2,
    "max_new_tokens": 32,
}
ARMS = ("bug", "fix")


def _profile_and_analyze(runs_root: Path, batch: str, arm: str) -> Path:
    """01_profile creates the run dir itself, so its notebook is written beside it and moved in after."""
    run_id = f"mini-{arm}-ctx{DEMO_PARAMS['context_len']}"
    staging = runs_root / batch / f".{run_id}.01_profile.ipynb"
    run_dir = runs_root / batch / run_id
    try:
        notebooks.execute(
            "01_profile",
            staging,
            {**DEMO_PARAMS, "arm": arm, "runs_root": str(runs_root), "batch": batch, "run_id": run_id},
        )
    finally:
        if run_dir.is_dir() and staging.exists():
            shutil.move(staging, run_dir / "executed-01_profile.ipynb")
    notebooks.execute("02_analyze", run_dir / "executed-02_analyze.ipynb", {"run_dir": str(run_dir)})
    return run_dir


def run_demo(runs_root: Path) -> Path:
    runs_root = Path(runs_root).resolve()
    batch = "demo-" + time.strftime("%Y%m%d-%H%M%S")
    batch_dir = runs_root / batch
    batch_dir.mkdir(parents=True)
    t0 = time.perf_counter()
    notebooks.execute(
        "00_build_sglang", batch_dir / "executed-00_build_sglang.ipynb", {"out_dir": str(batch_dir / "build")}
    )
    run_dirs = [_profile_and_analyze(runs_root, batch, arm) for arm in ARMS]
    notebooks.execute(
        "03_compare",
        batch_dir / "executed-03_compare.ipynb",
        {"run_a": str(run_dirs[0]), "run_b": str(run_dirs[1]), "out_dir": str(batch_dir)},
    )
    executed = notebooks.execute(
        "04_report", batch_dir / "executed-04_report.ipynb", {"batch_dir": str(batch_dir)}
    )
    report.export_html(executed, batch_dir / "report.html")
    elapsed = time.perf_counter() - t0

    print(f"\nDemo batch: {batch_dir}  ({elapsed:.0f} s)")
    for run_dir in run_dirs:
        v = json.loads((run_dir / "verdict.json").read_text())
        print(
            f"  {v['arm']:>4}: launches/round {v['launches_per_round']} expected {v['expected_per_round']} "
            f"-> {v['status'].upper()} (source: {v['source']}, method: {v['method']})"
        )
        print(f"        {run_dir}/verdict.json  rounds.csv  timeline.png  executed-0*.ipynb")
    print(f"  build:   {batch_dir}/build/manifest.json")
    print(f"  compare: {batch_dir}/comparison.json")
    print(f"  report:  {batch_dir}/report.html")
    return batch_dir
