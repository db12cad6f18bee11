"""Helpers for tests that need a working Nsight Systems: real reports are generated live, not mocked.

`nsys_bin` skips a test only when nsys is absent AND we are not in CI; in CI (env CI=true) a missing
nsys FAILS the test, so the Nsight-backed tests can never silently stop running there.
Import the fixture into a test module: `from nsys_helpers import nsys_bin  # noqa: F401`.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from kit.paths import REPO

TESTS = REPO / "tests"
WORKLOAD = TESTS / "nsys_workload.py"
FIXTURES = TESTS / "fixtures"
# CPU-side NVTX profiling only. --sample=none/--cpuctxsw=none: on the 2-core VM the default CPU sampling
# made the nsys 2022.4 agent spin for minutes after the program exited; without it a profile takes ~2 s.
PROFILE_FLAGS = ("--trace=nvtx", "--sample=none", "--cpuctxsw=none")


def nsys_or_skip() -> str:
    """Path of nsys, or skip (developer machine) / fail (CI) when it is missing."""
    from kit.trace.nsys import find_nsys

    found = find_nsys()
    if found:
        return found
    msg = "nsys not found (KIT_NSYS or PATH; run `make nsys`)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{msg}: Nsight-backed tests must run in CI")
    pytest.skip(msg)


@pytest.fixture(scope="session")
def nsys_bin() -> str:
    return nsys_or_skip()


def profile(
    nsys: str, out_base: Path, args: list[str], *, env: dict | None = None, timeout: int = 300, program=None
) -> Path:
    """Run the workload (or `program`) under `nsys profile` and return the .nsys-rep.

    One retry: on the shared 2-core VM an nsys 2022.4 session started while another user's session was
    finishing once failed with "End of file"; a second failure is reported with both outputs.
    """
    program = program or [sys.executable, str(WORKLOAD), *args]
    cmd = [nsys, "profile", *PROFILE_FLAGS, "-o", str(out_base), *program]
    rep = out_base.parent / f"{out_base.name}.nsys-rep"
    failures = []
    for _ in range(2):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode == 0 and rep.exists():
            return rep
        failures.append(f"exit {proc.returncode}: {proc.stdout[-600:]} {proc.stderr[-600:]}")
        rep.unlink(missing_ok=True)
    raise AssertionError("nsys profile failed twice: " + " | ".join(failures))


def export(nsys: str, rep: Path, out: Path | None = None) -> Path:
    """`nsys export --type sqlite` into a new file."""
    out = out or rep.parent / f"{rep.name.removesuffix('.nsys-rep')}.sqlite"
    cmd = [nsys, "export", "--type", "sqlite", "-o", str(out), str(rep)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 or not out.exists():
        raise AssertionError(f"nsys export failed ({proc.returncode}): {proc.stderr[-800:]}")
    return out


def profile_sqlite(nsys: str, out_base: Path, args: list[str], **kw) -> Path:
    return export(nsys, profile(nsys, out_base, args, **kw))


_LIVE: dict[tuple, Path] = {}


def live_report(nsys: str, tmp_root: Path, *args: str) -> Path:
    """A real report of the workload with these args, generated once per test session and cached
    (modules import the fixtures separately, so pytest alone would profile the same workload again)."""
    if args not in _LIVE:
        base = tmp_root / ("live_" + "_".join(a.strip("-") for a in args))
        _LIVE[args] = profile_sqlite(nsys, base, list(args))
    return _LIVE[args]


@pytest.fixture(scope="session")
def live_reports(nsys_bin: str, tmp_path_factory: pytest.TempPathFactory):
    """Factory: live_reports("--pattern", "bug", ...) -> path of a fresh nsys SQLite export."""
    root = tmp_path_factory.mktemp("nsys_live")
    return lambda *args: live_report(nsys_bin, root, *args)


def drop_ranges(src: Path, dst: Path, name: str, inside: str | None = None) -> Path:
    """A copy of an nsys SQLite export without its NVTX ranges named `name` (only those starting inside a
    range named `inside` on the same thread, when given): a report whose ranges were lost or never
    recorded, made from a real one."""
    shutil.copy(src, dst)
    con = sqlite3.connect(dst)
    named = "({0}.text = ? OR {0}.textId IN (SELECT id FROM StringIds WHERE value = ?))"
    where, params = named.format("e"), [name, name]
    if inside is not None:
        where += (
            f" AND EXISTS (SELECT 1 FROM NVTX_EVENTS r WHERE {named.format('r')} "
            "AND r.globalTid = e.globalTid AND e.start >= r.start AND e.start < r.end)"
        )
        params += [inside, inside]
    try:
        sql = f"DELETE FROM NVTX_EVENTS WHERE rowid IN (SELECT e.rowid FROM NVTX_EVENTS e WHERE {where})"
        assert con.execute(sql, params).rowcount > 0, f"no {name!r} range to drop in {src}"
        con.commit()
    finally:
        con.close()
    return dst
