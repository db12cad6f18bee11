"""Execute the kit's jupytext notebooks with papermill; the .py files are the source of truth."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from kit.errors import KitError
from kit.paths import NOTEBOOKS

NOTEBOOK_DIR = NOTEBOOKS
NAMES = ("00_build_sglang", "01_profile", "02_analyze", "03_compare", "04_report")


def source(name: str) -> Path:
    path = NOTEBOOK_DIR / f"{name}.py"
    if not path.is_file():
        raise KitError(f"notebook {name!r} not found at {path}: known notebooks are {', '.join(NAMES)}")
    return path


def execute(name: str, output: Path, parameters: dict[str, Any], cwd: Path | None = None) -> Path:
    """Run one notebook top to bottom; on failure papermill leaves `output` run up to the failing cell."""
    import jupytext
    import papermill

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
            kernel_name="python3",
            cwd=str(cwd) if cwd else None,
            progress_bar=False,
            log_output=False,
            # The kernel listens on loopback only; its TCP-encryption warning at every start is noise.
            extra_arguments=["--IPKernelApp.log_level=ERROR"],
        )
    return output
