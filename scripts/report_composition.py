"""What fills each nsys SQLite export given (kit.trace.composition): one JSON object per file, keyed by the
name given with NAME=PATH (else the path).

    python scripts/report_composition.py [NAME=]EXPORT...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import _checkout  # noqa: F401  (this checkout's kit first on sys.path)

from kit.errors import KitError, exit_code
from kit.trace.composition import composition

USAGE = "usage: python scripts/report_composition.py [NAME=]EXPORT...  (nsys SQLite exports)"


def main(argv: list[str]) -> int:
    if not argv:
        print(USAGE, file=sys.stderr)
        return 2
    out = {}
    for arg in argv:
        name, _, path = arg.rpartition("=")
        if not Path(path).is_file():
            msg = f"{path}: no such file (give nsys SQLite exports, e.g. a cell's profile.sqlite)"
            print(msg, file=sys.stderr)
            return 2
        try:
            out[name or path] = composition(Path(path))
        except KitError as exc:
            print(f"{path}: {exc}", file=sys.stderr)
            return exit_code(exc)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
