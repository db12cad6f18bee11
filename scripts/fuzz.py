"""The corruption fuzzer (issue 32): wrong fixes that corrupt only part of the shared top-k, drawn per class,
each run as the fix arm of the mini task model and judged by the gate (kit.compare.fuzz).

    python scripts/fuzz.py OUT [-n 200] [--seed 0]   # run into OUT (a new folder), write OUT/fuzz.json
    python scripts/fuzz.py OUT --rejudge-into FILE   # judge OUT's cells again with this kit, into FILE

Prints the fuzz block (kill rate overall and per class value, no-ops, survivors with why, the negative
control). Exit 0: the fix passes, the targets are met and the negative control reports survivors; 1: one of
them does not; 2: an error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import _checkout  # noqa: F401  (this checkout's kit first on sys.path)

from kit.compare import fuzz
from kit.errors import EXIT, KitError


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="a new folder for the runs and fuzz.json")
    ap.add_argument("-n", type=int, default=fuzz.TARGETS["corruptions"], help="corruptions to count")
    ap.add_argument("--seed", type=int, default=0, help="the draws' seed")
    ap.add_argument(
        "--rejudge-into", type=Path, help="judge the cells of OUT (a fuzzer folder) again, into FILE"
    )
    args = ap.parse_args(argv)
    if args.rejudge_into is not None:
        try:
            result = fuzz.rejudge(args.out, args.rejudge_into)
        except KitError as exc:
            print(f"fuzz.py: error: {exc}", file=sys.stderr)
            return EXIT["error"]
        print(fuzz.table(result))
        return EXIT["pass"] if fuzz.passes(result) else EXIT["fail"]
    if args.n < 1:
        print(f"fuzz.py: error: -n {args.n}: count at least 1 corruption", file=sys.stderr)
        return EXIT["error"]
    if args.out.exists():
        print(
            f"fuzz.py: error: {args.out} exists: name a new folder (nothing is overwritten)", file=sys.stderr
        )
        return EXIT["error"]
    try:
        result = fuzz.run(args.out, args.n, seed=args.seed)
    except KitError as exc:
        print(f"fuzz.py: error: {exc}", file=sys.stderr)
        return EXIT["error"]
    except KeyboardInterrupt:
        print("fuzz.py: interrupted", file=sys.stderr)
        return EXIT["interrupted"]
    print(fuzz.table(result))
    return EXIT["pass"] if fuzz.passes(result) else EXIT["fail"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
