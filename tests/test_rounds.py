"""kit.analysis (rounds, attribution, classifier, rounds_csv): per-round attribution by every method.

Real reports: live nsys 2022.4 profiles of tests/nsys_workload.py (marked nsys) and the committed real
fixtures. Kernel methods (eager/graph/classifier): hand-built files following the documented nsys 2025.3
schema, tests named `..._synthetic_schema` (no GPU here; real H200 reports to come).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from nsys_helpers import FIXTURES, WORKLOAD, live_reports, nsys_bin  # noqa: F401
from packed_helpers import plain
from synthetic_schema import INDEXER_KERNELS, SynthReport, draft_loop_eager, draft_loop_graph, gtid

import kit.trace.nsys_cuda
from kit.analysis.attribution import attribute, choose_method
from kit.analysis.rounds import ROUND_COLUMNS, RangeNames
from kit.analysis.rounds_csv import rows_to_csv
from kit.errors import KitError
from kit.trace.registry import open_trace

BUG = plain(FIXTURES / "nsys2022.4_kit_bug_steps4.sqlite.xz")
DROPPED = plain(FIXTURES / "nsys2022.4_nvtx0.2.14_dropped.sqlite.xz")
H200_MINI = FIXTURES / "h200_mini"


def launches(att) -> list[int]:
    return att.rows.column("indexer_launches")


# ---- nvtx method on real reports ---------------------------------------------------------------


def test_real_fixture_bug_pattern_with_decoys() -> None:
    """Decoys: target-model indexer ranges outside rounds, another thread, other domains: none counted."""
    with open_trace(BUG) as t:
        att = attribute(t)
    assert att.method == "nvtx" and att.inconclusive is None
    assert launches(att) == [3] * 5
    assert att.rows.column("draft_forwards") == [3] * 5
    assert att.rows.column("round") == [1, 2, 3, 4, 5]
    assert set(att.rows.column("indexer_kernels")) == {None}
    row = att.rows[0]
    assert row["step_ns"] == pytest.approx(row["round_ns"] / 3)


def test_range_names_and_domain_are_parameters() -> None:
    with open_trace(BUG) as t:
        other = attribute(t, names=RangeNames(domain="otherdomain"))
        default = attribute(t, names=RangeNames(domain=""))
        steps_as_indexer = attribute(t, names=RangeNames(indexer_range="draft_step"))
    # the decoy rounds of the workload's decoy_domains()
    assert launches(other) == [3] and launches(default) == [3]
    assert launches(steps_as_indexer) == [3] * 5


def test_dropped_nvtx_is_inconclusive_not_zero() -> None:
    with open_trace(DROPPED) as t:
        att = attribute(t)
    assert len(att.rows) == 0
    assert att.inconclusive and att.inconclusive.startswith("NVTX dropped")


@pytest.mark.nsys
@pytest.mark.parametrize(("pattern", "expected"), [("bug", 4), ("fix", 1), ("off", 4)])
def test_live_patterns(live_reports, pattern: str, expected: int) -> None:  # noqa: F811
    db = live_reports("--pattern", pattern, "--rounds", "6", "--num-steps", "5", "--decoys")
    with open_trace(db) as t:
        att = attribute(t)
    assert att.method == "nvtx" and att.inconclusive is None
    assert launches(att) == [expected] * 6
    assert att.rows.column("draft_forwards") == [4] * 6


@pytest.mark.nsys
def test_live_two_processes_counted_per_pid(live_reports) -> None:  # noqa: F811
    db = live_reports("--pattern", "fix", "--rounds", "4", "--num-steps", "3", "--procs", "2")
    with open_trace(db) as t:
        att = attribute(t)
    pids = att.rows.column("pid")
    assert len(set(pids)) == 2
    assert att.rows.column("proc") == [0] * 4 + [1] * 4
    assert att.rows.column("round") == [1, 2, 3, 4] * 2
    assert launches(att) == [1] * 8
    assert any("2 processes" in w for w in att.warnings)


@pytest.mark.nsys
def test_live_round_open_at_exit_is_left_out(live_reports) -> None:  # noqa: F811
    """nsys 2022.4 closes a dangling push range at the session end; the kit treats it as unclosed."""
    db = live_reports("--pattern", "bug", "--rounds", "3", "--num-steps", "3", "--unclosed")
    with open_trace(db) as t:
        assert t.session_end
        att = attribute(t)
    assert launches(att) == [2] * 3
    assert any("1 unclosed 'draft_round'" in w for w in att.warnings)


def test_recorder_rounds(tmp_path: Path) -> None:
    rec = tmp_path / "recorder.sqlite"
    args = ["--pattern", "bug", "--rounds", "4", "--num-steps", "4", "--decoys", "--sink", "recorder"]
    subprocess.run([sys.executable, str(WORKLOAD), *args, "--recorder-path", str(rec)], check=True)
    with open_trace(rec) as t:
        att = attribute(t)
    assert att.method == "nvtx" and launches(att) == [3] * 4
    assert any("NOT measured under Nsight" in w for w in att.warnings)


# ---- nvtx edge cases on hand-built tables -------------------------------------------------------


def test_inline_text_start_end_and_nested_rounds_synthetic_schema(tmp_path: Path) -> None:
    r = SynthReport(tmp_path / "n.sqlite")
    g = gtid(300)
    outer = r.push(g, "draft_round", inline=True)
    ix = r.push(g, "indexer", start_end=True)
    r.pop(ix)
    inner = r.push(g, "draft_round")
    ix = r.push(g, "indexer", inline=True)
    r.pop(ix)
    r.pop(inner)
    r.pop(outer)
    path = r.write()
    with open_trace(path) as t:
        att = attribute(t)
    assert launches(att) == [2, 1]
    assert any("nested rounds" in w for w in att.warnings)


def test_no_rounds_is_inconclusive_synthetic_schema(tmp_path: Path) -> None:
    r = SynthReport(tmp_path / "n.sqlite")
    ix = r.push(gtid(1), "indexer")
    r.pop(ix)
    with open_trace(r.write()) as t:
        att = attribute(t)
    assert len(att.rows) == 0 and "no 'draft_round' rounds" in att.inconclusive


# ---- kernel methods (synthetic schema) -----------------------------------------------------------


@pytest.mark.parametrize(("pattern", "per_round"), [("bug", 3), ("fix", 1)])
def test_graph_replay_attribution_synthetic_schema(tmp_path: Path, pattern: str, per_round: int) -> None:
    db = draft_loop_graph(tmp_path / "g.sqlite", pattern, num_steps=4, rounds=3)
    with open_trace(db) as t:
        assert choose_method(t) == "graph"
        att = attribute(t)
    assert att.method == "graph" and att.inconclusive is None
    assert launches(att) == [per_round] * 3
    assert att.rows.column("indexer_kernels") == [per_round * len(INDEXER_KERNELS)] * 3
    assert att.rows.column("indexer_gpu_ns") == [per_round * len(INDEXER_KERNELS) * 40] * 3
    assert att.rows.column("draft_forwards") == [3] * 3  # capture-time draft_step ranges
    # the capture-time draft_round launched nothing and is reported, not counted
    assert any("launched no kernels" in w for w in att.warnings)


def test_graph_two_processes_with_colliding_ids_synthetic_schema(tmp_path: Path) -> None:
    """Correlation ids and graph node ids restart in each process: counting must stay per pid."""
    db = draft_loop_graph(tmp_path / "g.sqlite", "bug", num_steps=5, rounds=2, pids=(4000, 4001))
    with open_trace(db) as t:
        att = attribute(t)
    assert att.rows.column("pid") == [4000, 4000, 4001, 4001]
    assert launches(att) == [4] * 4
    assert any("2 processes" in w for w in att.warnings)


def test_graph_clone_chain_and_missing_capture_synthetic_schema(tmp_path: Path) -> None:
    db = draft_loop_graph(tmp_path / "g.sqlite", "bug", num_steps=3, rounds=2, verify=False)
    con = sqlite3.connect(db)
    # Re-point every replayed kernel at a clone of its instantiated node (clone of a clone).
    top = con.execute("SELECT MAX(graphNodeId) FROM CUDA_GRAPH_NODE_EVENTS").fetchone()[0]
    for (node,) in con.execute("SELECT DISTINCT graphNodeId FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall():
        clone = node + top
        con.execute(
            "INSERT INTO CUDA_GRAPH_NODE_EVENTS SELECT start + 1000000, end + 1000000, eventClass, "
            "globalTid, nameId, ?, ? FROM CUDA_GRAPH_NODE_EVENTS WHERE graphNodeId = ?",
            (clone, node, node),
        )
        sql = "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET graphNodeId = ? WHERE graphNodeId = ?"
        con.execute(sql, (clone, node))
    con.commit()
    with open_trace(db) as t:
        assert launches(attribute(t)) == [2, 2]
    # Without the capture-time creation events nothing can be attributed: said, not hidden.
    con.execute("DELETE FROM CUDA_GRAPH_NODE_EVENTS WHERE originalGraphNodeId IS NULL")
    con.commit()
    con.close()
    with open_trace(db) as t:
        att = attribute(t)
    assert launches(att) == [0, 0]
    assert any("without a capture-time creation event" in w for w in att.warnings)


@pytest.mark.parametrize(("pattern", "per_round"), [("bug", 3), ("fix", 1)])
def test_eager_attribution_synthetic_schema(tmp_path: Path, pattern: str, per_round: int) -> None:
    """Indexer kernels run on the GPU after their round ended: attribution goes by the launch call."""
    db = draft_loop_eager(tmp_path / "e.sqlite", pattern, num_steps=4, rounds=3)
    with open_trace(db) as t:
        assert choose_method(t) == "eager"
        att = attribute(t)
    assert att.method == "eager"
    assert launches(att) == [per_round] * 3
    assert att.rows.column("indexer_kernels") == [per_round * len(INDEXER_KERNELS)] * 3
    assert att.rows.column("draft_forwards") == [3] * 3


def test_method_override_and_errors_synthetic_schema(tmp_path: Path) -> None:
    db = draft_loop_graph(tmp_path / "g.sqlite", "bug", num_steps=4, rounds=2)
    with open_trace(db) as t:
        nvtx = attribute(t, "nvtx")  # CPU view of the same report: the capture round holds the ranges
        assert nvtx.method == "nvtx" and launches(nvtx) == [3, 0, 0]
        with pytest.raises(KitError, match="unknown attribution method"):
            attribute(t, "magic")
    with open_trace(BUG) as t, pytest.raises(KitError, match="needs CUDA kernels"):
        attribute(t, "graph")


@pytest.mark.parametrize(("pattern", "per_round"), [("bug", 3), ("fix", 1)])
def test_classifier_synthetic_schema(tmp_path: Path, pattern: str, per_round: int) -> None:
    db = draft_loop_graph(tmp_path / "c.sqlite", pattern, num_steps=4, rounds=3, nvtx=False)
    with open_trace(db) as t:
        assert choose_method(t) == "classifier"
        # Without NVTX the draft graph and the verify graph both carry indexer kernels: say so.
        ambiguous = attribute(t)
        assert ambiguous.inconclusive and "graph_kernels=N" in ambiguous.inconclusive
        assert len(ambiguous.rows) == 6
        # The draft graph: 3 steps x (4 layer + 6 layer kernels) + its indexer calls' kernels.
        n_kernels = 3 * 10 + per_round * len(INDEXER_KERNELS)
        att = attribute(t, graph_kernels=n_kernels)
    assert att.inconclusive is None
    assert launches(att) == [per_round] * 3
    named = len(INDEXER_KERNELS) - 1  # the head-gate GEMM is not an indexer kernel by name
    assert att.rows.column("indexer_kernels") == [per_round * named] * 3


@pytest.mark.parametrize(("pattern", "per_round"), [("bug", 3), ("fix", 1), ("reuse", 0)])
def test_classifier_finds_the_draft_loop_by_its_forwards_synthetic_schema(
    tmp_path: Path, pattern: str, per_round: int
) -> None:
    """With token-embedding lookups the draft loop is the graph running several forwards, whatever its
    indexer count, down to none: sglang 0.5.16's draft loop reuses the target's top-k and its graph holds
    no indexer kernel (on the H200 the classifier called all four 0.5.16 cells inconclusive before)."""
    db = draft_loop_graph(tmp_path / "f.sqlite", pattern, num_steps=4, rounds=3, nvtx=False, forwards=True)
    with open_trace(db) as t:
        att = attribute(t)
    assert att.inconclusive is None, att.inconclusive
    assert launches(att) == [per_round] * 3 and att.rows.column("draft_forwards") == [3] * 3
    if pattern == "reuse":
        assert any("holds no indexer kernel" in w for w in att.warnings), att.warnings


def test_a_draft_graph_without_known_indexer_names_is_inconclusive_not_zero_synthetic_schema(
    tmp_path: Path,
) -> None:
    """The 0-per-round reading needs indexer kernels the table knows somewhere in the report (verify runs
    the indexer every round): kernels of unknown names everywhere must not read as 0.5.16's 0."""
    unknown = ("mystery_a", "mystery_b")
    db = draft_loop_graph(tmp_path / "u.db", "bug", 4, 3, nvtx=False, forwards=True, indexer_kernels=unknown)
    with open_trace(db) as t:
        att = attribute(t)
    assert att.method == "classifier" and att.inconclusive and "named like the indexer's" in att.inconclusive


