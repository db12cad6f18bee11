"""Put this checkout first on sys.path, so that `import kit` in a script is the kit beside it.

The scripts' one way to the checkout: `python scripts/x.py` puts scripts/ on sys.path, so every script
imports this module first (`import _checkout`) and takes the repository root from kit.paths (REPO, DATA,
...); none computes it itself. On a GPU host with only the checkout on PYTHONPATH this changes nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

CHECKOUT = str(Path(__file__).resolve().parent.parent)
if CHECKOUT not in sys.path:
    sys.path.insert(0, CHECKOUT)


def _one_line(kind: type[BaseException], exc: BaseException, tb: object) -> None:
    """A script run by a Python without the kit's packages (e.g. the system one): one line and the fix, exit
    2, not a traceback; a Ctrl-C: one line, the "interrupted" code; anything else as Python prints it."""
    if issubclass(kind, KeyboardInterrupt):
        from kit.errors import EXIT

        print(f"{Path(sys.argv[0]).name}: interrupted", file=sys.stderr)
        raise SystemExit(EXIT["interrupted"])
    if issubclass(kind, ModuleNotFoundError):
        print(
            f"{Path(sys.argv[0]).name}: {exc} in {sys.executable}; run `make setup` once, then "
            f".venv/bin/python {' '.join(sys.argv)}",
            file=sys.stderr,
        )
        raise SystemExit(2)
    sys.__excepthook__(kind, exc, tb)  # type: ignore[arg-type]


sys.excepthook = _one_line
