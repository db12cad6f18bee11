"""`kit` command line: parsers in kit.cli.parsers, what each command does in kit.cli.commands (each imports
its module when it runs).

Exit codes: 0 success (a check that passed), 1 a check that failed, 2 an error (one line on stderr, never a
traceback), 3 an inconclusive check, 130 interrupted (kit.errors.EXIT; an exception's code is
kit.errors.exit_code). An error the kit did not foresee is one line too, naming the file that holds its
traceback (kit.errors.log_unforeseen); KIT_DEBUG=1 prints the traceback instead.
"""

from __future__ import annotations

import argparse
import sys
import traceback

from kit.cli.parsers import build_parser
from kit.errors import KitError, debug, exit_code, log_unforeseen
from kit.paths import require_checkout

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:  # building the parser imports most of the kit: a Ctrl-C there is an interruption too
        args = build_parser(only_analyze=argv[:1] == ["analyze"]).parse_args(argv)
    except KeyboardInterrupt as exc:
        print("kit: interrupted", file=sys.stderr)
        return exit_code(exc)
    try:
        require_checkout()
        return args.func(args)
    except KeyboardInterrupt as exc:
        print(f"kit {args.cmd}: interrupted", file=sys.stderr)
        return exit_code(exc)
    except Exception as exc:
        print(f"kit {args.cmd}: error: {describe(exc, args)}", file=sys.stderr)
        return exit_code(exc)


def describe(exc: Exception, args: argparse.Namespace) -> str:
    """The one line: a KitError's message (led by the option it names, when its text does not), or an
    unforeseen exception's type and message with where its traceback is (KIT_DEBUG=1: printed here)."""
    if debug():
        traceback.print_exc()
    if isinstance(exc, KitError):
        return _with_param(str(exc), getattr(exc, "param", None), args)
    what = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
    if debug():
        return f"{what} (unforeseen: the traceback is above)"
    log = log_unforeseen(exc, args.cmd)
    where = f"its traceback is in {log}" if log else "no log file could be written"
    return f"{what} (unforeseen by the kit: {where}; KIT_DEBUG=1 prints it here)"


def _with_param(message: str, param: str | None, args: argparse.Namespace) -> str:
    """`message`, led by the parameter a UsageError names (as the option, --model-path, when the command
    has one) unless the message already says it."""
    if not param:
        return message
    dest = param.lstrip("-").replace("-", "_")
    name = f"--{dest.replace('_', '-')}" if not param.startswith("-") and hasattr(args, dest) else param
    return message if name in message else f"{name}: {message}"