def test_classifier_needs_graph_launches_synthetic_schema(tmp_path: Path) -> None:
    db = draft_loop_eager(tmp_path / "e.sqlite", "bug", num_steps=4, rounds=2)
    con = sqlite3.connect(db)
    con.execute("DROP TABLE NVTX_EVENTS")
    con.commit()
    con.close()
    with open_trace(db) as t:
        att = attribute(t)
    assert att.method == "classifier" and len(att.rows) == 0
    assert "no cudaGraphLaunch" in att.inconclusive


def test_eager_two_threads_of_one_process_synthetic_schema(tmp_path: Path) -> None:
    """Rounds on two threads of one process: each kernel belongs to its launching thread's round only."""
    r = SynthReport(tmp_path / "t.sqlite")
    threads = (gtid(6000, 6000), gtid(6000, 6001))
    for per_round, g in zip((3, 1), threads, strict=True):
        for _ in range(2):
            rnd = r.push(g, "draft_round")
            for _ in range(per_round):
                st = r.push(g, "draft_step")
                ix = r.push(g, "indexer")
                for k in INDEXER_KERNELS:
                    r.eager_kernel(g, k)
                r.pop(ix)
                r.pop(st)
            # the other thread launches an indexer kernel while this round is open: not this round's
            other = threads[1] if g == threads[0] else threads[0]
            r.eager_kernel(other, INDEXER_KERNELS[0])
            r.pop(rnd)
    db = r.write()
    with open_trace(db) as t:
        att = attribute(t)
    assert att.method == "eager"
    assert att.rows.column("tid") == [6000, 6000, 6001, 6001]
    assert launches(att) == [3, 3, 1, 1]
    assert att.rows.column("indexer_kernels") == [12, 12, 4, 4]


