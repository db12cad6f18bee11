"""A batch matrix (YAML): axes whose product is the set of runs, plus fixed parameters shared by all of them.

Optionally, per arm, the sglang build its cells run with (`builds:`), more cells beside the product
(`include:`, each entry the base axes with some replaced), named grids over the same base (`modes:`, one
batch each, picked with `kit batch MATRIX --mode NAME`), and wrong fixes run as the fix arm in builds of
their own (`mutants:`, kit.pipeline.mutant_cells: the mutation suite, each judged by the gate). Everything
a user can get wrong in the file is caught here, as one line that names the key, before any run starts: a
typo found after an hour of GPU time is an hour lost.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kit.arms import ARMS
from kit.backends.profile import models, param_specs
from kit.checks import (
    Check,
    mapping,
    string,
    string_list,
    type_name,
    unknown_key,
)
from kit.errors import InputError, KitError, UsageError
from kit.params import RunParams, Spec
from kit.paths import MATRICES

MATRIX_DIR = MATRICES
TOP_KEYS = ("batch", "description", "axes", "params", "builds", "include", "modes", "mutants")
MODE_KEYS = ("description", "axes", "params", "include", "builds", "mutants")
BUILD_KEYS = ("pythonpath", "python")
_NAME_OK = re.compile(r"^[A-Za-z0-9._-]+$")


_NONE = Spec("")


class _Loader(yaml.SafeLoader):
    """YAML 1.2 booleans: only true/false. YAML 1.1 reads `arm: off` (and on/yes/no) as a bool."""


_Loader.yaml_implicit_resolvers = {
    first: [r for r in resolvers if r[0] != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


# From the backends' parameter models (kit.params): the axes whose product makes the cells, in run-id order,
# and the fixed parameters shared by every cell, each with its value check; some apply to one backend only.
# A missing axis takes the default of each cell's backend (sglang: CUDA graphs on, on cuda).
_SPECS = param_specs()
AXES: dict[str, Check] = {n: s.check for n, s in _SPECS.items() if s.matrix == "axis" and s.check}
PARAMS: dict[str, Check] = {n: s.check for n, s in _SPECS.items() if s.matrix == "param" and s.check}
OPTIONAL_AXES = RunParams.OPTIONAL_AXES
REQUIRED_AXES = ("arm", "context_len")
# the base's defaults of the axes a matrix may leave out (readers of runs that recorded fewer keys)
AXIS_DEFAULTS: dict[str, Any] = {
    n: RunParams.defaults()[n]
    for n in AXES
    if n in RunParams.specs() and n not in (*OPTIONAL_AXES, *REQUIRED_AXES)
}
BACKEND_ONLY: dict[str, str] = {
    n: next(b for b, m in models().items() if n in m.specs())
    for n in PARAMS
    if sum(m.specs().get(n, _NONE).matrix is not None for m in models().values()) == 1
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
    mutant: str | None = None  # a wrong fix run as its arm, in its own build: named after it, not the arm

    @property
    def name(self) -> str:
        """What the cell's run id and server folder name it by: its mutant, else its arm."""
        return self.mutant or self.params["arm"]

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


def _name(params: dict[str, Any], *, arm: bool, context: bool, workload: bool = True) -> str:
    parts = [params["backend"], *([params["arm"]] if arm else [])]
    if workload and params.get("workload"):
        parts.append(params["workload"])
    if context:
        parts.append(f"ctx{params['context_len']}")
    parts += [f"s{params['num_steps']}", "graph" if params["cuda_graph"] else "eager", params["device"]]
    if params.get("profiler") == "torch":  # cells under the PyTorch profiler are named apart
        parts.append("torch")
    if params.get("profile") is False:
        parts.append("noprofile")
    return "-".join(parts)


def run_id(params: dict[str, Any]) -> str:
    """Readable and stable: the same cell gets the same id on every run, so --resume can find it."""
    return _name(params, arm=True, context=True)


def group_id(params: dict[str, Any]) -> str:
    return _name(params, arm=False, context=True)


def server_id(params: dict[str, Any], one_workload: bool) -> str:
    """The folder of a server that runs several cells of one arm (kit.pipeline.groups): the cells' name
    without the context length (and without the workload when they span several)."""
    return _name(params, arm=True, context=False, workload=one_workload) + "-server"


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
            raise unknown_key(str(key), f"under {where}", AXES, f"{where}.{key}")


def _check_param_keys(raw_params: dict[Any, Any], where: str) -> None:
    for key in raw_params:
        if key in AXES:
            raise UsageError(
                f"{where}.{key}: {key!r} is an axis; list it under axes:", param=f"{where}.{key}"
            )
        if key not in PARAMS:
            raise unknown_key(str(key), f"under {where}", PARAMS, f"{where}.{key}")


