"""kit.analysis.analyze: run dir or bare report -> rounds.csv + verdict.json (never overwritten), timeline."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nsys_helpers import FIXTURES, WORKLOAD, live_reports, nsys_bin, profile  # noqa: F401
from synthetic_schema import draft_loop_graph

from kit.analysis.analyze import analyze
from kit.analysis.rounds import ROUND_COLUMNS
from kit.analysis.timeline import timeline_png
from kit.errors import ExistsError, KitError, UsageError

BUG = FIXTURES / "nsys2022.4_kit_bug_steps4.sqlite"
DROPPED = FIXTURES / "nsys2022.4_nvtx0.2.14_dropped.sqlite"


def run_dir(tmp_path: Path, report: Path | None, name: str = "profile.sqlite", **params) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    p = {"backend": "mini", "arm": "bug", "num_steps": 4, "context_len": 8192, "index_topk": 2048, **params}
    (d / "params.json").write_text(json.dumps(p))
    if report is not None:
        shutil.copyfile(report, d / name)
    return d


def test_run_dir_real_report(tmp_path: Path) -> None:
    d = run_dir(tmp_path, BUG)
    t0 = time.perf_counter()
    v = analyze(d)
    assert time.perf_counter() - t0 < 5
    assert v["status"] == "pass" and v["passed"] and v["arm"] == "bug" and v["expected_per_round"] == 3
    assert v["launches_per_round"] == [3] * 5 and v["source"] == "nsys" and v["method"] == "nvtx"
    assert v["report"]["nsys_version"] == "2022.4.2.1" and v["nvtx_dropped"] is False
    assert json.loads((d / "verdict.json").read_text()) == v
    with (d / "rounds.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert list(table[0]) == list(ROUND_COLUMNS) and len(table) == 5
    assert {r["indexer_launches"] for r in table} == {"3"}


def test_never_overwrites(tmp_path: Path) -> None:
    d = run_dir(tmp_path, BUG)
    analyze(d)
    before = (d / "verdict.json").read_text()
    with pytest.raises(KitError, match="already exists: pass another out dir"):
        analyze(d, method="nvtx")
    assert (d / "verdict.json").read_text() == before
    v = analyze(d, tmp_path / "again")  # another out dir works
    assert v["status"] == "pass" and (tmp_path / "again" / "rounds.csv").exists()


def test_dropped_nvtx_run_is_inconclusive(tmp_path: Path) -> None:
    v = analyze(run_dir(tmp_path, DROPPED))
    assert v["status"] == "inconclusive" and v["passed"] is False and v["nvtx_dropped"] is True
    assert v["num_rounds"] == 0 and "NVTX dropped" in v["warnings"][0]


def test_recorder_run(tmp_path: Path) -> None:
    d = run_dir(tmp_path, None, arm="fix", num_steps=5)
    args = ["--pattern", "fix", "--rounds", "3", "--num-steps", "5", "--sink", "recorder"]
    rec = ["--recorder-path", str(d / "recorder.sqlite")]
    subprocess.run([sys.executable, str(WORKLOAD), *args, *rec], check=True)
    v = analyze(d)
    assert v["source"] == "recorder" and v["status"] == "pass" and v["launches_per_round"] == [1, 1, 1]
    assert any("NOT measured under Nsight Systems" in w for w in v["warnings"])


def test_params_and_missing_inputs(tmp_path: Path) -> None:
    with pytest.raises(KitError, match=r"needs --arm and --num-steps"):
        analyze(BUG, tmp_path / "o1")
    with pytest.raises(KitError, match=r"needs --num-steps \(no params.json\)"):
        analyze(BUG, tmp_path / "o2", arm="bug")
    v = analyze(BUG, tmp_path / "o3", arm="fix", num_steps=4, context_len=1024)
    assert v["status"] == "fail" and any("context_len 1024 <= index_topk 2048" in w for w in v["warnings"])
    empty = run_dir(tmp_path, None)
    with pytest.raises(KitError, match="holds no profile.sqlite, profile.nsys-rep or recorder.sqlite"):
        analyze(empty)
    (tmp_path / "noparams").mkdir()
    with pytest.raises(KitError, match="params.json not found"):
        analyze(tmp_path / "noparams")
    with pytest.raises(KitError, match="not found"):
        analyze(tmp_path / "nothing.sqlite", arm="bug", num_steps=4)


def test_cli_option_overrides_params(tmp_path: Path) -> None:
    v = analyze(run_dir(tmp_path, BUG), tmp_path / "o", arm="fix")
    assert v["arm"] == "fix" and v["status"] == "fail"


@pytest.mark.nsys
def test_run_dir_with_only_nsys_rep(nsys_bin: str, tmp_path: Path) -> None:  # noqa: F811
    d = run_dir(tmp_path, None, arm="fix", num_steps=3)
    profile(nsys_bin, d / "profile", ["--pattern", "fix", "--rounds", "4", "--num-steps", "3", "--decoys"])
    v = analyze(d)
    assert (d / "profile.sqlite").exists()  # exported into the run dir, as a new file
    assert v["report"]["exported_from"] == str(d / "profile.nsys-rep")
    assert v["status"] == "pass" and v["launches_per_round"] == [1] * 4


@pytest.mark.nsys
def test_live_bug_and_fix_runs(live_reports, tmp_path: Path) -> None:  # noqa: F811
    for arm in ("bug", "fix"):
        db = live_reports("--pattern", arm, "--rounds", "6", "--num-steps", "5", "--decoys")
        v = analyze(db, tmp_path / arm, arm=arm, num_steps=5, context_len=8192)
        assert v["status"] == "pass", v
        assert v["launches_per_round"] == ([4] if arm == "bug" else [1]) * 6
        wrong = analyze(db, tmp_path / f"{arm}-as-other", arm="fix" if arm == "bug" else "bug", num_steps=5)
        assert wrong["status"] == "fail"


def test_timeline_png(tmp_path: Path) -> None:
    d = run_dir(tmp_path, BUG)
    png = timeline_png(d, tmp_path / "t.png", round_index=2)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(KitError, match="already exists"):
        timeline_png(d, tmp_path / "t.png")
    with pytest.raises(KitError, match="no round 99"):
        timeline_png(d, tmp_path / "t99.png", round_index=99)


def test_timeline_png_with_kernels_synthetic_schema(tmp_path: Path) -> None:
    db = draft_loop_graph(tmp_path / "g.sqlite", "bug", num_steps=4, rounds=2)
    png = timeline_png(db, tmp_path / "g.png")
    assert png.stat().st_size > 1000


def test_errors_are_typed(tmp_path: Path) -> None:
    """Refusing to overwrite: ExistsError naming the file; bad parameters: UsageError."""
    d = run_dir(tmp_path, BUG)
    analyze(d)
    with pytest.raises(ExistsError) as err:
        analyze(d)
    assert err.value.path == d / "rounds.csv"
    with pytest.raises(UsageError, match="unknown attribution method"):
        analyze(d, tmp_path / "o1", method="magic")
    with pytest.raises(UsageError, match="needs --num-steps"):
        analyze(BUG, tmp_path / "o2", arm="bug")
    with pytest.raises(UsageError, match="no round 99"):
        timeline_png(d, tmp_path / "t.png", round_index=99)
