"""Real sglang 0.5.14 runs on an H200 (nsys 2025.3.1), bug (0.5.14) and fix (0.5.14+pr29654), so bug =
num_steps - 1 indexer runs per draft round and fix = 1. Three series:
- `eager`, `graph`: EAGLE 5/1/6 at 4k context (4 per round in the bug arm), trimmed to 8 draft rounds;
  the two builds' greedy outputs diverge (random-weight checkpoint with near-ties), so the gate fails on
  outputs and only on outputs;
- `steps3`: EAGLE 3/1/4 with CUDA graphs at 16k context (2 per round in the bug arm), a checkpoint whose
  greedy choices have a margin: outputs identical, the gate passes. Trimmed to 16 draft rounds, of which
  the first 12 precede the probe's `profile_window_start` mark (warm-up), so an analysis keeps 4.

Each method on its own and against the others: the NVTX attribution (eager / graph), the NVTX-free
classifier, and the compare gate. Fixture provenance: tests/fixtures/h200_sglang/README.md.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from packed_helpers import plain, plain_run

from kit.analysis.analyze import analyze
from kit.analysis.attribution import attribute, choose_method
from kit.cli import main as kit_main
from kit.compare.runs import compare_runs, equivalence, gate_failures
from kit.paths import REPO
from kit.trace.registry import open_trace

FIXTURES = REPO / "tests" / "fixtures" / "h200_sglang"
ARMS = ("bug", "fix")


@dataclass(frozen=True)
class Series:
    mode: str  # eager / graph: CUDA graphs off / on, and the NVTX attribution auto picks
    num_steps: int  # --speculative-num-steps
    context_len: int
    trimmed_rounds: int  # draft rounds left in profile.sqlite (scripts/trim_fixture.py --rounds)
    rounds: int  # of those, the rounds an analysis keeps (from the profile window's start mark on)
    warmup_rounds: int = 0  # rounds before that mark


SERIES = {
    "eager": Series("eager", 5, 4096, 8, 8),
    "graph": Series("graph", 5, 4096, 8, 8),
    "steps3": Series("graph", 3, 16384, 20, 8, warmup_rounds=12),
}
GRAPH_SERIES = tuple(k for k, v in SERIES.items() if v.mode == "graph")
# The 4k pairs' outputs diverge (the gate fails on outputs); the steps3 pair's are identical.
DIVERGENT, IDENTICAL = ("eager", "graph"), ("steps3",)


def expected(series: str, arm: str) -> int:
    """Indexer launches per draft round: the bug re-runs the indexer in each of num_steps - 1 draft
    forwards, the fix runs it once."""
    return SERIES[series].num_steps - 1 if arm == "bug" else 1


def run_name(series: str, arm: str) -> str:
    return f"{series}-{arm}-ctx{SERIES[series].context_len}"


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """Copies of the committed run directories analysed by the auto method (verdict.json in the run dir)
    and by the classifier (in RUN/classifier), like `kit analyze` and `kit analyze --method classifier`."""
    root = tmp_path_factory.mktemp("h200_sglang")
    out = {}
    for series in SERIES:
        for arm in ARMS:
            run = shutil.copytree(FIXTURES / run_name(series, arm), root / run_name(series, arm))
            analyze(run)
            analyze(run, run / "classifier", method="classifier")
            out[(series, arm)] = run
    return out


def verdict(run: Path, sub: str = "") -> dict:
    return json.loads((run / sub / "verdict.json").read_text())


def rounds(run: Path, sub: str = "") -> pd.DataFrame:
    return pd.read_csv(run / sub / "rounds.csv")


# ---- the fixtures themselves --------------------------------------------------------------------


@pytest.mark.parametrize("series", SERIES)
@pytest.mark.parametrize("arm", ARMS)
def test_fixture_layout(series: str, arm: str) -> None:
    s, run = SERIES[series], FIXTURES / run_name(series, arm)
    params = json.loads((run / "params.json").read_text())
    assert params["backend"] == "sglang" and params["arm"] == arm
    assert params["num_steps"] == s.num_steps and params["cuda_graph"] == (s.mode == "graph")
    assert params["context_len"] == s.context_len
    assert plain(run / "profile.sqlite.xz").stat().st_size < 2_000_000
    prov = json.loads((run / "provenance.json").read_text())
    assert prov["gpu"]["name"] == "NVIDIA H200"
    assert prov["sglang"]["state"]["state"] == arm
    con = sqlite3.connect(f"file:{plain(run / 'profile.sqlite.xz')}?mode=ro", uri=True)
    env = con.execute("SELECT COUNT(*) FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT%'").fetchone()
    marks = con.execute(
        "SELECT s.value, n.start FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId "
        "WHERE s.value IN ('draft_round', 'profile_window_start') ORDER BY n.start"
    ).fetchall()
    con.close()
    assert env == (0,)  # the host's environment was scrubbed
    names = [m[0] for m in marks]
    assert names.count("draft_round") == s.trimmed_rounds
    if s.warmup_rounds:
        # The trim kept the probe's window mark (a cut at or before it would leave only warm-up rounds,
        # and nothing to tell an analysis so).
        assert names.count("profile_window_start") == 1
        assert names.index("profile_window_start") == s.warmup_rounds
    else:
        assert "profile_window_start" not in names  # written before the probe marked the window


# ---- NVTX attribution (auto) --------------------------------------------------------------------


@pytest.mark.parametrize("series", SERIES)
@pytest.mark.parametrize("arm", ARMS)
def test_auto_method_counts(analysed, series: str, arm: str) -> None:
    s = SERIES[series]
    v = verdict(analysed[(series, arm)])
    assert v["method"] == s.mode and v["source"] == "nsys"
    assert v["expected_per_round"] == expected(series, arm)
    assert v["launches_per_round"] == [expected(series, arm)] * s.rounds
    assert v["status"] == "pass" and v["passed"]
    r = rounds(analysed[(series, arm)])
    assert set(r["draft_forwards"]) == {s.num_steps - 1}  # the bug changes indexer runs, not forwards
    # One indexer call is 12 (eager) / 13 (graph) kernels inside its NVTX range in sglang 0.5.14.
    per_call = {"eager": 12, "graph": 13}[s.mode]
    assert set(r["indexer_kernels"]) == {expected(series, arm) * per_call}
    window = [w for w in v["warnings"] if "before the profile window's start mark" in w]
    if s.warmup_rounds:
        assert len(window) == 1 and window[0].startswith(f"{s.warmup_rounds} draft round(s) ")
    else:
        assert not window


# ---- the classifier (no NVTX) -------------------------------------------------------------------


@pytest.mark.parametrize("series", GRAPH_SERIES)
@pytest.mark.parametrize("arm", ARMS)
def test_classifier_agrees_with_graph_attribution(analysed, series: str, arm: str) -> None:
    s, run = SERIES[series], analysed[(series, arm)]
    graph, cls = verdict(run), verdict(run, "classifier")
    assert graph["method"] == "graph"
    assert cls["method"] == "classifier" and cls["status"] == "pass" and cls["passed"]
    assert cls["launches_per_round"] == graph["launches_per_round"] == [expected(series, arm)] * s.rounds
    # The same rounds: each classifier round (GPU span of one draft-graph replay) starts after the NVTX
    # round that launched it and before the next one.
    g, c = rounds(run), rounds(run, "classifier")
    starts = g["start_ns"].tolist() + [float("inf")]
    assert all(lo <= s < hi for s, lo, hi in zip(c["start_ns"], starts[:-1], starts[1:], strict=True))
    assert set(c["draft_forwards"]) == {s.num_steps - 1}
    # Name-matched kernels per call: hadamard x2, k-cache store, act_quant, logits, top-k transform (the
    # MoE router's deepseek_v3_topk_kernel must not count); the metadata kernel runs outside the graph.
    assert set(c["indexer_kernels"]) == {expected(series, arm) * 6}
    # The target-verify graph (80 kernels, 2 indexer calls, one forward) is left out, and said so.
    assert any("left out" in w and "80 kernels" in w for w in cls["warnings"])


@pytest.mark.parametrize("series", GRAPH_SERIES)
@pytest.mark.parametrize("arm", ARMS)
def test_classifier_reads_no_nvtx(tmp_path: Path, series: str, arm: str) -> None:
    """The same counts from a copy whose NVTX_EVENTS table is gone: auto then picks the classifier. (The
    window mark is NVTX too, so every draft-loop replay in the report counts, warm-up ones included.)"""
    db = tmp_path / "no_nvtx.sqlite"
    shutil.copyfile(plain(FIXTURES / run_name(series, arm) / "profile.sqlite.xz"), db)
    con = sqlite3.connect(db)
    con.execute("DROP TABLE NVTX_EVENTS")
    con.commit()
    con.close()
    with open_trace(db) as t:
        assert choose_method(t) == "classifier"
        att = attribute(t)
    assert att.method == "classifier" and att.inconclusive is None
    assert att.rows.column("indexer_launches") == [expected(series, arm)] * SERIES[series].trimmed_rounds


@pytest.mark.parametrize("arm", ARMS)
def test_classifier_on_eager_runs_is_inconclusive(analysed, arm: str) -> None:
    """Without CUDA graphs nothing NVTX-free delimits a draft round: inconclusive, never a count."""
    cls = verdict(analysed[("eager", arm)], "classifier")
    assert cls["status"] == "inconclusive" and not cls["passed"]
    assert cls["launches_per_round"] == []
    assert "no cudaGraphLaunch calls" in cls["meaning"]


@pytest.mark.parametrize("series", GRAPH_SERIES)
def test_classifier_graph_kernels_override(series: str) -> None:
    """graph_kernels=80 picks the target-verify graph instead: its 2 indexer calls (2 DSA layers)."""
    with open_trace(FIXTURES / run_name(series, "bug") / "profile.sqlite.xz") as t:
        att = attribute(t, "classifier", graph_kernels=80)
    n = SERIES[series].trimmed_rounds
    assert att.rows.column("indexer_launches") == [2] * n
    assert att.rows.column("draft_forwards") == [1] * n


# ---- the gate -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", DIVERGENT)
def test_gate_passes_launches_fails_on_outputs(analysed, mode: str) -> None:
    result = compare_runs(analysed[(mode, "bug")], analysed[(mode, "fix")])
    assert result["a"]["launches_per_round"] == [4] and result["b"]["launches_per_round"] == [1]
    failures = gate_failures(result)
    assert failures and all(f.startswith("greedy outputs differ") for f in failures)
    assert not any("launches" in f for f in failures)


def _logprob_fields_ok(outputs: dict) -> None:
    """compare's logprob agreement: both fields present and finite (the runs returned logprobs)."""
    for key in ("logprob_max_abs_diff", "min_margin"):
        assert isinstance(outputs[key], float) and math.isfinite(outputs[key]), key
    assert outputs["logprob_max_abs_diff"] >= 0 and outputs["min_margin"] > 0
    for r in outputs["requests"]:
        assert r["logprob_max_abs_diff"] is not None and r["min_margin"] is not None


