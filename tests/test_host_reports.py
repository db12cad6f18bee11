"""kit.pipeline.host_reports: the profiles a reviewer opens, gathered on the GPU host after the grid
(issue 33, item 6), here on the real sglang fixtures (tests/fixtures/h200_sglang) standing in for the
grid's 4k cells: every report's size listed, each cell's export trimmed and still analysing to its
verdict, the reports included only when they fit together."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest
from packed_helpers import plain_run

from kit.analysis.analyze import analyze
from kit.errors import InputError
from kit.paths import REPO
from kit.pipeline import host_reports

FIXTURES = REPO / "tests" / "fixtures" / "h200_sglang"
LAUNCHES = {"bug": 4, "fix": 1}


def _batch(tmp_path: Path, report_bytes: int) -> Path:
    """A batch whose 4k graph cells of bug and fix are the real fixtures, each alone on its server (its
    report in its own folder), with a stand-in .nsys-rep of the given size."""
    batch = tmp_path / "runs" / "h200_pr29654"
    for arm in LAUNCHES:
        cell = plain_run(FIXTURES / f"graph-{arm}-ctx4096", batch / f"sglang-{arm}-{host_reports.CELL}")
        analyze(cell)
        (cell / "profile.nsys-rep").write_bytes(b"\0" * report_bytes)
    return batch


def _launches(cell: Path) -> list[int]:
    analyze(cell, cell / "again")
    return json.loads((cell / "again" / "verdict.json").read_text())["launches_per_round"]


def test_the_cells_come_back_trimmed_with_their_reports_when_they_fit(tmp_path: Path) -> None:
    batch = _batch(tmp_path, 1000)
    out = tmp_path / "out"
    got = host_reports.gather(out, batch, arms=tuple(LAUNCHES), rounds=3)
    assert got["included"] and got["total_bytes"] == 2000 and got["why"] == ""
    listed = (out / "sizes-h200_pr29654.txt").read_text().splitlines()
    largest = max(p.stat().st_size for p in batch.rglob("*.sqlite"))
    assert len(listed) == 4 and listed[0].split()[0] == str(largest)
    with tarfile.open(out / "profiles.tgz") as tar:
        tar.extractall(tmp_path / "back", filter="data")
    for arm, n in LAUNCHES.items():
        cell = tmp_path / "back" / "profiles" / f"sglang-{arm}-{host_reports.CELL}"
        assert (cell / "profile.nsys-rep").stat().st_size == 1000 and got[arm]["trimmed_export"]
        whole = (
            batch / cell.name / "profile.sqlite"
        )  # the host's exports are plain; what comes back is packed
        assert (cell / "profile.sqlite.xz").stat().st_size < whole.stat().st_size
        assert _launches(cell) == [n] * 3  # the trimmed export analyses to the cell's own count
        committed = json.loads((cell / "verdict.json").read_text())
        assert set(committed["launches_per_round"]) == {n}


def test_reports_over_the_limit_stay_and_the_exports_still_come(tmp_path: Path) -> None:
    batch = _batch(tmp_path, 4000)
    out = tmp_path / "out"
    got = host_reports.gather(out, batch, arms=tuple(LAUNCHES), limit=5000, rounds=3)
    assert not got["included"] and "8,000 bytes, over 5,000" in got["why"]
    cell = out / "profiles" / f"sglang-bug-{host_reports.CELL}"
    assert not (cell / "profile.nsys-rep").exists() and (cell / "profile.sqlite.xz").is_file()


def test_a_missing_cell_is_named(tmp_path: Path) -> None:
    batch = _batch(tmp_path, 10)
    with pytest.raises(InputError, match="sglang-upstream-ctx4096-s5-graph-cuda: not finished"):
        host_reports.gather(tmp_path / "out", batch)


def test_the_profiles_mode_takes_the_grids_reports_or_runs_each_cell_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`h200_sglang.sh OUT profiles`: the grid's 4k reports when they fit; when they do not, the matrix's
    mode profiles (one server a cell) into a batch of its own, whose reports are gathered instead."""
    from kit.pipeline import host, host_sglang

    narrow = {"arms": tuple(LAUNCHES), "limit": 3000, "rounds": 3}  # the fixtures' two arms, a small limit
    dirs = host_sglang.HostDirs(tmp_path / "host", site=tmp_path / "site")
    call = host_sglang.SglangCall(tmp_path / "out", "profiles", host.Clock.starting_now(60), dirs)
    call.out.mkdir(parents=True)
    ran: list[tuple] = []
    monkeypatch.setattr(call, "batch", lambda *a: ran.append(a) or 0)
    call.profiles(**narrow)  # a bare host (no grid, no cells): the mode's own batch, then its cells named
    assert ran == [("h200_pr29654", "profiles", "h200_pr29654-profiles")] and call.status == 2
    assert "profiles: no grid" in call.log.read_text() and "not finished" in call.log.read_text()
    ran.clear()
    call.status = 0
    shutil.copytree(_batch(tmp_path / "a", 1000).parent, dirs.runs)  # 2 x 1000 bytes: they fit
    call.profiles(**narrow)
    assert not ran and json.loads((call.out / "profiles" / "profiles.json").read_text())["included"]
    big = _batch(tmp_path / "b", 2000)  # 4000 bytes: over; each cell again, alone
    shutil.rmtree(dirs.runs)
    shutil.copytree(big.parent, dirs.runs)
    shutil.copytree(big, dirs.runs / "h200_pr29654-profiles")
    for rep in (dirs.runs / "h200_pr29654-profiles").rglob("profile.nsys-rep"):
        rep.write_bytes(b"\0" * 100)
    call.profiles(**narrow)
    assert ran == [("h200_pr29654", "profiles", "h200_pr29654-profiles")]
    got = json.loads((call.out / "profiles" / "profiles.json").read_text())
    assert got["included"] and got["total_bytes"] == 200
    assert {p.name for p in call.out.glob("sizes-*")} == {
        "sizes-h200_pr29654.txt",
        "sizes-h200_pr29654-profiles.txt",
    }
    assert "the grid's reports stay" in call.log.read_text()


def test_the_profiles_mode_is_the_grids_4k_graph_cells_with_a_shorter_window() -> None:
    """The one-server reports of 10 draft steps were 7.4 + 5.5 + 0.8 MB on the H200 (over 6 MB together,
    data/results/h200-pr29654/profiles/profiles.json): the mode re-runs the very cells of the grid, every
    parameter the same but the window, 3 steps, so the three reports a reviewer opens may fit."""
    from kit.pipeline import matrix

    path = REPO / "data" / "matrices" / "h200_pr29654.yaml"
    grid = {
        c.params["arm"]: c.params
        for c in matrix.load(path).cells
        if c.params["context_len"] == 4096 and c.params["cuda_graph"]
    }
    cells = matrix.load(path, mode="profiles").cells
    assert sorted(c.params["arm"] for c in cells) == ["bug", "fix", "upstream"]
    for c in cells:
        assert c.params["profile_steps"] == 3 and grid[c.params["arm"]]["profile_steps"] == 10
        assert {**c.params, "profile_steps": 10} == grid[c.params["arm"]]
    committed = json.loads((REPO / "data/results/h200-pr29654/profiles/profiles.json").read_text())
    assert committed["total_bytes"] > host_reports.LIMIT and not committed["included"]
