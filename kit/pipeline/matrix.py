"""A batch matrix (YAML): axes whose product is the set of runs, plus fixed parameters shared by all of them.

Optionally, per arm, the sglang build its cells run with (`builds:`), and named grids over the same base
(`modes:`, one batch each, picked with `kit batch MATRIX --mode NAME`). Everything a user can get wrong in
the file is caught here, as one line that names the key, before any run starts: a typo found after an hour
of GPU time is an hour lost.
"""

from __future__ import annotations

import difflib
import itertools
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kit.arms import ARMS
from kit.errors import InputError, KitError, UsageError
from kit.paths import MATRICES

MATRIX_DIR = MATRICES
TOP_KEYS = ("batch", "description", "axes", "params", "builds", "modes")
MODE_KEYS = ("description", "axes", "params")
BUILD_KEYS = ("pythonpath", "python")
_NAME_OK = re.compile(r"^[A-Za-z0-9._-]+$")

Check = Callable[[str, Any], Any]  # (dotted key, value) -> value, or raises UsageError(param=key)


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
            raise UsageError(f"{key}: expected an integer, got {_type_name(value)}", param=key)
        if value < minimum:
            raise UsageError(f"{key}: must be >= {minimum}, got {value}", param=key)
        return value

    return check


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise UsageError(f"{key}: expected true or false, got {_type_name(value)}", param=key)
    return value


def _str(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise UsageError(f"{key}: expected a non-empty string, got {_type_name(value)}", param=key)
    return value


def _str_list(key: str, value: Any) -> list[str]:
    """A list of non-empty strings (an argument list, never one shell string); one string is a list of one."""
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
        raise UsageError(f"{key}: expected a list of non-empty strings, got {_type_name(value)}", param=key)
    return list(values)


def _choice(*allowed: str) -> Check:
    def check(key: str, value: Any) -> str:
        if value not in allowed:
            raise UsageError(f"{key}: unknown value {value!r}; allowed: {', '.join(allowed)}", param=key)
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
    "workload": _choice("same-target", "moving-target"),  # the task workloads; absent: not in the cells
    "profiler": _choice("nsys", "torch"),  # Nsight Systems, or the PyTorch profiler (a Kineto trace)
}
AXIS_DEFAULTS: dict[str, Any] = {"backend": "mini", "num_steps": 5, "cuda_graph": False, "device": "cpu"}
OPTIONAL_AXES = ("workload", "profiler")
# The sglang backend's torch-profiler path is prepared (the commands: data/results/h200-kineto/README.md),
# not yet run through the batch.
TORCH_PROFILER_BACKENDS = ("mini",)
REQUIRED_AXES = ("arm", "context_len")

# Fixed parameters, shared by every cell; some only make sense for one backend.
PARAMS: dict[str, Check] = {
    "num_requests": _int(1),
    "max_new_tokens": _int(1),
    "seed": _int(0),
    "preset": _str,
    "index_topk": _int(1),
    "indexer_impl": _choice("auto", "torch", "sglang"),
    "indexer_path": _choice("paged", "ragged"),
    "eagle_topk": _int(1),
    "num_draft_tokens": _int(2),
    "model_path": _str,
    "tp_size": _int(1),
    "profile_skip": _int(0),
    "profile_steps": _int(1),
    "extra_args": _str_list,
    "model": _choice("random", "task"),
    "task_checkpoint": _str,
}
BACKEND_ONLY: dict[str, str] = {
    "model_path": "sglang",
    "tp_size": "sglang",
    "profile_skip": "sglang",
    "profile_steps": "sglang",
    "extra_args": "sglang",
    "preset": "mini",
    "index_topk": "mini",
    "indexer_impl": "mini",
    "indexer_path": "mini",
    "model": "mini",
    "task_checkpoint": "mini",
}