@pytest.mark.parametrize("series", IDENTICAL)
def test_gate_passes_with_identical_outputs(analysed, series: str) -> None:
    """The steps3 pair: launches 2 vs 1 per round by the graph attribution, all 4 greedy outputs identical,
    the same accept length, and the fix's draft loop faster on the GPU: the gate passes."""
    result = compare_runs(analysed[(series, "bug")], analysed[(series, "fix")])
    a, b = result["a"], result["b"]
    assert (a["arm"], b["arm"]) == ARMS and a["method"] == b["method"] == "graph"
    assert a["launches_per_round"] == [expected(series, "bug")] == [2]
    assert b["launches_per_round"] == [expected(series, "fix")] == [1]
    assert a["num_rounds"] == b["num_rounds"] == SERIES[series].rounds
    assert gate_failures(result) == []
    o = result["outputs"]
    assert o["all_identical"] and o["n_identical"] == o["n_requests"] == 4 and o["match_rate"] == 1.0
    assert o["first_divergence"] is None and o["divergence_margins"] == []
    _logprob_fields_ok(o)
    # Same tokens, yet the two builds' logprobs of them differ (up to 0.28 nats): less than the smallest
    # top-1/top-2 margin either run had (0.75), which is why this checkpoint's greedy choices agree.
    assert o["logprob_max_abs_diff"] == pytest.approx(0.2752, abs=1e-4)
    assert o["min_margin"] == pytest.approx(0.75)
    assert o["logprob_max_abs_diff"] < o["min_margin"]
    assert a["accept_length"] == b["accept_length"] == 4.0 and result["accept_length_diff_b_minus_a"] == 0
    assert a["draft_step_basis"] == b["draft_step_basis"] == "gpu"
    assert result["draft_step_ratio_a_over_b"] > 1.05  # one indexer call less per round


