"""Where things are: the one place that knows the repository layout (stdlib only: the probe imports it).

The kit runs from its checkout (`pip install -e`, or the checkout on PYTHONPATH): data/, notebooks/,
build/ and .cache/ are folders of the checkout, beside the package. A non-editable install (a wheel in
site-packages) has none of them; `require_checkout` refuses it in one line (README, "The kit runs from its
checkout").
"""

from __future__ import annotations

from pathlib import Path

from kit.errors import NotACheckout

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
CHECKOUT_MARKS = (REPO / "pyproject.toml", MATRICES, NOTEBOOKS)  # what only the checkout has beside kit/


def require_checkout() -> None:
    """Refuse a kit installed without its checkout: its matrices, notebooks and result sets are not there,
    and its build/ and .cache/ would land in site-packages."""
    missing = [p.name for p in CHECKOUT_MARKS if not p.exists()]
    if missing:
        raise NotACheckout(
            f"the kit at {KIT} is installed without its checkout ({', '.join(missing)} not beside it): it "
            "runs from its git checkout; install that with `pip install -e /path/to/pr29654-kit`"
        )


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
