"""Load a profile (nsys SQLite export, .nsys-rep, or the kit's recorder.sqlite) behind one interface.

Loading is kept apart from analysis (kit/rounds.py): this module knows table and column names of the
exports, guards the schema, and presents normalized tables; the analyzers only speak SQL against them.

Normalized schema (temp view `ranges`, both sources):
    ranges(start, end, tid, pid, domain, name, gtid)
        start/end  ns; end is NULL for a range that never closed: NULL or -1 in the export, or (nsys
                   2022.4) closed by the profiler at the session end, which it does to every range
                   still open when the program exits (detected via ANALYSIS_DETAILS.duration)
        tid/pid    OS thread/process ids (nsys: decoded from globalTid; recorder: tid, pid from kit_meta or 0)
        domain     NVTX domain name ('' for the default domain); domainIds are resolved per process
        name       range text (NVTX_EVENTS.text, or StringIds.value via textId)
        gtid       a thread key unique across processes (nsys globalTid; recorder tid), for joins with
                   CUPTI_ACTIVITY_KIND_RUNTIME.globalTid and CUDA_GRAPH_NODE_EVENTS.globalTid
The view suits notebooks and small reports. Big reports: `materialize(domain, name)` copies one range
name into a temp table keyed (gtid, start) for indexed nesting queries, and `range_columns(...)` hands
the analyzers numpy columns from a single scan (the fastest path: ~1 s for 10^6 ranges on 2 cores).
The report file itself is opened read-only and never modified.
"""

from __future__ import annotations

import os
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import numpy as np

from kit.errors import KitError

SQLITE_MAGIC = b"SQLite format 3\x00"
# ENUM_NSYS_EVENT_TYPE ids; read from the export when it carries the enum table.
NVTX_PUSHPOP, NVTX_STARTEND, NVTX_DOMAIN_CREATE = 59, 60, 75
_EVENT_TYPE_NAMES = {
    "NvtxPushPopRange": "pushpop",
    "NvtxStartEndRange": "startend",
    "NvtxDomainCreate": "domain_create",
}
# Columns the analyzers read, per table; a table that exists without them is an unsupported export.
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "NVTX_EVENTS": ("start", "end", "eventType", "globalTid", "text", "textId", "domainId"),
    "StringIds": ("id", "value"),
    "CUPTI_ACTIVITY_KIND_KERNEL": ("start", "end", "correlationId", "shortName"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("start", "end", "globalTid", "correlationId", "nameId"),
    "CUDA_GRAPH_NODE_EVENTS": ("start", "globalTid", "graphNodeId", "originalGraphNodeId"),
}
RECORDER_COLUMNS = ("start", "end", "tid", "domain", "name")
TESTED_NSYS = ("2022.4", "2025.3")
SCAN_MIN_ROWS = 20_000  # a thread scans at least this many rows: fewer do not pay for its connection
_PID = "((({c}) >> 24) & 16777215)"
_TID = "(({c}) & 16777215)"


def pid_of(col: str) -> str:
    """SQL expression: the OS pid inside an nsys serialized globalTid/globalPid."""
    return _PID.format(c=col)


def tid_of(col: str) -> str:
    """SQL expression: the OS tid inside an nsys serialized globalTid."""
    return _TID.format(c=col)


@dataclass
class NvtxStatus:
    """What the report says about one NVTX domain; `dropped` is the nsys 2022.4 + nvtx>=0.2.12 failure."""

    domain: str
    created: bool
    has_ranges: bool

    @property
    def dropped(self) -> bool:
        return self.created and not self.has_ranges


