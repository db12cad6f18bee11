"""kit.analysis.analyze: run dir or bare report -> rounds.csv + verdict.json (never overwritten), timeline."""

from __future__ import annotations

import csv
import json
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kineto_synth import drop_ranges as kineto_drop_ranges
from nsys_helpers import FIXTURES, WORKLOAD, drop_ranges, live_reports, nsys_bin, profile  # noqa: F401
from packed_helpers import plain
from synthetic_schema import draft_loop_graph

from kit.analysis.analyze import analyze
from kit.analysis.rounds import ROUND_COLUMNS
from kit.analysis.timeline import timeline_png
from kit.errors import ExistsError, InputError, KitError, TraceError, UsageError
from kit.trace.registry import open_trace

BUG = plain(FIXTURES / "nsys2022.4_kit_bug_steps4.sqlite.xz")
DROPPED = plain(FIXTURES / "nsys2022.4_nvtx0.2.14_dropped.sqlite.xz")


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
    with pytest.raises(
        KitError, match="holds no profile.sqlite, profile.sqlite.xz, profile.nsys-rep or recorder.sqlite"
    ):
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


# ---- an unfinished run is never a pass; exit codes; re-analysis; what is checked first ---------------


def _cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "kit.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_an_interrupted_run_is_never_a_pass(tmp_path: Path) -> None:
    """Issue 14.1: Ctrl-C during `kit run` leaves error.json beside a report whose rounds all look right."""
    from kit.rundir import write_error

    d = run_dir(tmp_path, BUG)
    write_error(d, "profile", KeyboardInterrupt(), "nsys: Generated profile.nsys-rep")
    res = _cli("analyze", str(d))
    assert res.returncode == 3, res.stderr
    v = json.loads(res.stdout)
    assert v["status"] == "inconclusive" and v["passed"] is False and v["launches_per_round"] == [3] * 5
    assert v["meaning"].startswith("inconclusive: the run did not finish (profile stage: KeyboardInterrupt")
    assert "error.json" in v["meaning"]
    assert res.stderr.strip().splitlines() == [f"kit analyze: {v['meaning']}"]


