"""kit.trace (registry, sqlite, nsys_export, recorder): opening reports, the schema guard, the normalized
`ranges` view, dropped NVTX."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from nsys_helpers import FIXTURES, WORKLOAD, live_reports, nsys_bin, profile  # noqa: F401
from packed_helpers import plain
from synthetic_schema import SynthReport, draft_loop_graph, gtid

from kit.errors import ExistsError, KitError, TraceError
from kit.trace import registry
from kit.trace.registry import FileKind, open_trace
from kit.trace.source import NvtxStatus, TraceSource
from kit.trace.sqlite import pack, unpack

BUG = plain(FIXTURES / "nsys2022.4_kit_bug_steps4.sqlite.xz")
DROPPED = plain(FIXTURES / "nsys2022.4_nvtx0.2.14_dropped.sqlite.xz")


def test_real_2022_4_export_is_recognized() -> None:
    with open_trace(BUG) as t:
        assert t.source == "nsys"
        assert t.nsys_version == "2022.4.2.1"
        assert t.schema_version == "3.0.0"
        assert t.domains() == ["otherdomain", "pr29654"]
        assert t.warnings == []
        assert not t.has_kernels and not t.has_graph_replays


def test_ranges_view_is_normalized() -> None:
    with open_trace(BUG) as t:
        cur = t.con.execute("SELECT * FROM ranges LIMIT 1")
        assert [d[0] for d in cur.description] == ["start", "end", "tid", "pid", "domain", "name", "gtid"]
        rows = t.query("SELECT domain, name, COUNT(*) FROM ranges GROUP BY 1, 2 ORDER BY 1, 2")
        counts = {(d, n): c for d, n, c in rows}
        assert counts[("pr29654", "draft_round")] == 5
        assert counts[("pr29654", "draft_step")] == 15
        assert counts[("otherdomain", "draft_round")] == 1
        assert counts[("", "draft_round")] == 1  # the default domain
        pids = t.query("SELECT DISTINCT pid FROM ranges")
        tids = t.query("SELECT COUNT(DISTINCT tid) FROM ranges WHERE domain = 'pr29654' AND name = 'indexer'")
        assert len(pids) == 1 and tids[0][0] == 2  # the decoy thread


def test_nvtx_dropped_real_fixture() -> None:
    """nsys 2022.4 + nvtx 0.2.14: the domain-create event is there, the ranges are not."""
    with open_trace(DROPPED) as t:
        status = t.nvtx_status("pr29654")
        assert status.created and not status.has_ranges and status.dropped
        assert t.query("SELECT COUNT(*) FROM ranges")[0][0] == 0


def test_materialized_ranges_use_an_index() -> None:
    with open_trace(BUG) as t:
        table = t.materialize("pr29654", "indexer")
        n = t.query(f"SELECT COUNT(*) FROM temp.{table}")[0][0]
        # 15 in rounds, 3 prefill + 15 verify + 5 extend, and the decoy thread's (timing-dependent)
        assert n > 38
        assert n == t.query("SELECT COUNT(*) FROM ranges WHERE domain = 'pr29654' AND name = 'indexer'")[0][0]
        plan = " ".join(
            r[-1]
            for r in t.query(
                f"EXPLAIN QUERY PLAN SELECT COUNT(*) FROM temp.{table} "
                "WHERE gtid = ? AND start >= ? AND start < ?",
                (1, 0, 10),
            )
        )
        assert "PRIMARY KEY" in plan


def test_report_is_never_modified(tmp_path: Path) -> None:
    from kit.analysis.attribution import attribute

    copy = tmp_path / "r.sqlite"
    shutil.copyfile(BUG, copy)
    before = hashlib.sha256(copy.read_bytes()).hexdigest()
    with open_trace(copy) as t:
        attribute(t)
        t.materialize("pr29654", "indexer")
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == before


def test_a_packed_export_reads_as_its_plain_file_and_is_never_unpacked_on_disk(tmp_path: Path) -> None:
    """What git keeps (X.sqlite.xz) gives the same rounds as the plain export, read in memory: nothing is
    written beside it and the packed bytes do not change."""
    from kit.analysis.attribution import attribute
    from kit.analysis.rounds_csv import rows_to_csv

    plain_copy = shutil.copyfile(BUG, tmp_path / "r.sqlite")
    packed = pack(plain_copy)
    assert not plain_copy.exists() and packed.name == "r.sqlite.xz"
    before = hashlib.sha256(packed.read_bytes()).hexdigest()
    with open_trace(BUG) as t:
        expected = rows_to_csv(attribute(t).rows)
    with open_trace(packed) as t:
        assert t.source == "nsys" and t.path == packed and rows_to_csv(attribute(t).rows) == expected
    assert hashlib.sha256(packed.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.sqlite.xz"]
    assert unpack(packed, tmp_path / "back.sqlite").read_bytes() == BUG.read_bytes()
    again = shutil.copyfile(BUG, tmp_path / "r.sqlite")
    with pytest.raises(ExistsError, match="r.sqlite.xz exists"):
        pack(again)  # the packed file is never replaced, the plain one kept
    assert again.exists() and hashlib.sha256(packed.read_bytes()).hexdigest() == before


def test_a_damaged_packed_export_names_the_file(tmp_path: Path) -> None:
    packed = pack(shutil.copyfile(BUG, tmp_path / "r.sqlite"))
    cut = tmp_path / "cut.sqlite.xz"
    cut.write_bytes(packed.read_bytes()[:5000])
    not_xz = tmp_path / "notes.sqlite.xz"
    not_xz.write_text("not xz\n")
    for bad in (cut, not_xz):
        with pytest.raises(TraceError, match=rf"{bad.name} cannot be decompressed.*re-copy it") as err:
            open_trace(bad)
        assert err.value.path == bad


def test_truncated_file_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "cut.sqlite"
    data = BUG.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(KitError, match=r"cut\.sqlite.*truncated"):
        open_trace(bad)


def test_non_sqlite_and_empty_files(tmp_path: Path) -> None:
    text = tmp_path / "notes.sqlite"
    text.write_text("this is not a database\n" * 10)
    with pytest.raises(KitError, match=r"notes\.sqlite is not a SQLite database"):
        open_trace(text)
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    with pytest.raises(KitError, match=r"empty\.sqlite is not a SQLite database"):
        open_trace(empty)
    with pytest.raises(KitError, match="not found"):
        open_trace(tmp_path / "missing.sqlite")


def test_sqlite_that_is_no_report(tmp_path: Path) -> None:
    db = tmp_path / "other.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    with pytest.raises(KitError, match="neither an nsys export.*nor a kit recorder"):
        open_trace(db)


def test_missing_columns_are_named(tmp_path: Path) -> None:
    db = tmp_path / "old.sqlite"
    con = sqlite3.connect(db)
    con.executescript(
        "CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT);"
        "INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_PRODUCT_VERSION', '2020.1');"
        "CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);"
        "CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, eventType INTEGER, text TEXT, "
        "globalTid INTEGER);"
    )
    con.close()
    with pytest.raises(KitError, match=r"NVTX_EVENTS lacks column\(s\) textId, domainId .*nsys 2020\.1"):
        open_trace(db)
    con = sqlite3.connect(db)
    con.execute("DROP TABLE StringIds")
    con.close()
    with pytest.raises(KitError, match="StringIds is missing"):
        open_trace(db)


def test_nsys_rep_without_nsys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rep = tmp_path / "profile.nsys-rep"
    rep.write_bytes(b"not opened: nsys is missing")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("KIT_NSYS", raising=False)
    hint = r"nsys is not on PATH.*install Nsight Systems.*or pass the exported \.sqlite"
    with pytest.raises(KitError, match=hint):
        open_trace(rep)
    assert not (tmp_path / "profile.sqlite").exists()


@pytest.mark.nsys
def test_nsys_rep_is_exported_into_a_new_file(nsys_bin: str, tmp_path: Path) -> None:  # noqa: F811
    rep = profile(nsys_bin, tmp_path / "run", ["--pattern", "fix", "--rounds", "2"])
    squatter = tmp_path / "run.sqlite"
    squatter.write_text("someone else's file")
    with open_trace(rep) as t:
        assert t.path == tmp_path / "run.1.sqlite"
        assert t.exported_from == rep
        assert t.nvtx_status("pr29654").has_ranges
    assert squatter.read_text() == "someone else's file"
    with open_trace(rep) as t:  # a second open exports again, into yet another new file
        assert t.path == tmp_path / "run.2.sqlite"


def test_recorder_sqlite(tmp_path: Path) -> None:
    rec = tmp_path / "recorder.sqlite"
    args = ["--pattern", "bug", "--rounds", "3", "--num-steps", "3", "--sink", "recorder"]
    subprocess.run([sys.executable, str(WORKLOAD), *args, "--recorder-path", str(rec)], check=True)
    with open_trace(rec) as t:
        assert t.source == "recorder"
        assert any("NOT measured under Nsight" in w for w in t.warnings)
        assert t.nvtx_status("pr29654").has_ranges
        n = t.query("SELECT COUNT(*) FROM ranges WHERE domain = 'pr29654' AND name = 'indexer'")[0][0]
        assert n == 3 * 2
        assert t.range_names("pr29654")["indexer"] == n and t.has_range("pr29654", "draft_round")
        assert not t.has_range("pr29654", "idx") and t.range_names("elsewhere") == {}


def test_every_source_lists_a_domains_ranges_by_name() -> None:
    """What a verdict names when the ranges asked for match none; the same ranges from an nsys export and
    the mini engine's Kineto trace of the same workload shape."""
    kineto = FIXTURES / "kineto" / "mini_cpu_bug.trace.json.gz"
    want = {"draft_extend": 5, "draft_round": 5, "draft_step": 15, "indexer": 39, "prefill": 1, "verify": 5}
    with open_trace(BUG) as t:
        assert t.range_names("pr29654") == want and t.range_names("nope") == {}
        assert t.has_range("pr29654", "indexer") and not t.has_range("pr29654", "idx")
        assert not t.has_range("nope", "indexer")
    with open_trace(kineto) as t:
        assert t.range_names("pr29654") == {
            "draft_extend": 6,
            "draft_round": 5,
            "draft_step": 20,
            "indexer": 38,
            "prefill": 1,
            "verify": 5,
        }
        assert t.has_range("pr29654", "indexer") and not t.has_range("pr29654", "idx")
        assert t.range_names("nope") == {}


