"""Parameter validation of the mini backend: defaults, one-line errors naming the parameter, warnings."""

from __future__ import annotations

import pytest
import torch

from kit.backends.mini.params import MiniParams, validate, warnings_for
from kit.errors import KitError, UsageError


def test_defaults_are_filled():
    p = validate({})
    assert p.backend == "mini" and p.context_len == 4096 and p.num_steps == 5
    assert p.num_draft_tokens == 6 and p.eagle_topk == 1 and p.index_topk == 2048
    assert p.nvtx_sink == "nvtx" and p.device == "cpu" and p.cuda_graph is False
    only_when_set = {"workload", "task_checkpoint", "mutant", "corrupt"}
    assert set(MiniParams.defaults()) - only_when_set <= set(p.to_json())
    assert validate({"num_steps": 3}).num_draft_tokens == 4


def test_unknown_keys_pass_through():
    assert validate({"run_id": "x"}).to_json()["run_id"] == "x"


@pytest.mark.parametrize(
    "params,name,allowed",
    [
        ({"num_steps": 1}, "num_steps", "2..16"),
        ({"num_steps": "5"}, "num_steps", "integer"),
        ({"num_steps": True}, "num_steps", "integer"),
        ({"arm": "patched"}, "arm", "off | bug | fix | upstream"),
        ({"context_len": 65537}, "context_len", "64..65536"),
        ({"context_len": 32}, "context_len", "64..65536"),
        ({"context_len": 4096.0}, "context_len", "integer"),
        ({"preset": "dsv4"}, "preset", "tiny | dsv32 | glm5"),
        ({"device": "tpu"}, "device", "cpu | cuda"),
        ({"cuda_graph": "yes"}, "cuda_graph", "true | false"),
        ({"cuda_graph": True}, "cuda_graph", "unless device is cuda"),
        ({"static_batch": "yes"}, "static_batch", "true | false"),
        ({"static_batch": 1, "model": "task", "workload": "same-target"}, "static_batch", "true | false"),
        ({"num_draft_tokens": 4}, "num_draft_tokens", "num_steps + 1 = 6"),
        ({"eagle_topk": 0}, "eagle_topk", "1..8"),
        ({"num_requests": 0}, "num_requests", "1..64"),
        ({"max_new_tokens": -1}, "max_new_tokens", "1..4096"),
        ({"index_topk": 8}, "index_topk", "16..65536"),
        ({"nvtx_sink": "perfetto"}, "nvtx_sink", "nvtx | recorder | off"),
        ({"backend": "sglang"}, "backend", "mini"),
        ({"preset": "dsv32", "context_len": 16384}, "context_len", "64..8192 for preset dsv32 on cpu"),
    ],
)
def test_bad_parameters_give_one_line_naming_parameter_and_range(params, name, allowed):
    with pytest.raises(KitError) as info:
        validate(params)
    msg = str(info.value)
    assert "\n" not in msg
    assert f"{name}=" in msg and allowed in msg, msg


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_gpu_is_refused():
    with pytest.raises(KitError, match=r"device='cuda'.*no CUDA GPU"):
        validate({"device": "cuda"})


def test_not_a_dict():
    with pytest.raises(KitError, match="JSON object"):
        validate(["arm", "bug"])


def test_warnings():
    assert warnings_for(validate({})) == []
    short = warnings_for(validate({"context_len": 2048}))
    assert len(short) == 1 and "cannot show the bug's cost" in short[0]
    tree = warnings_for(validate({"arm": "off", "eagle_topk": 2}))
    assert len(tree) == 1 and "disables index sharing" in tree[0] and "self.topk == 1" in tree[0]
    two = warnings_for(validate({"num_steps": 2}))
    assert len(two) == 1 and "cannot tell them apart" in two[0]
    more = {"arm": "off", "context_len": 1024, "num_steps": 2, "eagle_topk": 4}
    assert len(warnings_for(validate(more))) == 3


@pytest.mark.parametrize(
    "params",
    [
        {"arm": "fix", "eagle_topk": 2},
        {"arm": "bug", "eagle_topk": 4},
        {"arm": "upstream", "eagle_topk": 2},
        {"arm": "fix", "eagle_topk": 2, "model": "task", "workload": "same-target"},
        {"arm": "fix", "eagle_topk": 2, "model": "task", "workload": "same-target", "mutant": "no-clear"},
    ],
)
def test_eagle_topk_other_than_1_is_refused_where_the_verdict_needs_sharing(params):
    """sglang shares the top-k only with topk 1: with topk 2 the fix arm's 1 launch per round cannot show
    (a false FAIL) and the bug arm's 4 show on any build (a pass that proves nothing)."""
    with pytest.raises(UsageError, match=r"speculative_eagle_topk == 1.*self\.topk == 1") as info:
        validate(params)
    assert info.value.param == "eagle_topk" and "\n" not in str(info.value)
    assert f"arm {params['arm']}" in str(info.value)


def test_the_off_arm_runs_any_eagle_topk():
    """off never shares, whatever the topk: its num_steps - 1 launches per round mean the same."""
    assert validate({"arm": "off", "eagle_topk": 3}).eagle_topk == 3


def test_a_matrix_cell_with_eagle_topk_2_is_refused_before_anything_runs():
    from kit.pipeline import matrix

    m = matrix.parse(
        {"axes": {"arm": ["bug", "fix"], "context_len": [4096]}, "params": {"eagle_topk": 2}}, "m"
    )
    with pytest.raises(UsageError, match=r"cell mini-bug-ctx4096-s5-eager-cpu: eagle_topk=2 with arm bug"):
        matrix.check_cells(m)
    off = matrix.parse({"axes": {"arm": ["off"], "context_len": [4096]}, "params": {"eagle_topk": 2}}, "m")
    matrix.check_cells(off)  # off alone: valid


def test_static_batch_is_the_graph_runner_without_the_graph():
    assert validate({}).static_batch is False and validate({"static_batch": True}).static_batch is True
    task = validate({"static_batch": True, "model": "task", "workload": "moving-target"})
    assert task.static_batch is True and task.cuda_graph is False


def test_static_batch_and_a_real_graph_do_not_mix(monkeypatch: pytest.MonkeyPatch):
    import kit.backends.mini.params as mp

    monkeypatch.setattr(mp, "_cuda_available", lambda: True)
    with pytest.raises(KitError, match="static_batch.*a captured graph already keeps its batch"):
        validate({"device": "cuda", "cuda_graph": True, "static_batch": True})
