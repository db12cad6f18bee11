"""The kit's in-process NVTX recorder (recorder.sqlite: table kit_ranges, optional kit_meta) as a trace
source: NVTX ranges only, in-process timestamps, no CUDA data. Written where nsys was missing."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np

from kit.errors import TraceError
from kit.trace.source import NvtxStatus
from kit.trace.sqlite import SqliteSource

RECORDER_COLUMNS = ("start", "end", "tid", "domain", "name")


class RecorderSource(SqliteSource):
    """kit_ranges(start, end, tid, domain, name): the thread key is the OS tid, the pid comes from
    kit_meta (0 when the recorder wrote none)."""

    source = "recorder"

    @staticmethod
    def claims(columns: dict[str, set[str]]) -> bool:
        return "kit_ranges" in columns

    def __init__(self, path: Path, con: sqlite3.Connection, columns: dict[str, set[str]]) -> None:
        super().__init__(path, con, columns)
        missing = [c for c in RECORDER_COLUMNS if c not in columns["kit_ranges"]]
        if missing:
            raise TraceError(
                f"{path}: recorder table kit_ranges lacks column(s) {', '.join(missing)}", path=path
            )
        self.recorder_pid = 0
        if "kit_meta" in columns:
            meta = dict(con.execute("SELECT key, value FROM main.kit_meta").fetchall())
            if str(meta.get("pid", "")).isdigit():
                self.recorder_pid = int(meta["pid"])
        self.warnings.append("recorder.sqlite: in-process timestamps, NOT measured under Nsight Systems")
        con.execute(
            f"CREATE TEMP VIEW ranges AS SELECT e.start AS start, {self._end_sql('e')} AS end, e.tid AS tid, "
            f"{self.recorder_pid} AS pid, e.domain AS domain, e.name AS name, e.tid AS gtid "
            "FROM main.kit_ranges e"
        )

    def _ranges_where(self, domain: str, names: list[str]) -> tuple[str, dict, list[str], str]:
        params: dict = {f"n{i}": n for i, n in enumerate(names)}
        conds = [f"name = :n{i}" for i in range(len(names))]
        params["domain"] = domain
        return f"FROM main.kit_ranges WHERE domain = :domain AND ({' OR '.join(conds)})", params, conds, "tid"

    def pid_tid(self, gtid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.full(len(gtid), self.recorder_pid, dtype=np.int64), gtid

    def nvtx_status(self, domain: str) -> NvtxStatus:
        if ("status", domain) not in self._cache:
            has = self.con.execute("SELECT 1 FROM main.kit_ranges WHERE domain = ? LIMIT 1", (domain,))
            found = has.fetchone() is not None
            self._cache[("status", domain)] = NvtxStatus(domain, created=found, has_ranges=found)
        return self._cache[("status", domain)]

    def domains(self) -> list[str]:
        return [r[0] for r in self.query("SELECT DISTINCT domain FROM main.kit_ranges ORDER BY 1")]
