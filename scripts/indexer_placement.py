"""Print where in the decode round the indexer ran, from one profile: per kind of probe range (draft round,
draft extend, verify), how many ranges held how many indexer calls (kit.analysis.placement).

    python scripts/indexer_placement.py REPORT.sqlite|.nsys-rep|.json.gz [...]
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import _checkout  # noqa: F401  (this checkout's kit first on sys.path)

from kit.analysis.placement import NOT_RECORDED, indexer_placement
from kit.errors import KitError
from kit.trace.registry import open_trace


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    for arg in argv:
        path = Path(arg)
        try:
            with open_trace(path) as t:
                where = indexer_placement(t)
        except KitError as exc:
            print(f"{path}: {exc}", file=sys.stderr)
            return 2
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
        print(f"{path} (sha256 {digest}...): indexer calls per range -> ranges, the whole report")
        for kind, per in where.items():
            shown = ", ".join(
                f"no launch recorded in {r}" if n == NOT_RECORDED else f"{n} in {r}" for n, r in per.items()
            )
            shown = shown or "no such range"
            print(f"  {kind:<13} {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