@pytest.mark.parametrize("graph", [False, True])
def test_kernels_without_global_pid_join_on_correlation_id_synthetic_schema(
    tmp_path: Path, graph: bool
) -> None:
    """An export whose kernel table lacks globalPid: kernels join their launch by correlationId alone."""
    make = draft_loop_graph if graph else draft_loop_eager
    db = make(tmp_path / "k.sqlite", "bug", num_steps=4, rounds=3)
    with open_trace(db) as t:
        expected = rows_to_csv(attribute(t).rows)
    con = sqlite3.connect(db)
    con.execute("ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN globalPid")
    con.commit()
    con.close()
    with open_trace(db) as t:
        att = attribute(t)
    assert att.method == ("graph" if graph else "eager")
    assert rows_to_csv(att.rows) == expected


def _reference_rounds(db: Path, graph: bool) -> list[tuple]:
    """Per round, from plain SQL (the nsys source's kernel_join: temp tables, no numpy) and Python loops:
    (start, launches, draft forwards, indexer kernels, indexer GPU ns, round GPU span)."""
    with open_trace(db) as t:
        join, point_g, point_t, _ = t.kernel_join(graph)
        kernels = t.query(
            f"SELECT rt.gtid, rt.start, {point_g}, {point_t}, k.start, k.end "
            f"FROM main.CUPTI_ACTIVITY_KIND_KERNEL k {join}"
        )
        ranges = {
            name: t.query(
                "SELECT gtid, start, end FROM ranges WHERE domain = ? AND name = ?", ("pr29654", name)
            )
            for name in ("draft_round", "draft_step", "indexer")
        }

    def enclosing(name: str, g: int, time: int) -> tuple | None:
        inside = [r for r in ranges[name] if r[0] == g and r[1] <= time and r[2] is not None and r[2] >= time]
        return max(inside, key=lambda r: r[1]) if inside else None

    per_round: dict[tuple, list] = {}
    for rg, rs, pg, pt, ks, ke in kernels:
        rnd = enclosing("draft_round", rg, rs)
        if rnd is None:
            continue
        row = per_round.setdefault(rnd, [set(), set(), 0, 0, ks, ke])
        idx, step = enclosing("indexer", pg, pt), enclosing("draft_step", pg, pt)
        if step:
            row[1].add(step)
        if idx:
            row[0].add(idx)
            row[2] += 1
            row[3] += ke - ks
        row[4], row[5] = min(row[4], ks), max(row[5], ke)
    return sorted((r[1], len(v[0]), len(v[1]), v[2], v[3], v[5] - v[4]) for r, v in per_round.items())


