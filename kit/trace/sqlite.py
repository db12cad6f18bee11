"""SQLite reports (an nsys export, the kit's recorder.sqlite): the file checks, a read-only connection, and
the column scans both sources share. Their base class only: which source a file is, is decided above both,
in kit.trace.sqlite_open.

A report is evidence: it is opened read-only and never modified; what an analysis builds lives in temp
tables in memory. Each SQLite source presents the normalized temp view `ranges`, for notebooks and
ad-hoc SQL:
    ranges(start, end, tid, pid, domain, name, gtid)
        start/end  ns; end is NULL for a range that never closed: NULL or -1 in the file, or (nsys 2022.4)
                   closed by the profiler at the session end, which it does to every range still open when
                   the program exits
        tid/pid    OS thread/process ids
        domain     NVTX domain name ('' for the default domain)
        name       range text
        gtid       the thread key of kit.trace.source (nsys globalTid; recorder tid)
The analyses read numpy columns instead (`range_columns_multi`: one scan of the file for several names).

An export committed to git is xz-compressed (`*.sqlite.xz`: every call to the GPU host carries the tracked
tree); it is read into memory, never unpacked on disk.
"""

from __future__ import annotations

import lzma
import os
import sqlite3
from abc import abstractmethod
from pathlib import Path
from urllib.parse import quote

import numpy as np

from kit.errors import ExistsError, TraceError
from kit.trace.source import TraceSource

SQLITE_MAGIC = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database
PACKED = ".sqlite.xz"  # an export as committed: xz-compressed, read in memory
SCAN_MIN_ROWS = 20_000  # a thread scans at least this many rows: fewer do not pay for its connection


