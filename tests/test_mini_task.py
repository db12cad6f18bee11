"""The mini engine on the retrieval task (model task): its EAGLE loop drives kit.task's target and NextN.

What the equivalence checks need from it: the indexer launches per round of each arm (under real nsys), tokens
identical across arms and equal to kit.task.reference.generate, answers right, and acceptance that only the
moving-target workload's shared top-k lowers.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kit.backends.mini.engine import Engine
from kit.backends.mini.params import MiniParams, validate
from kit.backends.mini.task_model import ON_THE_FLY_OVERRIDES, pack, unpack
from kit.compare.equivalence import compare_runs
from kit.errors import KitError
from kit.probe import ranges as nr
from kit.task.reference import generate

ARMS = ("off", "bug", "fix")
WORKLOADS = ("same-target", "moving-target")
CONTEXTS = (4096, 16384)
NEW, REQUESTS, STEPS = 32, 2, 5


def _params(arm: str, workload: str, context: int, extra: dict | None = None) -> MiniParams:
    return validate(
        {
            "model": "task",
            "workload": workload,
            "arm": arm,
            "context_len": context,
            "num_requests": REQUESTS,
            "max_new_tokens": NEW,
            "num_steps": STEPS,
            "nvtx_sink": "off",
            **(extra or {}),
        }
    )


@functools.cache
def engine_run(arm: str, workload: str, context: int) -> tuple[Engine, list[dict], dict]:
    nr.configure("off")
    engine = Engine(_params(arm, workload, context))
    rows, info = engine.run()
    return engine, rows, info


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("workload", WORKLOADS)
def test_tokens_identical_across_arms_and_answers_right(workload: str, context: int) -> None:
    runs = {arm: engine_run(arm, workload, context)[1] for arm in ARMS}
    for arm in ARMS[1:]:
        summary = compare_runs(runs["off"], runs[arm])
        assert summary["all_identical"], (arm, summary["first_divergence"])
    for arm in ARMS:
        rows = runs[arm]
        accuracy = sum(r["accuracy"] for r in rows) / len(rows)
        assert accuracy >= 0.95, (arm, accuracy)
        for r in rows:
            assert r["workload"] == workload and r["correct"] is (r["output_ids"] == r["expected_ids"])
            assert r["completion_tokens"] == len(r["output_ids"]) == len(r["expected_ids"]) == NEW
            assert r["accept_length"] == pytest.approx(NEW / r["spec_verify_ct"])
            assert len(r["draft_ids"]) == r["spec_verify_ct"] and all(len(d) == STEPS for d in r["draft_ids"])
            assert len(r["output_logprobs"]) == len(r["output_margins"]) == NEW
            assert all(lp <= 0 for lp in r["output_logprobs"]) and min(r["output_margins"]) > 5


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("workload", WORKLOADS)
def test_indexer_calls_per_round(workload: str, context: int) -> None:
    """The engine's own count; the nsys test below counts the same ranges from a real report."""
    for arm, per_round in (("off", STEPS - 1), ("bug", STEPS - 1), ("fix", 1)):
        info = engine_run(arm, workload, context)[2]
        assert info["draft_indexer_calls_per_round"] == [per_round] * info["draft_rounds"], arm
        assert info["model"] == "task" and info["indexer_impl"] == "task" and info["preset"] is None


@pytest.mark.parametrize("context", CONTEXTS)
def test_acceptance_same_target_equal_moving_target_lower_with_sharing(context: int) -> None:
    accept = {
        (wl, arm): [r["accept_length"] for r in engine_run(arm, wl, context)[1]]
        for wl in WORKLOADS
        for arm in ARMS
    }
    for wl in WORKLOADS:
        assert accept[(wl, "bug")] == accept[(wl, "off")]  # neither shares: same drafts
        assert all(3.0 < a < STEPS + 1 for a in accept[(wl, "bug")])  # the draft misses on purpose
    assert accept[("same-target", "fix")] == accept[("same-target", "bug")]
    for fix, bug in zip(accept[("moving-target", "fix")], accept[("moving-target", "bug")], strict=True):
        assert fix < bug - 1.0


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("arm", ARMS)
def test_mini_equals_the_reference_generate(arm: str, workload: str) -> None:
    """Same prompt, same model: the mini's loop and kit.task.reference.generate agree token for token."""
    engine, rows, _ = engine_run(arm, workload, 4096)
    model = engine.target.batch.model
    for prompt, row in zip(engine.task_prompts, rows, strict=True):
        ref = generate(model, prompt.ids, NEW, arm=arm, num_steps=STEPS)
        assert row["output_ids"] == ref["output_ids"]
        assert row["spec_verify_ct"] == ref["spec_verify_ct"] and row["accept_length"] == ref["accept_length"]
        assert row["draft_ids"] == ref["draft_ids"]


