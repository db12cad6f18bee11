"""The mutation suite on CPU, for real: every cell under Nsight Systems (one session, a window per cell),
analysed, compared with bug (off as the control) through the gate. Each mutant must be killed by exactly
the checks the registry names; the one that breaks only under CUDA graphs must equal the fix in eager mode
and be killed with the graph runner's static batch; the fix and off must pass in both; and the result must
be what data/results/mutants/cpu holds.

Marked `mutants` (about a minute on 2 cores): `pytest -m "not mutants"` leaves it out of a quick run; CI
runs everything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kit.compare import mutation
from kit.compare.mutation import CPU_WORKLOADS as WORKLOADS  # what the committed results ran
from kit.paths import RESULTS
from kit.rundir import read_outputs
from kit.sglang_src.mutants import MUTANTS

pytestmark = [pytest.mark.mutants, pytest.mark.nsys]


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory, require_nsys: str) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("mutants") / "cpu"
    return mutation.run_cpu(out), out


def test_every_mutant_is_killed_by_what_the_registry_names(suite: tuple[dict, Path]) -> None:
    result, _ = suite
    rows = {r["candidate"]: r for r in result["rows"] if r["mode"] == "eager"}
    assert list(rows) == ["fix", *MUTANTS]
    for name, m in MUTANTS.items():
        assert set(rows[name]["killed_by"]) == set(m.cpu), (name, rows[name]["failures"])
        assert (rows[name]["verdict"] == "killed") == bool(m.cpu)
    static = {r["candidate"]: r for r in result["rows"] if r["mode"] == "static"}
    assert list(static) == ["fix", *(n for n, m in MUTANTS.items() if m.cpu_static is not None)]
    for name in list(static)[1:]:
        assert set(static[name]["killed_by"]) == set(MUTANTS[name].cpu_static), name
    # the part mutants that only drop slots change nothing a draft reads at 4k (their kills: any-slot)
    unkilled = [n for n, m in MUTANTS.items() if not m.cpu and not m.cpu_static]
    assert mutation.as_expected(result, "cpu") and mutation.survivors(result) == unkilled
    assert {MUTANTS[n].kind for n in unkilled} == {"part"}


def test_the_fix_and_the_off_control_pass(suite: tuple[dict, Path]) -> None:
    result, _ = suite
    for fix in (r for r in result["rows"] if r["candidate"] == "fix"):
        assert fix["verdict"] == "passes" and fix["gate_failures"] == {w: [] for w in WORKLOADS}
    assert set(result["off"]) == {f"{w} ({m})" for w in WORKLOADS for m in ("eager", "static")}
    assert all(v["passes"] for v in result["off"].values())


def test_the_graph_only_mutant_equals_the_fix_in_eager_mode(suite: tuple[dict, Path]) -> None:
    """no-clear survives eager because there it IS the fix: same tokens, drafts, rounds, launches. With the
    graph runner's static batch it never launches the indexer in a round."""
    result, out = suite
    for w in WORKLOADS:
        fix, mutant = (out / result["cells"][mutation.cell_id(n, w)] for n in ("fix", "no-clear"))
        keys = ("output_ids", "draft_ids", "spec_verify_ct")
        assert [{k: r[k] for k in keys} for r in read_outputs(fix)] == [
            {k: r[k] for k in keys} for r in read_outputs(mutant)
        ]
        launches = [json.loads((d / "verdict.json").read_text())["launches_per_round"] for d in (fix, mutant)]
        assert launches[0] == launches[1] and set(launches[0]) == {1}
        static = out / result["cells"]["static-" + mutation.cell_id("no-clear", w)]
        assert set(json.loads((static / "verdict.json").read_text())["launches_per_round"]) == {0}


def test_each_cell_is_its_own_window_of_one_nsys_report(suite: tuple[dict, Path]) -> None:
    result, out = suite
    reports = set()
    for rel in result["cells"].values():
        cell = out / rel
        verdict = json.loads((cell / "verdict.json").read_text())
        rounds = max(r["spec_verify_ct"] for r in read_outputs(cell))
        assert verdict["num_rounds"] == rounds and verdict["source"] == "nsys"
        reports.add((cell / "profile.sqlite").resolve())
    assert len(reports) == 1


def test_the_committed_results_are_what_the_suite_gives(suite: tuple[dict, Path]) -> None:
    result, _ = suite
    committed = json.loads((RESULTS / "mutants" / "cpu" / "suite.json").read_text())
    assert committed["settings"] == result["settings"]
    assert [(r["candidate"], r["mode"], r["failures"].keys(), r["killed_by"]) for r in committed["rows"]] == [
        (r["candidate"], r["mode"], r["failures"].keys(), r["killed_by"]) for r in result["rows"]
    ]
    # the suite's budget on the kit's 2-core machine, with make test's second worker sharing its cores: 300 s
    # for the 32 cells of nine mutants, 420 s since the six part mutants added twelve (197 s measured alone
    # on a loaded machine, 325 s beside a full make test and another test run)
    assert result["seconds"]["total"] < 420
