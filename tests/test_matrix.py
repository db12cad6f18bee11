"""Matrix YAML: expansion into cells, stable run ids, and one-line errors that name the key (nothing runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kit.errors import KitError
from kit.paths import REPO
from kit.pipeline import matrix

BASE = """\
batch: t
axes:
  arm: [bug, fix]
  context_len: [2048, 4096]
params:
  num_requests: 1
"""


def _write(tmp_path: Path, text: str, name: str = "m.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _error(tmp_path: Path, text: str) -> str:
    with pytest.raises(KitError) as exc:
        matrix.load(_write(tmp_path, text))
    msg = str(exc.value)
    assert len(msg.splitlines()) == 1, msg
    return msg


def test_product_of_axes_with_defaults_and_fixed_params(tmp_path: Path) -> None:
    m = matrix.load(_write(tmp_path, BASE))
    assert m.batch == "t"
    assert [c.run_id for c in m.cells] == [
        "mini-bug-ctx2048-s5-eager-cpu",
        "mini-bug-ctx4096-s5-eager-cpu",
        "mini-fix-ctx2048-s5-eager-cpu",
        "mini-fix-ctx4096-s5-eager-cpu",
    ]
    assert m.cells[0].params == {
        "backend": "mini",
        "arm": "bug",
        "context_len": 2048,
        "num_steps": 5,
        "cuda_graph": False,
        "device": "cpu",
        "num_requests": 1,
    }
    assert m.cells[0].group == m.cells[2].group == "mini-ctx2048-s5-eager-cpu"


def test_every_axis_multiplies_and_ids_stay_unique(tmp_path: Path) -> None:
    text = (
        "axes:\n  arm: [off, bug, fix]\n  context_len: [8192, 32768]\n  num_steps: [3, 5]\n"
        "  cuda_graph: [true, false]\n  device: cuda\n"
    )
    m = matrix.load(_write(tmp_path, text, "sweep.yaml"))
    assert len(m.cells) == 3 * 2 * 2 * 2
    assert len({c.run_id for c in m.cells}) == len(m.cells)
    assert m.batch == "sweep"  # no batch: the file's name
    assert "mini-off-ctx8192-s3-graph-cuda" in {c.run_id for c in m.cells}


def test_yaml_off_is_an_arm_not_false(tmp_path: Path) -> None:
    """YAML 1.1 reads `off` as False; the matrix loader keeps only true/false as booleans."""
    m = matrix.load(_write(tmp_path, "axes:\n  arm: [off]\n  context_len: [2048]\n  cuda_graph: [false]\n"))
    assert m.cells[0].params["arm"] == "off" and m.cells[0].params["cuda_graph"] is False


@pytest.mark.parametrize(
    "text,needles",
    [
        ("", ["empty"]),
        ("batch: x\n", ["empty", "axes"]),
        ("axes: {arm: [fix]}\n", ["axes.context_len", "missing"]),
        ("axes: {arm: [fix], context_len: ['4k']}\n", ["axes.context_len", "integer", "'4k'"]),
        ("axes: {arm: [fix], context_len: [4096.5]}\n", ["axes.context_len", "integer"]),
        ("axes: {arm: [fix], context_len: [true]}\n", ["axes.context_len", "integer"]),
        ("axes: {arm: [fix], context_len: [0]}\n", ["axes.context_len", ">= 1"]),
        (
            "axes: {arm: [sideways], context_len: [4096]}\n",
            ["axes.arm", "'sideways'", "off, bug, fix, upstream"],
        ),
        ("axes: {arm: [fix], context_len: [4096], device: [tpu]}\n", ["axes.device", "cpu, cuda"]),
        (
            "axes: {arm: [fix], context_len: [4096], cuda_graph: [yes]}\n",
            ["axes.cuda_graph", "true or false"],
        ),
        (
            "axes: {arm: [fix], contxt_len: [4096]}\n",
            ["'contxt_len'", "did you mean 'context_len'", "allowed:"],
        ),
        ("axes: {arm: [fix], context_len: []}\n", ["axes.context_len", "empty"]),
        ("axes: {arm: [fix, fix], context_len: [4096]}\n", ["axes.arm", "more than once"]),
        (
            "axes: {arm: [fix], context_len: [4096], num_requests: [1]}\n",
            ["axes.num_requests", "under params"],
        ),
        (
            "axes: {arm: [fix], context_len: [4096]}\nparams: {context_len: 1}\n",
            ["params.context_len", "axis"],
        ),
        (
            "axes: {arm: [fix], context_len: [4096]}\nparams: {max_new_tokns: 8}\n",
            ["'max_new_tokns'", "params", "max_new_tokens"],
        ),
        (
            "axes: {arm: [fix], context_len: [4096]}\nparams: {num_requests: two}\n",
            ["params.num_requests", "integer"],
        ),
        (
            "axes: {arm: [fix], context_len: [4096]}\nparams: {model_path: /m}\n",
            ["params.model_path", "sglang only"],
        ),
        (
            "axes: {backend: [sglang], arm: [fix], context_len: [80000], device: [cuda]}\n"
            "params: {preset: tiny}\n",
            ["params.preset", "mini only"],
        ),
        (
            "axes: {backend: [sglang], arm: [fix], context_len: [4096], device: [cpu]}\n",
            ["axes.device", "cuda only"],
        ),
        ("axis: {arm: [fix], context_len: [4096]}\n", ["'axis'", "top level", "did you mean 'axes'"]),
        ("batch: 'my batch'\naxes: {arm: [fix], context_len: [4096]}\n", ["batch", "valid name"]),
        ("- arm\n- fix\n", ["mapping"]),
        ("axes: {arm: [fix], context_len: [4096]\n", ["not valid YAML", "line"]),
    ],
)
def test_bad_matrix_is_one_line_naming_the_key(tmp_path: Path, text: str, needles: list[str]) -> None:
    msg = _error(tmp_path, text)
    assert str(tmp_path / "m.yaml") in msg
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_shipped_matrices_validate() -> None:
    sizes = {"demo": 2, "cpu_sweep": 8, "gpu_pr29654": 4, "h200_mini": 30}
    for name, n in sizes.items():
        m = matrix.load(name)
        assert m.batch == name and len(m.cells) == n
    demo = matrix.load("demo")
    assert {c.params["arm"] for c in demo.cells} == {"bug", "fix"}
    assert {(c.params["context_len"], c.params["num_steps"], c.params["device"]) for c in demo.cells} == {
        (4096, 5, "cpu")
    }
    gpu = matrix.load("gpu_pr29654")
    p = gpu.cells[0].params
    assert (p["backend"], p["tp_size"], p["num_steps"], p["eagle_topk"], p["num_draft_tokens"]) == (
        "sglang",
        4,
        5,
        1,
        6,
    )
    assert p["cuda_graph"] is True and p["device"] == "cuda" and "GLM-5.2-FP8" in p["model_path"]
    assert sorted({c.params["context_len"] for c in gpu.cells}) == [80000, 500000]
    h200 = matrix.load("h200_mini")
    assert {c.params["arm"] for c in h200.cells} == {"off", "bug", "fix"}
    assert {c.params["cuda_graph"] for c in h200.cells} == {True, False}
    assert {c.params["preset"] for c in h200.cells} == {"dsv32"}


def test_unknown_matrix_name_lists_the_shipped_ones() -> None:
    with pytest.raises(KitError, match="shipped matrices: .*demo"):
        matrix.load("nope")


def test_the_pr_sweep_validates_against_a_dsa_model_config(tmp_path: Path) -> None:
    """data/matrices/gpu_pr29654.yaml is checked cell by cell by the sglang backend (no GPU needed):
    with a local GLM-5-like config standing in for the weights, every cell validates."""
    import yaml
    from sglang_run_helpers import GLM52_CONFIG, make_model

    from kit.pipeline.plan import check_notebook_accepts

    spec = yaml.safe_load((REPO / "data" / "matrices" / "gpu_pr29654.yaml").read_text())
    spec["params"]["model_path"] = str(make_model(tmp_path, GLM52_CONFIG))
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(spec))
    m = matrix.load(path)
    assert len(m.cells) == 4
    matrix.check_cells(m)
    check_notebook_accepts(m)


MODES = """\
batch: m
axes:
  arm: [bug, fix]
  context_len: [2048, 4096]