@pytest.mark.parametrize(
    "db,graph",
    [
        *[
            (plain(H200_MINI / f"tiny-{arm}-ctx8192-{mode}" / "profile.sqlite.xz"), mode == "graph")
            for arm in ("bug", "fix")
            for mode in ("eager", "graph")
        ],
        ("synth_eager_2p", False),
        ("synth_graph_2p", True),
    ],
)
@pytest.mark.parametrize("in_list_max", [10_000, 0])
def test_kernel_rounds_match_a_plain_sql_join(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db, graph: bool, in_list_max: int
) -> None:
    """The numpy join (one scan per table) counts exactly what a plain SQL join of the same tables counts,
    with the kernel scan narrowed by an id list or by the ids' span."""
    monkeypatch.setattr(kit.trace.nsys_cuda, "IN_LIST_MAX", in_list_max)
    if db == "synth_eager_2p":
        db = draft_loop_eager(tmp_path / "e.sqlite", "bug", num_steps=5, rounds=3, pids=(5000, 5001))
    elif db == "synth_graph_2p":
        db = draft_loop_graph(tmp_path / "g.sqlite", "bug", num_steps=5, rounds=3, pids=(4000, 4001))
    cols = ("start_ns", "indexer_launches", "draft_forwards", "indexer_kernels", "indexer_gpu_ns")
    with open_trace(db) as t:
        rows = attribute(t, "graph" if graph else "eager").rows
    got = sorted(zip(*(rows.column(c) for c in (*cols, "round_gpu_ns")), strict=True))
    assert got == _reference_rounds(db, graph)
    assert len(got) >= 3


