"""The kit's notebooks: a jupytext `.py` (what a reviewer diffs) paired with an output-free `.ipynb` (what
papermill runs, for `kit batch` as for anyone calling papermill by hand).

The `.ipynb` is generated from the `.py` (`python -m kit.pipeline.notebooks`); a test fails when a pair
differs or a committed `.ipynb` carries outputs. Each notebook runs in a kernel of its own session, whose
output goes to `<notebook>.kernel.log` (never to the terminal). Ctrl-C of a batch reaches only the kit's own
process, which then stops the notebooks in flight (`interrupt`): each running kernel gets one SIGINT (the
cell stops what it started and says why), and no further cell starts.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kit.checks import unknown_key
from kit.errors import InputError
from kit.paths import NOTEBOOKS
from kit.pipeline.matrix import Build

NOTEBOOK_DIR = NOTEBOOKS
KERNEL_LOG = ".kernel.log"  # suffix that replaces the executed notebook's .ipynb
INTERRUPTED = threading.Event()  # set on Ctrl-C: no notebook cell starts any more
_kernels: dict[Any, bool] = {}  # running kernel managers -> already interrupted
_kernels_lock = threading.Lock()
NAMES = ("00_build_sglang", "01_profile", "02_analyze", "03_compare", "04_report")
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}
# The line papermill heads its injected-parameters cell with (its Python translator's
# codify(parameters, comment="Parameters")), and the names papermill itself may inject (--inject-paths).
INJECTED_HEADER = "# Parameters"
PAPERMILL_NAMES = ("PAPERMILL_INPUT_PATH", "PAPERMILL_OUTPUT_PATH")

# notebooks/01_profile: its `parameters` cell is the run parameters of the backends' models (kit.params) that
# a matrix may set, written by `python -m kit.pipeline.notebooks`, then these options of its own (value,
# comment): where the run goes and, for a batch's shared server, its cells.
PROFILE = "01_profile"
PROFILE_OPTIONS: dict[str, tuple[Any, str]] = {
    "runs_root": ("runs", ""),
    "batch": ("interactive", ""),
    "run_id": (None, "with cell_ids: the server folder's name"),
    "cell_ids": (None, "sglang, several cells on one server: their run directory names, contexts outer"),
    "start_before": (None, "sglang, several cells: time.time() from which no further cell starts"),
}
PROFILE_HEADER = (
    "# None: the backend's own default (after the #). Written by python -m kit.pipeline.notebooks from the\n"
    "# parameter models (kit/params.py, kit/backends/*/params.py): edit those, not this cell.\n"
)


def _path(name: str, suffix: str) -> Path:
    path = NOTEBOOK_DIR / f"{name}{suffix}"
    if name not in NAMES or not path.is_file():
        raise InputError(
            f"notebook {name!r} not found at {path}: known notebooks are {', '.join(NAMES)}", path=path
        )
    return path


def source(name: str) -> Path:
    """The jupytext source (`notebooks/NAME.py`): the file to edit."""
    return _path(name, ".py")


def ipynb(name: str) -> Path:
    """The paired notebook (`notebooks/NAME.ipynb`, no outputs): the file papermill executes."""
    return _path(name, ".ipynb")


def parameters_cell(nb: dict[str, Any]) -> str:
    """The source of a notebook's cell tagged `parameters` (papermill injects its values after it)."""
    for cell in nb["cells"]:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            src = cell["source"]
            return src if isinstance(src, str) else "".join(src)
    raise InputError("notebook has no cell tagged 'parameters'")


def defaults(name: str) -> dict[str, Any]:
    """A notebook's `parameters` cell: each name it assigns and its value (None where not a literal).

    Read from the executed `.ipynb` as JSON, so that a host without Jupyter (the plain runner) gives a
    stage exactly the values papermill would.
    """
    cell = parameters_cell(json.loads(ipynb(name).read_text()))
    out: dict[str, Any] = {}
    for node in ast.walk(ast.parse(cell)):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    try:
                        out[target.id] = ast.literal_eval(node.value)
                    except ValueError:
                        out[target.id] = None
    return out


def parameters(name: str) -> set[str]:
    """Names assigned in a notebook's `parameters` cell: what papermill can actually set."""
    return set(defaults(name))


