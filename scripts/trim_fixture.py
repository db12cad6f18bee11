"""Trim a real `kit run` directory into a small test fixture (deterministic: same input, same bytes).

    .venv/bin/python scripts/trim_fixture.py SRC_RUN_DIR DST_RUN_DIR [--rounds 8]

Why: a real sglang report is 1-10 MB, most of it tables the kit never reads and decode iterations past
the few the tests need. What is kept of profile.sqlite:
- everything before the start of draft round `rounds + 1` counted from the probe's profile-window mark
  (NVTX `draft_round` of domain pr29654; a CUDA-graph report starts at capture and holds the warm-up
  requests' rounds before that mark, which the analysis leaves out, so they are kept but not counted): the
  capture-time NVTX ranges and CUDA graph node events the graph attribution follows, and every kernel
  launched before the cut, with its runtime call;
- of the runtime calls, those that launched a kernel (what every analysis joins on); the others are
  50-97% of the rows (torch's stream-capture queries, event create/record/destroy, synchronisations) and
  no analysis reads them;
- only the tables the kit reads (kit/trace/nsys_export.py REQUIRED_COLUMNS, metadata, enums) plus the
  GPU/device info.
Also deleted: the host's environment variables (META_DATA_CAPTURE), PROCESSES/ThreadNames rows of other
processes, and every StringIds row that no kept row references. Then VACUUM, and xz (profile.sqlite.xz, the
form git keeps: kit.trace.sqlite reads it in memory).
The run's params.json, outputs.jsonl, provenance.json and probe_census.jsonl are copied as they are.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

import _checkout  # noqa: F401  (this checkout's kit first on sys.path)

from kit.errors import InputError, KitError
from kit.probe.targets import WINDOW_START
from kit.rundir import RunDir
from kit.trace.sqlite import PACKED, pack, unpack

DOMAIN, ROUND = "pr29654", "draft_round"
RUN_FILES = ("params.json", "outputs.jsonl", "provenance.json", "probe_census.jsonl")
KEEP_TABLES = (
    "StringIds",
    "NVTX_EVENTS",
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUDA_GRAPH_NODE_EVENTS",
    "META_DATA_EXPORT",
    "META_DATA_CAPTURE",
    "ANALYSIS_DETAILS",
    "ENUM_NSYS_EVENT_TYPE",
    "ENUM_NSYS_EVENT_CLASS",
    "ENUM_CUDA_KERNEL_LAUNCH_TYPE",
    "TARGET_INFO_GPU",
    "TARGET_INFO_CUDA_DEVICE",
    "TARGET_INFO_SESSION_START_TIME",
    "PROCESSES",
    "ThreadNames",
)
# (table, column) pairs that reference StringIds.id in the kept tables.
STRING_REFS = (
    ("NVTX_EVENTS", "textId"),
    ("NVTX_EVENTS", "jsonTextId"),
    ("CUPTI_ACTIVITY_KIND_RUNTIME", "nameId"),
    ("CUPTI_ACTIVITY_KIND_KERNEL", "shortName"),
    ("CUPTI_ACTIVITY_KIND_KERNEL", "demangledName"),
    ("CUPTI_ACTIVITY_KIND_KERNEL", "mangledName"),
    ("CUDA_GRAPH_NODE_EVENTS", "nameId"),
    ("ThreadNames", "nameId"),
)
PID = "((({c}) >> 24) & 16777215)"


def _pid(col: str) -> str:
    return PID.format(c=col)


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in con.execute(f"PRAGMA table_info({table})")}


def _starts(con: sqlite3.Connection, text: str, closed: bool) -> list[int]:
    """Start times of our domain's NVTX events named `text` (closed ranges only, or marks too), in order."""
    rows = con.execute(
        "SELECT e.start FROM NVTX_EVENTS e "
        "JOIN (SELECT DISTINCT globalTid >> 24 AS p, domainId, text FROM NVTX_EVENTS WHERE eventType = 75) d "
        "ON d.p = e.globalTid >> 24 AND d.domainId = e.domainId AND d.text = ? "
        "LEFT JOIN StringIds s ON s.id = e.textId "
        "WHERE COALESCE(e.text, s.value) = ? "
        + ("AND e.end IS NOT NULL AND e.end >= e.start " if closed else "")
        + "ORDER BY e.start",
        (DOMAIN, text),
    ).fetchall()
    return [r[0] for r in rows]


def round_starts(con: sqlite3.Connection) -> list[int]:
    """Start times of the closed draft_round ranges of our domain, in time order (any process)."""
    return _starts(con, ROUND, closed=True)


def rounds_before_window(con: sqlite3.Connection, starts: list[int]) -> int:
    """Rounds before the probe's profile-window mark: with CUDA graphs the report starts at capture and
    holds the warm-up requests' rounds, which the analysis leaves out (analyze._window_rounds)."""
    mark = _starts(con, WINDOW_START, closed=False)
    return sum(1 for t in starts if t < mark[0]) if mark else 0


