"""`make demo`: the embedded default, executed as papermill notebooks, bug vs fix on the mini backend."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from kit import rundir
from kit.pipeline import batch, matrix, notebooks
from kit.pipeline.summary import summary
from kit.report.this_batch import batch_runs

DEMO_MATRIX = "demo"  # data/matrices/demo.yaml: mini, arms bug and fix, context 4096, num_steps 5, cpu


def run_demo(runs_root: Path) -> tuple[Path, int]:
    """Build the patched sglang once, then the demo matrix through kit.pipeline.batch (one per-cell path):
    the batch folder and the batch's exit code (README's table: a failed gate 1, a failed stage 2, ...)."""
    runs_root = Path(runs_root).resolve()
    m = matrix.load(DEMO_MATRIX)
    name = "demo-" + time.strftime("%Y%m%d-%H%M%S")
    batch_dir = rundir.check_folder(runs_root / name, "the demo batch")
    batch_dir.mkdir(parents=True)
    t0 = time.perf_counter()
    notebooks.execute(
        "00_build_sglang", batch_dir / "executed-00_build_sglang.ipynb", {"out_dir": str(batch_dir / "build")}
    )
    result = batch.run_batch(m, runs_root, batch=name)
    print(f"\nDemo batch: {batch_dir}  ({time.perf_counter() - t0:.0f} s)")
    print(summary(result))
    print(f"  build:   {batch_dir}/build/manifest.json  (notebook: executed-00_build_sglang.ipynb)")
    for run_dir in batch_runs(batch_dir):
        print(
            f"  {run_dir.name}/: verdict.json rounds.csv timeline.png launches_per_round.png "
            "executed-01_profile.ipynb executed-02_analyze.ipynb"
        )
    print(f"  plots:   {batch_dir}/report_plots.png   report: {batch_dir}/report.html")
    if result.exit_code:
        print(
            f"kit demo: {len(result.failures)} stage(s) did not pass, listed above; see {batch_dir}",
            file=sys.stderr,
        )
    return batch_dir, result.exit_code
