"""The gate says why (kit.compare.per_request): comparison.json's per-request table, its marks by the gate's
own rules, `kit compare`'s text, the report's tables, and old comparisons (rebuilt from their runs, or said
not recorded). The real mini runs under nsys are in tests/test_mini_task.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_gate import ANSWER, make_run, rows

from kit.cli import main as kit_main
from kit.compare import per_request
from kit.compare.gate import gate_checks
from kit.compare.runs import compare_runs, comparison, request_table, write_comparison
from kit.paths import RESULTS
from kit.report import mutation_suite, this_batch
from kit.report.page import table_html
from kit.report.rung import Batch
from kit.rundir import read_outputs

CPU = RESULTS / "mutants" / "cpu"
PER_REQUEST_CHECKS = ("tokens", "accuracy", "acceptance", "share_model")


@pytest.fixture
def runs(tmp_path: Path) -> dict[str, Path]:
    """bug, a fix and off on same-target (the off control wobbles by one round on request 1: floor 0.4); a
    fix whose request 2 takes 7 verify rounds instead of 4 (its acceptance moves beyond the floor) and whose
    request 1 answers wrong (its tokens differ there)."""
    wrong = [ANSWER + [0] * 8, [7, 8, 0, 10] + [1] * 8, ANSWER + [2] * 8]
    return {
        "bug": make_run(tmp_path, "bug", "bug", rows([4, 5, 4])),
        "fix": make_run(tmp_path, "fix", "fix", rows([4, 5, 4])),
        "off": make_run(tmp_path, "off", "off", rows([4, 6, 4])),
        "bad": make_run(tmp_path, "bad", "fix", rows([4, 5, 7], outs=wrong)),
    }


def _by_prompt(table: dict[str, Any], workload: str) -> dict[Any, dict[str, Any]]:
    return {r["prompt_id"]: r for r in table["by_workload"][workload]["rows"]}


def test_the_table_holds_each_sides_numbers_and_marks_what_fails(runs: dict[str, Path]) -> None:
    result = comparison(runs["bug"], runs["bad"], runs["off"])
    table = result["per_request"]
    assert table["sides"] == {"a": "bug", "b": "fix", "control": "off"}
    t = table["by_workload"]["same-target"]
    assert t["failed"] == ["tokens", "accuracy", "acceptance"]  # the gate's order (CHECKS)
    assert t["floors"] == {"acceptance": pytest.approx(12 / 5 - 12 / 6)}
    by = _by_prompt(table, "same-target")
    assert by[2]["accept"] == {"a": 3.0, "b": pytest.approx(12 / 7), "control": 3.0}
    assert by[2]["ran"] == {"a": 4, "b": 7, "control": 4}
    assert by[1]["right"] == {"a": True, "b": False, "control": True}
    # acceptance: only the request that moved beyond the floor; accuracy and tokens: request 1's b
    assert by[0]["failing"] == {}
    assert by[1]["failing"] == {"accuracy": ["b"], "tokens": ["b"]}
    assert by[2]["failing"] == {"acceptance": ["b"]}
    assert table["share_model_why"]  # sglang runs without task.json: no prediction, and why


def test_a_passing_comparison_marks_nothing_and_one_without_control_fails_its_workload(
    runs: dict[str, Path],
) -> None:
    good = comparison(runs["bug"], runs["fix"], runs["off"])["per_request"]
    assert good["by_workload"]["same-target"]["failed"] == []
    assert all(not r["failing"] for r in good["by_workload"]["same-target"]["rows"])
    bare = compare_runs(runs["bug"], runs["fix"])["per_request"]
    assert bare["sides"] == {"a": "bug", "b": "fix"}
    assert bare["by_workload"]["same-target"]["failed"] == ["acceptance"]  # not_run: no floor, no cell


def test_kit_compare_prints_the_table_under_a_failing_gate_and_a_line_for_a_passing_one(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bug, off = str(runs["bug"]), str(runs["off"])
    assert (
        kit_main(["compare", bug, str(runs["bad"]), "--control", off, "--gate", "--out", str(tmp_path / "x")])
        == 1
    )
    err = capsys.readouterr().err.splitlines()
    head = err.index(
        "same-target: per request fails tokens, accuracy, acceptance (the control's floors: acceptance 0.4); "
        "*: fails the gate"
    )
    assert err[head - 1].startswith("GATE") and "prompt" in err[head + 2]
    cells = {line.split()[0]: line.split() for line in err[head + 3 : head + 6]}
    assert cells["1"][-2:] == ["yes/NO/yes*", "no*"] and cells["2"][2] == "1.714*"
    assert not any(c.endswith("*") for c in cells["0"])
    # a pass: one line per workload, no table
    assert (
        kit_main(["compare", bug, str(runs["fix"]), "--control", off, "--gate", "--out", str(tmp_path / "y")])
        == 0
    )
    err = capsys.readouterr().err
    assert "same-target: 3 requests, no per-request check failed; mean accept length bug 2.800" in err
    assert "right: bug 3/3, fix 3/3, off 3/3" in err and "prompt" not in err
    # asked for: the table of every workload, without --gate too
    assert kit_main(["compare", bug, str(runs["fix"]), "--per-request", "--out", str(tmp_path / "z")]) == 0
    err = capsys.readouterr().err
    assert "same-target: per request fails acceptance" in err and "  prompt" in err


# ---------------------------------------------------------------------------------------------------
# committed comparisons, written before comparison.json held the table


def test_a_killed_mutant_renders_with_its_failing_rows_marked() -> None:
    """first-topk-kept on moving-target (CPU): the share model kills it on requests 1 and 2 (ran 22 and 23
    rounds, 23 and 24 predicted); the table is the one kit compare recorded, and its numbers are those of
    the runs' outputs.jsonl."""
    f = CPU / "comparisons" / "moving-target" / "first-topk-kept" / "comparison.json"
    table = request_table(f)
    recorded = json.loads(f.read_text())
    assert table == recorded["per_request"]
    outputs = {
        s: {r["prompt_id"]: r for r in read_outputs(f.parent / recorded[s]["run"])} for s in ("a", "b")
    }
    by = _by_prompt(table, "moving-target")
    for pid, r in by.items():
        for s in ("a", "b"):
            row = outputs[s][pid]
            assert r["accept"][s] == row["completion_tokens"] / row["spec_verify_ct"]
            assert r["ran"][s] == row["spec_verify_ct"]
    assert [by[p]["predicted"]["b"] for p in (0, 1, 2)] == [25, 23, 24]
    assert [by[p]["ran"]["b"] for p in (0, 1, 2)] == [25, 22, 23]
    assert [by[p]["failing"] for p in (0, 1, 2)] == [{}, {"share_model": ["b"]}, {"share_model": ["b"]}]
    text = "\n".join(per_request.lines(table))
    assert "moving-target: per request fails share model" in text
    assert "22 (23)*" in text and "23 (24)*" in text and "25 (25)*" not in text


