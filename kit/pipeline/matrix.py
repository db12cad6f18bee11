"""A batch matrix (YAML): axes whose product is the set of runs, plus fixed parameters shared by all of them.

Everything a user can get wrong in the file is caught here, as one line that names the key, before any
run starts: a typo found after an hour of GPU time is an hour lost.
"""

from __future__ import annotations

import difflib
import itertools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kit.arms import ARMS
from kit.errors import KitError
from kit.paths import MATRICES

MATRIX_DIR = MATRICES
TOP_KEYS = ("batch", "description", "axes", "params")
_NAME_OK = re.compile(r"^[A-Za-z0-9._-]+$")

Check = Callable[[str, Any], Any]  # (dotted key, value) -> value, or raises KitError


class _Loader(yaml.SafeLoader):
    """YAML 1.2 booleans: only true/false. YAML 1.1 reads `arm: off` (and on/yes/no) as a bool."""


_Loader.yaml_implicit_resolvers = {
    first: [r for r in resolvers if r[0] != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _type_name(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _int(minimum: int) -> Check:
    def check(key: str, value: Any) -> int:
        # bool is an int in Python, and YAML turns `yes` into True: neither is a count.
        if isinstance(value, bool) or not isinstance(value, int):
            raise KitError(f"{key}: expected an integer, got {_type_name(value)}")
        if value < minimum:
            raise KitError(f"{key}: must be >= {minimum}, got {value}")
        return value

    return check


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise KitError(f"{key}: expected true or false, got {_type_name(value)}")
    return value


def _str(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise KitError(f"{key}: expected a non-empty string, got {_type_name(value)}")
    return value


def _choice(*allowed: str) -> Check:
    def check(key: str, value: Any) -> str:
        if value not in allowed:
            raise KitError(f"{key}: unknown value {value!r}; allowed: {', '.join(allowed)}")
        return value

    return check


# The axes whose product makes the cells, in run-id order; a missing axis takes its default.
AXES: dict[str, Check] = {
    "backend": _choice("mini", "sglang"),
    "arm": _choice(*ARMS),
    "context_len": _int(1),
    "num_steps": _int(2),
    "cuda_graph": _bool,
    "device": _choice("cpu", "cuda"),
}
AXIS_DEFAULTS: dict[str, Any] = {"backend": "mini", "num_steps": 5, "cuda_graph": False, "device": "cpu"}
REQUIRED_AXES = ("arm", "context_len")

# Fixed parameters, shared by every cell; some only make sense for one backend.
PARAMS: dict[str, Check] = {
    "num_requests": _int(1),
    "max_new_tokens": _int(1),
    "seed": _int(0),
    "preset": _str,
    "index_topk": _int(1),
    "eagle_topk": _int(1),
    "num_draft_tokens": _int(2),
    "model_path": _str,
    "tp_size": _int(1),
}
BACKEND_ONLY: dict[str, str] = {
    "model_path": "sglang",
    "tp_size": "sglang",
    "preset": "mini",
    "index_topk": "mini",
}


@dataclass(frozen=True)
class Cell:
    """One run of the batch: the parameters handed to notebooks/01_profile and the run directory name."""

    run_id: str
    params: dict[str, Any] = field(hash=False)

    @property
    def group(self) -> str:
        """Cells that differ only by arm share a group: the unit that 03_compare compares."""
        return group_id(self.params)


@dataclass(frozen=True)
class Matrix:
    path: Path
    batch: str
    axes: dict[str, list[Any]]
    params: dict[str, Any]
    cells: list[Cell]
    description: str = ""


def run_id(params: dict[str, Any]) -> str:
    """Readable and stable: the same cell gets the same id on every run, so --resume can find it."""
    return (
        f"{params['backend']}-{params['arm']}-ctx{params['context_len']}-s{params['num_steps']}"
        f"-{'graph' if params['cuda_graph'] else 'eager'}-{params['device']}"
    )


def group_id(params: dict[str, Any]) -> str:
    return (
        f"{params['backend']}-ctx{params['context_len']}-s{params['num_steps']}"
        f"-{'graph' if params['cuda_graph'] else 'eager'}-{params['device']}"
    )


def _unknown(key: str, where: str, allowed: Iterable[str]) -> KitError:
    allowed = list(allowed)
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return KitError(f"unknown key {key!r} {where}{hint}; allowed: {', '.join(allowed)}")


def _axis_values(name: str, raw: Any) -> list[Any]:
    values = raw if isinstance(raw, list) else [raw]
    if not values:
        raise KitError(f"axes.{name} is an empty list: give at least one value")
    checked = [AXES[name](f"axes.{name}", v) for v in values]
    for v in checked:
        if checked.count(v) > 1:
            raise KitError(f"axes.{name} lists {v!r} more than once")
    return checked


def parse(doc: Any, path: Path | str = "<matrix>") -> Matrix:
    """Validate a loaded YAML document and expand it into cells."""
    path = Path(path)
    if doc is None or doc == {}:
        raise KitError("the matrix is empty: it needs at least axes.arm and axes.context_len")
    if not isinstance(doc, dict):
        raise KitError(f"the matrix must be a mapping (batch:, axes:, params:), got {type(doc).__name__}")
    for key in doc:
        if key not in TOP_KEYS:
            raise _unknown(str(key), "at the top level", TOP_KEYS)

    batch = doc.get("batch", path.stem)
    if not isinstance(batch, str) or not _NAME_OK.match(batch):
        raise KitError(f"batch: {batch!r} is not a valid name; use letters, digits, '.', '_' or '-'")
    description = doc.get("description") or ""
    if not isinstance(description, str):
        raise KitError(f"description: expected a string, got {_type_name(description)}")

    raw_axes = doc.get("axes")
    if not raw_axes:
        raise KitError("the matrix is empty: axes: needs at least arm and context_len")
    if not isinstance(raw_axes, dict):
        raise KitError(f"axes: expected a mapping of axis -> list of values, got {_type_name(raw_axes)}")
    for key in raw_axes:
        if key in PARAMS:
            raise KitError(f"axes.{key}: {key!r} is a fixed parameter, not an axis; put it under params:")
        if key not in AXES:
            raise _unknown(str(key), "under axes", AXES)
    for key in REQUIRED_AXES:
        if key not in raw_axes:
            raise KitError(f"axes.{key} is missing: every matrix names its {key} values")
    axes = {name: _axis_values(name, raw_axes.get(name, AXIS_DEFAULTS.get(name))) for name in AXES}
    if "sglang" in axes["backend"] and axes["device"] != ["cuda"]:
        raise KitError(f"axes.device: backend sglang runs on cuda only, got {', '.join(axes['device'])}")

    raw_params = doc.get("params") or {}
    if not isinstance(raw_params, dict):
        raise KitError(f"params: expected a mapping of name -> value, got {_type_name(raw_params)}")
    params: dict[str, Any] = {}
    for key, value in raw_params.items():
        if key in AXES:
            raise KitError(f"params.{key}: {key!r} is an axis; list it under axes:")
        if key not in PARAMS:
            raise _unknown(str(key), "under params", PARAMS)
        params[key] = PARAMS[key](f"params.{key}", value)
        only = BACKEND_ONLY.get(key)
        if only and axes["backend"] != [only]:
            raise KitError(
                f"params.{key} applies to backend {only} only, but axes.backend is "
                f"{', '.join(axes['backend'])}"
            )

    cells = []
    for combo in itertools.product(*axes.values()):
        cell_params = {**dict(zip(axes, combo, strict=True)), **params}
        cells.append(Cell(run_id(cell_params), cell_params))
    return Matrix(path=path, batch=batch, axes=axes, params=params, cells=cells, description=description)


def find(name_or_path: str | Path) -> Path:
    """A path, or the name of a shipped matrix (`demo` -> data/matrices/demo.yaml)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = MATRIX_DIR / f"{path.stem}.yaml"
    if path.parent == Path(".") and shipped.is_file():
        return shipped
    names = ", ".join(sorted(p.stem for p in MATRIX_DIR.glob("*.yaml")))
    raise KitError(f"matrix {name_or_path} not found; shipped matrices: {names}")


def load(name_or_path: str | Path) -> Matrix:
    path = find(name_or_path)
    try:
        doc = yaml.load(path.read_text(), Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise KitError(f"matrix {path} is not valid YAML{where}: {problem}") from None
    try:
        return parse(doc, path)
    except KitError as exc:
        raise KitError(f"matrix {path}: {exc}") from None


def check_cells(matrix: Matrix) -> None:
    """The backend's own validation (value ranges, presets) for every cell, still before anything runs."""
    from kit.backends.profile import validate

    for cell in matrix.cells:
        try:
            validate(dict(cell.params))
        except KitError as exc:
            raise KitError(f"matrix {matrix.path}: cell {cell.run_id}: {exc}") from None
