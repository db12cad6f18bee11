"""The typed run parameters (kit/params.py and each backend's model): one default per parameter, old
params.json files load, and every place that shows a default (the CLI, the matrix, the notebook's
`parameters` cell) agrees with the models."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kit import params as kp
from kit.backends.mini.params import MiniParams
from kit.backends.profile import load_params
from kit.backends.sglang.params import SglangParams
from kit.paths import REPO

COMMITTED = sorted(
    [*REPO.glob("data/results/**/params.json"), *REPO.glob("tests/fixtures/**/params.json")],
    key=lambda p: str(p),
)


def test_there_are_committed_params_of_both_backends() -> None:
    backends = {json.loads(p.read_text()).get("backend") for p in COMMITTED}
    assert {"mini", "sglang"} <= backends and len(COMMITTED) > 100


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_committed_params_json_loads_and_writes_back_what_it_holds(path: Path) -> None:
    """Every key as written; a key an older kit did not write yet comes back as today's default."""
    data = json.loads(path.read_text())
    model = load_params(data)
    assert type(model) is {"mini": MiniParams, "sglang": SglangParams}[data["backend"]]
    out = model.to_json()
    assert {k: out[k] for k in data} == data
    defaults = type(model).defaults()
    assert {k: out[k] for k in set(out) - set(data)} == {k: defaults[k] for k in set(out) - set(data)}
    assert model.arm == data["arm"] and model.num_steps == data["num_steps"]


def test_an_old_params_json_with_missing_keys_takes_the_defaults() -> None:
    """Runs written before a parameter existed: what they ran is the default of today."""
    old_mini = load_params({"backend": "mini", "arm": "bug", "context_len": 2048, "num_steps": 5})
    assert old_mini.profiler == "nsys" and old_mini.model == "random" and old_mini.indexer_impl == "auto"
    assert old_mini.static_batch is False and old_mini.workload is None and old_mini.under_nsys
    old = {"backend": "sglang", "arm": "fix", "context_len": 4096, "num_steps": 5, "profile": True}
    sg = load_params(old)
    assert sg.profiler == "nsys" and sg.workload == "records" and sg.concurrency == 1
    assert sg.target_topk is None and sg.classifier_only is False and sg.time_decode is False
    assert sg.under_nsys and not load_params({**old, "profile": False}).under_nsys
    assert "profiler" in sg.to_json() and "device" not in sg.to_json()  # sglang's runs never recorded one
    assert load_params({"arm": "bug"}).backend == "mini"  # the earliest runs named no backend


def test_keys_no_model_declares_are_kept() -> None:
    cell = {
        "backend": "sglang",
        "arm": "bug",
        "server_dir": "../s",
        "cell_index": 1,
        "profile_window_ordinal": 2,
    }
    model = load_params(cell)
    assert model.extras == {"server_dir": "../s", "cell_index": 1, "profile_window_ordinal": 2}
    assert {k: model.to_json()[k] for k in cell} == cell


def test_an_unknown_backend_is_refused_in_one_line() -> None:
    from kit.errors import UsageError

    with pytest.raises(UsageError, match="backend 'tpu'") as info:
        load_params({"backend": "tpu"})
    assert info.value.param == "backend"


def test_a_shared_parameter_has_one_default_and_a_backend_says_why_it_differs() -> None:
    base = kp.RunParams.defaults()
    for model in (MiniParams, SglangParams):
        for name, spec in kp.RunParams.specs().items():
            own = model.spec(name)
            if model.defaults()[name] != base[name]:
                assert own.why, f"{model.__name__}.{name}: its own default needs its reason"
            else:
                assert not own.why, f"{model.__name__}.{name}: a reason for a default that is the base's"
            assert own.help == spec.help and own.matrix == spec.matrix
    assert MiniParams.defaults() | SglangParams.defaults()  # both build
    assert {n for n in kp.RunParams.specs() if SglangParams.spec(n).why} == {
        "backend",
        "context_len",
        "num_requests",
        "max_new_tokens",
        "cuda_graph",
        "device",
        "workload",
    }
    assert not any(MiniParams.spec(n).why for n in kp.RunParams.specs())


def test_derived_properties() -> None:
    sg = SglangParams(context_len=[4096, 8192], workload=["records", "answered"])
    assert [c.tag for c in sg.cells] == [
        "ctx4096-records",
        "ctx4096-answered",
        "ctx8192-records",
        "ctx8192-answered",
    ]
    one = sg.for_cell(sg.cells[1])
    assert (one.context_len, one.workload) == (4096, "answered") and sg.context_len == [4096, 8192]
    assert sg.under_nsys and not sg.replace(profiler="torch").under_nsys
    assert not sg.replace(profile=False).under_nsys
    assert MiniParams().under_nsys and not MiniParams(profiler="torch").under_nsys


# -- the places that show a default agree with the models ------------------------------------------------


