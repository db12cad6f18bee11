"""Opening a SQLite report as the source its tables say it is (kit.trace.registry's openers of the SQLite
family): the recorder's kit_ranges, else an nsys export; an .nsys-rep is exported to SQLite first.

Above kit.trace.sqlite and both of its subclasses, so that the base class never imports what builds on it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from kit.errors import TraceError
from kit.trace.nsys_export import NsysSource
from kit.trace.recorder import RecorderSource
from kit.trace.sqlite import SqliteSource, check_sqlite_file, connect_ro, table_columns


def open_sqlite(path: Path) -> SqliteSource:
    """Open a SQLite report as the source whose tables it holds (the recorder's, else an nsys export's)."""
    check_sqlite_file(path)
    con = connect_ro(path)
    try:
        try:
            columns = table_columns(con)
        except sqlite3.DatabaseError as exc:
            raise TraceError(
                f"{path} cannot be read as SQLite ({exc}): the file is damaged", path=path
            ) from exc
        for cls in (RecorderSource, NsysSource):
            if cls.claims(columns):
                return cls(path, con, columns)
        raise TraceError(
            f"{path} is SQLite but neither an nsys export (no META_DATA_EXPORT/EXPORT_META_DATA, NVTX_EVENTS "
            "or CUPTI tables) nor a kit recorder file (no kit_ranges table)",
            path=path,
        )
    except Exception:
        con.close()
        raise


def open_nsys_rep(path: Path) -> SqliteSource:
    """An .nsys-rep: exported to a new .sqlite next to it, which is what gets opened."""
    from kit.trace import nsys  # subprocess: imported only by the analyses that export

    trace = open_sqlite(nsys.export_report(path))
    trace.exported_from = path
    return trace


def refuse_qdstrm(path: Path) -> SqliteSource:
    raise TraceError(
        f"{path} is an unimported .qdstrm: nsys could not run its importer (the Debian package needs the "
        "host-linux-x64 symlink; run scripts/ensure-nsys.sh) and re-profile",
        path=path,
    )
