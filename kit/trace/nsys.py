"""Nsight Systems: find it, build the profile command, export SQLite.

The one place that knows the nsys binary; nothing here knows the engine or the export's tables.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from kit.errors import ExistsError, ToolMissing, TraceError
from kit.paths import unique_path
from kit.proc import NSYS_ONLY, failure_line, run_logged


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


# nsys's own agent failing, not the program under it: seen in CI with nsys 2022.4 and other nsys runs
# beside it ("[QuadDCommon::tag_message*] = Local Endpoint is not available."), or a failed run whose log
# holds nothing but nsys's lines ("End of file": seen with a second kit's nsys runs beside it); transient,
# so retried once.
AGENT_FAULT = re.compile(r"QuadDCommon::|Local Endpoint is not available")


def agent_fault(log: Path) -> str | None:
    """Why a failed profiled run looks like nsys's own failure, not the program's, or None."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    said = next((ln.strip() for ln in lines if AGENT_FAULT.search(ln)), None)
    return said or (NSYS_ONLY if failure_line(log) == NSYS_ONLY else None)


def run_profiled(
    cmd: list[str], log: Path, report_base: Path, env: Mapping[str, str], timeout: float | None
) -> tuple[int, list[str]]:
    """`cmd` (a profile_cmd) to completion; when it fails because nsys's own agent did, once more, the
    attempt's log kept as attempt-1-<log> and its partial report removed. Returns (exit code, the agent
    faults retried: for provenance). A failure the program's log explains is never retried."""
    rc = run_logged(cmd, log, env=env, timeout=timeout)
    fault = agent_fault(log) if rc != 0 else None
    if fault is None:
        return rc, []
    log.replace(log.with_name(f"attempt-1-{log.name}"))
    for suffix in (".nsys-rep", ".qdstrm"):
        report_base.with_name(report_base.name + suffix).unlink(missing_ok=True)
    return run_logged(cmd, log, env=env, timeout=timeout), [fault]


# An .nsys-rep's first line: "NVIDIA Tegra Profiler Report 1." (2022.x), "... Report 2024@6@2@225-...v0."
# (2024.6.2; 2025.3.1 writes its own the same way).
REPORT_HEADER = b"NVIDIA Tegra Profiler Report "


def release(version: str) -> tuple[int, ...]:
    """(year, minor, patch) of "2022.4.2.1-df9881f" or "2025.3.1": what decides which reports it reads."""
    head = version.replace("@", ".").split("-", 1)[0].split(".")[:3]
    return tuple(int(x) for x in head) if all(x.isdigit() for x in head) else ()


def report_release(rep: Path) -> str | None:
    """The Nsight Systems release that wrote `rep`, from its first line ("2024.6.2"); None for the older
    format (a bare number) or a file that is no report."""
    with open(rep, "rb") as f:
        line = f.read(256).split(b"\n", 1)[0]
    if not line.startswith(REPORT_HEADER):
        return None
    found = line[len(REPORT_HEADER) :].decode("ascii", "replace").rstrip(".").split("@")
    return ".".join(found[:3]) if len(found) >= 3 and release(".".join(found[:3])) else None


def readable(nsys_version_: str, rep: Path) -> str | None:
    """Why `nsys` cannot read `rep`, or None. A report from a later release than the nsys is refused by it
    ("Version number is invalid", measured with nsys 2022.4 on a 2024.6.2 report): say so before exporting,
    with what to do instead."""
    wrote, have = report_release(rep), release(nsys_version_)
    if wrote is None or not have or release(wrote) <= have:
        return None
    return (
        f"{rep} was written by Nsight Systems {wrote}, newer than this nsys ({nsys_version_}), which cannot "
        f"read it: export it with nsys {wrote} or later where it was recorded (nsys export --type sqlite "
        f"-o {rep.with_suffix('.sqlite').name} {rep.name}) and pass the .sqlite"
    )


def export_sqlite(nsys: str, rep: Path, out: Path) -> Path:
    """Export a report; refuses to overwrite an existing export, and a report newer than the nsys."""
    if out.exists():
        raise ExistsError(f"{out} already exists: refusing to overwrite it", path=out)
    if not rep.is_file():
        raise TraceError(f"Nsight report {rep} not found: the profiled program did not produce one", path=rep)
    # nsys --version only when the report names its release
    why = readable(nsys_version(nsys), rep) if report_release(rep) else None
    if why:
        raise TraceError(why, path=rep)
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
