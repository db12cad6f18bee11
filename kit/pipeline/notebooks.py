"""The kit's notebooks: a jupytext `.py` (what a reviewer diffs) paired with an output-free `.ipynb` (what
papermill runs, for `kit batch` as for anyone calling papermill by hand).

The `.ipynb` is generated from the `.py` (`python -m kit.pipeline.notebooks`); a test fails when a pair
differs or a committed `.ipynb` carries outputs.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from kit.errors import InputError
from kit.paths import NOTEBOOKS
from kit.pipeline.matrix import Build

NOTEBOOK_DIR = NOTEBOOKS
NAMES = ("00_build_sglang", "01_profile", "02_analyze", "03_compare", "04_report")
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


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
    if not path.is_file():
        return [f"{path} is missing"]
    have = nbformat.read(path, as_version=4)
    problems = []
    if have.metadata.get("kernelspec", {}).get("name") != KERNELSPEC["name"]:
        problems.append("kernelspec is not python3")
    cells = [(c.cell_type, c.source, c.metadata.get("tags", [])) for c in have.cells]
    if cells != [(c.cell_type, c.source, c.metadata.get("tags", [])) for c in want.cells]:
        problems.append("cells differ from the .py")
    if any(c.get("outputs") or c.get("execution_count") for c in have.cells if c.cell_type == "code"):
        problems.append("it carries outputs")
    return problems


def sync(names: tuple[str, ...] = NAMES) -> list[Path]:
    """Write each `.ipynb` from its `.py` (outputs dropped); returns the files written."""
    import jupytext

    written = []
    for name in names:
        path = NOTEBOOK_DIR / f"{name}.ipynb"
        text = jupytext.writes(paired(name), fmt="ipynb")
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    return written


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
    """Run one notebook's `.ipynb` top to bottom, as `papermill notebooks/NAME.ipynb OUT -p ...` does; on
    failure papermill leaves `output` run up to the failing cell.

    `build`: the environment of the cell's kernel (a matrix arm's sglang build); None: this interpreter.
    """
    import papermill

    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    kernel = {"km": _kernel_manager(build)} if build is not None else {}
    papermill.execute_notebook(
        str(ipynb(name)),
        str(output),
        parameters=parameters,
        kernel_name=KERNELSPEC["name"],
        cwd=str(cwd) if cwd else None,
        progress_bar=False,
        log_output=False,
        # The kernel listens on loopback only; its TCP-encryption warning at every start is noise.
        extra_arguments=["--IPKernelApp.log_level=ERROR"],
        **kernel,
    )
    return output


if __name__ == "__main__":
    for path in sync():
        print(f"wrote {path}")