class SqliteSource(TraceSource):
    """A report in SQLite: a read-only connection plus what the schema guard learned."""

    nsys_version: str | None = None
    schema_version: str | None = None
    session_end: int | None = None  # ranges ending at or after this were closed by the profiler at exit

    def __init__(self, path: Path, con: sqlite3.Connection, columns: dict[str, set[str]]) -> None:
        self.path = path
        self.con = con
        self.columns = columns
        self.warnings: list[str] = []
        self.exported_from: Path | None = None
        self.temp_tables: set[str] = set()  # analysis temp tables already built on `con`
        self.temp_tables_info: dict[str, int] = {}
        self._materialized: dict[tuple[str, str], str] = {}
        self._cache: dict = {}

    # ---- schema facts -------------------------------------------------------------------------
    def has(self, table: str, *cols: str) -> bool:
        """True when the table exists (nsys creates tables lazily) and has all the columns."""
        have = self.columns.get(table)
        return have is not None and all(c in have for c in cols)

    def _nonempty(self, table: str) -> bool:
        if table not in self.columns:
            return False
        return self.con.execute(f"SELECT 1 FROM main.{table} LIMIT 1").fetchone() is not None

    def describe(self) -> dict[str, str | None]:
        return {
            "report": str(self.path),
            "source": self.source,
            "nsys_version": self.nsys_version,
            "export_schema_version": self.schema_version,
            "exported_from": str(self.exported_from) if self.exported_from else None,
        }

    # ---- SQL helpers --------------------------------------------------------------------------
    def query(self, sql: str, params: tuple | list | dict = ()) -> list[tuple]:
        try:
            return self.con.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as exc:
            raise TraceError(
                f"{self.path}: reading the report failed ({exc}): the file may be damaged", path=self.path
            ) from exc

    def concat_columns(
        self, exprs: list[str], from_where: str, params: tuple | list | dict = ()
    ) -> list[np.ndarray]:
        """Integer columns of a query as numpy arrays, fetched as one group_concat string per column.

        Why: sqlite3 builds a Python tuple per row, while group_concat runs in C and numpy parses the text
        far faster. group_concat skips NULLs: columns that must stay aligned need COALESCE; a CASE without
        ELSE deliberately selects a subset.
        """
        return _concat_columns(self.con, self.path, exprs, from_where, params)

    def scan_columns(self, exprs: list[str], table: str, where: str = "1") -> list[np.ndarray]:
        """concat_columns over a big table, split by rowid into slices that threads scan at once, each on
        its own read-only connection (sqlite3 lets go of the GIL while SQLite steps). Rows come back in
        rowid order, as from one scan. Why: this scan is most of an analysis, and the hosts have cores."""
        lo = self.query(f"SELECT MIN(rowid) FROM main.{table}")[0][0]  # separate: each is one seek
        hi = self.query(f"SELECT MAX(rowid) FROM main.{table}")[0][0]
        parts = 1 if lo is None else max(1, min(_scan_threads(), (hi - lo + 1) // SCAN_MIN_ROWS))
        if parts == 1:
            return self.concat_columns(exprs, f"FROM main.{table} WHERE {where}")
        step = -(-(hi - lo + 1) // parts)

        def part(first: int) -> list[np.ndarray]:
            con = connect_ro(self.path)
            try:
                sql = f"FROM main.{table} WHERE rowid BETWEEN {first} AND {first + step - 1} AND ({where})"
                return _concat_columns(con, self.path, exprs, sql)
            finally:
                con.close()

        from concurrent.futures import ThreadPoolExecutor  # only big reports pay for its import

        with ThreadPoolExecutor(parts) as pool:
            slices = list(pool.map(part, range(lo, hi + 1, step)))
        return [np.concatenate(cols) for cols in zip(*slices, strict=True)]

    @staticmethod
    def ordinal_sql(col: str, values: list[int]) -> str | None:
        """SQL mapping `col` to its index in `values` (a short column to fetch instead of a wide id);
        None for a single value, which needs no column."""
        if len(values) < 2:
            return None
        return f"CASE {col} " + " ".join(f"WHEN {int(v)} THEN {i}" for i, v in enumerate(values)) + " END"

    # ---- NVTX ranges --------------------------------------------------------------------------
    @abstractmethod
    def _ranges_where(self, domain: str, names: list[str]) -> tuple[str, dict, list[str], str]:
        """(FROM ... WHERE ..., named params, one SQL condition per name, thread column) selecting the
        ranges of `names` in `domain`."""

    def _end_sql(self, alias: str = "") -> str:
        """A range's end, NULL when it never closed: NULL or -1 in the file, or closed by the profiler
        itself at the session end (nsys 2022.4 does that to every range still open at exit)."""
        a = f"{alias}." if alias else ""
        late = f" OR {a}end >= {int(self.session_end)}" if self.session_end else ""
        return f"CASE WHEN {a}end IS NULL OR {a}end < {a}start{late} THEN NULL ELSE {a}end END"

    def materialize(self, domain: str, name: str) -> str:
        """Copy one range name of one domain into an indexed temp table; return the table's name.

        The table is keyed by (gtid, start), so "ranges on this thread starting in [a, b)" and "the last
        range on this thread starting before t" are index seeks. For ad-hoc SQL and small windows; the
        analyses use `range_columns_multi`, which is cheaper on big reports.
        """
        key = (domain, name)
        if key in self._materialized:
            return self._materialized[key]
        table = f"kit_sel_{len(self._materialized)}"
        from_where, params, _, gcol = self._ranges_where(domain, [name])
        end = self._end_sql()
        try:
            self.con.execute(
                f"CREATE TEMP TABLE {table} (gtid INTEGER, start INTEGER, end INTEGER, src INTEGER, "
                "PRIMARY KEY (gtid, start, src)) WITHOUT ROWID"
            )
            self.con.execute(
                f"INSERT OR IGNORE INTO temp.{table} SELECT {gcol}, start, {end}, rowid {from_where}", params
            )
        except sqlite3.DatabaseError as exc:
            raise TraceError(
                f"{self.path}: reading NVTX ranges failed ({exc}): the file may be damaged", path=self.path
            ) from exc
        self._materialized[key] = table
        return table

    def has_range(self, domain: str, name: str) -> bool:
        """Stops at the first range of that name."""
        from_where, params, _, _ = self._ranges_where(domain, [name])
        return bool(self.query(f"SELECT 1 {from_where} LIMIT 1", params))

    def range_names(self, domain: str) -> dict[str, int]:
        """Through the normalized `ranges` view (one scan of every range)."""
        sql = "SELECT name, COUNT(*) FROM temp.ranges WHERE domain = ? GROUP BY name ORDER BY name"
        return {str(n): int(c) for n, c in self.query(sql, (domain,)) if n is not None}

    def range_columns_multi(
        self, domain: str, names: list[str], gtids: list[int] | None = None, with_end: bool = True
    ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        """{name: (gtid, start, end)} in ONE scan of the file (see TraceSource). With `gtids` the wide
        thread column is not fetched (one thread: no column at all)."""
        from_where, params, conds, gcol = self._ranges_where(domain, names)
        end = f"COALESCE({self._end_sql()}, -1)"
        if gtids is not None:
            if not gtids:
                empty = np.zeros(0, dtype=np.int64)
                return {n: (empty, empty, empty if with_end else None) for n in names}
            from_where += f" AND {gcol} IN ({','.join(str(int(g)) for g in gtids)})"
        thread = gcol if gtids is None else self.ordinal_sql(gcol, gtids)
        exprs: list[str] = []
        for cond in conds:
            exprs.append(f"CASE WHEN {cond} THEN start END")
            if with_end:
                exprs.append(f"CASE WHEN {cond} THEN {end} END")
            if thread is not None:
                exprs.append(f"CASE WHEN {cond} THEN {thread} END")
        cols = iter(self.concat_columns(exprs, from_where, params))
        out = {}
        for name in names:
            start = next(cols)
            stop = next(cols) if with_end else None
            if thread is None:
                g = np.full(len(start), gtids[0] if gtids else 0, dtype=np.int64)
            elif gtids is None:
                g = next(cols)
            else:
                g = np.asarray(gtids, dtype=np.int64)[next(cols)]
            out[name] = (g, start, stop)
        return out

    def close(self) -> None:
        self.con.close()


def _concat_columns(
    con: sqlite3.Connection, path: Path, exprs: list[str], from_where: str, params: tuple | list | dict = ()
) -> list[np.ndarray]:
    sql = "SELECT " + ", ".join(f"group_concat({e})" for e in exprs) + " " + from_where
    try:
        row = con.execute(sql, params if isinstance(params, dict) else tuple(params)).fetchone()
    except sqlite3.DatabaseError as exc:
        raise TraceError(
            f"{path}: reading the report failed ({exc}): the file may be damaged", path=path
        ) from exc
    return [np.fromstring(v or "", dtype=np.int64, sep=",") for v in row]


def _scan_threads() -> int:
    """Threads for one table scan: the cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# ---- the file checks and the connection (kit.trace.sqlite_open opens a report with them) -------------


def check_sqlite_file(path: Path) -> None:
    """Reject non-SQLite and truncated files by their header, before SQLite gives a vaguer error."""
    if path.name.endswith(PACKED):
        data = _unpacked(path)
        size, head = len(data), data[:100]
    else:
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(100)
    if len(head) < 100 or not head.startswith(SQLITE_MAGIC):
        raise TraceError(
            f"{path} is not a SQLite database (nsys export or recorder.sqlite expected)", path=path
        )
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(head[28:32], "big")
    change_counter = int.from_bytes(head[24:28], "big")
    valid_for = int.from_bytes(head[92:96], "big")
    # The in-header page count is trustworthy only when it was written by the same change.
    if pages and change_counter == valid_for and size < pages * page_size:
        raise TraceError(
            f"{path} is truncated: {size} bytes, the header says {pages * page_size}; "
            "re-export or re-copy it",
            path=path,
        )
    if page_size and size % page_size:
        raise TraceError(
            f"{path} is truncated or damaged: {size} bytes is not a multiple of its page size", path=path
        )


def connect_ro(path: Path) -> sqlite3.Connection:
    """Read-only connection (the report is evidence: never modified); temp tables live in memory. A packed
    export is a copy in memory, so nothing reaches the file either."""
    try:
        if path.name.endswith(PACKED):
            con = sqlite3.connect(":memory:")
            if not hasattr(con, "deserialize"):  # Python 3.10
                con.close()
                raise TraceError(
                    f"{path}: reading a compressed export needs Python 3.11+; "
                    f"`xz -dk {path}` and pass the .sqlite",
                    path=path,
                )
            con.deserialize(_unpacked(path))
        else:
            con = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True)
        for pragma in ("temp_store=MEMORY", "cache_size=-262144", "mmap_size=1073741824", "threads=2"):
            con.execute(f"PRAGMA {pragma}")
        con.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        raise TraceError(
            f"{path} cannot be read as SQLite ({exc}): the file is damaged or not a report", path=path
        ) from exc
    return con


def table_columns(con: sqlite3.Connection) -> dict[str, set[str]]:
    names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")]
    return {n: {r[1] for r in con.execute(f"PRAGMA table_info('{n}')")} for n in names}


def _unpacked(path: Path) -> bytes:
    """The database a packed export holds."""
    try:
        return lzma.decompress(path.read_bytes())
    except lzma.LZMAError as exc:
        raise TraceError(
            f"{path} cannot be decompressed ({exc}): the file is damaged; re-copy it", path=path
        ) from exc


def pack(path: Path) -> Path:
    """X.sqlite -> X.sqlite.xz, the form git keeps (the plain file removed once the packed one is whole); an
    X.sqlite.xz already there is refused, never replaced."""
    packed = path.with_name(path.name + ".xz")
    tmp = packed.with_name(f".{packed.name}.{os.getpid()}")
    try:
        tmp.write_bytes(lzma.compress(path.read_bytes(), preset=9))
        os.link(tmp, packed)  # fails where a packed file exists, also one written since a check
    except FileExistsError:
        raise ExistsError(f"{packed} exists; move it aside to pack {path.name} again", path=packed) from None
    finally:
        tmp.unlink(missing_ok=True)
    path.unlink()
    return packed


def unpack(path: Path, dst: Path) -> Path:
    """A packed export written out as a plain SQLite file, for what needs one on disk (sqlite3 writers,
    nsys stats, a byte-level cut)."""
    dst.write_bytes(_unpacked(path))
    return dst
