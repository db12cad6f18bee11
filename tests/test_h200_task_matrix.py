"""data/matrices/h200_task.yaml against the committed runs the earlier bash scripts/h200_task.sh made (their
params.json: what actually ran). Each step, now a mode run by kit batch, must expand to those cells with those
parameters, so a re-run sits beside the committed results; kineto and tp4 add the off arm (their gate's
control), and upstream, with no committed task run, must be the bug mode's settings on 0.5.16's build."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from kit.backends.sglang.params import SglangParams
from kit.paths import REPO
from kit.pipeline import matrix
from kit.pipeline.host_builds import later_releases
from kit.pipeline.host_task import STEPS, shared_gpu_args
from kit.sglang_src.releases import BASELINE, PATCHED

RESULTS = REPO / "data" / "results"
TASK = RESULTS / "h200-sglang-task" / "runs" / "task"
BOTH = ("same-target", "moving-target")
# what a committed params.json and a matrix cell both say (the rest is the run's own: its server folder,
# ports, the model's config as read, timeouts)
KEYS = (
    "backend arm tp_size num_steps eagle_topk num_draft_tokens context_len workload num_requests concurrency "
    "target_topk max_new_tokens cuda_graph profile profile_skip profile_steps extra_args model_path seed"
).split()


# what a run takes where a matrix cell says nothing: the typed parameters' defaults (kit/params.py)
DEFAULTS = {
    f.name: f.default for f in dataclasses.fields(SglangParams) if f.default is not dataclasses.MISSING
}


def _key(p: dict[str, Any]) -> tuple:
    """What tells a cell from the others: arm, context, workload, graphs, profiler, profiled."""
    axes = (p["arm"], p["context_len"], p["workload"], p["cuda_graph"])
    return (*axes, p.get("profiler", "nsys"), p.get("profile", True))


def _cell(c: matrix.Cell) -> tuple:
    return _key(c.params)


def _committed(run: Path) -> dict[str, Any]:
    return json.loads((run / "params.json").read_text())


def _as_committed(run: Path) -> tuple:
    return _key(_committed(run))


# mode -> the committed runs it re-runs (the bash driver's cells), and the extra_args they ran with when
# several servers shared the GPU (the kineto step ran with JOBS > 1)
COMMITTED: dict[str, list[Path]] = {
    arm: [TASK / f"{arm}-ctx{c}-{w}" for c in (4096, 65536, 500000) for w in BOTH]
    for arm in ("bug", "fix", "off")
}
COMMITTED["control"] = [TASK / f"control-ctx65536-{w}" for w in BOTH]
COMMITTED["kineto"] = sorted((RESULTS / "h200-kineto" / "sglang").glob("*-*-*"))
COMMITTED["kineto-long"] = [RESULTS / "h200-kineto" / "long" / "torch-bug-graph"]
COMMITTED["tp4"] = sorted((RESULTS / "h200-tp4" / "tp1-dry-run" / "task").glob("tp1-*-ctx*"))
SHARED = {"kineto": 2 * 65536}  # the committed kineto runs' JOBS > 1 flags (shared_gpu_args)
ADDED_OFF = ("kineto", "tp4")  # the off arm these modes add beside the committed bug and fix


def test_every_step_is_a_mode_and_every_mode_a_step() -> None:
    modes = {m for step in STEPS.values() for m in step.modes}
    assert modes == set(COMMITTED) | {"upstream", "arms"} == set(matrix.load("h200_task").modes)
    assert all(COMMITTED[m] and all((r / "params.json").is_file() for r in COMMITTED[m]) for m in COMMITTED)


@pytest.mark.parametrize("mode", sorted(COMMITTED))
def test_each_mode_expands_to_the_committed_runs_cells_and_parameters(mode: str) -> None:
    # the committed tp runs: TP=1, the dry run of its path (kit host task --tp 1)
    m = matrix.load("h200_task", mode, {"tp_size": 1} if mode == "tp4" else None)
    runs = {_as_committed(r): r for r in COMMITTED[mode]}
    cells = {_cell(c): c for c in m.cells}
    added = {k for k in cells if k[0] == "off"} if mode in ADDED_OFF else set()
    assert set(cells) - added == set(runs) and len(m.cells) == len(cells)
    if mode in ADDED_OFF:  # an off cell beside every fix cell
        assert {k[1:] for k in added} == {k[1:] for k in runs if k[0] == "fix"}
    for key, run in runs.items():
        got, want = {**DEFAULTS, **cells[key].params}, _committed(run)
        if mode in SHARED:
            got = {**got, "extra_args": shared_gpu_args(got["extra_args"], SHARED[mode])}
        assert {k: got.get(k) for k in KEYS} == {k: want.get(k) for k in KEYS}, run.name
    paths = {c.params["arm"]: c.build.pythonpath[0] for c in m.cells if c.build}
    for arm, path in paths.items():
        assert path == f"/tmp/kit-sgl/sglang-{BASELINE if arm == 'bug' else PATCHED}", (arm, path)


def test_upstream_is_the_bug_modes_settings_on_the_next_release() -> None:
    """No committed task run of 0.5.16: the upstream mode is the bug mode's cells at 64k and 500k, with
    every other parameter the same, on 0.5.16's build (by the release registry)."""
    bug = {(c.params["context_len"], c.params["workload"]): c for c in matrix.load("h200_task", "bug").cells}
    up = matrix.load("h200_task", "upstream").cells
    assert {(c.params["context_len"], c.params["workload"]) for c in up} == {
        (ctx, w) for ctx in (65536, 500000) for w in BOTH
    }
    for c in up:
        twin = bug[(c.params["context_len"], c.params["workload"])]
        assert {**c.params, "arm": "bug"} == twin.params
        v = later_releases()[0]
        assert c.build and re.fullmatch(rf"/tmp/kit-sgl16/sglang-{re.escape(v)}", c.build.pythonpath[0])


