"""`kit` command line: parsers in kit.cli.parsers, what each command does in kit.cli.commands (each imports
its module when it runs).

Exit codes: 0 success (a check that passed), 1 a check that failed, 2 an error (one line on stderr, never a
traceback for a user's mistake), 3 an inconclusive check, 130 interrupted (see kit.errors.EXIT).
"""

from __future__ import annotations

import sys

from kit.cli.parsers import build_parser
from kit.errors import EXIT, KitError

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:  # building the parser imports most of the kit: a Ctrl-C there is an interruption too
        args = build_parser(only_analyze=argv[:1] == ["analyze"]).parse_args(argv)
    except KeyboardInterrupt:
        print("kit: interrupted", file=sys.stderr)
        return EXIT["interrupted"]
    try:
        return args.func(args)
    except KitError as exc:
        print(f"kit {args.cmd}: error: {exc}", file=sys.stderr)
        return EXIT["error"]
    except KeyboardInterrupt:
        print(f"kit {args.cmd}: interrupted", file=sys.stderr)
        return EXIT["interrupted"]
