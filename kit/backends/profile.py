"""The profile stage for every backend: one run of the workload into a new run directory.

Backends are a registry: a name, the function that checks its parameters (nothing created) and the one
that runs it. A new backend is one entry; its modules are imported only when it is used (the sglang one
must not pull in torch, the mini one must not need sglang's environment).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kit import rundir
from kit.errors import UsageError

if TYPE_CHECKING:
    import pandas as pd

    from kit.params import RunParams, Spec

OUTPUT_COLUMNS = ("run", "prompt_id", "input_len", "completion_tokens", "spec_verify_ct", "accept_length")


@dataclass(frozen=True)
class Backend:
    """`module:name` of a backend's parameter model and its two entry points.

    model: its kit.params.RunParams subclass;
    validate(params) -> the model, defaults filled (refuses bad ones, creates nothing);
    run(params, runs_root, batch, run_id, **options) -> the new run directory.
    """

    model: str
    validate: str
    run: str

    def load(self, which: str) -> Callable[..., Any]:
        module, _, name = getattr(self, which).partition(":")
        return getattr(importlib.import_module(module), name)


BACKENDS: dict[str, Backend] = {
    "mini": Backend(
        model="kit.backends.mini.params:MiniParams",
        validate="kit.backends.mini.params:validate",
        run="kit.backends.mini.run:run",
    ),
    "sglang": Backend(
        model="kit.backends.sglang.params:SglangParams",
        validate="kit.backends.sglang.params:validate",
        run="kit.backends.sglang.launch:run_arm",
    ),
}


def params_model(name: str) -> type[RunParams]:
    """The parameter model of backend `name` (kit.params)."""
    if name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r}: use {' or '.join(map(repr, BACKENDS))}", param="backend")
    return BACKENDS[name].load("model")


def models() -> dict[str, type[RunParams]]:
    """Every backend's parameter model, by name."""
    return {name: params_model(name) for name in BACKENDS}


def param_specs() -> dict[str, Spec]:
    """Every run parameter of every backend's model and its Spec (kit.params), the shared ones first."""
    from kit.params import RunParams

    out: dict[str, Spec] = dict(RunParams.specs())
    for model in models().values():
        out.update({k: v for k, v in model.specs().items() if k not in out})
    return out


def load_params(data: Mapping[str, Any]) -> RunParams:
    """A params.json object as its backend's model (the base's backend where it names none), unchecked:
    see RunParams.from_json. Readers of old runs that want keys as written keep RunDir.read_params()."""
    from kit.params import RunParams

    name = data.get("backend", RunParams.defaults()["backend"])
    try:
        cls = params_model(name)
    except UsageError:
        raise UsageError(
            f"params.json names backend {name!r}, which the kit does not have", param="backend"
        ) from None
    return cls.from_json(data)


def _backend(params: dict[str, Any]) -> tuple[Backend, dict[str, Any]]:
    """The backend params name (mini when unset), and params with that name filled in."""
    from kit.params import RunParams

    name = params.get("backend", RunParams.defaults()["backend"])
    params_model(name)  # refuses an unknown one
    return BACKENDS[name], {**params, "backend": name}


def validate(params: dict[str, Any]) -> RunParams:
    backend, params = _backend(params)
    return backend.load("validate")(params)


def run_profile(
    params: dict[str, Any],
    runs_root: Path | str = "runs",
    batch: str = "default",
    run_id: str | None = None,
    **options: Any,
) -> Path:
    """Run one arm on its backend (which validates first: nothing is created for bad input). `options` go
    to the backend's run (mini: timeout_s)."""
    backend, params = _backend(params)
    return backend.load("run")(params, Path(runs_root), batch, run_id, **options)


def cell_dirs(run_dir: Path, cell_ids: list[str] | None) -> list[Path]:
    """The run directories a profile stage made: its own, or (a shared server) those of its cells that
    started; a deadline that passed before a cell leaves it out."""
    if not cell_ids:
        return [run_dir]
    return [run_dir.parent / c for c in cell_ids if (run_dir.parent / c).is_dir()]


def outputs_table(dirs: list[Path]) -> pd.DataFrame:
    """One row per request of every run directory that has outputs; the same columns when none has (no
    cell started before the deadline), so the notebook shows an empty table instead of failing."""
    import pandas as pd

    ran = [d for d in dirs if rundir.RunDir(d).outputs.is_file()]
    rows = [{"run": d.name, **r} for d in ran for r in rundir.read_outputs(d)]
    return pd.DataFrame(rows, columns=list(OUTPUT_COLUMNS))
