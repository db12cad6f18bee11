"""Which trace source opens a file: report formats registered by file kind (name suffix, else leading bytes).

A new format is one module implementing kit.trace.source.TraceSource plus an opener, and one entry in
KINDS (the PyTorch-profiler Kineto trace, kit.trace.kineto, is such an entry). When several suffixes fit a
name, the longest wins (`x.ranges.json` is not a `.json` trace).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kit.errors import TraceError
from kit.trace.source import TraceSource
from kit.trace.sqlite import PACKED, SQLITE_MAGIC


@dataclass(frozen=True)
class FileKind:
    """Files ending in one of `suffixes`, or else starting with `magic`, are opened by `opener`
    ("module:function", imported on first use) as a source whose `source` is one of `sources`."""

    name: str
    opener: str
    sources: tuple[str, ...]
    suffixes: tuple[str, ...] = ()
    magic: bytes | None = None

    def load(self) -> Callable[[Path], TraceSource]:
        module, func = self.opener.split(":")
        return getattr(importlib.import_module(module), func)


KINDS: tuple[FileKind, ...] = (
    FileKind("nsys-rep", "kit.trace.sqlite_open:open_nsys_rep", ("nsys",), suffixes=(".nsys-rep", ".qdrep")),
    FileKind("qdstrm", "kit.trace.sqlite_open:refuse_qdstrm", (), suffixes=(".qdstrm",)),
    # an nsys export or the kit's recorder.sqlite, told apart by their tables; packed as committed to git
    FileKind("sqlite", "kit.trace.sqlite_open:open_sqlite", ("nsys", "recorder"), magic=SQLITE_MAGIC),
    FileKind("sqlite-xz", "kit.trace.sqlite_open:open_sqlite", ("nsys", "recorder"), suffixes=(PACKED,)),
    # torch.profiler's export_chrome_trace, sglang's /start_profile (*.trace.json.gz, merged or per rank)
    FileKind("kineto", "kit.trace.kineto:open_kineto", ("kineto",), suffixes=(".json", ".json.gz")),
)


def source_names() -> tuple[str, ...]:
    """Every `source` a registered format can report (what verdict.json may say)."""
    return tuple(dict.fromkeys(s for kind in KINDS for s in kind.sources))


def file_kind(path: Path) -> FileKind | None:
    """The kind whose longest suffix ends the name, else the first whose magic starts the file."""
    fits = [(len(s), i) for i, kind in enumerate(KINDS) for s in kind.suffixes if path.name.endswith(s)]
    if fits:
        return KINDS[max(fits, key=lambda f: (f[0], -f[1]))[1]]
    longest = max((len(k.magic) for k in KINDS if k.magic), default=0)
    with path.open("rb") as fh:
        head = fh.read(longest)
    return next((k for k in KINDS if k.magic and head.startswith(k.magic)), None)


def open_trace(path: Path | str) -> TraceSource:
    """Open a report as the source its file kind names (an .nsys-rep is exported next to it with nsys)."""
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path} not found", path=path)
    if path.is_dir():
        raise TraceError(
            f"{path} is a directory: pass a .sqlite[.xz]/.nsys-rep/.json[.gz] file "
            "(or use kit.analysis.analyze on a run dir)",
            path=path,
        )
    kind = file_kind(path)
    if kind is None:
        raise TraceError(
            f"{path} is not a SQLite database (nsys export or recorder.sqlite expected) nor a "
            "PyTorch-profiler trace (.json / .json.gz)",
            path=path,
        )
    return kind.load()(path)