@dataclass
class Trace:
    """An opened report: a read-only SQLite connection plus what the schema guard learned."""

    path: Path
    source: str  # "nsys" | "recorder"
    con: sqlite3.Connection
    columns: dict[str, set[str]]
    nsys_version: str | None = None
    schema_version: str | None = None
    exported_from: Path | None = None
    warnings: list[str] = field(default_factory=list)
    temp_tables: set[str] = field(default_factory=set)  # analyzer temp tables already built on `con`
    temp_tables_info: dict[str, int] = field(default_factory=dict)
    _materialized: dict[tuple[str, str], str] = field(default_factory=dict)
    _cache: dict = field(default_factory=dict)
    _event_types: dict[str, int] = field(default_factory=dict)
    recorder_pid: int = 0  # kit_meta 'pid' when the recorder wrote one
    session_end: int | None = None  # ANALYSIS_DETAILS.duration: nsys closes dangling ranges at this time

    # ---- schema facts -------------------------------------------------------------------------
    def has(self, table: str, *cols: str) -> bool:
        """True when the table exists (lazily created by nsys) and has all the columns."""
        have = self.columns.get(table)
        return have is not None and all(c in have for c in cols)

    @property
    def has_kernels(self) -> bool:
        return self.source == "nsys" and self._nonempty("CUPTI_ACTIVITY_KIND_KERNEL")

    @property
    def has_runtime(self) -> bool:
        return self.source == "nsys" and self._nonempty("CUPTI_ACTIVITY_KIND_RUNTIME")

    @property
    def has_graph_replays(self) -> bool:
        """Replayed kernels carry graphNodeId and the node events exist: the graph method can work."""
        if not (self.has_kernels and self.has("CUPTI_ACTIVITY_KIND_KERNEL", "graphNodeId")):
            return False
        if not self._nonempty("CUDA_GRAPH_NODE_EVENTS"):
            return False
        row = self.con.execute(
            "SELECT 1 FROM main.CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NOT NULL LIMIT 1"
        ).fetchone()
        return row is not None

    def _nonempty(self, table: str) -> bool:
        if table not in self.columns:
            return False
        return self.con.execute(f"SELECT 1 FROM main.{table} LIMIT 1").fetchone() is not None

    def describe(self) -> dict[str, str | None]:
        """Provenance of the report for verdict.json."""
        return {
            "report": str(self.path),
            "source": self.source,
            "nsys_version": self.nsys_version,
            "export_schema_version": self.schema_version,
            "exported_from": str(self.exported_from) if self.exported_from else None,
        }

    # ---- SQL helpers --------------------------------------------------------------------------
    def query(self, sql: str, params: tuple | dict = ()) -> list[tuple]:
        try:
            return self.con.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as exc:
            raise KitError(
                f"{self.path}: reading the report failed ({exc}): the file may be damaged"
            ) from exc

    def pid_expr(self, col: str) -> str:
        return pid_of(col) if self.source == "nsys" else str(self.recorder_pid)

    def tid_expr(self, col: str) -> str:
        return tid_of(col) if self.source == "nsys" else f"({col})"

    # ---- NVTX ---------------------------------------------------------------------------------
    def _domain_rows(self) -> list[tuple[int, int, str]]:
        """(pid, domainId, name) of every domain-create event; one scan, cached."""
        if "domain_rows" not in self._cache:
            rows: list[tuple[int, int, str]] = []
            if self.source == "nsys" and self.has("NVTX_EVENTS"):
                rows = [
                    (int(p), int(d), t)
                    for p, d, t in self.query(
                        f"SELECT DISTINCT {pid_of('globalTid')}, domainId, text FROM main.NVTX_EVENTS "
                        "WHERE eventType = ?",
                        (self._event_types["domain_create"],),
                    )
                    if d is not None
                ]
            self._cache["domain_rows"] = rows
        return self._cache["domain_rows"]

    def _domain_filter(self, domain: str) -> str:
        """WHERE fragment restricting NVTX_EVENTS to one domain, as cheap as the report allows.

        domainIds are per process (each process numbers its domains from 1), so the id alone is enough
        only when no process uses one of our ids for another domain. Ids are integers read from the
        report, inlined.
        """
        if domain == "":
            return "(domainId IS NULL OR domainId = 0)"
        rows = self._domain_rows()
        pairs = sorted({(p, d) for p, d, t in rows if t == domain})
        if not pairs:
            return "0"
        ids = sorted({d for _, d in pairs})
        if not any(d in ids and t != domain for _, d, t in rows):
            return f"domainId IN ({','.join(map(str, ids))})"
        values = ",".join(f"({p}, {d})" for p, d in pairs)
        return f"({pid_of('globalTid')}, domainId) IN (VALUES {values})"

    def _end_sql(self, alias: str = "") -> str:
        """A range's end, NULL when it never closed: NULL or -1 in the export, or (nsys 2022.4) closed by
        the profiler itself at the session end, which it does for every range still open at exit."""
        a = f"{alias}." if alias else ""
        late = f" OR {a}end >= {int(self.session_end)}" if self.session_end else ""
        return f"CASE WHEN {a}end IS NULL OR {a}end < {a}start{late} THEN NULL ELSE {a}end END"

    def _name_condition(self, name: str, param: str) -> str:
        """SQL true for NVTX_EVENTS rows whose text is `name` (inline text or a registered string id)."""
        if self.source == "recorder":
            return f"name = :{param}"
        ids = [int(r[0]) for r in self.query("SELECT id FROM main.StringIds WHERE value = ?", (name,))]
        by_id = f"textId IN ({','.join(map(str, ids))}) OR " if ids else ""
        return f"({by_id}text = :{param})"

    def _ranges_where(self, domain: str, names: list[str]) -> tuple[str, dict, list[str], str]:
        """(FROM ... WHERE ..., named params, one condition per name, thread column) for ranges of
        `names` in `domain`."""
        params: dict = {f"n{i}": n for i, n in enumerate(names)}
        if self.source == "recorder":
            conds = [f"name = :n{i}" for i in range(len(names))]
            params["domain"] = domain
            return (
                f"FROM main.kit_ranges WHERE domain = :domain AND ({' OR '.join(conds)})",
                params,
                conds,
                "tid",
            )
        if not self.has("NVTX_EVENTS"):
            conds = ["0" for _ in names]
            return "FROM (SELECT 0 AS globalTid, 0 AS start, 0 AS end) WHERE 0", {}, conds, "globalTid"
        conds = [self._name_condition(n, f"n{i}") for i, n in enumerate(names)]
        dom_sql = self._domain_filter(domain)
        kinds = f"{self._event_types['pushpop']}, {self._event_types['startend']}"
        sql = f"FROM main.NVTX_EVENTS WHERE eventType IN ({kinds}) AND ({' OR '.join(conds)}) AND {dom_sql}"
        return sql, params, conds, "globalTid"

    def materialize(self, domain: str, name: str) -> str:
        """Copy one range name of one domain into an indexed temp table; return the table's name.

        The table is keyed by (gtid, start), so "ranges on this thread starting in [a, b)" and "the last
        range on this thread starting before t" are index seeks. For ad-hoc SQL and small windows (the
        timeline); the analyzers use `range_columns`, which is ~2x cheaper on a million ranges.
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
            raise KitError(
                f"{self.path}: reading NVTX ranges failed ({exc}): the file may be damaged"
            ) from exc
        self._materialized[key] = table
        return table

    def concat_columns(
        self, exprs: list[str], from_where: str, params: tuple | list | dict = ()
    ) -> list[np.ndarray]:
        """Integer columns of a query as numpy arrays, fetched as one group_concat string per column.

        Why: sqlite3 builds a Python tuple per row (~1 s per million rows on 2 cores), while group_concat
        runs in C and numpy parses the text in milliseconds. group_concat skips NULLs: columns that must
        stay aligned need COALESCE; a CASE without ELSE deliberately selects a subset.
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
            con = _connect_ro(self.path)
            try:
                sql = f"FROM main.{table} WHERE rowid BETWEEN {first} AND {first + step - 1} AND ({where})"
                return _concat_columns(con, self.path, exprs, sql)
            finally:
                con.close()

        from concurrent.futures import ThreadPoolExecutor

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

    def range_columns_multi(
        self, domain: str, names: list[str], gtids: list[int] | None = None, with_end: bool = True
    ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        """{name: (gtid, start, end)} for several range names of `domain` in ONE scan of the report.

        end is -1 for an unclosed range (None when with_end is False). `gtids` restricts to those
        threads and avoids fetching the wide thread column (one thread: not fetched at all).
        """
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

    def range_columns(
        self, domain: str, name: str, gtids: list[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(gtid, start, end) of the ranges named `name` in `domain`; end = -1 when unclosed."""
        g, start, stop = self.range_columns_multi(domain, [name], gtids)[name]
        assert stop is not None
        return g, start, stop

    def nvtx_status(self, domain: str) -> NvtxStatus:
        """Was the domain created, and does it hold any range? (cheap: stops at the first match)."""
        if ("status", domain) in self._cache:
            return self._cache[("status", domain)]
        status = self._nvtx_status(domain)
        self._cache[("status", domain)] = status
        return status

    def _nvtx_status(self, domain: str) -> NvtxStatus:
        if self.source == "recorder":
            has = self.con.execute("SELECT 1 FROM main.kit_ranges WHERE domain = ? LIMIT 1", (domain,))
            found = has.fetchone() is not None
            return NvtxStatus(domain, created=found, has_ranges=found)
        if not self.has("NVTX_EVENTS"):
            return NvtxStatus(domain, created=False, has_ranges=False)
        created = any(t == domain for _, _, t in self._domain_rows())
        row = self.query(
            "SELECT 1 FROM main.NVTX_EVENTS WHERE eventType IN (?, ?) "
            f"AND {self._domain_filter(domain)} LIMIT 1",
            (self._event_types["pushpop"], self._event_types["startend"]),
        )
        return NvtxStatus(domain, created=created, has_ranges=bool(row))

    def domains(self) -> list[str]:
        """Domain names created in the report (nsys) or used (recorder)."""
        if self.source == "recorder":
            return [r[0] for r in self.query("SELECT DISTINCT domain FROM main.kit_ranges ORDER BY 1")]
        return sorted({t for _, _, t in self._domain_rows() if t is not None})

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Trace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _concat_columns(
    con: sqlite3.Connection, path: Path, exprs: list[str], from_where: str, params: tuple | list | dict = ()
) -> list[np.ndarray]:
    sql = "SELECT " + ", ".join(f"group_concat({e})" for e in exprs) + " " + from_where
    try:
        row = con.execute(sql, params if isinstance(params, dict) else tuple(params)).fetchone()
    except sqlite3.DatabaseError as exc:
        raise KitError(f"{path}: reading the report failed ({exc}): the file may be damaged") from exc
    return [np.fromstring(v or "", dtype=np.int64, sep=",") for v in row]


def _scan_threads() -> int:
    """Threads for one table scan: the cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# ---- opening ----------------------------------------------------------------------------------


def open_trace(path: Path | str) -> Trace:
    """Open an nsys SQLite export, a recorder.sqlite, or an .nsys-rep (exported next to it with nsys)."""
    path = Path(path)
    if not path.exists():
        raise KitError(f"{path} not found")
    if path.is_dir():
        raise KitError(
            f"{path} is a directory: pass a .sqlite/.nsys-rep file (or use kit.analysis.analyze on a run dir)"
        )
    exported_from = None
    if path.suffix in (".nsys-rep", ".qdrep"):
        exported_from = path
        path = export_report(path)
    elif path.suffix == ".qdstrm":
        raise KitError(
            f"{path} is an unimported .qdstrm: nsys could not run its importer (see facts: the Debian "
            "package needs the host-linux-x64 symlink; run scripts/ensure-nsys.sh) and re-profile"
        )
    _check_sqlite_file(path)
    con = _connect_ro(path)
    try:
        trace = _guard(path, con)
    except Exception:
        con.close()
        raise
    trace.exported_from = exported_from
    return trace


def _check_sqlite_file(path: Path) -> None:
    """Reject non-SQLite and truncated files by their header, before SQLite gives a vaguer error."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(100)
    if len(head) < 100 or not head.startswith(SQLITE_MAGIC):
        raise KitError(f"{path} is not a SQLite database (nsys export or recorder.sqlite expected)")
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(head[28:32], "big")
    change_counter = int.from_bytes(head[24:28], "big")
    valid_for = int.from_bytes(head[92:96], "big")
    # The in-header page count is trustworthy only when it was written by the same change.
    if pages and change_counter == valid_for and size < pages * page_size:
        raise KitError(
            f"{path} is truncated: {size} bytes, the header says {pages * page_size}; re-export or re-copy it"
        )
    if page_size and size % page_size:
        raise KitError(f"{path} is truncated or damaged: {size} bytes is not a multiple of its page size")


def _connect_ro(path: Path) -> sqlite3.Connection:
    """Read-only connection (the report is evidence: never modified); temp tables live in memory."""
    try:
        con = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True)
        for pragma in ("temp_store=MEMORY", "cache_size=-262144", "mmap_size=1073741824", "threads=2"):
            con.execute(f"PRAGMA {pragma}")
        con.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        raise KitError(
            f"{path} cannot be read as SQLite ({exc}): the file is damaged or not a report"
        ) from exc
    return con


def _table_columns(con: sqlite3.Connection) -> dict[str, set[str]]:
    names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")]
    return {n: {r[1] for r in con.execute(f"PRAGMA table_info('{n}')")} for n in names}


def _meta(con: sqlite3.Connection, columns: dict[str, set[str]]) -> dict[str, str]:
    """Key/value metadata: EXPORT_META_DATA (nsys 2022.4) or META_DATA_EXPORT/_CAPTURE (newer)."""
    meta: dict[str, str] = {}
    for table in ("EXPORT_META_DATA", "META_DATA_EXPORT", "META_DATA_CAPTURE"):
        cols = columns.get(table)
        if not cols:
            continue
        key, val = ("name", "value") if {"name", "value"} <= cols else (None, None)
        if key is None:
            ordered = [r[1] for r in con.execute(f"PRAGMA table_info('{table}')")]
            if len(ordered) < 2:
                continue
            key, val = ordered[0], ordered[1]
        for k, v in con.execute(f'SELECT "{key}", "{val}" FROM main.{table}'):
            if k is not None:
                meta.setdefault(str(k), "" if v is None else str(v))
    return meta


def _versions(meta: dict[str, str]) -> tuple[str | None, str | None]:
    product = schema = None
    for key, value in meta.items():
        upper = key.upper()
        if "SCHEMA_VERSION" in upper and not re.search(r"(MAJOR|MINOR|MICRO|CKSUM)$", upper):
            schema = schema or value
        elif re.search(r"(PRODUCT_VERSION|NSYS_VERSION|NSIGHT_SYSTEMS_VERSION|^VERSION)$", upper):
            product = product or value
    return product, schema


def _guard(path: Path, con: sqlite3.Connection) -> Trace:
    """Decide what the file is and whether the kit can read it; fail in one line naming what is missing."""
    try:
        columns = _table_columns(con)
    except sqlite3.DatabaseError as exc:
        raise KitError(f"{path} cannot be read as SQLite ({exc}): the file is damaged") from exc
    if "kit_ranges" in columns:
        missing = [c for c in RECORDER_COLUMNS if c not in columns["kit_ranges"]]
        if missing:
            raise KitError(f"{path}: recorder table kit_ranges lacks column(s) {', '.join(missing)}")
        trace = Trace(path=path, source="recorder", con=con, columns=columns)
        if "kit_meta" in columns:
            meta = dict(con.execute("SELECT key, value FROM main.kit_meta").fetchall())
            if str(meta.get("pid", "")).isdigit():
                trace.recorder_pid = int(meta["pid"])
        trace.warnings.append("recorder.sqlite: in-process timestamps, NOT measured under Nsight Systems")
        _create_ranges_view(trace)
        return trace

    is_nsys = bool({"EXPORT_META_DATA", "META_DATA_EXPORT"} & columns.keys()) or (
        "StringIds" in columns and any(t in columns for t in ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL"))
    )
    if not is_nsys:
        raise KitError(
            f"{path} is SQLite but neither an nsys export (no META_DATA_EXPORT/EXPORT_META_DATA, NVTX_EVENTS "
            "or CUPTI tables) nor a kit recorder file (no kit_ranges table)"
        )
    meta = _meta(con, columns)
    product, schema = _versions(meta)
    where = f"export from nsys {product or '?'} (schema {schema or '?'})"
    needs_strings = any(t in columns for t in ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL"))
    if needs_strings and "StringIds" not in columns:
        raise KitError(
            f"{path}: table StringIds is missing ({where}); the kit reads nsys 2022.4 and 2025.3 exports"
        )
    for table, cols in REQUIRED_COLUMNS.items():
        if table not in columns:
            continue
        missing = [c for c in cols if c not in columns[table]]
        if missing:
            raise KitError(
                f"{path}: table {table} lacks column(s) {', '.join(missing)} ({where}); "
                f"the kit reads nsys {' and '.join(TESTED_NSYS)} exports"
            )
    trace = Trace(
        path=path, source="nsys", con=con, columns=columns, nsys_version=product, schema_version=schema
    )
    if product and not any(product.startswith(v) for v in TESTED_NSYS):
        trace.warnings.append(
            f"nsys {product} export: the kit was tested with nsys {' and '.join(TESTED_NSYS)}"
        )
    trace._event_types = _event_types(con, columns)
    if {"duration"} <= columns.get("ANALYSIS_DETAILS", set()):
        row = con.execute("SELECT MAX(duration) FROM main.ANALYSIS_DETAILS").fetchone()
        trace.session_end = int(row[0]) if row and row[0] else None
    _create_ranges_view(trace)
    return trace


def _event_types(con: sqlite3.Connection, columns: dict[str, set[str]]) -> dict[str, int]:
    found = {"pushpop": NVTX_PUSHPOP, "startend": NVTX_STARTEND, "domain_create": NVTX_DOMAIN_CREATE}
    if {"id", "name"} <= columns.get("ENUM_NSYS_EVENT_TYPE", set()):
        for ident, name in con.execute("SELECT id, name FROM main.ENUM_NSYS_EVENT_TYPE"):
            if name in _EVENT_TYPE_NAMES:
                found[_EVENT_TYPE_NAMES[name]] = int(ident)
    return found


def _create_ranges_view(trace: Trace) -> None:
    """The normalized `ranges` view (see module docstring)."""
    end = trace._end_sql("e")
    if trace.source == "recorder":
        sql = (
            f"CREATE TEMP VIEW ranges AS SELECT e.start AS start, {end} AS end, e.tid AS tid, "
            f"{trace.recorder_pid} AS pid, e.domain AS domain, e.name AS name, e.tid AS gtid "
            "FROM main.kit_ranges e"
        )
    elif trace.has("NVTX_EVENTS"):
        types = trace._event_types
        sql = (
            "CREATE TEMP VIEW ranges AS "
            f"SELECT e.start AS start, {end} AS end, {tid_of('e.globalTid')} AS tid, "
            f"{pid_of('e.globalTid')} AS pid, COALESCE(d.text, '') AS domain, "
            "COALESCE(e.text, s.value) AS name, e.globalTid AS gtid "
            "FROM main.NVTX_EVENTS e "
            "LEFT JOIN main.StringIds s ON s.id = e.textId "
            f"LEFT JOIN (SELECT DISTINCT {pid_of('globalTid')} AS pid, domainId, text FROM main.NVTX_EVENTS "
            f"WHERE eventType = {types['domain_create']}) d "
            f"ON d.domainId = e.domainId AND d.pid = {pid_of('e.globalTid')} "
            f"WHERE e.eventType IN ({types['pushpop']}, {types['startend']})"
        )
    else:
        sql = (
            "CREATE TEMP VIEW ranges AS SELECT NULL AS start, NULL AS end, NULL AS tid, NULL AS pid, "
            "NULL AS domain, NULL AS name, NULL AS gtid WHERE 0"
        )
    trace.con.execute(sql)


# ---- .nsys-rep -> .sqlite ---------------------------------------------------------------------


def _new_export_path(rep: Path) -> Path:
    """X.sqlite next to X.nsys-rep, or X.1.sqlite, X.2.sqlite ... : an export never overwrites a file."""
    candidate = rep.with_suffix(".sqlite")
    n = 0
    while candidate.exists():
        n += 1
        candidate = rep.with_name(f"{rep.stem}.{n}.sqlite")
    return candidate


def export_report(rep: Path | str) -> Path:
    """Export an .nsys-rep to SQLite with nsys (KIT_NSYS or PATH), into a new file next to it."""
    from kit.trace import nsys as capture
    rep = Path(rep)
    nsys = capture.find_nsys()
    if nsys is None:
        raise KitError(
            f"{rep} needs `nsys export` but nsys is not on PATH: install Nsight Systems "
            "(scripts/ensure-nsys.sh) or pass the exported .sqlite instead"
        )
    return capture.export_sqlite(nsys, rep, _new_export_path(rep))