def test_gate_names_the_margin_where_outputs_split(analysed, tmp_path: Path) -> None:
    """A fix run whose request 2 took another token at position 40, where both runs were 0.02 nats from
    a tie: the gate fails on outputs and its message carries that margin (what tells rounding from a bug)."""
    fix = shutil.copytree(analysed[("steps3", "fix")], tmp_path / "fix")
    rows = [json.loads(line) for line in (fix / "outputs.jsonl").read_text().splitlines()]
    rows[2]["output_ids"][40] += 1
    rows[2]["output_margins"][40] = 0.02
    (fix / "outputs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    bug = json.loads((analysed[("steps3", "bug")] / "outputs.jsonl").read_text().splitlines()[2])
    result = compare_runs(analysed[("steps3", "bug")], fix)
    margin = min(bug["output_margins"][40], 0.02)
    assert result["outputs"]["divergence_margins"] == [margin]
    assert gate_failures(result) == [
        f"greedy outputs differ: 3/4 requests identical, first divergence at token 40 "
        f"(top-2 logprob margins there: {margin:.3f})"
    ]


@pytest.mark.parametrize("method", ["auto", "classifier"])
@pytest.mark.parametrize("series", GRAPH_SERIES)
def test_gate_cli(analysed, tmp_path: Path, capsys, series: str, method: str) -> None:
    """`kit compare --gate` on the graph pairs, analysed by the default method and by the classifier
    alone: the same launch outcome either way; exit 1 on the 4k pair (outputs only), 0 on steps3."""
    runs = []
    for arm in ARMS:
        run = tmp_path / arm
        shutil.copytree(analysed[(series, arm)], run, ignore=shutil.ignore_patterns("*.csv", "*.json"))
        shutil.copyfile(analysed[(series, arm)] / "params.json", run / "params.json")
        shutil.rmtree(run / "classifier")
        analyze(run, method=method)
        runs.append(str(run))
    rc = kit_main(["compare", "--gate", *runs])
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["a"]["method"] == ("graph" if method == "auto" else "classifier") == result["b"]["method"]
    assert result["a"]["launches_per_round"] == [expected(series, "bug")]
    assert result["b"]["launches_per_round"] == [expected(series, "fix")]
    assert "indexer launches" not in err
    if series in IDENTICAL:
        assert rc == 0 and "GATE FAILED" not in err
        assert result["outputs"]["all_identical"]
        _logprob_fields_ok(result["outputs"])
    else:
        assert rc == 1 and "GATE FAILED: greedy outputs differ" in err


@pytest.mark.parametrize("series", GRAPH_SERIES)
def test_gate_catches_a_bug_build_labelled_fix(analysed, tmp_path: Path, series: str) -> None:
    """The launch gate can fail: the bug build's report analysed as if it were the fix arm."""
    run = shutil.copytree(FIXTURES / run_name(series, "bug"), tmp_path / "relabelled")
    params = json.loads((run / "params.json").read_text())
    (run / "params.json").write_text(json.dumps({**params, "arm": "fix"}))
    analyze(run)
    failures = gate_failures(compare_runs(analysed[(series, "bug")], run))
    bug = expected(series, "bug")
    assert any(f"indexer launches per round [{bug}]" in f and "expected exactly 1" in f for f in failures)


def test_outputs_diverge_for_numerical_reasons_not_the_patch() -> None:
    """Why the gate fails on outputs here: the same build diverges between eager and graph mode, and a
    fix/bug pair in different modes can match exactly (random-weight checkpoint, near-tie logits)."""

    def outputs(mode: str, arm: str) -> list[dict]:
        return equivalence.read_outputs(FIXTURES / run_name(mode, arm) / "outputs.jsonl")

    def by_prompt(result: dict) -> dict[int, dict]:
        return {r["prompt_id"]: r for r in result["requests"]}

    same_build = by_prompt(equivalence.compare_runs(outputs("eager", "bug"), outputs("graph", "bug")))
    assert not same_build[1]["identical"] and same_build[1]["first_divergence"] == 58
    cross = by_prompt(equivalence.compare_runs(outputs("eager", "fix"), outputs("graph", "bug")))
    assert cross[1]["identical"]


# ---- the trimming script ------------------------------------------------------------------------


def _trim_module():
    spec = importlib.util.spec_from_file_location("trim_fixture", REPO / "scripts" / "trim_fixture.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(REPO / "scripts"))  # as `python scripts/trim_fixture.py` has it
        spec.loader.exec_module(mod)
    return mod


def test_trim_script_writes_a_packed_fixture_whole_or_nothing(tmp_path: Path, capsys) -> None:
    """The script as a user runs it: a packed fixture that analyses to its arm's count; a source without a
    report, a destination already there, a report with no draft rounds: one line each, exit 2, and no
    destination or half-built folder left."""
    trim = _trim_module()
    dst = tmp_path / "fixture"
    assert trim.main([str(FIXTURES / run_name("graph", "fix")), str(dst), "--rounds", "3"]) == 0
    assert sorted(p.name for p in dst.iterdir()) == sorted([*trim.RUN_FILES, "profile.sqlite.xz"])
    analyze(dst)
    assert json.loads((dst / "verdict.json").read_text())["launches_per_round"] == [1] * 3
    no_rounds = tmp_path / "no-rounds"
    no_rounds.mkdir()
    dropped = REPO / "tests" / "fixtures" / "nsys2022.4_nvtx0.2.14_dropped.sqlite.xz"  # no ranges recorded
    shutil.copyfile(dropped, no_rounds / "profile.sqlite.xz")
    capsys.readouterr()
    for src, out, why in (
        (tmp_path / "nothing", tmp_path / "a", "holds no profile.sqlite[.xz]"),
        (FIXTURES / run_name("graph", "fix"), dst, "exists: refusing to overwrite it"),
        (no_rounds, tmp_path / "b", "no pr29654/draft_round ranges"),
    ):
        assert trim.main([str(src), str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert why in err and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fixture", "no-rounds"]  # nothing half-built


def test_trim_script_is_deterministic_and_keeps_counts(tmp_path: Path) -> None:
    trim = _trim_module()
    src = plain(FIXTURES / run_name("graph", "bug") / "profile.sqlite.xz")
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    counts = trim.trim_report(src, a, 3)
    trim.trim_report(src, b, 3)
    assert counts["draft_rounds"] == 3
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()
    with open_trace(a) as t:
        assert attribute(t).rows.column("indexer_launches") == [4] * 3
        assert attribute(t, "classifier").rows.column("indexer_launches") == [4] * 3


def test_trim_script_counts_rounds_from_the_profile_window_mark(tmp_path: Path) -> None:
    """A CUDA-graph report starts at capture: `--rounds N` keeps the warm-up rounds before the probe's mark
    and N rounds after it, so the trimmed report still has N rounds for the analysis to count."""
    trim = _trim_module()
    cut = tmp_path / "cut.sqlite"
    counts = trim.trim_report(plain(FIXTURES / run_name("steps3", "bug") / "profile.sqlite.xz"), cut, 3)
    assert counts["draft_rounds"] == SERIES["steps3"].warmup_rounds + 3
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / run_name("steps3", "bug"), run)
    shutil.copyfile(cut, run / "profile.sqlite")
    analyze(run)
    assert json.loads((run / "verdict.json").read_text())["launches_per_round"] == [2] * 3


def test_rounds_before_the_profile_window_mark_are_left_out(tmp_path: Path) -> None:
    """With CUDA graphs the report starts at capture, so warm-up rounds precede sglang's window; the probe's
    `profile_window_start` mark (here placed before the 5th round of a real report) bounds the analysis."""
    import sqlite3

    from kit.analysis.analyze import analyze

    run = plain_run(FIXTURES / run_name("graph", "bug"), tmp_path / "run")
    con = sqlite3.connect(run / "profile.sqlite")
    rows = con.execute(
        "SELECT n.rowid, n.start FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId "
        "WHERE s.value = 'draft_round' ORDER BY n.start"
    ).fetchall()
    assert len(rows) == 8
    text_id = con.execute("SELECT MAX(id) + 1 FROM StringIds").fetchone()[0]
    con.execute("INSERT INTO StringIds (id, value) VALUES (?, 'profile_window_start')", (text_id,))
    mark = rows[4][1] - 1000
    con.execute(
        "INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, textId, domainId) "
        "SELECT ?, ?, eventType, globalTid, ?, domainId FROM NVTX_EVENTS WHERE rowid = ?",
        (mark, mark + 500, text_id, rows[0][0]),
    )
    con.commit()
    con.close()
    v = analyze(run, tmp_path / "out")
    assert v["num_rounds"] == 4 and set(v["launches_per_round"]) == {4} and v["status"] == "pass"
    assert any("4 draft round(s) before the profile window's start mark" in w for w in v["warnings"])