@dataclass(frozen=True)
class Build:
    """What one arm's cells run with: folders put first on PYTHONPATH, and/or another interpreter.

    `kit stage install` lays out one folder per sglang build (`sglang-<version>/`) beside shared `deps/`
    and `fallback/`; an arm names the folders of its build, so a bug cell and a fix cell of one batch each
    import their own sglang (the profile stage reads it by AST and refuses a mismatch).
    """

    pythonpath: tuple[str, ...] = ()
    python: str | None = None

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """The variables this build sets in a cell's process: its folders before `base`'s PYTHONPATH."""
        if not self.pythonpath:
            return {}
        rest = [base["PYTHONPATH"]] if base.get("PYTHONPATH") else []
        return {"PYTHONPATH": os.pathsep.join([*self.pythonpath, *rest])}

    def problems(self) -> list[str]:
        """What is missing on this host (checked before a batch starts, never at load)."""
        out = [f"pythonpath folder {p} not found" for p in self.pythonpath if not Path(p).is_dir()]
        if self.python is not None and shutil.which(self.python) is None:
            out.append(f"python {self.python} not found or not executable")
        return out


@dataclass(frozen=True)
class Cell:
    """One run of the batch: the parameters handed to notebooks/01_profile and the run directory name."""

    run_id: str
    params: dict[str, Any] = field(hash=False)
    build: Build | None = field(default=None, hash=False)

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
    builds: dict[str, Build] = field(default_factory=dict)
    mode: str | None = None
    modes: tuple[str, ...] = ()
    overrides: dict[str, Any] = field(default_factory=dict)

    def record(self) -> str:
        """The matrix as run, kept beside its runs: the file, headed by the mode and --set it ran with."""
        if self.path.is_file():
            text = self.path.read_text()
        else:
            text = json.dumps({"axes": self.axes, "params": self.params})
        how = ([f"--mode {self.mode}"] if self.mode else []) + [
            f"--set {k}={json.dumps(v)}" for k, v in self.overrides.items()
        ]
        return f"# kit batch {self.path.name} {' '.join(how)}\n{text}" if how else text


def _profiler_tag(params: dict[str, Any]) -> str:
    """Cells under the PyTorch profiler are named apart (Nsight cells keep their names)."""
    return "-torch" if params.get("profiler") == "torch" else ""


def run_id(params: dict[str, Any]) -> str:
    """Readable and stable: the same cell gets the same id on every run, so --resume can find it."""
    workload = f"-{params['workload']}" if params.get("workload") else ""
    return (
        f"{params['backend']}-{params['arm']}{workload}-ctx{params['context_len']}-s{params['num_steps']}"
        f"-{'graph' if params['cuda_graph'] else 'eager'}-{params['device']}{_profiler_tag(params)}"
    )


def group_id(params: dict[str, Any]) -> str:
    workload = f"-{params['workload']}" if params.get("workload") else ""
    return (
        f"{params['backend']}{workload}-ctx{params['context_len']}-s{params['num_steps']}"
        f"-{'graph' if params['cuda_graph'] else 'eager'}-{params['device']}{_profiler_tag(params)}"
    )


def _unknown(key: str, where: str, allowed: Iterable[str], param: str) -> UsageError:
    allowed = list(allowed)
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return UsageError(f"unknown key {key!r} {where}{hint}; allowed: {', '.join(allowed)}", param=param)


