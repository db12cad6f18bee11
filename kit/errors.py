"""The kit's failures, one class per kind, each carrying what a caller branches on, and the exit codes.

Every one is a `KitError`: the CLI prints its one line (cause and fix) and exits 2; nothing here is ever a
traceback for a user's mistake. Exit codes of a finished check (pass 0, fail 1, inconclusive 3) are in
`EXIT`; what an exception ends in is `exit_code(exc)`, the one mapping the CLI and a batch's stages share.
An exception the kit did not foresee (not a `KitError`) is an error too: `log_unforeseen` keeps its
traceback in a file so that the user still sees one line (`KIT_DEBUG=1` prints it instead).
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from pathlib import Path

EXIT = {"pass": 0, "fail": 1, "error": 2, "inconclusive": 3, "interrupted": 130}
DEBUG_ENV = "KIT_DEBUG"  # KIT_DEBUG=1: an error's traceback on stderr instead of only in its log file


def exit_code(exc: BaseException) -> int:
    """The exit code an exception ends a command in, by the table `EXIT_OF`: Ctrl-C is "interrupted",
    anything else "error" (exit 1 is never an exception's)."""
    return EXIT[next(kind for cls, kind in EXIT_OF if isinstance(exc, cls))]


def debug() -> bool:
    """KIT_DEBUG=1: show tracebacks (the documented switch)."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def error_log_dirs() -> list[Path]:
    """Where an unforeseen error's traceback is written, first writable wins: the user's cache
    ($XDG_CACHE_HOME or ~/.cache, /pr29654-kit/errors), else the temp dir. Never a run or batch folder:
    an unwritable or damaged folder is often what failed."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [Path(cache) / "pr29654-kit" / "errors", Path(tempfile.gettempdir()) / "pr29654-kit-errors"]


def log_unforeseen(exc: BaseException, command: str) -> Path | None:
    """Write `exc`'s traceback to a new file (see `error_log_dirs`); its path, or None if none could be
    written."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    name = f"kit-{command}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    for folder in error_log_dirs():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / name
            with open(path, "x") as f:  # "x": never overwrite an earlier log
                f.write(text)
            return path
        except OSError:
            continue
    return None


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
    """A program or package the run needs is not there, or fails the kit's check of it (nsys, nvtx, sglang,
    sglang's indexer kernels, tokenizers)."""

    def __init__(self, message: str, *, tool: str) -> None:
        super().__init__(message)
        self.tool = tool


class ServerError(KitError):
    """The sglang server could not start (no free port), died, never became healthy, or stopped answering;
    or a cell it served did not run."""

    def __init__(self, message: str, *, log: Path | str | None = None) -> None:
        super().__init__(message)
        self.log = Path(log) if log is not None else None


class StartupError(ServerError):
    """The sglang server died or never became healthy while starting (before it answered /health)."""


class HttpError(ServerError):
    """An HTTP request to the server failed; `status` is None when no response came (timeout, refused)."""

    def __init__(self, message: str, *, url: str, status: int | None = None) -> None:
        super().__init__(message)
        self.url, self.status = url, status


class NetworkError(KitError):
    """A download (PyPI) failed or its bytes did not match the pinned sha256."""


class NotWritable(InputError):
    """A folder the kit must write into is read-only, immutable or not permitted: refused before writing."""


class NotACheckout(KitError):
    """The kit is installed without its checkout (data/, notebooks/, build/ beside the package): refused."""


class EngineError(KitError):
    """The mini engine, a process the kit started, failed, timed out or exited without its outputs."""


class InstallError(KitError):
    """Installing a build into its folder failed (pip's own words in the message)."""


class InternalError(KitError):
    """A check of the kit's own consistency failed: a bug of the kit, not the user's input."""


class ProbeRefused(KitError):
    """(Inside sglang's processes.) The installed sglang lacks a probe target, or the sink cannot work: the
    probe refuses to run unprobed."""


class ProbeError(KitError, ImportError):
    """(Inside sglang's processes.) A target vanished between the AST check and the import; an ImportError
    too, since it is raised from the import hook."""


class OverrideRefused(KitError, RuntimeError):
    """(Inside sglang's processes.) The override cannot tell which indexer to change: the run must fail,
    not run half-controlled."""


class BusyError(KitError):
    """A folder another kit process is writing (a batch running in it): refused before anything is touched."""

    def __init__(self, message: str, *, path: Path | str, holder: str) -> None:
        super().__init__(message)
        self.path, self.holder = Path(path), holder


# What each kind of exception ends a command in, the first class that matches; `exit_code` reads it. A
# check that failed (1) or could not judge (3) is a result, never an exception.
EXIT_OF: tuple[tuple[type[BaseException], str], ...] = (
    (KeyboardInterrupt, "interrupted"),
    (BaseException, "error"),  # a KitError, or one the kit did not foresee (its traceback is logged)
)