def _plain(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def profile_parameters() -> dict[str, tuple[Any, str]]:
    """01_profile's parameters, each (value, comment): a parameter every backend defaults alike shows that
    value (`backend`, which picks the model, the base's); one whose default depends on the backend, or that
    one backend alone has, shows None and names the default(s) in its comment. Then the notebook's own
    options."""
    from kit.backends.profile import models, param_specs
    from kit.params import RunParams

    out: dict[str, tuple[Any, str]] = {}
    for name, spec in param_specs().items():
        if spec.matrix is None:
            continue
        having = {b: m.defaults()[name] for b, m in models().items() if name in m.specs()}
        having = {b: v for b, v in having.items() if models()[b].spec(name).matrix is not None}
        if name == "backend" or (name in RunParams.specs() and len(set(map(repr, having.values()))) == 1):
            out[name] = (RunParams.defaults()[name], spec.note)
            continue
        shown = {b: v for b, v in having.items() if v not in (None, [], {})}
        if len(having) == 1:
            only = next(iter(having))
            note = (
                spec.note
                if spec.note.startswith(only)
                else f"{only} only" + (f": {spec.note}" if spec.note else "")
            )
            default = f"default {_plain(shown[only])}" if shown else ""
        else:
            note, default = spec.note, ", ".join(f"{b} {_plain(v)}" for b, v in shown.items())
        out[name] = (None, f"{note} ({default})" if note and default else note or default)
    return {**out, **PROFILE_OPTIONS}


def profile_cell() -> str:
    """The source of 01_profile's `parameters` cell, from the models."""
    lines = []
    for name, (value, comment) in profile_parameters().items():
        literal = json.dumps(value) if isinstance(value, str) else repr(value)
        lines.append(f"{name} = {literal}" + (f"  # {comment}" if comment else ""))
    return PROFILE_HEADER + "\n".join(lines)


def profile_args(namespace: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """What 01_profile hands run_profile from its variables: (the run parameters that are set, the options
    cell_ids and start_before that are set); None is left to the backend."""
    names = [n for n in profile_parameters() if n not in PROFILE_OPTIONS]
    params = {n: namespace[n] for n in names if namespace.get(n) is not None}
    options = {n: namespace[n] for n in ("cell_ids", "start_before") if namespace.get(n) is not None}
    return params, options


def _with_cell(text: str, cell: str) -> str:
    """A jupytext source with its `parameters` cell's body replaced by `cell`."""
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("# %%") and '"parameters"' in line)
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("# %%"))
    return "\n".join([*lines[: start + 1], cell, "", *lines[end:]])


def write_profile_cell() -> Path | None:
    """Rewrite notebooks/01_profile.py's `parameters` cell from the models; the path when it changed."""
    path = NOTEBOOK_DIR / f"{PROFILE}.py"
    text = path.read_text()
    new = _with_cell(text, profile_cell())
    if new == text:
        return None
    path.write_text(new)
    return path


def declared(name: str) -> list[str]:
    """The names notebook `name` takes: 01_profile's from the models (what its cell is written from), the
    others' from their `parameters` cell."""
    return list(profile_parameters()) if name == PROFILE else list(defaults(name))


def injected(history: Sequence[str]) -> list[str]:
    """The names papermill injected, from the kernel's input history (IPython's `In`, this cell last).

    papermill puts its `injected-parameters` cell right after the parameters cell and runs the cells in
    order, so in the first code cell after the parameters cell the cell run just before is the injected
    one, headed by INJECTED_HEADER. Any other cell there (no -p given, cells run by hand in JupyterLab)
    injected nothing: [].
    """
    if len(history) < 2 or history[-2].lstrip().split("\n", 1)[0].strip() != INJECTED_HEADER:
        return []
    return [
        target.id
        for node in ast.parse(history[-2]).body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    ]


def check_parameters(name: str, history: Sequence[str]) -> None:
    """Refuse, in one line, a name papermill injected that notebook `name` does not declare: papermill only
    warns, and the notebook would run on its defaults (`-p contxt_len 8192` ran at 4096). Each notebook
    calls it first thing after its parameters cell, with `In`; the names it accepts are `declared`, the
    ones `kit batch` checks a matrix against (kit.pipeline.plan)."""
    names = declared(name)
    for key in injected(history):
        if key not in names and key not in PAPERMILL_NAMES:
            raise unknown_key(key, f"in papermill's parameters for notebooks/{name}", names, key)


def paired(name: str) -> Any:
    """The `.ipynb` the `.py` stands for: no outputs, the python3 kernel, ids derived from each cell's
    content (so that regenerating an unchanged notebook changes nothing)."""
    import jupytext

    nb = jupytext.read(source(name))
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    seen: dict[str, int] = {}
    for cell in nb.cells:
        digest = hashlib.sha256(f"{cell.cell_type}\n{cell.source}".encode()).hexdigest()[:8]
        seen[digest] = seen.get(digest, 0) + 1
        cell["id"] = digest if seen[digest] == 1 else f"{digest}-{seen[digest]}"
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


def stale(name: str) -> list[str]:
    """How the committed `.ipynb` differs from its `.py` (cells, tags, kernel) or carries outputs."""
    import nbformat

    want, path = paired(name), NOTEBOOK_DIR / f"{name}.ipynb"
    problems = []
    if name == PROFILE:
        src = source(name).read_text()
        if _with_cell(src, profile_cell()) != src:
            problems.append("its parameters cell differs from the parameter models")
    if not path.is_file():
        return [*problems, f"{path} is missing"]
    have = nbformat.read(path, as_version=4)
    if have.metadata.get("kernelspec", {}).get("name") != KERNELSPEC["name"]:
        problems.append("kernelspec is not python3")
    cells = [(c.cell_type, c.source, c.metadata.get("tags", [])) for c in have.cells]
    if cells != [(c.cell_type, c.source, c.metadata.get("tags", [])) for c in want.cells]:
        problems.append("cells differ from the .py")
    if any(c.get("outputs") or c.get("execution_count") for c in have.cells if c.cell_type == "code"):
        problems.append("it carries outputs")
    return problems