def trim_report(src: Path, dst: Path, rounds: int) -> dict[str, int]:
    """Copy src (plain or packed) to dst and trim dst in place; returns row counts of the kept tables."""
    if src.name.endswith(PACKED):
        unpack(src, dst)
    else:
        shutil.copyfile(src, dst)
    con = sqlite3.connect(dst)
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    for t in tables:
        if t not in KEEP_TABLES:
            con.execute(f"DROP TABLE {t}")
    starts = round_starts(con)
    if not starts:
        con.close()
        raise InputError(f"{src}: no {DOMAIN}/{ROUND} ranges: nothing to cut at", path=src)
    end = rounds_before_window(con, starts) + rounds  # keep `rounds` rounds the analysis counts
    cut = starts[end] if len(starts) > end else None
    present = set(tables) & set(KEEP_TABLES)
    if cut is not None:
        for t in ("NVTX_EVENTS", "CUDA_GRAPH_NODE_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME"):
            if t in present:
                con.execute(f"DELETE FROM {t} WHERE start >= ?", (cut,))
    # Kernels join their launch call on (pid, correlationId).
    con.execute("CREATE TEMP TABLE launched (pid INTEGER, cid INTEGER, PRIMARY KEY (pid, cid)) WITHOUT ROWID")
    con.execute(
        f"INSERT OR IGNORE INTO temp.launched SELECT {_pid('globalPid')}, correlationId "
        "FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE correlationId IS NOT NULL"
    )
    con.execute(
        "DELETE FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE NOT EXISTS (SELECT 1 FROM temp.launched l "
        f"WHERE l.pid = {_pid('globalTid')} AND l.cid = correlationId)"
    )
    con.execute("DELETE FROM temp.launched")
    con.execute(
        f"INSERT OR IGNORE INTO temp.launched SELECT {_pid('globalTid')}, correlationId "
        "FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId IS NOT NULL"
    )
    con.execute(
        "DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE NOT EXISTS (SELECT 1 FROM temp.launched l "
        f"WHERE l.pid = {_pid('globalPid')} AND l.cid = correlationId)"
    )
    if "META_DATA_CAPTURE" in present:
        con.execute("DELETE FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT_VARIABLE%'")
    pids = {
        r[0]
        for t, c in (
            ("NVTX_EVENTS", "globalTid"),
            ("CUPTI_ACTIVITY_KIND_RUNTIME", "globalTid"),
            ("CUPTI_ACTIVITY_KIND_KERNEL", "globalPid"),
            ("CUDA_GRAPH_NODE_EVENTS", "globalTid"),
        )
        if t in present
        for r in con.execute(f"SELECT DISTINCT {_pid(c)} FROM {t}")
    }
    keep = ",".join(str(p) for p in sorted(pids)) or "-1"
    if "PROCESSES" in present:
        con.execute(f"DELETE FROM PROCESSES WHERE pid NOT IN ({keep})")
    if "ThreadNames" in present:
        con.execute(f"DELETE FROM ThreadNames WHERE {_pid('globalTid')} NOT IN ({keep})")
    used = " UNION ".join(
        f"SELECT {c} FROM {t} WHERE {c} IS NOT NULL"
        for t, c in STRING_REFS
        if t in present and c in _columns(con, t)
    )
    con.execute(f"DELETE FROM StringIds WHERE id NOT IN ({used})")
    con.commit()
    con.execute("VACUUM")
    counts = {t: con.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in sorted(present)}
    counts["draft_rounds"] = len(round_starts(con))
    con.close()
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", type=Path, help="a run directory of `kit run` (with profile.sqlite[.xz])")
    p.add_argument("dst", type=Path, help="new fixture directory (must not exist)")
    p.add_argument(
        "--rounds", type=int, default=8, help="draft rounds to keep: the first ones inside the profile window"
    )
    a = p.parse_args(argv)
    src = RunDir(a.src)
    report = next((r for r in (src.nsys_sqlite, src.nsys_sqlite_packed) if r.is_file()), None)
    if report is None:
        print(
            f"trim_fixture: {a.src} holds no profile.sqlite[.xz]: pass a run directory of `kit run`",
            file=sys.stderr,
        )
        return 2
    if a.dst.exists():
        print(f"trim_fixture: {a.dst} exists: refusing to overwrite it", file=sys.stderr)
        return 2
    # built beside dst and renamed at the end: an interrupted or failed trim leaves no half fixture
    a.dst.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{a.dst.name}.", dir=a.dst.parent))
    try:
        for name in RUN_FILES:
            if (a.src / name).is_file():
                shutil.copyfile(a.src / name, work / name)
        plain = RunDir(work).nsys_sqlite
        counts = trim_report(report, plain, a.rounds)
        size = plain.stat().st_size
        packed = pack(plain).name  # the form git keeps
        work.chmod(0o755)  # mkdtemp's 0700 is for the work in progress, not the fixture
        try:
            work.rename(a.dst)
        except OSError:  # dst appeared since the check: another trim wrote it
            raise InputError(f"{a.dst} exists: refusing to overwrite it", path=a.dst) from None
    except (KitError, sqlite3.DatabaseError, OSError) as exc:
        print(f"trim_fixture: {exc}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{a.dst / packed}: {(a.dst / packed).stat().st_size} bytes ({size} unpacked), {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
