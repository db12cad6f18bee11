"""`plan()` shows every arm's exact commands, environment and requests without starting anything.
Golden files pin them; machine-specific bits become placeholders. Regenerate deliberately with
KIT_UPDATE_GOLDEN=1 and review the diff."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from sglang_run_helpers import DSV32_CONFIG, GLM52_CONFIG, make_model

from kit.backends.sglang.plan import plan
from kit.paths import REPO
from kit.probe import kit_root
from kit.trace import nsys as capture

GOLDEN = REPO / "tests" / "golden"
PY = "/opt/sglang-env/bin/python"

CASES = {
    # the PR's setup: GLM-5.2-FP8, TP4, EAGLE 5/1/6, ~500k input, CUDA graphs on
    "plan_glm52_tp4_500k_graph": (
        GLM52_CONFIG,
        {"arms": ["bug", "fix"], "tp_size": 4, "context_len": 500000, "cuda_graph": True},
    ),
    # the PR's setup on 4x B300 (data/stage/README.md, B300): GLM-5.2-FP8, TP4, EAGLE 5/1/6, one server per
    # arm running 80k and 500k as two cells, CUDA graphs on; bug, fix and the off control
    "plan_glm52_b300_tp4_80k_500k_graph": (
        GLM52_CONFIG,
        {"arms": ["bug", "fix", "off"], "tp_size": 4, "context_len": [81920, 500000], "cuda_graph": True},
    ),
    # a DSA model whose config lacks the flag (override added), eager mode, all arms
    "plan_dsv32_80k_eager": (
        DSV32_CONFIG,
        {
            "arms": ["bug", "fix", "upstream", "off"],
            "tp_size": 8,
            "context_len": 81920,
            "cuda_graph": False,
            "max_new_tokens": 512,
            "num_requests": 2,
            "port": 31000,
        },
    ),
    # the next GPU session's shape: one server per arm runs three contexts as cells, two requests in flight,
    # one nsys report with a window per cell (--capture-range-end=none)
    "plan_glm52_3cells_c2_graph": (
        GLM52_CONFIG,
        {
            "arms": ["bug", "fix"],
            "context_len": [4096, 65536, 500000],
            "num_requests": 8,
            "concurrency": 2,
            "max_new_tokens": 96,
            "profile_skip": 2,
            "profile_steps": 10,
            "extra_args": ["--cuda-graph-max-bs=2", "--max-running-requests=2", "--context-length=524288"],
        },
    ),
    # a control run: the target's indexer keeps the last index_topk tokens (eager, one cell)
    "plan_dsv32_control_eager": (
        DSV32_CONFIG,
        {"arms": ["bug"], "context_len": 65536, "cuda_graph": False, "target_topk": "last", "port": 31000},
    ),
    # node 0 of two, sglang's multi-node args and one passthrough arg, outputs only (no nsys)
    "plan_glm52_2nodes_noprofile": (
        GLM52_CONFIG,
        {
            "arms": ["fix"],
            "tp_size": 16,
            "context_len": 81920,
            "nnodes": 2,
            "node_rank": 0,
            "dist_init_addr": "10.0.0.1:5000",
            "profile": False,
            "extra_args": ["--mem-fraction-static", "0.85"],
        },
    ),
}


def _normalise(obj: dict, model: Path, runs: Path) -> dict:
    text = json.dumps(obj, indent=2, sort_keys=True)
    nsys = capture.find_nsys()
    for real, placeholder in (
        (str(model), "<MODEL>"),
        (str(runs), "<RUNS>"),
        (str(kit_root()), "<KIT_ROOT>"),
        (nsys or "<NSYS>", "<NSYS>"),
    ):
        text = text.replace(real, placeholder)
    return json.loads(text)


@pytest.mark.parametrize("name", sorted(CASES))
def test_plan_matches_golden(name: str, tmp_path: Path) -> None:
    config, params = CASES[name]
    model = make_model(tmp_path, config, "GLM-5.2-FP8" if config is GLM52_CONFIG else "DeepSeek-V3.2")
    runs = tmp_path / "runs"
    got = _normalise(plan({**params, "model_path": str(model), "python": PY}, runs, "pr29654"), model, runs)
    path = GOLDEN / f"{name}.json"
    if os.environ.get("KIT_UPDATE_GOLDEN") == "1":
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert got == json.loads(path.read_text())


def test_plan_starts_and_creates_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_process(*a: object, **k: object) -> None:
        raise AssertionError("plan() must not start a process")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    model = make_model(tmp_path, GLM52_CONFIG)
    out = plan(
        {"arms": ["bug", "fix"], "model_path": str(model), "python": PY, "profile": False}, tmp_path / "runs"
    )
    assert set(out["arms"]) == {"bug", "fix"}
    assert not (tmp_path / "runs").exists()


def test_plan_graph_mode_starts_profiler_at_capture_and_eager_uses_the_window(tmp_path: Path) -> None:
    model = make_model(tmp_path, GLM52_CONFIG)
    graph = plan({"arm": "fix", "model_path": str(model), "python": PY}, tmp_path)["arms"]["fix"]
    eager = plan({"arm": "fix", "model_path": str(model), "python": PY, "cuda_graph": False}, tmp_path)[
        "arms"
    ]["fix"]
    assert (
        graph["env"]["KIT_PROBE_PROFILE_FROM"] == "capture"
        and "--disable-cuda-graph" not in graph["server_cmd"]
    )
    assert "KIT_PROBE_PROFILE_FROM" not in eager["env"] and "--disable-cuda-graph" in eager["server_cmd"]
    for p in (graph, eager):
        assert p["nsys_cmd"][p["nsys_cmd"].index("-o") + 2 :] == p["server_cmd"]
        assert (
            "--capture-range=cudaProfilerApi" in p["nsys_cmd"] and "--cuda-graph-trace=node" in p["nsys_cmd"]
        )
        assert p["env"]["KIT_PROBE"] == "1" and p["env"]["PYTHONPATH"].endswith("kit/probe/site")


def test_plan_command_prints_every_arm(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from kit.cli import build_parser

    parser = build_parser()
    model = make_model(tmp_path, GLM52_CONFIG)
    args = parser.parse_args(
        [
            "plan",
            "--arms",
            "bug,fix",
            "--model-path",
            str(model),
            "--tp-size",
            "4",
            "--context-len",
            "500000",
            "--python",
            PY,
            "--out",
            str(tmp_path / "runs"),
            "--sglang-arg=--mem-fraction-static=0.85",
            "--model-override",
            "rope_scaling=null",
        ]
    )
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["arms"]) == {"bug", "fix"}
    cmd = out["arms"]["fix"]["server_cmd"]
    assert cmd[-1] == "--mem-fraction-static=0.85"
    assert json.loads(cmd[cmd.index("--json-model-override-args") + 1]) == {"rope_scaling": None}


def test_only_a_server_under_nsys_sleeps_on_idle(tmp_path: Path) -> None:
    """Collection runs while a profiled server idles; an unprofiled or Kineto-profiled server is left as
    sglang runs it by default, so its timings stay comparable with the committed ones."""
    model = make_model(tmp_path, GLM52_CONFIG)
    base = {"arm": "fix", "model_path": str(model), "python": PY}
    cmds = {
        name: plan({**base, **over}, tmp_path)["arms"]["fix"]["server_cmd"]
        for name, over in {
            "nsys": {},
            "eager nsys": {"cuda_graph": False},
            "unprofiled": {"profile": False},
            "torch": {"profiler": "torch"},
        }.items()
    }
    assert {n: "--sleep-on-idle" in c for n, c in cmds.items()} == {
        "nsys": True,
        "eager nsys": True,
        "unprofiled": False,
        "torch": False,
    }