def test_every_committed_comparison_marks_what_its_gate_failed() -> None:
    """Each of the committed comparisons renders (rebuilt from its runs), and the per-request checks its
    table marks are exactly those its recorded gate fails (a request only one run holds has no row to
    mark)."""
    n = 0
    for f in sorted(RESULTS.rglob("comparison.json")):
        recorded = json.loads(f.read_text())
        table = request_table(f)
        marked = {c for t in table["by_workload"].values() for c in t["failed"]}
        failed = {c for c, lines in gate_checks(recorded).items() if lines and c in PER_REQUEST_CHECKS}
        o = recorded["outputs"]
        if o["missing_in_a"] or o["missing_in_b"]:
            failed.discard("tokens")
        assert marked == failed, f
        n += 1
    assert n >= 111


def test_a_comparison_without_its_runs_says_the_table_is_not_recorded(tmp_path: Path) -> None:
    alone = tmp_path / "cmp" / "comparison.json"
    alone.parent.mkdir()
    old = RESULTS / "mutants" / "h200" / "comparisons" / "eager" / "same-target" / "first-topk-kept"
    shutil.copy(old / "comparison.json", alone)  # written before kit compare recorded the table
    table = request_table(alone)
    assert table["by_workload"] == {} and table["note"].startswith("not recorded (")
    assert per_request.lines(table) == [f"per request: {table['note']}"]


