"""Execute the kit's jupytext notebooks with papermill; the .py files are the source of truth.

Each notebook runs in a kernel of its own session, whose output goes to `<notebook>.kernel.log` (never to
the terminal). Ctrl-C of a batch reaches only the kit's own process, which then stops the notebooks in
flight (`interrupt`): each running kernel gets one SIGINT (the cell stops what it started and says why),
and no further cell starts.
"""

from __future__ import annotations

import ast
import os
import re
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from kit.errors import InputError
from kit.paths import NOTEBOOKS
from kit.pipeline.matrix import Build

NOTEBOOK_DIR = NOTEBOOKS
KERNEL_LOG = ".kernel.log"  # suffix that replaces the executed notebook's .ipynb
INTERRUPTED = threading.Event()  # set on Ctrl-C: no notebook cell starts any more
_kernels: dict[Any, bool] = {}  # running kernel managers -> already interrupted
_kernels_lock = threading.Lock()
NAMES = ("00_build_sglang", "01_profile", "02_analyze", "03_compare", "04_report")
_PARAMETERS_CELL = re.compile(r"^# %%.*\btags=\[.*[\"']parameters[\"'].*\]")


def source(name: str) -> Path:
    path = NOTEBOOK_DIR / f"{name}.py"
    if not path.is_file():
        raise InputError(
            f"notebook {name!r} not found at {path}: known notebooks are {', '.join(NAMES)}", path=path
        )
    return path


def defaults(name: str) -> dict[str, Any]:
    """A notebook's `parameters` cell: each name it assigns and its value (None where not a literal).

    Read from the jupytext source as text, so that a host without Jupyter (the plain runner) gives a stage
    exactly the values papermill would.
    """
    lines = source(name).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if _PARAMETERS_CELL.match(line)) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("# %%")), len(lines))
    out: dict[str, Any] = {}
    for node in ast.walk(ast.parse("\n".join(lines[start:end]))):
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
    """Run one notebook top to bottom; on failure papermill leaves `output` run up to the failing cell.

    `build`: the environment of the cell's kernel (a matrix arm's sglang build); None: this interpreter.
    """
    import jupytext
    import papermill

    if INTERRUPTED.is_set():
        raise KeyboardInterrupt
    nb = jupytext.read(source(name))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / f"{name}.ipynb"
        jupytext.write(nb, src)
        papermill.execute_notebook(
            str(src),
            str(output),
            parameters=parameters,
            engine_name=_engine(),
            kernel_name="python3",
            kernel_manager_class=_kernel_class(build, kernel_log(output)),
            cwd=str(cwd) if cwd else None,
            progress_bar=False,
            log_output=False,
            # The kernel listens on loopback only; its TCP-encryption warning at every start is noise.
            extra_arguments=["--IPKernelApp.log_level=ERROR"],
        )
    return output
