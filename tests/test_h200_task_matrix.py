"""data/matrices/h200_task.yaml against what the earlier bash scripts/h200_task.sh and h200_upstream.sh ran
as `kit run` calls (their settings: scripts/h200_task_settings.sh's SGL and TASK, read here from that file;
their cells: the table below, read off the bash at ff05f7a~1). Each step, now a mode run by kit batch, must
expand to exactly those cells with exactly those parameters, so a re-run sits beside the committed results."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest

from kit.paths import REPO
from kit.pipeline import matrix
from kit.pipeline.host_builds import later_releases
from kit.pipeline.host_task import STEPS, shared_gpu_args
from kit.sglang_src.releases import BASELINE, PATCHED

SETTINGS = REPO / "scripts" / "h200_task_settings.sh"
BOTH = ("same-target", "moving-target")
ARMS_CONTEXTS = (4096, 65536, 500000)


def _array(name: str) -> list[str]:
    """One of the settings' bash arrays, as bash expands it ($ckpt and $runs named, nothing run)."""
    script = f'ckpt=/tmp/kit-task runs=RUNS; eval "$(sed -n "/^{name}=(/,/)$/p" {SETTINGS})"; '
    script += f'printf "%s\\n" "${{{name}[@]}}"'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.split()


def _task_params() -> dict[str, Any]:
    """TASK's kit run options as matrix parameters."""
    words, out = _array("TASK"), {}
    for flag, key in (
        ("--num-steps", "num_steps"),
        ("--eagle-topk", "eagle_topk"),
        ("--num-draft-tokens", "num_draft_tokens"),
        ("--num-requests", "num_requests"),
        ("--concurrency", "concurrency"),
        ("--max-new-tokens", "max_new_tokens"),
        ("--profile-skip", "profile_skip"),
        ("--profile-steps", "profile_steps"),
    ):
        out[key] = int(words[words.index(flag) + 1])
    out["model_path"] = words[words.index("--model-path") + 1]
    assert "--cuda-graph" in words  # the graph axis: every mode's cells but kineto's eager ones
    out["backend"] = words[words.index("--backend") + 1]
    return out


def _sgl() -> list[str]:
    return [w.removeprefix("--sglang-arg=") for w in _array("SGL")]


def _cells(arms: tuple[str, ...], contexts: tuple[int, ...], workloads: tuple[str, ...] = BOTH, **axes: Any):
    """The (arm, context, workload, cuda_graph, profiler, profile) of a kit run's cells."""
    graphs = axes.get("cuda_graph", (True,))
    profilers = axes.get("profiler", ("nsys",))
    profiles = axes.get("profile", (True,))
    return {
        (a, c, w, g, p, pr)
        for a in arms
        for c in contexts
        for w in workloads
        for g in graphs
        for p in profilers
        for pr in profiles
    }


# mode -> (cells, parameters other than TASK's and SGL's) as the bash driver's `kit run` calls ran them
OLD: dict[str, tuple[set, dict[str, Any]]] = {
    "bug": (_cells(("bug",), ARMS_CONTEXTS), {}),
    "fix": (_cells(("fix",), ARMS_CONTEXTS), {}),
    "off": (_cells(("off",), ARMS_CONTEXTS), {}),
    "control": (_cells(("fix",), (65536,), profile=(False,)), {"target_topk": "last"}),
    "kineto": (
        _cells(
            ("bug", "fix"), (65536,), ("same-target",), cuda_graph=(True, False), profiler=("torch", "nsys")
        ),
        {},
    ),
    "kineto-long": (
        _cells(("bug",), (65536,), ("same-target",), profiler=("torch",)),
        {"profile_steps": 100, "max_new_tokens": 720, "num_requests": 2},
    ),
    "tp4": (_cells(("bug", "fix"), (65536, 500000)), {"tp_size": 4}),
    "upstream": (_cells(("upstream",), (65536, 500000)), {}),
}


def test_every_step_is_a_mode_and_every_mode_a_step() -> None:
    modes = {m for step in STEPS.values() for m in step.modes}
    assert modes == set(OLD) == set(matrix.load("h200_task").modes)


@pytest.mark.parametrize("mode", sorted(OLD))
def test_each_mode_expands_to_the_cells_and_parameters_the_bash_driver_ran(mode: str) -> None:
    m = matrix.load("h200_task", mode)
    cells, own = OLD[mode]
    got = {
        (
            c.params["arm"],
            c.params["context_len"],
            c.params["workload"],
            c.params["cuda_graph"],
            c.params.get("profiler", "nsys"),
            c.params.get("profile", True),
        )
        for c in m.cells
    }
    assert got == cells and len(m.cells) == len(cells)
    want = {**_task_params(), **own, "extra_args": _sgl()}
    for c in m.cells:
        assert {k: c.params.get(k) for k in want} == want, c.run_id
        assert c.params.get("target_topk") == own.get("target_topk"), c.run_id
        assert c.params.get("tp_size", 1) == own.get("tp_size", 1), c.run_id
    # each arm's build, by the release registry's names (0.5.16: the upstream arm the bash driver ran)
    paths = {c.params["arm"]: c.build.pythonpath[0] for c in m.cells if c.build}
    expected = {"bug": BASELINE, "fix": PATCHED, "off": PATCHED, "upstream": later_releases()[0]}
    for arm, path in paths.items():
        assert re.fullmatch(rf"/tmp/kit-sgl(16)?/sglang-{re.escape(expected[arm])}", path), (arm, path)


def test_the_base_grid_is_the_three_arms_steps_together() -> None:
    """The batch bug, fix and off run into: the grid the compare pass reads (each pair with its control)."""
    base = matrix.load("h200_task")
    assert base.batch == "h200_task" and {STEPS[a].batch for a in ("bug", "fix", "off")} == {"h200_task"}
    arms = {c.run_id for a in ("bug", "fix", "off") for c in matrix.load("h200_task", a).cells}
    assert {c.run_id for c in base.cells} == arms


@pytest.mark.parametrize("context", [2 * 65536, 524288])
def test_several_servers_get_the_settings_capped_pool(context: int) -> None:
    """shared_gpu_args is h200_task_settings.sh's shared_gpu_flags (which h200_mutants.sh still uses)."""
    script = f'eval "$(sed -n "/^SGL=(/,/)$/p; /^shared_gpu_flags()/,/^}}/p" {SETTINGS})"; '
    script += f'shared_gpu_flags {context}; printf "%s\\n" "${{SGL[@]}}"'
    flags = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert shared_gpu_args(_sgl(), context) == [w.removeprefix("--sglang-arg=") for w in flags]


@pytest.mark.parametrize(("key", "value"), [("concurrency", 0), ("target_topk", "first")])
def test_a_bad_concurrency_or_target_topk_is_refused_at_load(key: str, value: Any) -> None:
    """The two parameters the task modes added to the matrix are checked as every other one is."""
    from kit.errors import UsageError

    doc = {"batch": "t", "axes": {"backend": ["sglang"], "arm": ["fix"], "context_len": [4096]}}
    doc["params"] = {key: value}
    with pytest.raises(UsageError, match=f"params.{key}"):
        matrix.parse(doc)
