"""kit.trace.composition and scripts/report_composition.py: what fills an nsys report (issue 33 item 6)."""

from __future__ import annotations

import json
import subprocess
import sys

from kit.paths import REPO
from kit.trace.composition import composition

PROFILES = REPO / "data" / "results" / "h200-pr29654" / "profiles"
H100 = PROFILES / "h100-3-step-2026-12-05"


def test_a_trimmed_export_is_mostly_inside_the_probes_ranges() -> None:
    """The committed trimmed export (8 rounds after the window opens): its runtime calls counted, and the
    ones outside every probe range named; kernels outnumber runtime calls (graph replays)."""
    got = composition(PROFILES / "sglang-bug-ctx4096-s5-graph-cuda" / "profile.sqlite.xz")
    assert got["tables"]["CUPTI_ACTIVITY_KIND_RUNTIME"] == got["runtime_calls"] == 5072
    assert got["outside_probe_ranges"] == 1360 and sum(got["outside_top"].values()) == 1360
    assert got["tables"]["CUPTI_ACTIVITY_KIND_KERNEL"] > got["runtime_calls"]
    assert 0 < got["longest_gap_s"] < got["span_s"]


def test_the_h100_reports_are_filled_by_calls_outside_the_rounds() -> None:
    """The committed composition of the 3-step reports (made from their full exports on the host, which
    stayed there): most runtime calls fall outside every probe range, and the fix report, the largest, was
    collected longest and holds the longest gap (its cell waited for the GPU with collection on)."""
    comp = json.loads((H100 / "composition.json").read_text())
    sizes = json.loads((H100 / "profiles.json").read_text())
    for arm in ("bug", "fix"):
        c = comp[arm]
        assert c["outside_probe_ranges"] > 0.9 * c["runtime_calls"]
    assert sizes["fix"]["report_bytes"] > sizes["bug"]["report_bytes"] > sizes["upstream"]["report_bytes"]
    assert comp["fix"]["span_s"] > 2 * comp["bug"]["span_s"]
    assert comp["fix"]["longest_gap_s"] > 5 * comp["bug"]["longest_gap_s"]
    assert sizes["total_bytes"] > sizes["limit"] and not sizes["included"]


def test_the_script_says_what_is_wrong_in_one_line(tmp_path) -> None:
    script = REPO / "scripts" / "report_composition.py"
    not_sqlite = tmp_path / "x.sqlite"
    not_sqlite.write_text("not a database")
    for args, words in (
        ([], "usage:"),
        ([str(tmp_path / "none.sqlite")], "no such file"),
        ([str(not_sqlite)], "cannot be read as SQLite"),
    ):
        res = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True)
        assert res.returncode == 2 and res.stdout == "", res
        assert len(res.stderr.splitlines()) == 1 and words in res.stderr, res.stderr


def test_gaps_are_measured_between_ranges_clipped_to_the_calls(tmp_path) -> None:
    """A probe range open before the first recorded call (the report starts mid-range) must not shift
    which edges pair up: the gaps are 0 (inside that range), 3 s between ranges, 1 s at the end."""
    import sqlite3

    db = tmp_path / "t.sqlite"
    con = sqlite3.connect(db)
    con.executescript(
        "CREATE TABLE StringIds (id INTEGER, value TEXT);"
        "CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, textId INTEGER);"
        "CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER, nameId INTEGER);"
        "INSERT INTO StringIds VALUES (1, 'draft_round'), (2, 'cudaEventCreate');"
        "INSERT INTO NVTX_EVENTS VALUES (0, 2000000000, 1), (5000000000, 6000000000, 1);"
        "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (1000000000, 1000000100, 2), "
        "(3000000000, 3000000100, 2), (6999999900, 7000000000, 2);"
    )
    con.commit()
    con.close()
    got = composition(db)
    assert got["runtime_calls"] == 3 and got["outside_probe_ranges"] == 2
    assert got["span_s"] == 6.0 and got["longest_gap_s"] == 3.0