def _builds(raw: Any, where: str = "builds") -> dict[str, Build]:
    out = {}
    for arm, spec in mapping(where, raw, "arm -> {pythonpath, python}").items():
        key = f"{where}.{arm}"
        if arm not in ARMS:
            raise UsageError(f"{key}: {arm!r} is not an arm; allowed: {', '.join(ARMS)}", param=key)
        spec = mapping(key, spec, "pythonpath: [folders] and/or python: interpreter")
        for k in spec:
            if k not in BUILD_KEYS:
                raise unknown_key(str(k), f"under {key}", BUILD_KEYS, f"{key}.{k}")
        if not spec:
            raise UsageError(f"{key}: give pythonpath and/or python", param=key)
        pythonpath = tuple(string_list(f"{key}.pythonpath", spec.get("pythonpath", [])))
        python = string(f"{key}.python", spec["python"]) if "python" in spec else None
        out[str(arm)] = Build(pythonpath, python)
    return out


def _modes(raw: Any) -> dict[str, dict[Any, Any]]:
    modes = mapping("modes", raw, "mode name -> {axes, params, include, builds, description}")
    for name, body in modes.items():
        key = f"modes.{name}"
        if not isinstance(name, str) or not _NAME_OK.match(name):
            raise UsageError(f"{key}: not a valid mode name; use letters, digits, '.', '_' or '-'", param=key)
        for k in mapping(key, body or {}, "axes, params, description"):
            if k not in MODE_KEYS:
                raise unknown_key(str(k), f"under {key}", MODE_KEYS, f"{key}.{k}")
    return {name: body or {} for name, body in modes.items()}