def sync(names: tuple[str, ...] = NAMES) -> list[Path]:
    """Write 01_profile's `parameters` cell from the models, then each `.ipynb` from its `.py` (outputs
    dropped); returns the files written."""
    import jupytext

    written = [p for p in [write_profile_cell() if PROFILE in names else None] if p is not None]
    for name in names:
        path = NOTEBOOK_DIR / f"{name}.ipynb"
        text = jupytext.writes(paired(name), fmt="ipynb")
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    return written


def _kernel_class(build: Build | None, log: Path) -> type:
    """nbclient's kernel manager for one notebook: the build's interpreter and folders (a kernel spec made
    for the cell; the batch's own environment is never changed, so cells of different builds can run side
    by side), its output into `log`, and registered while it runs so that `interrupt` can reach it."""
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    spec_manager = None
    if build is not None:
        spec = KernelSpec(
            argv=[build.python or sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            display_name=f"Python 3 ({build.python or 'this interpreter'})",
            language="python",
            env=build.env(os.environ),
        )

        class OneSpec(KernelSpecManager):
            def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
                return spec

        spec_manager = OneSpec

    class KitKernel(AsyncKernelManager):
        def __init__(self, **kw: Any) -> None:
            if spec_manager is not None:
                kw["kernel_spec_manager"] = spec_manager()
            super().__init__(**kw)

        async def start_kernel(self, **kw: Any) -> None:
            with log.open("ab") as out:  # the kernel keeps its own copy of the descriptor
                await super().start_kernel(**{"stdout": out, "stderr": out, **kw})
            with _kernels_lock:
                _kernels[self] = False
            if INTERRUPTED.is_set():
                interrupt()

        async def shutdown_kernel(self, now: bool = False, restart: bool = False) -> None:
            with _kernels_lock:
                _kernels.pop(self, None)
            await super().shutdown_kernel(now=now, restart=restart)

    return KitKernel


def interrupt() -> None:
    """Ctrl-C of the batch: no notebook cell starts any more, and every running kernel gets one SIGINT
    (its cell stops the processes it started and records why); call again to reach kernels started since."""
    INTERRUPTED.set()
    with _kernels_lock:
        todo = [km for km, done in _kernels.items() if not done]
        for km in todo:
            _kernels[km] = True
    for km in todo:
        pgid = getattr(km.provisioner, "pgid", None)
        try:
            if pgid:
                os.killpg(pgid, signal.SIGINT)
        except ProcessLookupError:
            pass


def _engine() -> str:
    """papermill's nbclient engine, refusing to start a cell once the batch is interrupted (papermill
    would otherwise run the next cell of a kernel interrupted between two)."""
    from papermill.engines import NBClientEngine, papermill_engines

    class StopBetweenCells(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man: Any, kernel_name: str, **kwargs: Any) -> Any:
            start = nb_man.cell_start

            def cell_start(cell: Any, cell_index: int | None = None, **kw: Any) -> Any:
                if INTERRUPTED.is_set():
                    raise KeyboardInterrupt
                return start(cell, cell_index, **kw)

            nb_man.cell_start = cell_start
            return super().execute_managed_notebook(nb_man, kernel_name, **kwargs)

    papermill_engines.register("kit", StopBetweenCells)
    return "kit"


def kernel_log(output: Path) -> Path:
    """Where the kernel that executes into `output` writes its own output."""
    return Path(output).with_suffix(KERNEL_LOG)


def execute(
    name: str, output: Path, parameters: dict[str, Any], cwd: Path | None = None, build: Build | None = None
) -> Path:
    """Run one notebook's `.ipynb` top to bottom, as `papermill notebooks/NAME.ipynb OUT -p ...` does; on
    failure papermill leaves `output` run up to the failing cell.

    `build`: the environment of the cell's kernel (a matrix arm's sglang build); None: this interpreter.
    """
    import papermill

    if INTERRUPTED.is_set():
        raise KeyboardInterrupt
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    papermill.execute_notebook(
        str(ipynb(name)),
        str(output),
        parameters=parameters,
        engine_name=_engine(),
        kernel_name=KERNELSPEC["name"],
        kernel_manager_class=_kernel_class(build, kernel_log(output)),
        cwd=str(cwd) if cwd else None,
        progress_bar=False,
        log_output=False,
        # The kernel listens on loopback only; its TCP-encryption warning at every start is noise.
        extra_arguments=["--IPKernelApp.log_level=ERROR"],
    )
    return output


if __name__ == "__main__":
    for path in sync():
        print(f"wrote {path}")