# ---------------------------------------------------------------------------------------------------
# the report


def test_the_mutation_rung_marks_the_failing_cells() -> None:
    rung = mutation_suite.mutation_suite(Batch(RESULTS, str))
    assert rung is not None
    [cpu] = [t for t in rung.tables if t.title.startswith("CPU: why the gate kills")]
    rows = cpu.frame.to_dict("records")
    stale = [i for i, r in enumerate(rows) if r["comparison"] == "first-topk-kept eager moving-target"]
    assert [rows[i]["prompt"] for i in stale] == ["0", "1", "2"]
    column = "verify rounds (predicted) fix"
    assert [(i, column) in cpu.marked for i in stale] == [False, True, True]
    assert rows[stale[1]][column] == "22 (23)*"
    page = table_html(cpu)
    assert '<td class="kit-fail">22 (23)*</td>' in page and "<td>25 (25)</td>" in page


def test_this_batchs_rung_shows_its_comparisons_request_by_request(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    batch = runs["bug"].parent
    write_comparison(runs["bug"], runs["bad"], batch / "compare-g", runs["off"])
    [table] = [t for t in this_batch.this_batch(Batch(batch, str)).tables if "request by request" in t.title]
    rows = table.frame.to_dict("records")
    assert [r["comparison"] for r in rows] == ["g FAIL same-target"] * 3
    assert (2, "accept length fix") in table.marked and (1, "right bug/fix/off") in table.marked


def test_the_script_adds_the_table_to_old_comparisons_and_keeps_the_rest(tmp_path: Path) -> None:
    """scripts/comparison_tables.py on a copy of the H200 part-mutant set with each comparison's table taken
    out (as kit compare wrote them before it recorded the table): without --write nothing changes; with it
    each comparison.json gains the table its runs give and keeps every other byte; a second run adds
    nothing."""
    import subprocess
    import sys

    from kit.paths import REPO

    suite = tmp_path / "h200-part"
    shutil.copytree(RESULTS / "mutants" / "h200-part", suite, symlinks=True)
    files = sorted(suite.rglob("comparison.json"))
    for f in files:  # an old comparison: the same, without its table
        old = json.loads(f.read_text())
        old.pop("per_request")
        f.write_text(json.dumps(old, indent=2) + "\n")
    before = {f: f.read_text() for f in files}
    script = [sys.executable, str(REPO / "scripts" / "comparison_tables.py"), str(suite)]
    out = subprocess.run(script, capture_output=True, text=True, check=True).stdout
    assert out.count("would add 8 request rows") == len(files) == 21
    assert {f: f.read_text() for f in files} == before
    rebuilt = {f: request_table(f) for f in files}
    out = subprocess.run([*script, "--write"], capture_output=True, text=True, check=True).stdout
    assert out.count("added 8 request rows") == 21
    for f in files:
        now = json.loads(f.read_text())
        assert now.pop("per_request") == json.loads(json.dumps(rebuilt[f]))
        assert json.dumps(now, indent=2) + "\n" == before[f]
        assert request_table(f) == json.loads(json.dumps(rebuilt[f]))
    out = subprocess.run([*script, "--write"], capture_output=True, text=True, check=True).stdout
    assert out.count("holds its table already") == 21
    bad = subprocess.run([*script[:2], str(tmp_path / "nosuch")], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("comparison_tables: error: not a folder")
