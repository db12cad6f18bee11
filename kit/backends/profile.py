"""The profile stage for every backend: one run of the workload into a new run directory.

Backends are a registry: a name, the function that checks its parameters (nothing created) and the one
that runs it. A new backend is one entry; its modules are imported only when it is used (the sglang one
must not pull in torch, the mini one must not need sglang's environment).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit.errors import UsageError


@dataclass(frozen=True)
class Backend:
    """`module:function` names of a backend's two entry points.

    validate(params) -> params with defaults filled (refuses bad ones, creates nothing);
    run(params, runs_root, batch, run_id, **options) -> the new run directory.
    """

    validate: str
    run: str

    def load(self, which: str) -> Callable[..., Any]:
        module, _, name = getattr(self, which).partition(":")
        return getattr(importlib.import_module(module), name)


BACKENDS: dict[str, Backend] = {
    "mini": Backend(validate="kit.backends.mini.params:validate", run="kit.backends.mini.run:run"),
    "sglang": Backend(
        validate="kit.backends.sglang.params:validate", run="kit.backends.sglang.launch:run_arm"
    ),
}


def _backend(params: dict[str, Any]) -> tuple[Backend, dict[str, Any]]:
    """The backend params name (mini when unset), and params with that name filled in."""
    name = params.get("backend", "mini")
    if name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r}: use {' or '.join(map(repr, BACKENDS))}", param="backend")
    return BACKENDS[name], {**params, "backend": name}


def validate(params: dict[str, Any]) -> dict[str, Any]:
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