def test_a_checkpoint_directory_runs_the_same_as_the_one_made_in_memory(tmp_path: Path) -> None:
    from kit.checkpoint import WEIGHTS
    from kit.task import make_task_checkpoint
    from kit.task.forward import read_safetensors
    from kit.task.weights import task_tensors

    make_task_checkpoint(tmp_path / "ckpt", seed=0, overrides=ON_THE_FLY_OVERRIDES, self_check=False)
    on_disk = read_safetensors(tmp_path / "ckpt" / WEIGHTS)
    _, _, in_memory = task_tensors(0, overrides=ON_THE_FLY_OVERRIDES)
    assert list(on_disk) == list(in_memory) and all(torch.equal(on_disk[k], in_memory[k]) for k in on_disk)
    nr.configure("off")
    engine = Engine(_params("fix", "moving-target", 4096, {"task_checkpoint": str(tmp_path / "ckpt")}))
    rows, info = engine.run()
    assert info["task"]["source"] == str(tmp_path / "ckpt")
    made = engine_run("fix", "moving-target", 4096)[1]
    for a, b in zip(rows, made, strict=True):
        assert a["output_ids"] == b["output_ids"] and a["draft_ids"] == b["draft_ids"]
        assert a["output_logprobs"] == b["output_logprobs"]


def test_carrier_packing_keeps_each_selection_and_its_order() -> None:
    sels = [[torch.tensor([5, 2, 9])], [torch.tensor([7, 1, 3, 0, 4])]]
    packed = pack(sels)
    assert packed.shape == (2, 1, 5) and packed.dtype == torch.long
    for per, row in zip(sels, packed, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(per, unpack(row), strict=True))


@pytest.mark.parametrize(
    "extra,name,allowed",
    [
        ({"preset": "tiny"}, "preset", "unset with model task"),
        ({"device": "cuda"}, "device", "cpu with model task"),
        ({"cuda_graph": True}, "cuda_graph", "false with model task"),
        ({"indexer_impl": "sglang"}, "indexer_impl", "auto | torch with model task"),
        ({"index_topk": 1024}, "index_topk", "2048 with model task"),
        ({"workload": "random"}, "workload", "same-target | moving-target"),
        ({"context_len": 2177}, "context_len", "2178..65536 for model task"),
        ({"task_checkpoint": "/nonexistent/ckpt"}, "task_checkpoint", "a task checkpoint directory"),
        ({"model": "big"}, "model", "random | task"),
    ],
)
def test_task_parameters_refused_in_one_line(extra: dict, name: str, allowed: str) -> None:
    with pytest.raises(KitError) as info:
        _params("fix", "same-target", 4096, extra)
    msg = str(info.value)
    assert "\n" not in msg and f"{name}=" in msg and allowed in msg, msg


def test_task_only_parameters_refused_for_the_random_model() -> None:
    for extra in ({"workload": "same-target"}, {"task_checkpoint": "x"}):
        with pytest.raises(KitError, match="unset unless model is task"):
            validate(extra)
    assert validate({"model": "task"}).workload == "same-target"
    assert validate({}).model == "random"


def test_the_cpu_task_matrix_expands_to_arm_workload_context_cells() -> None:
    from kit.pipeline import matrix

    m = matrix.load("cpu_task")
    matrix.check_cells(m)
    assert len(m.cells) == 12 and {c.params["model"] for c in m.cells} == {"task"}
    groups = {c.group for c in m.cells}
    assert groups == {f"mini-{wl}-ctx{ctx}-s5-eager-cpu" for wl in WORKLOADS for ctx in CONTEXTS}
    assert "mini-fix-moving-target-ctx16384-s5-eager-cpu" in {c.run_id for c in m.cells}
    assert all("workload" not in c.params for c in matrix.load("demo").cells)