def test_the_base_grid_is_the_three_arms_steps_together() -> None:
    """The batch bug, fix and off run into: the grid the compare pass reads (each pair with its control)."""
    base = matrix.load("h200_task")
    assert base.batch == "h200_task" and {STEPS[a].batch for a in ("bug", "fix", "off")} == {"h200_task"}
    arms = {c.run_id for a in ("bug", "fix", "off") for c in matrix.load("h200_task", a).cells}
    assert {c.run_id for c in base.cells} == arms


def test_the_arms_step_is_the_three_steps_in_one_call() -> None:
    """`arms` runs the same cells with the same parameters into the same batch as bug, fix and off; with
    JOBS > 1 only the KV pool flags change (each server capped for the 500k cells beside the others)."""
    one = {c.run_id: c.params for a in ("bug", "fix", "off") for c in matrix.load("h200_task", a).cells}
    assert {c.run_id: c.params for c in matrix.load("h200_task", "arms").cells} == one
    assert STEPS["arms"].batch == "h200_task" and STEPS["arms"].shared_context == 524288
    capped = shared_gpu_args(next(iter(one.values()))["extra_args"], 524288)
    assert "--context-length=524288" in capped and "--max-total-tokens=2097152" in capped


@pytest.mark.parametrize(("key", "value"), [("concurrency", 0), ("target_topk", "first")])
def test_a_bad_concurrency_or_target_topk_is_refused_at_load(key: str, value: Any) -> None:
    """The two parameters the task modes added to the matrix are checked as every other one is."""
    from kit.errors import UsageError

    doc = {"batch": "t", "axes": {"backend": ["sglang"], "arm": ["fix"], "context_len": [4096]}}
    doc["params"] = {key: value}
    with pytest.raises(UsageError, match=f"params.{key}"):
        matrix.parse(doc)