params:
  num_requests: 1
builds:
  bug: {pythonpath: [/opt/sgl/sglang-0.5.14, /opt/sgl/deps]}
  fix: {python: /opt/fix/bin/python}
modes:
  short:
    description: "one context"
    axes: {context_len: [2048]}
    params: {max_new_tokens: 8}
  empty:
"""


def test_modes_overlay_the_base_and_name_their_batch(tmp_path: Path) -> None:
    path = _write(tmp_path, MODES)
    base = matrix.load(path)
    assert base.batch == "m" and len(base.cells) == 4
    assert base.modes == ("short", "empty") and base.mode is None
    short = matrix.load(path, "short")
    assert short.batch == "m-short" and short.description == "one context" and short.mode == "short"
    assert [c.run_id for c in short.cells] == [
        "mini-bug-ctx2048-s5-eager-cpu",
        "mini-fix-ctx2048-s5-eager-cpu",
    ]
    assert short.cells[0].params["num_requests"] == 1 and short.cells[0].params["max_new_tokens"] == 8
    assert [c.run_id for c in matrix.load(path, "empty").cells] == [c.run_id for c in base.cells]
    assert short.record().startswith("# kit batch m.yaml --mode short\n") and "modes:" in short.record()
    assert base.record() == MODES


def test_builds_go_to_their_arms_cells(tmp_path: Path) -> None:
    m = matrix.load(_write(tmp_path, MODES))
    bug, fix = m.cells[0], m.cells[2]
    assert bug.build == matrix.Build(("/opt/sgl/sglang-0.5.14", "/opt/sgl/deps"))
    assert fix.build == matrix.Build((), "/opt/fix/bin/python")
    assert bug.build.env({"PYTHONPATH": "/kit"}) == {
        "PYTHONPATH": "/opt/sgl/sglang-0.5.14:/opt/sgl/deps:/kit"
    }
    assert bug.build.env({}) == {"PYTHONPATH": "/opt/sgl/sglang-0.5.14:/opt/sgl/deps"}
    assert fix.build.env({"PYTHONPATH": "/kit"}) == {}
    assert bug.build.problems() == [
        "pythonpath folder /opt/sgl/sglang-0.5.14 not found",
        "pythonpath folder /opt/sgl/deps not found",
    ]
    assert fix.build.problems() == ["python /opt/fix/bin/python not found or not executable"]
    assert "build" not in bug.params  # the notebook gets parameters only


def test_set_overrides_params_and_is_recorded(tmp_path: Path) -> None:
    path = _write(tmp_path, MODES)
    m = matrix.load(path, "short", matrix.parse_overrides(["num_requests=4", "seed=7"]))
    assert {c.params["num_requests"] for c in m.cells} == {4} and m.cells[0].params["seed"] == 7
    assert m.record().startswith("# kit batch m.yaml --mode short --set num_requests=4 --set seed=7\n")


def test_set_narrows_an_axis_to_some_of_its_values(tmp_path: Path) -> None:
    """`--set context_len=4096` runs the matrix's 4k cells only (the README's cpu_task at one context);
    every mode is still validated, with the params --set alone (a mode need not hold the narrowed value)."""
    path = _write(tmp_path, MODES)
    m = matrix.load(path, None, matrix.parse_overrides(["context_len=4096", "num_requests=2"]))
    assert [c.run_id for c in m.cells] == ["mini-bug-ctx4096-s5-eager-cpu", "mini-fix-ctx4096-s5-eager-cpu"]
    assert {c.params["num_requests"] for c in m.cells} == {2}
    assert m.record().startswith("# kit batch m.yaml --set context_len=4096 --set num_requests=2\n")
    both = matrix.load(path, None, matrix.parse_overrides(["arm=[fix]", "context_len=[2048, 4096]"]))
    assert [c.params["arm"] for c in both.cells] == ["fix", "fix"]


@pytest.mark.parametrize(
    "text,mode,sets,needles",
    [
        (MODES, "long", [], ["--mode long", "no such mode", "short, empty"]),
        (BASE + "modes: {x: {axes: {arm: [sideways]}}}\n", None, [], ["modes.x.axes.arm", "'sideways'"]),
        (BASE + "modes: {x: {axes: {contxt_len: [1]}}}\n", None, [], ["'contxt_len'", "under modes.x.axes"]),
        (
            BASE + "modes: {x: {params: {max_new_tokns: 1}}}\n",
            None,
            [],
            ["'max_new_tokns'", "modes.x.params"],
        ),
        (
            BASE + "modes: {x: {axs: {arm: [fix]}}}\n",
            None,
            [],
            ["'axs'", "under modes.x", "did you mean 'axes'"],
        ),
        (BASE + "modes: {'a b': {}}\n", None, [], ["modes.a b", "valid mode name"]),
        (BASE + "modes: [x]\n", None, [], ["modes", "mapping"]),
        (BASE, None, ["num_requests=two"], ["--set.num_requests", "integer"]),
        (BASE, None, ["contxt_len=1"], ["'contxt_len'", "under --set"]),
        (
            BASE,
            None,
            ["context_len=1"],
            ["--set.context_len", "not a value of the matrix's context_len axis"],
        ),
        (BASE, None, ["context_len=[]"], ["--set.context_len", "empty list"]),
        (BASE, None, ["arm=sideways"], ["--set.arm", "'sideways'"]),
        (BASE, None, ["num_requests"], ["--set 'num_requests'", "KEY=VALUE"]),
        (BASE + "builds: {sideways: {python: x}}\n", None, [], ["builds.sideways", "not an arm"]),
        (
            BASE + "builds: {fix: {pythonpth: [x]}}\n",
            None,
            [],
            ["'pythonpth'", "builds.fix", "did you mean 'pythonpath'"],
        ),
        (
            BASE + "builds: {fix: {pythonpath: [1]}}\n",
            None,
            [],
            ["builds.fix.pythonpath", "list of non-empty strings"],
        ),
        (BASE + "builds: {fix: {}}\n", None, [], ["builds.fix", "pythonpath and/or python"]),
        (BASE + "builds: {fix: {python: ''}}\n", None, [], ["builds.fix.python", "non-empty string"]),
        (
            BASE + "modes: {x: {builds: {sideways: {python: x}}}}\n",
            "x",
            [],
            ["modes.x.builds.sideways", "not an arm"],
        ),
        (
            "axes: {arm: [fix], context_len: [4096]}\nparams: {extra_args: [--x]}\n",
            None,
            [],
            ["params.extra_args", "sglang only"],
        ),
    ],
)
def test_bad_modes_builds_and_sets_are_one_line_naming_the_key(
    tmp_path: Path, text: str, mode: str | None, sets: list[str], needles: list[str]
) -> None:
    from kit.errors import UsageError

    with pytest.raises(UsageError) as exc:
        matrix.load(_write(tmp_path, text), mode, matrix.parse_overrides(sets))
    msg = str(exc.value)
    assert len(msg.splitlines()) == 1 and exc.value.param, msg
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_matrix_errors_are_typed(tmp_path: Path) -> None:
    from kit.errors import InputError, UsageError

    with pytest.raises(UsageError) as exc:
        matrix.load(_write(tmp_path, "axes: {arm: [fix], context_len: [0]}\n"))
    assert exc.value.param == "axes.context_len"
    with pytest.raises(InputError):
        matrix.load(_write(tmp_path, "axes: {arm: [fix]\n"))
    with pytest.raises(InputError):
        matrix.load("nope")


def test_shipped_modes_are_what_the_h200_scripts_ran() -> None:
    """scripts/h200_evidence.sh and scripts/h200_sglang.sh run these modes; each is one batch."""
    sizes = {
        "fixtures": 4,
        "graph": 15,
        "eager": 15,
        "batch4": 4,
        "glm5": 4,
        "kernels-base": 4,
        "kernels-b4": 4,
        "kernels-ragged": 4,
        "kernels-s3": 4,
        "kernels-glm5": 4,
        "kernels-control": 4,
    }
    for mode, n in sizes.items():
        m = matrix.load("h200_mini", mode)
        assert m.batch == f"h200_mini-{mode}" and len(m.cells) == n, mode
        p = m.cells[0].params
        assert p["device"] == "cuda" and p["max_new_tokens"] == (16 if mode == "fixtures" else 48)
        assert p["indexer_impl"] == (
            "sglang" if mode.startswith("kernels-") and mode != "kernels-control" else "torch"
        )
    assert {c.params["num_requests"] for c in matrix.load("h200_mini", "batch4").cells} == {4}
    assert matrix.load("h200_mini", "kernels-ragged").cells[0].params["indexer_path"] == "ragged"
    kernels = matrix.load("h200_mini", "kernels-base").cells
    assert [c.params["context_len"] for c in kernels][:2] == [524288, 131072]
    sizes = {"graph": 6, "graph-4k": 2, "eager": 2, "steps3": 2, "noise": 1}
    for mode, n in sizes.items():
        m = matrix.load("h200_sglang", mode)
        assert m.batch == f"h200_sglang-{mode}" and len(m.cells) == n, mode
        p = m.cells[0].params
        shape = (p["backend"], p["num_requests"], p["max_new_tokens"], p["profile_skip"], p["profile_steps"])
        assert shape == ("sglang", 4, 96, 2, 10)
        assert "--kv-cache-dtype=fp8_e4m3" in p["extra_args"] and p["model_path"] == "/tmp/kit-ckpt"
    steps3 = matrix.load("h200_sglang", "steps3").cells[0].params
    assert (steps3["num_steps"], steps3["num_draft_tokens"], steps3["context_len"]) == (3, 4, 16384)
    m = matrix.load("h200_sglang", "noise")
    assert [c.run_id for c in m.cells] == ["sglang-bug-ctx4096-s5-graph-cuda"]
    assert m.cells[0].build.pythonpath[0] == "/tmp/kit-sgl/sglang-0.5.14"
    fix = matrix.load("h200_sglang", "eager").cells[1]
    assert fix.build.pythonpath[0] == "/tmp/kit-sgl/sglang-0.5.14+pr29654"


def test_a_mode_may_run_an_arm_on_another_build() -> None:
    """The grid's `latest` mode: the upstream arm on sglang 0.5.17's folders, the other arms as the base
    has them, in a batch of its own (the base grid's 0.5.16 cells keep theirs)."""
    m = matrix.load("h200_pr29654", "latest")
    assert m.batch == "h200_pr29654-latest" and len(m.cells) == 6
    builds = {c.params["arm"]: c.build.pythonpath[0] for c in m.cells}
    assert builds == {
        "bug": "/tmp/kit-sgl/sglang-0.5.14",
        "fix": "/tmp/kit-sgl/sglang-0.5.14+pr29654",
        "upstream": "/tmp/kit-sgl17/sglang-0.5.17",
    }
    assert matrix.load("h200_pr29654").cells[-1].build.pythonpath[0].startswith("/tmp/kit-sgl")
    base_up = [c for c in matrix.load("h200_pr29654").cells if c.params["arm"] == "upstream"]
    assert base_up[0].build.pythonpath[0] == "/tmp/kit-sgl16/sglang-0.5.16"


def test_the_h200_sglang_matrix_validates_against_a_dsa_model_config(tmp_path: Path) -> None:
    """Every mode's cells pass the sglang backend's own checks (no GPU needed) with a local DSA config in
    place of the generated checkpoint (--set model_path=...), and 01_profile takes every key."""
    from sglang_run_helpers import DSV32_CONFIG, make_model

    from kit.pipeline.plan import check_notebook_accepts

    model = make_model(tmp_path, DSV32_CONFIG)
    for mode in ("graph", "graph-4k", "eager", "steps3", "noise"):
        m = matrix.load("h200_sglang", mode, {"model_path": str(model)})
        matrix.check_cells(m)
        check_notebook_accepts(m)


def test_an_axis_left_out_takes_the_default_of_each_cells_backend() -> None:
    """One default per parameter, in the backend's model: an sglang matrix without cuda_graph or device
    runs sglang's (CUDA graphs, cuda), a mini one the mini's (eager, cpu); the base's num_steps for both."""
    from kit.backends.sglang.params import SglangParams

    sg = matrix.parse({"axes": {"backend": ["sglang"], "arm": ["fix"], "context_len": [4096]}}, "m")
    (cell,) = sg.cells
    defaults = SglangParams.defaults()
    assert (cell.params["cuda_graph"], cell.params["device"]) == (True, "cuda")
    assert (defaults["cuda_graph"], defaults["device"]) == (True, "cuda")
    assert cell.run_id == "sglang-fix-ctx4096-s5-graph-cuda"
    (mini,) = matrix.parse({"axes": {"arm": ["fix"], "context_len": [4096]}}, "m").cells
    assert mini.run_id == "mini-fix-ctx4096-s5-eager-cpu"