def _include(raw: Any, where: str) -> list[dict[Any, Any]]:
    """`include:`: a list of axis mappings; each replaces those axes of the grid for a product of its own."""
    if not isinstance(raw, list) or not raw:
        raise UsageError(
            f"{where}: expected a list of axis mappings, e.g. - {{context_len: [4096], cuda_graph: [false]}}",
            param=where,
        )
    for n, entry in enumerate(raw):
        mapping(f"{where}[{n}]", entry, "axis -> list of values")
        _check_axis_keys(entry, f"{where}[{n}]")
    return raw


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """`--set KEY=VALUE` (repeatable): VALUE read as YAML, so `--set num_requests=4` is an integer. KEY is
    a params: key (its value replaced), an axis (narrowed to those values: `--set context_len=4096`), or
    `mutants` (which of the registry's wrong fixes a `mutants:` section runs: kit.pipeline.mutant_cells)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--set {item!r}: expected KEY=VALUE (a params: key or an axis)", param="--set")
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
            raise unknown_key(str(key), "at the top level", TOP_KEYS, str(key))

    batch = doc.get("batch", path.stem)
    if not isinstance(batch, str) or not _NAME_OK.match(batch):
        raise UsageError(
            f"batch: {batch!r} is not a valid name; use letters, digits, '.', '_' or '-'", param="batch"
        )
    description = doc.get("description") or ""
    if not isinstance(description, str):
        raise UsageError(f"description: expected a string, got {type_name(description)}", param="description")
    modes = _modes(doc["modes"]) if doc.get("modes") is not None else {}
    include = _include(doc["include"], "include") if doc.get("include") is not None else []
    where_include = "include"
    builds = _builds(doc["builds"]) if doc.get("builds") is not None else {}
    raw_mutants, where_mutants = doc.get("mutants"), "mutants"

    raw_axes = doc.get("axes")
    if not raw_axes:
        raise UsageError("the matrix is empty: axes: needs at least arm and context_len", param="axes")
    mapping("axes", raw_axes, "axis -> list of values")
    _check_axis_keys(raw_axes, "axes")
    raw_params = mapping("params", doc.get("params") or {}, "name -> value")
    _check_param_keys(raw_params, "params")
    where_axis = dict.fromkeys(raw_axes, "axes")
    where_param = dict.fromkeys(raw_params, "params")
    if mode is not None:
        if mode not in modes:
            known = ", ".join(modes) or "none"
            raise UsageError(f"--mode {mode}: the matrix has no such mode (modes: {known})", param="--mode")
        body, key = modes[mode], f"modes.{mode}"
        mode_axes = mapping(f"{key}.axes", body.get("axes") or {}, "axis -> list of values")
        mode_params = mapping(f"{key}.params", body.get("params") or {}, "name -> value")
        _check_axis_keys(mode_axes, f"{key}.axes")
        _check_param_keys(mode_params, f"{key}.params")
        raw_axes, raw_params = {**raw_axes, **mode_axes}, {**raw_params, **mode_params}
        # a mode's grid is its own: the base's include: would add cells it never asked for
        where_include = f"{key}.include"
        include = _include(body["include"], where_include) if body.get("include") is not None else []
        where_axis.update(dict.fromkeys(mode_axes, f"{key}.axes"))
        where_param.update(dict.fromkeys(mode_params, f"{key}.params"))
        if body.get("builds") is not None:  # a mode may run an arm on another build (a later release)
            builds = {**builds, **_builds(body["builds"], f"{key}.builds")}
        if "mutants" in body:  # a mode's own suite (null: none)
            raw_mutants, where_mutants = body["mutants"], f"{key}.mutants"
        batch, description = f"{batch}-{mode}", body.get("description") or description
    narrow = {k: v for k, v in overrides.items() if k in AXES}  # --set AXIS=VALUES: some of its values
    set_params = {k: v for k, v in overrides.items() if k not in AXES and k != "mutants"}
    _check_param_keys(set_params, "--set")
    raw_params = {**raw_params, **set_params}
    where_param.update(dict.fromkeys(set_params, "--set"))

    for key in REQUIRED_AXES:
        if key not in raw_axes:
            raise UsageError(
                f"axes.{key} is missing: every matrix names its {key} values", param=f"axes.{key}"
            )
    backend = RunParams.defaults()["backend"]  # the one axis a grid always has: it picks the defaults
    axes = {
        name: _axis_values(f"{where_axis.get(name, 'axes')}.{name}", name, raw_axes.get(name, backend))
        for name in AXES
        if name in raw_axes or name == "backend"
    }
    extra_axes = [
        {
            name: _axis_values(f"{where_include}[{n}].{name}", name, entry[name]) if name in entry else values
            for name, values in axes.items()
        }
        | {
            name: _axis_values(f"{where_include}[{n}].{name}", name, entry[name])
            for name in entry
            if name not in axes
        }
        for n, entry in enumerate(include)
    ]
    grids = [("axes", axes), *((f"{where_include}[{n}]", g) for n, g in enumerate(extra_axes))]
    for where, grid in grids:
        _check_backend_axes(where, grid)
    backends = list(dict.fromkeys(b for _, grid in grids for b in grid["backend"]))

    params: dict[str, Any] = {}
    for key, value in raw_params.items():
        dotted = f"{where_param[key]}.{key}"
        params[key] = PARAMS[key](dotted, value)
        only = BACKEND_ONLY.get(key)
        if only and backends != [only]:
            raise UsageError(
                f"{dotted} applies to backend {only} only, but axes.backend is {', '.join(backends)}",
                param=dotted,
            )

    cells: list[Cell] = []
    seen: dict[str, str] = {}
    for where, grid in grids:
        for combo in itertools.product(*grid.values()):
            cell_params = {**_with_defaults(dict(zip(grid, combo, strict=True))), **params}
            rid = run_id(cell_params)
            if rid in seen:
                raise UsageError(f"{where} repeats cell {rid} (already made by {seen[rid]})", param=where)
            seen[rid] = where
            cells.append(Cell(rid, cell_params, builds.get(cell_params["arm"])))
    from kit.pipeline import mutant_section  # beside the arm's cells: --set arm= narrows the arms alone

    def mutant_cells() -> list[Cell]:
        made = mutant_section.expand(cells, raw_mutants, where_mutants, overrides.get("mutants"))
        return [Cell(run_id({**c.params, "arm": n}), dict(c.params), Build(p, py), n) for c, n, p, py in made]

    for name, raw in sorted(narrow.items(), key=lambda kv: kv[0] == "arm"):
        if name == "arm":
            mutants = mutant_cells()
        cells = _narrowed(cells, name, _axis_values(f"--set.{name}", name, raw))
    if "arm" not in narrow:
        mutants = mutant_cells()
    cells += mutants
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


def _with_defaults(axes: dict[str, Any]) -> dict[str, Any]:
    """One cell's axis values, in run-id order, with the default of its backend where the matrix gave none
    (an optional axis it leaves out is not in the cell: its backend's default applies at run time)."""
    defaults = models()[axes["backend"]].defaults()
    return {n: axes[n] if n in axes else defaults[n] for n in AXES if n in axes or n not in OPTIONAL_AXES}


def _narrowed(cells: list[Cell], name: str, values: list[Any]) -> list[Cell]:
    """The cells whose axis `name` takes one of `values` (`--set AXIS=VALUES`): a part of the matrix, never a
    cell it does not hold, so the batch still means what its file says."""
    has = list(dict.fromkeys(c.params.get(name) for c in cells))
    for v in values:
        if v not in has:
            raise UsageError(
                f"--set.{name}: {v!r} is not a value of the matrix's {name} axis "
                f"({', '.join(map(str, has))}); --set narrows an axis to some of its values",
                param=f"--set.{name}",
            )
    return [c for c in cells if c.params.get(name) in values]


def _check_backend_axes(where: str, grid: dict[str, list[Any]]) -> None:
    if "sglang" in grid["backend"] and grid.get("device", ["cuda"]) != ["cuda"]:
        raise UsageError(
            f"{where}.device: backend sglang runs on cuda only, got {', '.join(grid['device'])}",
            param=f"{where}.device",
        )
    if "profile" in grid and grid["backend"] != ["sglang"]:
        raise UsageError(
            f"{where}.profile: (false: a run without nsys and the probes) is for backend sglang only",
            param=f"{where}.profile",
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
        params_only = {k: v for k, v in (overrides or {}).items() if k not in AXES}  # axes: this grid's
        for other in m.modes:
            if other != mode:
                parse(doc, path, other, params_only)
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