def test_2025_3_schema_synthetic_schema(tmp_path: Path) -> None:
    db = draft_loop_graph(tmp_path / "g.sqlite", "bug", 4, 2)
    with open_trace(db) as t:
        assert t.source == "nsys" and t.nsys_version == "2025.3.1-synthetic"
        assert t.warnings == []
        assert t.has_kernels and t.has_runtime and t.has_graph_replays


def test_untested_version_warns_synthetic_schema(tmp_path: Path) -> None:
    db = draft_loop_graph(tmp_path / "g.sqlite", "bug", 4, 2)
    con = sqlite3.connect(db)
    con.execute("UPDATE META_DATA_EXPORT SET value = '2023.1.1' WHERE name = 'EXPORT_PRODUCT_VERSION'")
    con.commit()
    con.close()
    with open_trace(db) as t:
        assert any("tested with nsys 2022.4 and 2025.3" in w for w in t.warnings)


def test_unclosed_ranges_null_or_minus_one(tmp_path: Path) -> None:
    copy = tmp_path / "r.sqlite"
    shutil.copyfile(BUG, copy)
    con = sqlite3.connect(copy)
    ids = [r[0] for r in con.execute("SELECT id FROM StringIds WHERE value = 'draft_round'")]
    rows = con.execute(f"SELECT rowid FROM NVTX_EVENTS WHERE textId = {ids[0]} ORDER BY start").fetchall()
    con.execute("UPDATE NVTX_EVENTS SET end = NULL WHERE rowid = ?", rows[0])
    con.execute("UPDATE NVTX_EVENTS SET end = -1 WHERE rowid = ?", rows[1])
    con.commit()
    con.close()
    with open_trace(copy) as t:
        sql = "SELECT end FROM ranges WHERE domain = 'pr29654' AND name = 'draft_round' ORDER BY start"
        ends = t.query(sql)
        assert [e[0] is None for e in ends][:3] == [True, True, False]
        _, _, end = t.range_columns("pr29654", "draft_round")
        assert list(end[:2]) == [-1, -1] and end[2] > 0


