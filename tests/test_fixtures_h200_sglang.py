"""Real sglang 0.5.14 runs on an H200 (nsys 2025.3.1), trimmed to 8 draft rounds: eager and CUDA graph,
bug (0.5.14) and fix (0.5.14+pr29654), EAGLE 5/1/6, so bug = num_steps - 1 = 4 indexer runs per round.

Each method on its own and against the others: the NVTX attribution (eager / graph), the NVTX-free
classifier, and the compare gate. Fixture provenance: tests/fixtures/h200_sglang/README.md.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from kit import equivalence
from kit.analyze import analyze
from kit.cli import main as kit_main
from kit.compare import compare_runs, gate_failures
from kit.rounds import attribute, choose_method
from kit.trace import open_trace

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "h200_sglang"
MODES, ARMS = ("eager", "graph"), ("bug", "fix")
NUM_STEPS = 5
EXPECTED = {"bug": NUM_STEPS - 1, "fix": 1}
ROUNDS = 8


def run_name(mode: str, arm: str) -> str:
    return f"{mode}-{arm}-ctx4096"


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """Copies of the committed run directories analysed by the auto method (verdict.json in the run dir)
    and by the classifier (in RUN/classifier), like `kit analyze` and `kit analyze --method classifier`."""
    root = tmp_path_factory.mktemp("h200_sglang")
    out = {}
    for mode in MODES:
        for arm in ARMS:
            run = shutil.copytree(FIXTURES / run_name(mode, arm), root / run_name(mode, arm))
            analyze(run)
            analyze(run, run / "classifier", method="classifier")
            out[(mode, arm)] = run
    return out


def verdict(run: Path, sub: str = "") -> dict:
    return json.loads((run / sub / "verdict.json").read_text())


def rounds(run: Path, sub: str = "") -> pd.DataFrame:
    return pd.read_csv(run / sub / "rounds.csv")


# ---- the fixtures themselves --------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("arm", ARMS)
def test_fixture_layout(mode: str, arm: str) -> None:
    run = FIXTURES / run_name(mode, arm)
    params = json.loads((run / "params.json").read_text())
    assert params["backend"] == "sglang" and params["arm"] == arm
    assert params["num_steps"] == NUM_STEPS and params["cuda_graph"] == (mode == "graph")
    assert (run / "profile.sqlite").stat().st_size < 2_000_000
    prov = json.loads((run / "provenance.json").read_text())
    assert prov["gpu"]["name"] == "NVIDIA H200"
    assert prov["sglang"]["state"]["state"] == arm
    con = sqlite3.connect(f"file:{run / 'profile.sqlite'}?mode=ro", uri=True)
    env = con.execute("SELECT COUNT(*) FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT%'").fetchone()
    con.close()
    assert env == (0,)  # the host's environment was scrubbed


# ---- NVTX attribution (auto) --------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("arm", ARMS)
def test_auto_method_counts(analysed, mode: str, arm: str) -> None:
    v = verdict(analysed[(mode, arm)])
    assert v["method"] == mode and v["source"] == "nsys"
    assert v["launches_per_round"] == [EXPECTED[arm]] * ROUNDS
    assert v["status"] == "pass" and v["passed"]
    r = rounds(analysed[(mode, arm)])
    assert set(r["draft_forwards"]) == {NUM_STEPS - 1}  # the bug changes indexer runs, not forwards
    # One indexer call is 12 (eager) / 13 (graph) kernels inside its NVTX range in sglang 0.5.14.
    per_call = {"eager": 12, "graph": 13}[mode]
    assert set(r["indexer_kernels"]) == {EXPECTED[arm] * per_call}


# ---- the classifier (no NVTX) -------------------------------------------------------------------


@pytest.mark.parametrize("arm", ARMS)
def test_classifier_agrees_with_graph_attribution(analysed, arm: str) -> None:
    run = analysed[("graph", arm)]
    graph, cls = verdict(run), verdict(run, "classifier")
    assert cls["method"] == "classifier" and cls["status"] == "pass"
    assert cls["launches_per_round"] == graph["launches_per_round"] == [EXPECTED[arm]] * ROUNDS
    # The same rounds: each classifier round (GPU span of one draft-graph replay) starts after the NVTX
    # round that launched it and before the next one.
    g, c = rounds(run), rounds(run, "classifier")
    starts = g["start_ns"].tolist() + [float("inf")]
    assert all(lo <= s < hi for s, lo, hi in zip(c["start_ns"], starts[:-1], starts[1:], strict=True))
    assert set(c["draft_forwards"]) == {NUM_STEPS - 1}
    # Name-matched kernels per call: hadamard x2, k-cache store, act_quant, logits, top-k transform (the
    # MoE router's deepseek_v3_topk_kernel must not count); the metadata kernel runs outside the graph.
    assert set(c["indexer_kernels"]) == {EXPECTED[arm] * 6}
    # The target-verify graph (80 kernels, 2 indexer calls, one forward) is left out, and said so.
    assert any("left out" in w and "80 kernels" in w for w in cls["warnings"])


@pytest.mark.parametrize("arm", ARMS)
def test_classifier_reads_no_nvtx(tmp_path: Path, arm: str) -> None:
    """The same counts from a copy whose NVTX_EVENTS table is gone: auto then picks the classifier."""
    db = tmp_path / "no_nvtx.sqlite"
    shutil.copyfile(FIXTURES / run_name("graph", arm) / "profile.sqlite", db)
    con = sqlite3.connect(db)
    con.execute("DROP TABLE NVTX_EVENTS")
    con.commit()
    con.close()
    with open_trace(db) as t:
        assert choose_method(t) == "classifier"
        att = attribute(t)
    assert att.method == "classifier" and att.inconclusive is None
    assert att.rows.column("indexer_launches") == [EXPECTED[arm]] * ROUNDS


@pytest.mark.parametrize("arm", ARMS)
def test_classifier_on_eager_runs_is_inconclusive(analysed, arm: str) -> None:
    """Without CUDA graphs nothing NVTX-free delimits a draft round: inconclusive, never a count."""
    cls = verdict(analysed[("eager", arm)], "classifier")
    assert cls["status"] == "inconclusive" and not cls["passed"]
    assert cls["launches_per_round"] == []
    assert "no cudaGraphLaunch calls" in cls["meaning"]


def test_classifier_graph_kernels_override() -> None:
    """graph_kernels=80 picks the target-verify graph instead: its 2 indexer calls (2 DSA layers)."""
    with open_trace(FIXTURES / run_name("graph", "bug") / "profile.sqlite") as t:
        att = attribute(t, "classifier", graph_kernels=80)
    assert att.rows.column("indexer_launches") == [2] * ROUNDS
    assert att.rows.column("draft_forwards") == [1] * ROUNDS


# ---- the gate -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_gate_passes_launches_fails_on_outputs(analysed, mode: str) -> None:
    result = compare_runs(analysed[(mode, "bug")], analysed[(mode, "fix")])
    assert result["a"]["launches_per_round"] == [4] and result["b"]["launches_per_round"] == [1]
    failures = gate_failures(result)
    assert failures and all(f.startswith("greedy outputs differ") for f in failures)
    assert not any("launches" in f for f in failures)


def test_gate_cli_on_classifier_verdicts(analysed, tmp_path: Path, capsys) -> None:
    """`kit compare --gate` on classifier-only analyses of the graph pair: same launch outcome."""
    runs = []
    for arm in ARMS:
        run = tmp_path / arm
        shutil.copytree(analysed[("graph", arm)], run, ignore=shutil.ignore_patterns("*.csv", "*.json"))
        shutil.copyfile(analysed[("graph", arm)] / "params.json", run / "params.json")
        shutil.rmtree(run / "classifier")
        analyze(run, method="classifier")
        runs.append(str(run))
    assert kit_main(["compare", "--gate", *runs]) == 1
    err = capsys.readouterr().err
    assert "GATE FAILED: greedy outputs differ" in err and "indexer launches" not in err


def test_gate_catches_a_bug_build_labelled_fix(analysed, tmp_path: Path) -> None:
    """The launch gate can fail: the bug build's report analysed as if it were the fix arm."""
    run = shutil.copytree(FIXTURES / run_name("graph", "bug"), tmp_path / "relabelled")
    params = json.loads((run / "params.json").read_text())
    (run / "params.json").write_text(json.dumps({**params, "arm": "fix"}))
    analyze(run)
    failures = gate_failures(compare_runs(analysed[("graph", "bug")], run))
    assert any("indexer launches per round [4]" in f and "expected exactly 1" in f for f in failures)


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
    spec = importlib.util.spec_from_file_location("trim_fixture", ROOT / "scripts" / "trim_fixture.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_trim_script_is_deterministic_and_keeps_counts(tmp_path: Path) -> None:
    trim = _trim_module()
    src = FIXTURES / run_name("graph", "bug") / "profile.sqlite"
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    counts = trim.trim_report(src, a, 3)
    trim.trim_report(src, b, 3)
    assert counts["draft_rounds"] == 3
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()
    with open_trace(a) as t:
        assert attribute(t).rows.column("indexer_launches") == [4] * 3
        assert attribute(t, "classifier").rows.column("indexer_launches") == [4] * 3


def test_rounds_before_the_profile_window_mark_are_left_out(tmp_path: Path) -> None:
    """With CUDA graphs the report starts at capture, so warm-up rounds precede sglang's window; the probe's
    `profile_window_start` mark (here placed before the 5th round of a real report) bounds the analysis."""
    import sqlite3

    from kit.analyze import analyze

    run = shutil.copytree(FIXTURES / run_name("graph", "bug"), tmp_path / "run")
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
