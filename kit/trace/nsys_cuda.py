"""The CUDA half of an nsys SQLite export as a trace source: runtime calls, kernels, graph-node events.

Tables: CUPTI_ACTIVITY_KIND_RUNTIME (API calls: globalTid, correlationId, nameId), CUPTI_ACTIVITY_KIND_KERNEL
(correlationId, shortName/demangledName string ids, globalPid and graphNodeId where recorded) and
CUDA_GRAPH_NODE_EVENTS (graphNodeId, originalGraphNodeId, the creating globalTid and time). nsys packs a
thread into globalTid as (pid << 24) | tid; correlation ids and graph node ids restart in each process.

The scans read narrow integer columns of the big tables once, filtered by cheap conditions on the raw
columns (the export has no index to seek with), in rowid slices on parallel threads; temp tables keyed
by id are built only where SQL joins need them (the classifier, drawing one round).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kit.trace.source import GraphLaunchKernels, Kernels, NodeKey, distinct
from kit.trace.sqlite import SqliteSource

KERNEL, RUNTIME, NODE_EVENTS = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUDA_GRAPH_NODE_EVENTS",
)
# Up to this many launch calls, the kernel scan keeps only their correlation ids (an IN list, cheaper with
# CUDA graphs: few calls); beyond, the ids' span (eager: one call per kernel).
IN_LIST_MAX = 10_000
_GRAPH_LAUNCH = "cudaGraphLaunch%"


def pid_of(col: str) -> str:
    """SQL expression: the OS pid inside an nsys serialized globalTid/globalPid."""
    return f"((({col}) >> 24) & 16777215)"


def tid_of(col: str) -> str:
    """SQL expression: the OS tid inside an nsys serialized globalTid."""
    return f"(({col}) & 16777215)"


class NsysCuda(SqliteSource):
    """Runtime calls, kernels and graph nodes of an nsys export (the NVTX half: kit.trace.nsys_export)."""

    source = "nsys"

    # ---- what the export holds ----------------------------------------------------------------
    @property
    def has_kernels(self) -> bool:
        return self._nonempty(KERNEL)

    @property
    def has_runtime(self) -> bool:
        return self._nonempty(RUNTIME)

    @property
    def has_graph_nodes(self) -> bool:
        return self.has(NODE_EVENTS)

    @property
    def has_graph_replays(self) -> bool:
        if not (self.has_kernels and self.has(KERNEL, "graphNodeId")):
            return False
        if not self._nonempty(NODE_EVENTS):
            return False
        row = self.con.execute(
            f"SELECT 1 FROM main.{KERNEL} WHERE graphNodeId IS NOT NULL LIMIT 1"
        ).fetchone()
        return row is not None

    @property
    def kernels_have_pid(self) -> bool:
        return self.has(KERNEL, "globalPid")

    def pid_tid(self, gtid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return (gtid >> 24) & 0xFFFFFF, gtid & 0xFFFFFF

    def _kernel_pid(self, alias: str = "k") -> str:
        """SQL for a kernel's pid; NULL when the export lacks globalPid (joins use correlationId only)."""
        if self.kernels_have_pid:
            return pid_of(f"{alias}.globalPid" if alias else "globalPid")
        return "NULL"

    # ---- scans for the attribution ------------------------------------------------------------
    def _launch_name_filter(self) -> str:
        """SQL keeping only runtime calls that can launch a kernel (every CUDA launch API, runtime or
        driver, plain or graph, has "Launch" in its name): half of a real report's runtime rows are
        other calls (cuKernelGetName alone matches every cudaLaunchKernel), and each row not fetched is
        time saved."""
        if not self.has(RUNTIME, "nameId"):
            return ""
        ids = [r[0] for r in self.query("SELECT id FROM main.StringIds WHERE value LIKE '%Launch%'")]
        return f" AND nameId IN ({','.join(map(str, ids))})" if ids else ""

    def launch_calls(self, threads: list[int], lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        thread = self.ordinal_sql("globalTid", threads)
        cid, start, *ordinal = self.scan_columns(
            ["correlationId", "start", *([thread] if thread else [])],
            RUNTIME,
            f"globalTid IN ({','.join(map(str, threads))}) AND correlationId IS NOT NULL "
            f"AND start BETWEEN {int(lo)} AND {int(hi)}{self._launch_name_filter()}",
        )
        gtid = np.asarray(threads, dtype=np.int64)[ordinal[0]] if ordinal else np.full(len(cid), threads[0])
        return cid, start, gtid

    def kernels_of(self, cids: np.ndarray, pids: list[int] | None, nodes: bool) -> Kernels:
        if len(cids) <= IN_LIST_MAX:
            where = f"correlationId IN ({','.join(map(str, distinct(cids).tolist()))})"
        else:
            where = f"correlationId BETWEEN {int(cids.min())} AND {int(cids.max())}"
        exprs = {"cid": "correlationId", "start": "start", "dur": "end - start"}
        if pids is not None:
            kpid = self._kernel_pid("")
            where += f" AND {kpid} IN ({','.join(map(str, pids))})"
            ordinal = self.ordinal_sql(kpid, pids)
            if ordinal:
                exprs["proc"] = ordinal
        if nodes:
            exprs["node"] = "COALESCE(graphNodeId, -1)"
        cols = dict(zip(exprs, self.scan_columns(list(exprs.values()), KERNEL, where), strict=True))
        return Kernels(cols["cid"], cols["start"], cols["dur"], cols.get("proc"), cols.get("node"))

    def graph_node_events(self) -> tuple[dict[NodeKey, tuple[int, int]], dict[NodeKey, int]]:
        """One scan of the node events (capture-time creation rows only, where the export names them:
        small), cached."""
        if "node_events" in self._cache:
            return self._cache["node_events"]
        where, params = "", []
        if self.has(NODE_EVENTS, "nameId"):
            ids = [r[0] for r in self.query("SELECT id FROM main.StringIds WHERE value LIKE '%node creat%'")]
            if ids:
                marks = ",".join("?" * len(ids))
                if self.query(
                    f"SELECT 1 FROM main.{NODE_EVENTS} WHERE nameId IN ({marks}) LIMIT 1", tuple(ids)
                ):
                    where, params = f"WHERE nameId IN ({marks})", ids
        per_pid = self.kernels_have_pid
        # A node can have several events: nsys 2025.3 records an instantiated node's own creation (no
        # original) AND a row linking it to the captured node it was cloned from. Any link is followed; the
        # earliest event of the node at the end of the chain is its capture-time creation.
        first: dict[NodeKey, tuple[int, int]] = {}
        original: dict[NodeKey, int] = {}
        for pid, node, orig, gtid, start in self.query(
            f"SELECT {pid_of('globalTid')}, graphNodeId, originalGraphNodeId, globalTid, start "
            f"FROM main.{NODE_EVENTS} {where} ORDER BY start",
            tuple(params),
        ):
            key = (pid if per_pid else None, node)
            first.setdefault(key, (gtid, start))
            if orig is not None:
                original.setdefault(key, orig)
        self._cache["node_events"] = (first, original)
        return first, original

    # ---- SQL joins: the classifier and drawing one round --------------------------------------
    def runtime_table(self) -> str:
        """Temp table (pid, cid) -> launching thread, time and API name, for the calls that launched
        kernels. Correlation ids are per process: matched on (pid, id) when kernels say their process."""
        name = "kit_rt"
        if name in self.temp_tables:
            return name
        kpid = self._kernel_pid("k")
        rpid = pid_of("r.globalTid") if kpid != "NULL" else "NULL"
        self.con.execute(
            "CREATE TEMP TABLE kit_kcid (pid INTEGER, cid INTEGER, PRIMARY KEY (pid, cid)) WITHOUT ROWID"
        )
        self.query(f"INSERT OR IGNORE INTO temp.kit_kcid SELECT {kpid}, k.correlationId FROM main.{KERNEL} k")
        self.con.execute(
            f"CREATE TEMP TABLE {name} (pid INTEGER, cid INTEGER, gtid INTEGER, start INTEGER, "
            "name_id INTEGER, PRIMARY KEY (pid, cid)) WITHOUT ROWID"
        )
        self.query(
            f"INSERT OR IGNORE INTO temp.{name} "
            f"SELECT {rpid}, r.correlationId, r.globalTid, r.start, r.nameId FROM main.{RUNTIME} r "
            f"WHERE EXISTS (SELECT 1 FROM temp.kit_kcid c WHERE c.pid IS {rpid} AND c.cid = r.correlationId)"
        )
        self.temp_tables.add(name)
        return name

    def graph_roots(self) -> tuple[str, int]:
        """Temp table (pid, replayed graphNodeId) -> creation event (thread, time) of the node it was
        captured as, and how many replayed nodes have no capture-time creation event in the report."""
        table = "kit_groot"
        if table in self.temp_tables:
            return table, self.temp_tables_info.get(table, 0)
        used = self.query(
            f"SELECT DISTINCT {self._kernel_pid('k')}, k.graphNodeId FROM main.{KERNEL} k "
            "WHERE k.graphNodeId IS NOT NULL"
        )
        resolved, unresolved = [], 0
        for pid, node in used:
            point = self.capture_point(pid, node)
            if point is None:
                unresolved += 1
            else:
                resolved.append((pid, node, *point))
        self.con.execute(
            f"CREATE TEMP TABLE {table} (pid INTEGER, node INTEGER, gtid INTEGER, start INTEGER, "
            "PRIMARY KEY (pid, node)) WITHOUT ROWID"
        )
        self.con.executemany(f"INSERT OR IGNORE INTO temp.{table} VALUES (?, ?, ?, ?)", resolved)
        self.temp_tables.add(table)
        self.temp_tables_info[table] = unresolved
        return table, unresolved

    def kernel_join(self, graph: bool) -> tuple[str, str, str, int]:
        """SQL joining kernels `k` to their launch call `rt` (and, for graph replays, to the capture-time
        creation event `g` of their node), plus the expressions of each kernel's attribution point:
        (join, thread expr, time expr, replayed nodes without a capture-time event)."""
        rt = self.runtime_table()
        join = f"JOIN temp.{rt} rt ON rt.cid = k.correlationId AND rt.pid IS {self._kernel_pid('k')}"
        if not graph:
            return join, "rt.gtid", "rt.start", 0
        roots, unresolved = self.graph_roots()
        join += (
            f" LEFT JOIN temp.{roots} g "
            "ON k.graphNodeId IS NOT NULL AND g.pid IS rt.pid AND g.node = k.graphNodeId"
        )
        point_g = "COALESCE(CASE WHEN k.graphNodeId IS NULL THEN rt.gtid ELSE g.gtid END, -1)"
        point_t = "COALESCE(CASE WHEN k.graphNodeId IS NULL THEN rt.start ELSE g.start END, -1)"
        return join, point_g, point_t, unresolved

    def round_kernels(
        self, gtid: int, start: int, end: int, graph: bool
    ) -> list[tuple[int, int, str, int, int]]:
        join, point_g, point_t, _ = self.kernel_join(graph)
        return self.query(
            f"SELECT k.start, k.end, COALESCE(s.value, ''), {point_g}, {point_t} "
            f"FROM main.{KERNEL} k {join} LEFT JOIN main.StringIds s ON s.id = k.shortName "
            "WHERE rt.gtid = ? AND rt.start >= ? AND rt.start < ? ORDER BY k.start",
            (gtid, start, end),
        )

    def _graph_launch_ids(self) -> list[int]:
        return [r[0] for r in self.query(f"SELECT id FROM main.StringIds WHERE value LIKE '{_GRAPH_LAUNCH}'")]

    def has_graph_launch_calls(self) -> bool:
        return bool(self.query(f"SELECT 1 FROM main.StringIds WHERE value LIKE '{_GRAPH_LAUNCH}' LIMIT 1"))

    def graph_launch_kernels(self) -> GraphLaunchKernels | None:
        """One query over the kernels that cudaGraphLaunch calls replayed."""
        launch_ids = self._graph_launch_ids()
        if not launch_ids:
            return None
        rt = self.runtime_table()
        alt = "COALESCE(k.demangledName, -1)" if self.has(KERNEL, "demangledName") else "-1"
        cols = self.concat_columns(
            ["rt.gtid", "rt.cid", "k.start", "k.end", "COALESCE(k.shortName, -1)", alt],
            f"FROM main.{KERNEL} k "
            f"JOIN temp.{rt} rt ON rt.cid = k.correlationId AND rt.pid IS {self._kernel_pid('k')} "
            f"WHERE rt.name_id IN ({','.join('?' * len(launch_ids))})",
            launch_ids,
        )
        return GraphLaunchKernels(*cols)

    def kernel_name_ids(self, patterns: Sequence[str]) -> list[int]:
        """StringIds matching any pattern, looked up once per pattern (SQLite's lower() folds ASCII)."""
        ids: set[int] = set()
        for pat in patterns:
            if pat.startswith("="):
                sql, arg = "SELECT id FROM main.StringIds WHERE lower(value) = lower(?)", pat[1:]
            else:
                sql, arg = "SELECT id FROM main.StringIds WHERE instr(lower(value), lower(?)) > 0", pat
            ids.update(r[0] for r in self.query(sql, (arg,)))
        return sorted(ids)