def _actions(subcommand: str) -> dict[str, object]:
    from kit.cli.parsers import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "cmd")
    return {a.dest: a for a in sub.choices[subcommand]._actions}  # type: ignore[attr-defined]


def test_the_cli_options_are_the_models_parameters() -> None:
    """`kit run` has an option for every parameter whose model gives it one (default None: the backend's
    own), `kit plan` the shared and sglang ones; each option's help names each backend's default."""
    from kit.backends.profile import param_specs

    run, plan = _actions("run"), _actions("plan")
    with_option = {n: s for n, s in param_specs().items() if s.option(n)}
    assert set(with_option) <= set(run)
    assert {n for n, s in with_option.items() if s.group in ("shared", "sglang")} <= set(plan)
    for name, spec in with_option.items():
        action = run[name]
        assert action.default is None and spec.option(name) in action.option_strings, name  # type: ignore[attr-defined]
    assert "(mini 1, sglang 4)" in run["num_requests"].help  # type: ignore[attr-defined]
    assert "(mini 32, sglang 256)" in run["max_new_tokens"].help  # type: ignore[attr-defined]
    assert "(mini False, sglang True)" in run["cuda_graph"].help  # type: ignore[attr-defined]
    assert "(default 5)" in run["num_steps"].help  # type: ignore[attr-defined]


def test_an_option_of_the_other_backend_is_refused_not_ignored(capsys: pytest.CaptureFixture[str]) -> None:
    from kit.cli import main

    assert main(["run", "--arm", "bug", "--tp-size", "2"]) == 2
    assert "--tp-size is an sglang-backend option (--backend sglang)" in capsys.readouterr().err
    assert main(["run", "--backend", "sglang", "--arm", "bug", "--preset", "tiny"]) == 2
    assert "--preset is a mini-backend option (--backend mini)" in capsys.readouterr().err


def test_the_matrix_axes_params_and_checks_are_the_models() -> None:
    from kit.backends.profile import models, param_specs
    from kit.pipeline import matrix

    specs = param_specs()
    assert matrix.AXES == {n: s.check for n, s in specs.items() if s.matrix == "axis"}
    assert matrix.PARAMS == {n: s.check for n, s in specs.items() if s.matrix == "param"}
    for name, backend in matrix.BACKEND_ONLY.items():
        assert [b for b, m in models().items() if name in m.specs() and m.spec(name).matrix] == [backend]
    for backend, model in models().items():
        axes = {"backend": [backend], "arm": ["fix"], "context_len": [4096]}
        (cell,) = matrix.parse({"axes": axes}, "m").cells
        left_out = set(matrix.AXES) - set(axes) - set(matrix.OPTIONAL_AXES)
        assert {k: cell.params[k] for k in left_out} == {k: model.defaults()[k] for k in left_out}


def test_the_notebooks_parameters_cell_is_written_from_the_models() -> None:
    """The literal cell papermill and JupyterLab show: a parameter with one default shows it, one whose
    default is the backend's shows None and names each backend's default; a drifted cell is stale."""
    from kit.backends.profile import models
    from kit.pipeline import notebooks

    src = notebooks.source("01_profile").read_text()
    assert notebooks.profile_cell() in src and notebooks.stale("01_profile") == []
    shown = notebooks.defaults("01_profile")  # what papermill reads from the shipped .ipynb
    assert list(shown) == notebooks.declared("01_profile")
    cell = notebooks.profile_parameters()
    for name, (value, comment) in cell.items():
        assert shown[name] == value, name
        per_backend = {b: m.defaults()[name] for b, m in models().items() if name in m.specs()}
        if value is None and name not in notebooks.PROFILE_OPTIONS:
            for b, default in per_backend.items():
                if default not in (None, [], {}) and models()[b].spec(name).matrix:
                    assert str(default) in comment, (name, b)
        elif name not in notebooks.PROFILE_OPTIONS and name != "backend":
            assert set(map(repr, per_backend.values())) == {repr(value)}, name
    drifted = src.replace("num_steps = 5\n", "num_steps = 4\n")
    assert notebooks._with_cell(drifted, notebooks.profile_cell()) == src


def test_the_notebooks_names_check_uses_the_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """papermill's -p check (check_parameters) and kit batch's matrix check take what the models declare."""
    from kit.errors import UsageError
    from kit.pipeline import notebooks

    history = ["", "cell", "# Parameters\nnode_rank = 2\n", 'check_parameters("01_profile", In)']
    with pytest.raises(UsageError, match="unknown key 'node_rank'"):
        notebooks.check_parameters("01_profile", history)
    from kit.backends import profile

    specs = profile.param_specs()
    node_rank = dataclasses.replace(specs["node_rank"], matrix="param")
    monkeypatch.setattr(profile, "param_specs", lambda: {**specs, "node_rank": node_rank})
    notebooks.check_parameters("01_profile", history)  # a parameter the models give a notebook name