# ---- output ---------------------------------------------------------------------------------------


def test_rows_to_csv() -> None:
    with open_trace(BUG) as t:
        att = attribute(t)
    text = rows_to_csv(att.rows)
    lines = text.splitlines()
    assert lines[0] == ",".join(ROUND_COLUMNS)
    assert len(lines) == 6
    cells = dict(zip(ROUND_COLUMNS, lines[1].split(","), strict=True))
    assert cells["indexer_launches"] == "3" and cells["indexer_kernels"] == "" and cells["method"] == "nvtx"
    assert rows_to_csv(list(att.rows)) == text  # plain row dicts give the same file


@pytest.mark.parametrize(("pattern", "per_round"), [("bug", 3), ("fix", 1), ("reuse", 0)])
def test_placement_counts_the_indexer_in_each_kind_of_range_synthetic_schema(
    tmp_path: Path, pattern: str, per_round: int
) -> None:
    """Where the call sits: the draft rounds' replays hold the arm's count (0 for a release that reuses the
    target's top-k), the verify replays the target's 3; the capture-time ranges count by their probe
    ranges. A range with no launch recorded inside reads 'not recorded', never 0."""
    from kit.analysis.placement import NOT_RECORDED, indexer_placement

    db = draft_loop_graph(tmp_path / "p.sqlite", pattern, num_steps=4, rounds=3)
    with open_trace(db) as t:
        where = indexer_placement(t)
    assert where["draft_round"] == {per_round: 4}
    assert where["verify"] == {3: 4} and where["draft_extend"] == {}
    con = sqlite3.connect(db)  # launch calls after the first replay's untraced (outside nsys's capture range)
    con.execute(
        "DELETE FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE start > (SELECT MIN(start) + 1 FROM "
        "CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId IN (SELECT correlationId FROM "
        "CUPTI_ACTIVITY_KIND_KERNEL))"
    )
    con.commit()
    con.close()
    with open_trace(db) as t:
        where = indexer_placement(t)
    assert where["draft_round"][NOT_RECORDED] == 2  # the replays after the first: none reads as 0
    assert sum(where["draft_round"].values()) == 4
