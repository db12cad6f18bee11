"""Matrix YAML: expansion into cells, stable run ids, and one-line errors that name the key (nothing runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kit.errors import KitError
from kit.pipeline import matrix

REPO = Path(__file__).resolve().parent.parent

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
        "mini-bug-ctx2048-s5-eager-cpu", "mini-bug-ctx4096-s5-eager-cpu",
        "mini-fix-ctx2048-s5-eager-cpu", "mini-fix-ctx4096-s5-eager-cpu",
    ]
    assert m.cells[0].params == {"backend": "mini", "arm": "bug", "context_len": 2048, "num_steps": 5,
                                 "cuda_graph": False, "device": "cpu", "num_requests": 1}
    assert m.cells[0].group == m.cells[2].group == "mini-ctx2048-s5-eager-cpu"


def test_every_axis_multiplies_and_ids_stay_unique(tmp_path: Path) -> None:
    text = ("axes:\n  arm: [off, bug, fix]\n  context_len: [8192, 32768]\n  num_steps: [3, 5]\n"
            "  cuda_graph: [true, false]\n  device: cuda\n")
    m = matrix.load(_write(tmp_path, text, "sweep.yaml"))
    assert len(m.cells) == 3 * 2 * 2 * 2
    assert len({c.run_id for c in m.cells}) == len(m.cells)
    assert m.batch == "sweep"  # no batch: the file's name
    assert "mini-off-ctx8192-s3-graph-cuda" in {c.run_id for c in m.cells}


def test_yaml_off_is_an_arm_not_false(tmp_path: Path) -> None:
    """YAML 1.1 reads `off` as False; the matrix loader keeps only true/false as booleans."""
    m = matrix.load(_write(tmp_path, "axes:\n  arm: [off]\n  context_len: [2048]\n  cuda_graph: [false]\n"))
    assert m.cells[0].params["arm"] == "off" and m.cells[0].params["cuda_graph"] is False


@pytest.mark.parametrize("text,needles", [
    ("", ["empty"]),
    ("batch: x\n", ["empty", "axes"]),
    ("axes: {arm: [fix]}\n", ["axes.context_len", "missing"]),
    ("axes: {arm: [fix], context_len: ['4k']}\n", ["axes.context_len", "integer", "'4k'"]),
    ("axes: {arm: [fix], context_len: [4096.5]}\n", ["axes.context_len", "integer"]),
    ("axes: {arm: [fix], context_len: [true]}\n", ["axes.context_len", "integer"]),
    ("axes: {arm: [fix], context_len: [0]}\n", ["axes.context_len", ">= 1"]),
    ("axes: {arm: [sideways], context_len: [4096]}\n", ["axes.arm", "'sideways'", "off, bug, fix, upstream"]),
    ("axes: {arm: [fix], context_len: [4096], device: [tpu]}\n", ["axes.device", "cpu, cuda"]),
    ("axes: {arm: [fix], context_len: [4096], cuda_graph: [yes]}\n", ["axes.cuda_graph", "true or false"]),
    ("axes: {arm: [fix], contxt_len: [4096]}\n", ["'contxt_len'", "did you mean 'context_len'", "allowed:"]),
    ("axes: {arm: [fix], context_len: []}\n", ["axes.context_len", "empty"]),
    ("axes: {arm: [fix, fix], context_len: [4096]}\n", ["axes.arm", "more than once"]),
    ("axes: {arm: [fix], context_len: [4096], num_requests: [1]}\n", ["axes.num_requests", "under params"]),
    ("axes: {arm: [fix], context_len: [4096]}\nparams: {context_len: 1}\n", ["params.context_len", "axis"]),
    ("axes: {arm: [fix], context_len: [4096]}\nparams: {max_new_tokns: 8}\n",
     ["'max_new_tokns'", "params", "max_new_tokens"]),
    ("axes: {arm: [fix], context_len: [4096]}\nparams: {num_requests: two}\n",
     ["params.num_requests", "integer"]),
    ("axes: {arm: [fix], context_len: [4096]}\nparams: {model_path: /m}\n",
     ["params.model_path", "sglang only"]),
    ("axes: {backend: [sglang], arm: [fix], context_len: [80000], device: [cuda]}\nparams: {preset: tiny}\n",
     ["params.preset", "mini only"]),
    ("axes: {backend: [sglang], arm: [fix], context_len: [4096]}\n", ["axes.device", "cuda only"]),
    ("axis: {arm: [fix], context_len: [4096]}\n", ["'axis'", "top level", "did you mean 'axes'"]),
    ("batch: 'my batch'\naxes: {arm: [fix], context_len: [4096]}\n", ["batch", "valid name"]),
    ("- arm\n- fix\n", ["mapping"]),
    ("axes: {arm: [fix], context_len: [4096]\n", ["not valid YAML", "line"]),
])
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
        (4096, 5, "cpu")}
    gpu = matrix.load("gpu_pr29654")
    p = gpu.cells[0].params
    assert (p["backend"], p["tp_size"], p["num_steps"], p["eagle_topk"], p["num_draft_tokens"]) == (
        "sglang", 4, 5, 1, 6)
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
