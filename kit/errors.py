"""The kit's failures, one class per kind, each carrying what a caller branches on.

Every one is a `KitError`: the CLI prints its one line (cause and fix) and exits 2; nothing here is ever a
traceback for a user's mistake. Exit codes of `kit analyze` and `kit compare --gate` for a finished check
(pass 0, fail 1, inconclusive 3) are in `EXIT`.
"""

from __future__ import annotations

from pathlib import Path

EXIT = {"pass": 0, "fail": 1, "error": 2, "inconclusive": 3, "interrupted": 130}


class KitError(Exception):
    """A user-facing failure: one line that names the cause and the fix."""


class UsageError(KitError):
    """A parameter, argument or matrix value the kit refuses before anything runs."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class InputError(KitError):
    """A file or directory the user named is missing, damaged or of the wrong kind."""

    def __init__(self, message: str, *, path: Path | str | None = None) -> None:
        super().__init__(message)
        self.path = Path(path) if path is not None else None


class ExistsError(InputError):
    """The kit refuses to overwrite something already written (runs, analyses, builds are written once)."""


class TraceError(InputError):
    """A profile report that cannot be read, or lacks what the analysis needs."""


class PatchError(KitError):
    """A patch hunk that does not apply: the file and hunk it failed at."""

    def __init__(self, message: str, *, file: str, hunk: int | None = None) -> None:
        super().__init__(message)
        self.file, self.hunk = file, hunk


class BuildStateError(KitError):
    """The sglang build at hand is not the one an arm needs (kit verify's state, carrier)."""

    def __init__(self, message: str, *, arm: str | None = None, state: str | None = None) -> None:
        super().__init__(message)
        self.arm, self.state = arm, state


class ProbeTargetError(KitError):
    """A probe target (a method the probe wraps) is missing in the sglang at hand."""

    def __init__(self, message: str, *, missing: list[str] | None = None) -> None:
        super().__init__(message)
        self.missing = list(missing or [])


class ToolMissing(KitError):
    """A program or package the run needs is not there (nsys, nvtx, sglang)."""

    def __init__(self, message: str, *, tool: str) -> None:
        super().__init__(message)
        self.tool = tool


class ServerError(KitError):
    """The sglang server died, never became healthy, or stopped answering."""

    def __init__(self, message: str, *, log: Path | str | None = None) -> None:
        super().__init__(message)
        self.log = Path(log) if log is not None else None


class HttpError(ServerError):
    """An HTTP request to the server failed; `status` is None when no response came (timeout, refused)."""

    def __init__(self, message: str, *, url: str, status: int | None = None) -> None:
        super().__init__(message)
        self.url, self.status = url, status


class NetworkError(KitError):
    """A download (PyPI) failed or its bytes did not match the pinned sha256."""


class BusyError(KitError):
    """A folder another kit process is writing (a batch running in it): refused before anything is touched."""

    def __init__(self, message: str, *, path: Path | str, holder: str) -> None:
        super().__init__(message)
        self.path, self.holder = Path(path), holder