def _kit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kit.cli", *args], capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def nsys_task_runs(tmp_path_factory: pytest.TempPathFactory, require_nsys: str) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("task-runs")
    runs = {}
    for arm in ARMS:
        task = ["--model", "task", "--workload", "moving-target", "--context-len", "4096"]
        shape = ["--num-requests", "2", "--max-new-tokens", "16"]
        res = _kit("run", "--arm", arm, *task, *shape, "--out", str(root), "--batch", "t", "--run-id", arm)
        assert res.returncode == 0, res.stderr
        runs[arm] = Path(res.stdout.strip().splitlines()[-1])
        res = _kit("analyze", str(runs[arm]))
        assert res.returncode == 0, res.stderr
    return runs


@pytest.mark.nsys
@pytest.mark.parametrize("arm,expected", [("off", STEPS - 1), ("bug", STEPS - 1), ("fix", 1)])
def test_task_launches_per_round_under_nsys(nsys_task_runs: dict[str, Path], arm: str, expected: int) -> None:
    verdict = json.loads((nsys_task_runs[arm] / "verdict.json").read_text())
    assert verdict["source"] == "nsys" and verdict["expected_per_round"] == expected
    assert verdict["launches_per_round"] and set(verdict["launches_per_round"]) == {expected}
    assert verdict["passed"] is True
    rows = [json.loads(line) for line in (nsys_task_runs[arm] / "outputs.jsonl").read_text().splitlines()]
    assert all(r["correct"] and r["workload"] == "moving-target" for r in rows)


@pytest.mark.nsys
def test_task_runs_under_nsys_have_identical_tokens(nsys_task_runs: dict[str, Path]) -> None:
    res = _kit("compare", str(nsys_task_runs["bug"]), str(nsys_task_runs["fix"]), "--gate")
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    assert result["outputs"]["all_identical"] is True
    assert result["b"]["accept_length"] < result["a"]["accept_length"]  # moving-target: sharing costs


@pytest.fixture(scope="module")
def any_slot_runs(tmp_path_factory: pytest.TempPathFactory, require_nsys: str) -> dict[str, Path]:
    """off, bug and fix on any-slot (8192, 3 requests x 64 tokens, EAGLE 5/1/6): one nsys session."""
    from kit.analysis.analyze import analyze
    from kit.backends.mini.cells import run_cells

    base = {"backend": "mini", "model": "task", "workload": "any-slot", "context_len": 8192, "seed": 0}
    shape = {"num_requests": 3, "max_new_tokens": 64, "num_steps": 5}
    cells = [(arm, {**base, **shape, "arm": arm}) for arm in ARMS]
    dirs = run_cells(cells, tmp_path_factory.mktemp("any-slot"), "t", "any-slot")
    for d in dirs:
        analyze(d)
    return dict(zip(ARMS, dirs, strict=True))


@pytest.mark.nsys
def test_the_share_model_is_exact_on_any_slot(any_slot_runs: dict[str, Path]) -> None:
    """The gate passes the fix on any-slot with the share model matching every request of all three arms
    (the decoys do not upset the answers), and reports, not gates, its acceptance."""
    from kit.compare.runs import comparison

    res = comparison(any_slot_runs["bug"], any_slot_runs["fix"], any_slot_runs["off"])
    assert res["gate_failures"] == []
    judged = res["share_model"]["by_workload"]["any-slot"]
    assert judged["floor"] == 0 and judged["status"] == {"a": "matches", "b": "matches", "control": "matches"}
    assert all(r[s]["predicted"] == r[s]["ran"] for r in judged["requests"] for s in ("a", "b", "control"))
    assert res["accuracy"]["by_workload"]["any-slot"] == {"a": 1.0, "b": 1.0, "same": True}
    assert any("any-slot acceptance reported, not gated" in n for n in res["gate_notes"])
    fix = [json.loads(line) for line in (any_slot_runs["fix"] / "outputs.jsonl").read_text().splitlines()]
    bug = [json.loads(line) for line in (any_slot_runs["bug"] / "outputs.jsonl").read_text().splitlines()]
    assert sum(r["spec_verify_ct"] for r in fix) > sum(r["spec_verify_ct"] for r in bug)  # sharing costs
