"""Execute the kit's jupytext notebooks with papermill; the .py files are the source of truth."""

from __future__ import annotations

import ast
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from kit.errors import InputError
from kit.paths import NOTEBOOKS
from kit.pipeline.matrix import Build

NOTEBOOK_DIR = NOTEBOOKS
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


def _kernel_manager(build: Build) -> Any:
    """A kernel in the build's environment: its interpreter, its folders first on PYTHONPATH.

    The kernel is already a process of its own, so a kernel spec made for the cell is all it takes; the
    batch's own environment is never changed, so cells of different builds can run side by side (-j).
    """
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import KernelManager

    spec = KernelSpec(
        argv=[build.python or sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        display_name=f"Python 3 ({build.python or 'this interpreter'})",
        language="python",
        env=build.env(os.environ),
    )

    class OneSpec(KernelSpecManager):
        def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
            return spec

    return KernelManager(kernel_name="kit-cell", kernel_spec_manager=OneSpec())


def execute(
    name: str, output: Path, parameters: dict[str, Any], cwd: Path | None = None, build: Build | None = None
) -> Path:
    """Run one notebook top to bottom; on failure papermill leaves `output` run up to the failing cell.

    `build`: the environment of the cell's kernel (a matrix arm's sglang build); None: this interpreter.
    """
    import jupytext
    import papermill

    nb = jupytext.read(source(name))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    kernel = {"km": _kernel_manager(build)} if build is not None else {}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / f"{name}.ipynb"
        jupytext.write(nb, src)
        papermill.execute_notebook(
            str(src),
            str(output),
            parameters=parameters,
            kernel_name="python3",
            cwd=str(cwd) if cwd else None,
            progress_bar=False,
            log_output=False,
            # The kernel listens on loopback only; its TCP-encryption warning at every start is noise.
            extra_arguments=["--IPKernelApp.log_level=ERROR"],
            **kernel,
        )
    return output