def test_domain_ids_are_per_process_synthetic_schema(tmp_path: Path) -> None:
    """Process A's domainId 1 is 'pr29654', process B's domainId 1 is 'other': B's ranges are not ours."""
    r = SynthReport(tmp_path / "d.sqlite")
    a, b = gtid(100), gtid(200)
    r.push(b, "warmup", domain="other")  # B's first domain -> id 1
    row = r.push(b, "draft_round", domain="other")
    r.pop(row)
    row = r.push(a, "draft_round")  # A's first domain -> id 1 too
    r.pop(row)
    path = r.write()
    with open_trace(path) as t:
        g, start, _ = t.range_columns("pr29654", "draft_round")
        assert list(g) == [a]
        assert t.query("SELECT COUNT(*) FROM ranges WHERE domain = 'pr29654'")[0][0] == 1


def test_scan_columns_slices_give_one_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Split by rowid over threads (each its own connection), rows come back as one scan gives them."""
    import kit.trace.sqlite

    db = FIXTURES / "h200_mini" / "tiny-bug-ctx8192-eager" / "profile.sqlite.xz"
    exprs = ["correlationId", "start", "end - start"]
    where = "correlationId > 100 AND start % 3 = 0"
    with open_trace(db) as t:
        one = t.concat_columns(exprs, f"FROM main.CUPTI_ACTIVITY_KIND_KERNEL WHERE {where}")
        monkeypatch.setattr(kit.trace.sqlite, "SCAN_MIN_ROWS", 500)
        monkeypatch.setattr(kit.trace.sqlite, "_scan_threads", lambda: 3)
        sliced = t.scan_columns(exprs, "CUPTI_ACTIVITY_KIND_KERNEL", where)
        monkeypatch.setattr(kit.trace.sqlite, "_scan_threads", lambda: 64)  # more slices than threads
        many = t.scan_columns(exprs, "CUPTI_ACTIVITY_KIND_KERNEL", where)
    assert len(one[0]) > 1000
    for a, b, c in zip(one, sliced, many, strict=True):
        assert a.tolist() == b.tolist() == c.tolist()


# ---- the trace-source seam ------------------------------------------------------------------------


class _JsonRanges(TraceSource):
    """A second report format in a few lines (NVTX ranges as JSON): what a new source has to provide."""

    source = "json-ranges"

    def __init__(self, path: Path) -> None:
        self.path, self.warnings = path, []
        self.rows = json.loads(path.read_text())["ranges"]  # [gtid, start, end or -1, domain, name]

    def describe(self) -> dict[str, str | None]:
        return {"report": str(self.path), "source": self.source}

    def nvtx_status(self, domain: str) -> NvtxStatus:
        found = any(r[3] == domain for r in self.rows)
        return NvtxStatus(domain, created=found, has_ranges=found)

    def domains(self) -> list[str]:
        return sorted({r[3] for r in self.rows})

    def range_names(self, domain: str) -> dict[str, int]:
        return dict(sorted(Counter(r[4] for r in self.rows if r[3] == domain).items()))

    def range_columns_multi(self, domain, names, gtids=None, with_end=True):
        out = {}
        for name in names:
            sel = [r for r in self.rows if r[3:] == [domain, name] and (gtids is None or r[0] in gtids)]
            g, s, e = (np.array([r[i] for r in sel], dtype=np.int64) for i in range(3))
            out[name] = (g, s, e if with_end else None)
        return out

    def pid_tid(self, gtid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return (gtid >> 24) & 0xFFFFFF, gtid & 0xFFFFFF  # the nsys globalTid packing the ranges came with


def open_json_ranges(path: Path) -> TraceSource:
    return _JsonRanges(path)


def test_a_registered_format_needs_no_analysis_edit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One source class and one registry entry: attribution, verdict and the stage work on the new format
    and count what they count on the nsys export the ranges came from."""
    from kit.analysis.analyze import analyze
    from kit.analysis.attribution import attribute
    from kit.analysis.rounds_csv import rows_to_csv

    with open_trace(BUG) as t:
        rows = t.query("SELECT gtid, start, COALESCE(end, -1), domain, name FROM ranges")
        expected = rows_to_csv(attribute(t).rows)
    report = tmp_path / "bug.ranges.json"
    report.write_text(json.dumps({"ranges": rows}))
    kind = FileKind("json", f"{__name__}:open_json_ranges", ("json-ranges",), suffixes=(".ranges.json",))
    monkeypatch.setattr(registry, "KINDS", (*registry.KINDS, kind))
    with open_trace(report) as t:
        assert isinstance(t, _JsonRanges)
        assert rows_to_csv(attribute(t).rows) == expected
    v = analyze(report, tmp_path / "out", arm="bug", num_steps=4)
    assert v["source"] == "json-ranges" and v["status"] == "pass" and v["launches_per_round"] == [3] * 5


def test_report_errors_are_trace_errors_naming_the_file(tmp_path: Path) -> None:
    text = tmp_path / "notes.sqlite"
    text.write_text("this is not a database\n" * 10)
    for bad in (text, tmp_path / "missing.sqlite", tmp_path):
        with pytest.raises(TraceError) as err:
            open_trace(bad)
        assert err.value.path == bad
