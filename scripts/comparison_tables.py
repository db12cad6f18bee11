"""Add the per-request table (`per_request`, kit.compare.per_request) to comparison.json files written before
`kit compare` recorded it: rebuilt from the runs each one names, found beside it (kit.compare.runs
.request_table), its marks by the gate as recorded, with the note that says it was rebuilt. Every other key is
kept as it was; a file that holds the table already, or whose runs are not beside it, is left alone.

    python scripts/comparison_tables.py FOLDER...            # list what it would add (writes nothing)
    python scripts/comparison_tables.py FOLDER... --write    # add it

The readers rebuild the table on the fly anyway; writing it makes the files say why on their own.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import _checkout  # noqa: F401  (this checkout's kit first on sys.path)

from kit.compare.runs import COMPARISON, request_table


def add_table(f: Path, write: bool) -> str:
    """What adding the table to comparison.json `f` does (or did, with `write`), in a few words."""
    result = json.loads(f.read_text())
    if "per_request" in result:
        return "holds its table already"
    table = request_table(f)
    if not table["by_workload"]:
        return f"left alone: {table['note']}"
    if write:
        tmp = f.with_name(f".{f.name}.tmp")
        tmp.write_text(json.dumps({**result, "per_request": table}, indent=2, default=str) + "\n")
        os.replace(tmp, f)
    rows = sum(len(t["rows"]) for t in table["by_workload"].values())
    return f"{'added' if write else 'would add'} {rows} request rows"


def main(argv: list[str]) -> int:
    write = "--write" in argv
    folders = [Path(a) for a in argv if a != "--write"]
    missing = [str(d) for d in folders if not d.is_dir()]
    if not folders or missing:
        why = "not a folder: " + ", ".join(missing) if missing else "no folder given"
        usage = "python scripts/comparison_tables.py FOLDER... [--write]"
        print(f"comparison_tables: error: {why} (usage: {usage})", file=sys.stderr)
        return 2
    for d in folders:
        for f in sorted(d.rglob(COMPARISON)):
            print(f"{f}: {add_table(f, write)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
