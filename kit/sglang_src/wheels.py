"""Fetch sglang release wheels from PyPI, pinned by sha256, into a local cache.

The kit's "bug" and "fix" arms are defined by exact bytes, so a wheel is only ever used after its
sha256 matches the table below; a file that fails the check never reaches the cache.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from kit.errors import NetworkError
from kit.paths import WHEEL_CACHE
from kit.provenance import sha256_file  # the one sha256 of a file (build and stage use it through here)
from kit.sglang_src.releases import pinned

INDEX_URL = "https://pypi.org/simple"

_CHUNK = 1 << 20
_TIMEOUT_S = 120


def default_cache_dir() -> Path:
    """`$KIT_CACHE` if set, else `<repo>/.cache/wheels` (git-ignored)."""
    env = os.environ.get("KIT_CACHE")
    return Path(env).expanduser() if env else WHEEL_CACHE


def fetch_wheel(version: str, cache_dir: Path | None = None) -> Path:
    """Return the cached, sha256-verified wheel for `version`, downloading it when needed."""
    filename, expected = pinned(version)
    return fetch_file(filename, expected, Path(cache_dir) if cache_dir is not None else default_cache_dir())


def fetch_file(filename: str, expected: str, cache: Path) -> Path:
    """Any PyPI file pinned by sha256 (sglang releases, a stage lock's wheels): cached, else downloaded."""
    target = cache / filename
    if target.is_file() and sha256_file(target) == expected:
        return target
    with tempfile.TemporaryDirectory(prefix="kit-wheel-") as tmp:
        part = Path(tmp) / filename
        _download(_wheel_url(filename), part)
        actual = sha256_file(part)
        if actual != expected:
            raise NetworkError(
                f"sha256 mismatch for {filename}: expected {expected}, got {actual}; "
                "the download was discarded (check the pin or your PyPI mirror)"
            )
        _install_into_cache(part, target)
    return target


def _install_into_cache(src: Path, target: Path) -> None:
    """Copy next to the target, then rename: the cache only ever holds complete, verified files."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    os.close(fd)
    try:
        shutil.copyfile(src, staging)
        os.chmod(staging, 0o644)  # mkstemp makes 0600; the cache is shared, read-only data
        os.replace(staging, target)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise


def _wheel_url(filename: str) -> str:
    """Look the file up in PyPI's JSON simple index (PEP 691) to get its download URL."""
    project = filename.split("-", 1)[0]
    index = f"{INDEX_URL}/{project}/"
    req = urllib.request.Request(index, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=_TIMEOUT_S) as resp:
            data = json.load(resp)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise NetworkError(
            f"cannot read the PyPI index {index}: {e}; check network access to pypi.org"
        ) from None
    for entry in data.get("files", []):
        if entry.get("filename") == filename:
            return entry["url"]
    raise NetworkError(f"{filename} is not listed on {index}; the release may have been removed from PyPI")


def _download(url: str, dest: Path) -> None:
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as resp, open(dest, "wb") as out:
            shutil.copyfileobj(resp, out, _CHUNK)
    except (urllib.error.URLError, OSError) as e:
        raise NetworkError(
            f"download of {url} failed: {e}; check network access to files.pythonhosted.org"
        ) from None
