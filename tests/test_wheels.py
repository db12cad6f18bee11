"""kit.sglang_src.wheels: sha256 pinning, cache reuse, and a cache that never holds an unverified file."""

from __future__ import annotations

import hashlib
import re
import zipfile
from pathlib import Path

import pytest

from kit.errors import NetworkError, UsageError
from kit.paths import REPO
from kit.sglang_src import wheels
from kit.sglang_src.releases import RELEASES, Release, pinned
from kit.sglang_src.wheels import fetch_wheel, sha256_file

REQUIRED = ["0.5.12.post1", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.16", "0.5.23"]


def _pin(monkeypatch: pytest.MonkeyPatch, version: str, filename: str, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    monkeypatch.setitem(RELEASES, version, Release(version, filename, digest, "bug", None, None))
    return digest


def _offline(monkeypatch: pytest.MonkeyPatch, payload: bytes | None) -> list[str]:
    """Replace the network: record URLs asked for; write `payload` (None: fail if called)."""
    calls: list[str] = []

    def fake_url(filename: str) -> str:
        return f"https://files.example/{filename}"

    def fake_download(url: str, dest: Path) -> None:
        calls.append(url)
        if payload is None:
            raise AssertionError("the cache should have been used")
        dest.write_bytes(payload)

    monkeypatch.setattr(wheels, "_wheel_url", fake_url)
    monkeypatch.setattr(wheels, "_download", fake_download)
    return calls


def test_pinned_table_covers_the_kit_releases() -> None:
    for v in REQUIRED:
        name, digest = pinned(v)
        assert name.startswith(f"sglang-{v}-cp312-cp312-manylinux") and name.endswith("_x86_64.whl")
        assert re.fullmatch(r"[0-9a-f]{64}", digest)
    wheels_ = [r for r in RELEASES.values() if r.wheel]
    assert len({r.sha256 for r in wheels_}) == len(wheels_)


def test_unknown_version_lists_the_pins(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as e:
        fetch_wheel("0.0.1", tmp_path)
    msg = str(e.value)
    assert "0.0.1" in msg and all(v in msg for v in REQUIRED)
    assert list(tmp_path.iterdir()) == []


def test_cache_dir_default_and_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KIT_CACHE", raising=False)
    assert wheels.default_cache_dir() == REPO / ".cache" / "wheels"
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "c"))
    assert wheels.default_cache_dir() == tmp_path / "c"


def test_verified_cache_hit_does_not_touch_network(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    name = "sglang-9.9.9-cp312-cp312-manylinux_2_34_x86_64.whl"
    _pin(monkeypatch, "9.9.9", name, b"good bytes")
    (tmp_path / name).write_bytes(b"good bytes")
    calls = _offline(monkeypatch, None)
    assert fetch_wheel("9.9.9", tmp_path) == tmp_path / name
    assert calls == []


def test_corrupt_cached_file_is_replaced(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    name = "sglang-9.9.9-cp312-cp312-manylinux_2_34_x86_64.whl"
    digest = _pin(monkeypatch, "9.9.9", name, b"good bytes")
    (tmp_path / name).write_bytes(b"truncated")
    calls = _offline(monkeypatch, b"good bytes")
    path = fetch_wheel("9.9.9", tmp_path)
    assert len(calls) == 1 and sha256_file(path) == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_hash_mismatch_raises_and_leaves_cache_clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    name = "sglang-9.9.9-cp312-cp312-manylinux_2_34_x86_64.whl"
    expected = _pin(monkeypatch, "9.9.9", name, b"what we pinned")
    _offline(monkeypatch, b"what the mirror served")
    cache = tmp_path / "cache"
    with pytest.raises(NetworkError) as e:
        fetch_wheel("9.9.9", cache)
    msg = str(e.value)
    actual = hashlib.sha256(b"what the mirror served").hexdigest()
    assert name in msg and expected in msg and actual in msg and "\n" not in msg
    assert not cache.exists() or list(cache.iterdir()) == []


@pytest.mark.network
def test_fetch_real_wheel_matches_pin() -> None:
    path = fetch_wheel("0.5.14")
    name, digest = pinned("0.5.14")
    assert path.name == name and sha256_file(path) == digest
    assert zipfile.is_zipfile(path)
    assert not list(path.parent.glob("*.part"))


@pytest.mark.network
def test_real_download_with_wrong_pin_leaves_cache_clean(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    name, _ = pinned("0.5.12.post1")
    wrong = Release("0.5.12.post1", name, "0" * 64, "absent", None, None)
    monkeypatch.setitem(RELEASES, "0.5.12.post1", wrong)
    with pytest.raises(NetworkError) as e:
        fetch_wheel("0.5.12.post1", tmp_path)
    msg = str(e.value)
    assert (
        name in msg
        and "0" * 64 in msg
        and "fb53554bcb592c26b94f609745620e1b1fa5e9fb4650de4bc3a8373542dacd4d" in msg
    )
    assert list(tmp_path.iterdir()) == []
