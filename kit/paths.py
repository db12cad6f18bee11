"""Where things are: the one place that knows the repository layout (stdlib only: the probe imports it)."""

from __future__ import annotations

from pathlib import Path

KIT = Path(__file__).resolve().parent
REPO = KIT.parent
DATA = REPO / "data"
MATRICES = DATA / "matrices"
RESULTS = DATA / "results"
PUBLISHED = DATA / "pr29654_published.yaml"
NOTEBOOKS = REPO / "notebooks"
BUILD = REPO / "build"
WHEEL_CACHE = REPO / ".cache" / "wheels"
PATCHES = KIT / "sglang_src" / "patches"
PR_PATCH = PATCHES / "pr29654.patch"


def unique_path(path: Path, sep: str = "-", *, keep_suffix: bool = False, numbered: bool = False) -> Path:
    """`path` if free, else the first free `path<sep>N` (N = 1, 2, ...): never overwrite, never reuse.

    keep_suffix: N goes before the suffix (`X.1.sqlite`), for files that tools recognise by their suffix.
    numbered: always `path<sep>N`, even when `path` itself is free (folders of set-aside copies).
    """
    path = Path(path)
    if not path.exists() and not numbered:
        return path
    stem, suffix = (path.stem, path.suffix) if keep_suffix else (path.name, "")
    n = 1
    while True:
        candidate = path.with_name(f"{stem}{sep}{n}{suffix}")
        if not candidate.exists():
            return candidate
        n += 1