def _outputs(d: Path, *verify: int) -> None:
    rows = [
        {"prompt_id": i, "output_ids": [1] * 12, "completion_tokens": 12, "spec_verify_ct": n}
        for i, n in enumerate(verify)
    ]
    (d / "outputs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_fewer_rounds_than_the_run_took_is_inconclusive(tmp_path: Path) -> None:
    """mini: all requests decode as one batch, so the report must hold max(spec_verify_ct) rounds (5 here)."""
    d = run_dir(tmp_path, BUG, max_new_tokens=12)
    _outputs(d, 3, 5)
    assert analyze(d)["status"] == "pass"
    _outputs(d, 4, 9)
    v = analyze(d, tmp_path / "o1")
    assert (
        v["status"] == "inconclusive"
        and "holds 5 draft round(s) per process where the run took 9" in (v["meaning"])
    )
    # no outputs (the engine never finished): at least ceil((96 - 1) / (4 + 1)) rounds
    (tmp_path / "b").mkdir()
    v = analyze(run_dir(tmp_path / "b", BUG, max_new_tokens=96), tmp_path / "o2")
    assert v["status"] == "inconclusive" and "where the run took 19" in v["meaning"]


def test_sglang_window_short_of_profile_steps_is_a_warning(tmp_path: Path) -> None:
    """sglang's window counts forwards, not rounds: no count is implied, a short window is only said."""
    v = analyze(run_dir(tmp_path, BUG, backend="sglang", profile_steps=10))
    assert v["status"] == "pass"
    assert any("5 draft round(s) in the profile window of 10 forwards" in w for w in v["warnings"])


def test_exit_codes(tmp_path: Path) -> None:
    """Issue 14.3: pass 0, fail 1, inconclusive 3, error 2."""
    d = run_dir(tmp_path, BUG)
    assert _cli("analyze", str(d)).returncode == 0
    fail = _cli("analyze", str(d), "--arm", "fix", "--out", str(tmp_path / "o1"))
    assert fail.returncode == 1 and "fix arm FAILED" in fail.stderr
    nope = _cli("analyze", str(d), "--domain", "nope", "--out", str(tmp_path / "o2"))
    assert nope.returncode == 3 and json.loads(nope.stdout)["status"] == "inconclusive"
    assert _cli("analyze", str(tmp_path / "missing")).returncode == 2


def test_force_moves_the_earlier_analysis_aside(tmp_path: Path) -> None:
    d = run_dir(tmp_path, BUG)
    first = analyze(d)
    (d / "timeline.png").write_bytes(b"png")
    with pytest.raises(ExistsError, match="--force"):
        analyze(d)
    again = analyze(d, method="nvtx", force=True)
    aside = d / "analysis.superseded"
    assert sorted(p.name for p in aside.iterdir()) == ["rounds.csv", "timeline.png", "verdict.json"]
    assert json.loads((aside / "verdict.json").read_text())["analysis_s"] == first["analysis_s"]
    assert again["status"] == "pass" and "moved to analysis.superseded/" in again["warnings"][-1]
    res = _cli("analyze", str(d), "--force")
    assert res.returncode == 0 and (d / "analysis.superseded-1" / "verdict.json").is_file()
    assert not (d / "analysis.superseded-1" / "timeline.png").exists()


def test_a_bare_file_is_checked_before_its_options(tmp_path: Path) -> None:
    """Issue 14.8: junk is refused as junk, not asked for --arm/--num-steps."""
    junk = tmp_path / "junk.txt"
    junk.write_text("not a report\n")
    with pytest.raises(TraceError, match="not a SQLite database"):
        analyze(junk)
    res = _cli("analyze", str(junk))
    assert res.returncode == 2 and "not a SQLite database" in res.stderr and "--arm" not in res.stderr


def test_out_naming_a_file_is_one_line(tmp_path: Path) -> None:
    """Issue 14.6."""
    d = run_dir(tmp_path, BUG)
    (tmp_path / "afile").write_text("")
    with pytest.raises(InputError, match="is a file, not a folder"):
        analyze(d, tmp_path / "afile")
    res = _cli("analyze", str(d), "--out", str(tmp_path / "afile" / "sub"))
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (d / "verdict.json").exists()


# ---- a 0 needs evidence: indexer ranges that were recorded; a run that stopped is judged by its record ---

H200_MINI = FIXTURES / "h200_mini"
KINETO = FIXTURES / "kineto"
# real reports, one per range-counting method: (report, num_steps, the method auto picks)
COUNTED_BY_RANGES = [
    (BUG, 4, "nvtx"),
    (plain(H200_MINI / "tiny-bug-ctx8192-eager" / "profile.sqlite.xz"), 5, "eager"),
    (plain(H200_MINI / "tiny-bug-ctx8192-graph" / "profile.sqlite.xz"), 5, "graph"),
    (KINETO / "mini_cpu_bug.trace.json.gz", 5, "nvtx"),
    (KINETO / "synth_eager_bug.trace.json.gz", 5, "eager"),
]


def _without(report: Path, tmp_path: Path, name: str, inside: str | None = None) -> Path:
    """The report without its `name` ranges (those inside `inside` ranges only, when given)."""
    out = tmp_path / f"no-{name}-{report.name}"
    if report.name.endswith(".json.gz"):
        assert inside is None
        return kineto_drop_ranges(report, out, (name,))
    return drop_ranges(report, out, name, inside)


@pytest.mark.parametrize(
    ("report", "steps", "method"), COUNTED_BY_RANGES, ids=lambda x: getattr(x, "name", x)
)
def test_no_indexer_range_anywhere_is_inconclusive_for_every_arm(
    tmp_path: Path, report: Path, steps: int, method: str
) -> None:
    """Every round then reads 0, which for bug and off is "NOT reproduced", for fix a failure, and which
    upstream (0 per round on sglang 0.5.15+) would pass: nothing tells 0 launches from ranges never
    recorded, so nothing is judged, and the message names the ranges the report does hold."""
    bare = _without(report, tmp_path, "indexer")
    for arm in ("bug", "off", "fix", "upstream"):
        v = analyze(bare, tmp_path / arm, arm=arm, num_steps=steps)
        assert v["status"] == "inconclusive" and v["method"] == method, (arm, v["meaning"])
        assert (
            "no 'indexer' range anywhere in the report" in v["meaning"] and "draft_round x " in v["meaning"]
        )
    # the same on a run: upstream on the sglang backend expects 0 per round
    run = run_dir(
        tmp_path,
        bare,
        "profile.sqlite" if bare.suffix == ".sqlite" else "profile.trace.json.gz",
        backend="sglang",
        arm="upstream",
        num_steps=steps,
    )
    v = analyze(run)
    assert v["expected_per_round"] == 0 and v["status"] == "inconclusive", v["meaning"]


def test_a_range_name_that_matches_nothing_names_the_ranges_present(tmp_path: Path) -> None:
    d = run_dir(tmp_path, BUG)
    v = analyze(d, tmp_path / "o1", indexer_range="idx")
    assert v["status"] == "inconclusive" and "no 'idx' range anywhere in the report" in v["meaning"]
    assert "indexer x 39" in v["meaning"] and v["launches_per_round"] == [0] * 5
    v = analyze(d, tmp_path / "o2", round_range="round")
    assert v["status"] == "inconclusive" and "no 'round' rounds found" in v["meaning"]
    assert "draft_round x 5" in v["meaning"]
    res = _cli("analyze", str(d), "--indexer-range", "idx", "--out", str(tmp_path / "o3"))
    assert res.returncode == 3 and "draft_extend x 5, draft_round x 5" in res.stderr


def test_indexer_ranges_outside_the_rounds_are_the_evidence_a_zero_needs(tmp_path: Path) -> None:
    """sglang 0.5.15+ runs the indexer in draft_extend and verify, none in the draft loop: 0 per round is then
    a measurement (upstream passes, bug fails), as the indexer ranges elsewhere prove they were recorded."""
    for report, steps, _ in COUNTED_BY_RANGES[:3]:
        bare = _without(report, tmp_path, "indexer", inside="draft_step")
        v = analyze(bare, tmp_path / f"bug-{report.parent.name}", arm="bug", num_steps=steps)
        assert v["status"] == "fail" and set(v["launches_per_round"]) == {0}, v["meaning"]
        (tmp_path / report.parent.name).mkdir()
        up = run_dir(tmp_path / report.parent.name, bare, backend="sglang", arm="upstream", num_steps=steps)
        v = analyze(up)
        assert v["status"] == "pass" and v["expected_per_round"] == 0, v["meaning"]


def test_graph_replays_counted_by_kernel_name_need_no_indexer_range(tmp_path: Path) -> None:
    """A Kineto trace of CUDA-graph rounds has no indexer range at all (they exist at capture time, before
    the window): its rounds are counted by kernel name, which the rule leaves alone."""
    with open_trace(KINETO / "synth_graph_bug.trace.json.gz") as t:
        assert not t.has_range("pr29654", "indexer")
    v = analyze(KINETO / "synth_graph_bug.trace.json.gz", tmp_path, arm="bug", num_steps=5)
    assert v["method"] == "replay" and v["status"] == "pass"


def test_a_stopped_run_without_a_readable_report_is_inconclusive(tmp_path: Path) -> None:
    """Ctrl-C before the profiler wrote its report (or while it wrote it): the run's error.json is what
    says why, so the answer is inconclusive (3), not "holds no profile" (2)."""
    from kit.rundir import write_error

    d = run_dir(tmp_path, None)
    write_error(d, "profile", KeyboardInterrupt(), "")
    v = analyze(d)
    assert v["status"] == "inconclusive" and v["report"] is None and v["num_rounds"] == 0
    assert v["meaning"].startswith("inconclusive: the run did not finish (profile stage: KeyboardInterrupt")
    assert (d / "rounds.csv").read_text().splitlines() == [",".join(ROUND_COLUMNS)]
    (d / "profile.sqlite").write_bytes(BUG.read_bytes()[:50_000])  # cut short
    v = analyze(d, tmp_path / "o1")
    assert v["status"] == "inconclusive" and "its report cannot be read" in " ".join(v["warnings"])
    res = _cli("analyze", str(d), "--out", str(tmp_path / "o2"))
    assert res.returncode == 3 and res.stderr.startswith("kit analyze: inconclusive: the run did not finish")
    # a run that finished is held to its report: the same cut report is an error
    (d / "error.json").unlink()
    with pytest.raises(TraceError, match="truncated"):
        analyze(d, tmp_path / "o3")


def test_a_pass_says_its_warnings_on_stderr(tmp_path: Path) -> None:
    """A bare report of an interrupted run: its last round never closed and is left out, which a pass on the
    other rounds must say where it is read, not only inside verdict.json."""
    cut = tmp_path / "cut.sqlite"
    shutil.copy(BUG, cut)
    with open_trace(BUG) as t:
        last = int(t.range_columns("pr29654", "draft_round")[1].max())
    with sqlite3.connect(cut) as con:
        assert con.execute("UPDATE NVTX_EVENTS SET end = NULL WHERE start = ?", (last,)).rowcount == 1
    res = _cli("analyze", str(cut), "--arm", "bug", "--num-steps", "4")
    assert res.returncode == 0 and json.loads(res.stdout)["launches_per_round"] == [3] * 4
    assert "kit analyze: warning: 1 unclosed 'draft_round' range(s)" in res.stderr
