"""An nsys SQLite export as a trace source: the schema guard, versions, and the NVTX half (ranges, domains).
The CUDA half (runtime calls, kernels, graph nodes) is kit.trace.nsys_cuda; an .nsys-rep is exported with
nsys first (kit.trace.nsys).

NVTX_EVENTS holds push/pop and start/end ranges (text inline, or a StringIds id in textId) and, per
process, the domain-create events that name the domainIds; event type ids come from ENUM_NSYS_EVENT_TYPE
when the export carries it. The guard names any table or column the analyses need and the file lacks.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from kit.errors import TraceError
from kit.trace.nsys_cuda import NsysCuda, pid_of, tid_of
from kit.trace.source import NvtxStatus

# ENUM_NSYS_EVENT_TYPE ids; read from the export when it carries the enum table.
NVTX_PUSHPOP, NVTX_STARTEND, NVTX_DOMAIN_CREATE = 59, 60, 75
_EVENT_TYPE_NAMES = {
    "NvtxPushPopRange": "pushpop",
    "NvtxStartEndRange": "startend",
    "NvtxDomainCreate": "domain_create",
}
# Columns the analyses read, per table; a table that exists without them is an unsupported export.
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "NVTX_EVENTS": ("start", "end", "eventType", "globalTid", "text", "textId", "domainId"),
    "StringIds": ("id", "value"),
    "CUPTI_ACTIVITY_KIND_KERNEL": ("start", "end", "correlationId", "shortName"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("start", "end", "globalTid", "correlationId", "nameId"),
    "CUDA_GRAPH_NODE_EVENTS": ("start", "globalTid", "graphNodeId", "originalGraphNodeId"),
}
TESTED_NSYS = ("2022.4", "2025.3")


class NsysSource(NsysCuda):
    """An nsys export. Thread key: globalTid; ranges' domain ids are resolved per process."""

    ranges_hint = "was it profiled with --trace=nvtx and the kit's NVTX probe on?"

    @staticmethod
    def claims(columns: dict[str, set[str]]) -> bool:
        return bool({"EXPORT_META_DATA", "META_DATA_EXPORT"} & columns.keys()) or (
            "StringIds" in columns
            and any(t in columns for t in ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL"))
        )

    def __init__(self, path: Path, con: sqlite3.Connection, columns: dict[str, set[str]]) -> None:
        """Decide whether the kit can read the export; fail in one line naming what is missing."""
        super().__init__(path, con, columns)
        product, schema = _versions(_meta(con, columns))
        where = f"export from nsys {product or '?'} (schema {schema or '?'})"
        needs_strings = any(t in columns for t in ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL"))
        if needs_strings and "StringIds" not in columns:
            raise TraceError(
                f"{path}: table StringIds is missing ({where}); the kit reads nsys 2022.4 and 2025.3 exports",
                path=path,
            )
        for table, cols in REQUIRED_COLUMNS.items():
            if table not in columns:
                continue
            missing = [c for c in cols if c not in columns[table]]
            if missing:
                raise TraceError(
                    f"{path}: table {table} lacks column(s) {', '.join(missing)} ({where}); "
                    f"the kit reads nsys {' and '.join(TESTED_NSYS)} exports",
                    path=path,
                )
        self.nsys_version, self.schema_version = product, schema
        if product and not any(product.startswith(v) for v in TESTED_NSYS):
            self.warnings.append(
                f"nsys {product} export: the kit was tested with nsys {' and '.join(TESTED_NSYS)}"
            )
        self._event_types = _event_types(con, columns)
        if {"duration"} <= columns.get("ANALYSIS_DETAILS", set()):
            # nsys 2022.4 closes every range still open at exit at this time: such ranges never closed
            row = con.execute("SELECT MAX(duration) FROM main.ANALYSIS_DETAILS").fetchone()
            self.session_end = int(row[0]) if row and row[0] else None
        self._create_ranges_view()

    # ---- NVTX ---------------------------------------------------------------------------------
    def _domain_rows(self) -> list[tuple[int, int, str]]:
        """(pid, domainId, name) of every domain-create event; one scan, cached."""
        if "domain_rows" not in self._cache:
            rows: list[tuple[int, int, str]] = []
            if self.has("NVTX_EVENTS"):
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

    def _name_condition(self, name: str, param: str) -> str:
        """SQL true for NVTX_EVENTS rows whose text is `name` (inline text or a registered string id)."""
        ids = [int(r[0]) for r in self.query("SELECT id FROM main.StringIds WHERE value = ?", (name,))]
        by_id = f"textId IN ({','.join(map(str, ids))}) OR " if ids else ""
        return f"({by_id}text = :{param})"

    def _ranges_where(self, domain: str, names: list[str]) -> tuple[str, dict, list[str], str]:
        params: dict = {f"n{i}": n for i, n in enumerate(names)}
        if not self.has("NVTX_EVENTS"):
            conds = ["0" for _ in names]
            return "FROM (SELECT 0 AS globalTid, 0 AS start, 0 AS end) WHERE 0", {}, conds, "globalTid"
        conds = [self._name_condition(n, f"n{i}") for i, n in enumerate(names)]
        kinds = f"{self._event_types['pushpop']}, {self._event_types['startend']}"
        sql = (
            f"FROM main.NVTX_EVENTS WHERE eventType IN ({kinds}) AND ({' OR '.join(conds)}) "
            f"AND {self._domain_filter(domain)}"
        )
        return sql, params, conds, "globalTid"

    def nvtx_status(self, domain: str) -> NvtxStatus:
        """Cheap: stops at the first range of the domain."""
        if ("status", domain) in self._cache:
            return self._cache[("status", domain)]
        if not self.has("NVTX_EVENTS"):
            status = NvtxStatus(domain, created=False, has_ranges=False)
        else:
            created = any(t == domain for _, _, t in self._domain_rows())
            row = self.query(
                "SELECT 1 FROM main.NVTX_EVENTS WHERE eventType IN (?, ?) "
                f"AND {self._domain_filter(domain)} LIMIT 1",
                (self._event_types["pushpop"], self._event_types["startend"]),
            )
            status = NvtxStatus(domain, created=created, has_ranges=bool(row))
        self._cache[("status", domain)] = status
        return status

    def domains(self) -> list[str]:
        return sorted({t for _, _, t in self._domain_rows() if t is not None})

    def _create_ranges_view(self) -> None:
        """The normalized `ranges` view (kit.trace.sqlite)."""
        if self.has("NVTX_EVENTS"):
            types = self._event_types
            sql = (
                "CREATE TEMP VIEW ranges AS "
                f"SELECT e.start AS start, {self._end_sql('e')} AS end, {tid_of('e.globalTid')} AS tid, "
                f"{pid_of('e.globalTid')} AS pid, COALESCE(d.text, '') AS domain, "
                "COALESCE(e.text, s.value) AS name, e.globalTid AS gtid "
                "FROM main.NVTX_EVENTS e "
                "LEFT JOIN main.StringIds s ON s.id = e.textId "
                f"LEFT JOIN (SELECT DISTINCT {pid_of('globalTid')} AS pid, domainId, text "
                f"FROM main.NVTX_EVENTS WHERE eventType = {types['domain_create']}) d "
                f"ON d.domainId = e.domainId AND d.pid = {pid_of('e.globalTid')} "
                f"WHERE e.eventType IN ({types['pushpop']}, {types['startend']})"
            )
        else:
            sql = (
                "CREATE TEMP VIEW ranges AS SELECT NULL AS start, NULL AS end, NULL AS tid, NULL AS pid, "
                "NULL AS domain, NULL AS name, NULL AS gtid WHERE 0"
            )
        self.con.execute(sql)


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


def _event_types(con: sqlite3.Connection, columns: dict[str, set[str]]) -> dict[str, int]:
    found = {"pushpop": NVTX_PUSHPOP, "startend": NVTX_STARTEND, "domain_create": NVTX_DOMAIN_CREATE}
    if {"id", "name"} <= columns.get("ENUM_NSYS_EVENT_TYPE", set()):
        for ident, name in con.execute("SELECT id, name FROM main.ENUM_NSYS_EVENT_TYPE"):
            if name in _EVENT_TYPE_NAMES:
                found[_EVENT_TYPE_NAMES[name]] = int(ident)
    return found
