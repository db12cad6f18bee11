"""The checks a matrix's values pass, each refusal one line that names the key (kit.pipeline.matrix).

A check is `(dotted key, value) -> value`, raising UsageError(param=key): the YAML says where it went wrong.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from typing import Any

from kit.errors import UsageError

Check = Callable[[str, Any], Any]  # (dotted key, value) -> value, or raises UsageError(param=key)


def type_name(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def at_least(minimum: int) -> Check:
    def check(key: str, value: Any) -> int:
        # bool is an int in Python, and YAML turns `yes` into True: neither is a count.
        if isinstance(value, bool) or not isinstance(value, int):
            raise UsageError(f"{key}: expected an integer, got {type_name(value)}", param=key)
        if value < minimum:
            raise UsageError(f"{key}: must be >= {minimum}, got {value}", param=key)
        return value

    return check


def boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise UsageError(f"{key}: expected true or false, got {type_name(value)}", param=key)
    return value


def string(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise UsageError(f"{key}: expected a non-empty string, got {type_name(value)}", param=key)
    return value


def string_list(key: str, value: Any) -> list[str]:
    """A list of non-empty strings (an argument list, never one shell string); one string is a list of one."""
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
        raise UsageError(f"{key}: expected a list of non-empty strings, got {type_name(value)}", param=key)
    return list(values)


def choice(*allowed: str) -> Check:
    def check(key: str, value: Any) -> str:
        if value not in allowed:
            raise UsageError(f"{key}: unknown value {value!r}; allowed: {', '.join(allowed)}", param=key)
        return value

    return check


def unknown_key(key: str, where: str, allowed: Iterable[str], param: str) -> UsageError:
    allowed = list(allowed)
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return UsageError(f"unknown key {key!r} {where}{hint}; allowed: {', '.join(allowed)}", param=param)


def mapping(key: str, value: Any, what: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise UsageError(f"{key}: expected a mapping of {what}, got {type_name(value)}", param=key)
    return value
