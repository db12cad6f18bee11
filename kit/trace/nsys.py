"""Nsight Systems: find it, build the profile command, export SQLite.

The one place that knows the nsys binary; nothing here knows the engine or the export's tables.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from kit.errors import ExistsError, ToolMissing, TraceError
from kit.paths import unique_path


def find_nsys() -> str | None:
    """`KIT_NSYS` wins (GPU hosts keep nsys off PATH, see README), then PATH."""
    explicit = os.environ.get("KIT_NSYS")
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise ToolMissing(
                f"KIT_NSYS={explicit} is not an executable nsys: fix the path or unset KIT_NSYS", tool="nsys"
            )
        return explicit
    return shutil.which("nsys")


def nsys_version(nsys: str) -> str:
    out = subprocess.run([nsys, "--version"], capture_output=True, text=True, timeout=60)
    text = (out.stdout or out.stderr).strip()
    # "NVIDIA Nsight Systems version 2022.4.2.1-df9881f" -> "2022.4.2.1-df9881f"
    return text.rsplit(" ", 1)[-1] if text else "unknown"


def profile_cmd(nsys: str, out_base: Path, program: list[str], cuda: bool) -> list[str]:
    """Trace NVTX always, CUDA (with per-node graph tracing) when a GPU is in play; no CPU sampling."""
    trace = "cuda,nvtx" if cuda else "nvtx"
    cmd = [nsys, "profile", f"--trace={trace}", "--sample=none", "--cpuctxsw=none"]
    if cuda:
        cmd.append("--cuda-graph-trace=node")
    return [*cmd, "-o", str(out_base), *program]


def export_sqlite(nsys: str, rep: Path, out: Path) -> Path:
    """Export a report; refuses to overwrite an existing export."""
    if out.exists():
        raise ExistsError(f"{out} already exists: refusing to overwrite it", path=out)
    if not rep.is_file():
        raise TraceError(f"Nsight report {rep} not found: the profiled program did not produce one", path=rep)
    res = subprocess.run(
        [nsys, "export", "--type", "sqlite", "-o", str(out), str(rep)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if res.returncode != 0 or not out.is_file():
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        raise TraceError(f"nsys export of {rep} failed (exit {res.returncode}): {tail[0]}", path=rep)
    return out


def export_report(rep: Path | str) -> Path:
    """Export an .nsys-rep to SQLite (nsys from KIT_NSYS or PATH) into a new file next to it: X.sqlite, or
    X.1.sqlite, X.2.sqlite ... when taken (an export never overwrites a file)."""
    rep = Path(rep)
    nsys = find_nsys()
    if nsys is None:
        raise ToolMissing(
            f"{rep} needs `nsys export` but nsys is not on PATH: install Nsight Systems "
            "(scripts/ensure-nsys.sh) or pass the exported .sqlite instead",
            tool="nsys",
        )
    return export_sqlite(nsys, rep, unique_path(rep.with_suffix(".sqlite"), ".", keep_suffix=True))
