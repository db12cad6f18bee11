"""A report from a later Nsight Systems than the one at hand is refused with its cause and what to do
(issue 33, item 6: the H200's nsys 2025.3 writes reports CI's 2022.4 cannot read), before nsys is asked;
with CI's nsys the refusal is checked against nsys's own, on the committed 2022.4 report with a later
release's first line."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kit.errors import TraceError
from kit.paths import REPO
from kit.trace import nsys

COMMITTED = REPO / "data" / "results" / "mutants" / "cpu" / "runs" / "suite-session" / "profile.nsys-rep"
OLD_HEADER = b"NVIDIA Tegra Profiler Report 1.\n"


def _later(tmp_path: Path, version: str = "2025@3@1@100-1v0") -> Path:
    """The committed report (nsys 2022.4) with the first line a later release writes (2024.6.2 wrote
    "2024@6@2@225-246235244400v0")."""
    data = COMMITTED.read_bytes()
    assert data.startswith(OLD_HEADER)
    rep = tmp_path / "profile.nsys-rep"
    rep.write_bytes(nsys.REPORT_HEADER + version.encode() + b".\n" + data[len(OLD_HEADER) :])
    return rep


def test_the_release_that_wrote_a_report_is_read_from_its_first_line(tmp_path: Path) -> None:
    assert nsys.report_release(COMMITTED) is None  # the older format: a bare number
    assert nsys.report_release(_later(tmp_path)) == "2025.3.1"
    (tmp_path / "x.nsys-rep").write_text("not a report")
    assert nsys.report_release(tmp_path / "x.nsys-rep") is None
    assert nsys.release("2022.4.2.1-df9881f") == (2022, 4, 2) < nsys.release("2025.3.1")
    assert nsys.release("unknown") == ()


def test_a_newer_report_is_refused_with_the_fix_and_an_older_or_equal_one_is_not(tmp_path: Path) -> None:
    later = _later(tmp_path)
    why = nsys.readable("2022.4.2.1-df9881f", later)
    assert why and "2025.3.1" in why and "2022.4.2.1" in why and "nsys export --type sqlite" in why
    assert nsys.readable("2025.3.1.90-1", later) is None
    assert nsys.readable("2026.1.1", later) is None
    assert nsys.readable("2022.4.2.1-df9881f", COMMITTED) is None
    assert nsys.readable("unknown", later) is None  # cannot tell: nsys decides


@pytest.mark.skipif(shutil.which("nsys") is None, reason="needs nsys (make nsys)")
def test_ci_nsys_refuses_it_too_and_the_kit_says_so_first(tmp_path: Path) -> None:
    nsys_bin = shutil.which("nsys")
    assert nsys_bin
    later = _later(tmp_path)
    if nsys.readable(nsys.nsys_version(nsys_bin), later) is None:
        pytest.skip("this nsys is as new as the report")
    r = subprocess.run(
        [nsys_bin, "export", "--type", "sqlite", "-o", str(tmp_path / "n.sqlite"), str(later)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode != 0 and "Version number is invalid" in r.stdout + r.stderr  # nsys's own refusal
    with pytest.raises(TraceError, match="newer than this nsys"):
        nsys.export_sqlite(nsys_bin, later, tmp_path / "k.sqlite")
    assert not (tmp_path / "k.sqlite").exists()
