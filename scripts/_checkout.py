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