def _mapping(key: str, value: Any, what: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise UsageError(f"{key}: expected a mapping of {what}, got {_type_name(value)}", param=key)
    return value


def _axis_values(key: str, name: str, raw: Any) -> list[Any]:
    values = raw if isinstance(raw, list) else [raw]
    if not values:
        raise UsageError(f"{key} is an empty list: give at least one value", param=key)
    checked = [AXES[name](key, v) for v in values]
    for v in checked:
        if checked.count(v) > 1:
            raise UsageError(f"{key} lists {v!r} more than once", param=key)
    return checked


def _check_axis_keys(raw_axes: dict[Any, Any], where: str) -> None:
    for key in raw_axes:
        if key in PARAMS:
            raise UsageError(
                f"{where}.{key}: {key!r} is a fixed parameter, not an axis; put it under params:",
                param=f"{where}.{key}",
            )
        if key not in AXES:
            raise _unknown(str(key), f"under {where}", AXES, f"{where}.{key}")


def _check_param_keys(raw_params: dict[Any, Any], where: str) -> None:
    for key in raw_params:
        if key in AXES:
            raise UsageError(
                f"{where}.{key}: {key!r} is an axis; list it under axes:", param=f"{where}.{key}"
            )
        if key not in PARAMS:
            raise _unknown(str(key), f"under {where}", PARAMS, f"{where}.{key}")


def _builds(raw: Any) -> dict[str, Build]:
    out = {}
    for arm, spec in _mapping("builds", raw, "arm -> {pythonpath, python}").items():
        key = f"builds.{arm}"
        if arm not in ARMS:
            raise UsageError(f"{key}: {arm!r} is not an arm; allowed: {', '.join(ARMS)}", param=key)
        spec = _mapping(key, spec, "pythonpath: [folders] and/or python: interpreter")
        for k in spec:
            if k not in BUILD_KEYS:
                raise _unknown(str(k), f"under {key}", BUILD_KEYS, f"{key}.{k}")
        if not spec:
            raise UsageError(f"{key}: give pythonpath and/or python", param=key)
        pythonpath = tuple(_str_list(f"{key}.pythonpath", spec.get("pythonpath", [])))
        python = _str(f"{key}.python", spec["python"]) if "python" in spec else None
        out[str(arm)] = Build(pythonpath, python)
    return out


def _modes(raw: Any) -> dict[str, dict[Any, Any]]:
    modes = _mapping("modes", raw, "mode name -> {axes, params, description}")
    for name, body in modes.items():
        key = f"modes.{name}"
        if not isinstance(name, str) or not _NAME_OK.match(name):
            raise UsageError(f"{key}: not a valid mode name; use letters, digits, '.', '_' or '-'", param=key)
        for k in _mapping(key, body or {}, "axes, params, description"):
            if k not in MODE_KEYS:
                raise _unknown(str(k), f"under {key}", MODE_KEYS, f"{key}.{k}")
    return {name: body or {} for name, body in modes.items()}


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """`--set KEY=VALUE` (repeatable): VALUE read as YAML, so `--set num_requests=4` is an integer."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--set {item!r}: expected KEY=VALUE (a params: key)", param="--set")
        try:
            out[key.strip()] = yaml.load(value, Loader=_Loader)  # noqa: S506 (a SafeLoader)
        except yaml.YAMLError:
            raise UsageError(f"--set {item!r}: the value is not valid YAML", param="--set") from None
    return out


def parse(
    doc: Any,
    path: Path | str = "<matrix>",
    mode: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Matrix:
    """Validate a loaded YAML document and expand it (or one of its modes) into cells."""
    path = Path(path)
    overrides = dict(overrides or {})
    if doc is None or doc == {}:
        raise UsageError("the matrix is empty: it needs at least axes.arm and axes.context_len", param="axes")
    if not isinstance(doc, dict):
        raise UsageError(
            f"the matrix must be a mapping (batch:, axes:, params:), got {type(doc).__name__}", param=None
        )
    for key in doc:
        if key not in TOP_KEYS:
            raise _unknown(str(key), "at the top level", TOP_KEYS, str(key))

    batch = doc.get("batch", path.stem)
    if not isinstance(batch, str) or not _NAME_OK.match(batch):
        raise UsageError(
            f"batch: {batch!r} is not a valid name; use letters, digits, '.', '_' or '-'", param="batch"
        )
    description = doc.get("description") or ""
    if not isinstance(description, str):
        raise UsageError(
            f"description: expected a string, got {_type_name(description)}", param="description"
        )
    modes = _modes(doc["modes"]) if doc.get("modes") is not None else {}
    builds = _builds(doc["builds"]) if doc.get("builds") is not None else {}

    raw_axes = doc.get("axes")
    if not raw_axes:
        raise UsageError("the matrix is empty: axes: needs at least arm and context_len", param="axes")
    _mapping("axes", raw_axes, "axis -> list of values")
    _check_axis_keys(raw_axes, "axes")
    raw_params = _mapping("params", doc.get("params") or {}, "name -> value")
    _check_param_keys(raw_params, "params")
    where_axis = dict.fromkeys(raw_axes, "axes")
    where_param = dict.fromkeys(raw_params, "params")
    if mode is not None:
        if mode not in modes:
            known = ", ".join(modes) or "none"
            raise UsageError(f"--mode {mode}: the matrix has no such mode (modes: {known})", param="--mode")
        body, key = modes[mode], f"modes.{mode}"
        mode_axes = _mapping(f"{key}.axes", body.get("axes") or {}, "axis -> list of values")
        mode_params = _mapping(f"{key}.params", body.get("params") or {}, "name -> value")
        _check_axis_keys(mode_axes, f"{key}.axes")
        _check_param_keys(mode_params, f"{key}.params")
        raw_axes, raw_params = {**raw_axes, **mode_axes}, {**raw_params, **mode_params}
        where_axis.update(dict.fromkeys(mode_axes, f"{key}.axes"))
        where_param.update(dict.fromkeys(mode_params, f"{key}.params"))
        batch, description = f"{batch}-{mode}", body.get("description") or description
    _check_param_keys(overrides, "--set")
    raw_params = {**raw_params, **overrides}
    where_param.update(dict.fromkeys(overrides, "--set"))

    for key in REQUIRED_AXES:
        if key not in raw_axes:
            raise UsageError(
                f"axes.{key} is missing: every matrix names its {key} values", param=f"axes.{key}"
            )
    axes = {
        name: _axis_values(
            f"{where_axis.get(name, 'axes')}.{name}", name, raw_axes.get(name, AXIS_DEFAULTS.get(name))
        )
        for name in AXES
        if name in raw_axes or name not in OPTIONAL_AXES
    }
    if "torch" in axes.get("profiler", []) and set(axes["backend"]) - set(TORCH_PROFILER_BACKENDS):
        raise UsageError(
            "axes.profiler: torch runs with backend mini; the sglang backend's torch-profiler path is "
            "prepared, not run by the batch (data/results/h200-kineto/README.md has its commands)",
            param="axes.profiler",
        )
    if "sglang" in axes["backend"] and axes["device"] != ["cuda"]:
        raise UsageError(
            f"axes.device: backend sglang runs on cuda only, got {', '.join(axes['device'])}",
            param="axes.device",
        )

    params: dict[str, Any] = {}
    for key, value in raw_params.items():
        dotted = f"{where_param[key]}.{key}"
        params[key] = PARAMS[key](dotted, value)
        only = BACKEND_ONLY.get(key)
        if only and axes["backend"] != [only]:
            raise UsageError(
                f"{dotted} applies to backend {only} only, but axes.backend is {', '.join(axes['backend'])}",
                param=dotted,
            )

    cells = []
    for combo in itertools.product(*axes.values()):
        cell_params = {**dict(zip(axes, combo, strict=True)), **params}
        cells.append(Cell(run_id(cell_params), cell_params, builds.get(cell_params["arm"])))
    return Matrix(
        path=path,
        batch=batch,
        axes=axes,
        params=params,
        cells=cells,
        description=description,
        builds=builds,
        mode=mode,
        modes=tuple(modes),
        overrides=overrides,
    )


def find(name_or_path: str | Path) -> Path:
    """A path, or the name of a shipped matrix (`demo` -> data/matrices/demo.yaml)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = MATRIX_DIR / f"{path.stem}.yaml"
    if path.parent == Path(".") and shipped.is_file():
        return shipped
    names = ", ".join(sorted(p.stem for p in MATRIX_DIR.glob("*.yaml")))
    raise InputError(f"matrix {name_or_path} not found; shipped matrices: {names}", path=path)


def load(
    name_or_path: str | Path, mode: str | None = None, overrides: Mapping[str, Any] | None = None
) -> Matrix:
    """The matrix (or one of its modes, with `--set` overrides); every mode is validated, not just this."""
    path = find(name_or_path)
    try:
        doc = yaml.load(path.read_text(), Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise InputError(f"matrix {path} is not valid YAML{where}: {problem}", path=path) from None
    try:
        m = parse(doc, path, mode, overrides)
        for other in m.modes:
            if other != mode:
                parse(doc, path, other, overrides)
    except UsageError as exc:
        raise UsageError(f"matrix {path}: {exc}", param=exc.param) from None
    return m


def check_cells(matrix: Matrix) -> None:
    """The backend's own validation (value ranges, presets) for every cell, still before anything runs."""
    from kit.backends.profile import validate

    for cell in matrix.cells:
        try:
            validate(dict(cell.params))
        except KitError as exc:
            raise UsageError(
                f"matrix {matrix.path}: cell {cell.run_id}: {exc}", param=getattr(exc, "param", None)
            ) from None
