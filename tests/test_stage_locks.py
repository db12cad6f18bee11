"""The notebooks runner's stage lock (data/stage/notebooks-h200.json), beside sglang 0.5.14's.

Without network: it is a valid lock, adds nothing 0.5.14's lock already stages or the image has, and
travels as one part. With network (the wheels, sha256-pinned): the
notebooks set resolves, i.e. every requirement of every wheel in it is met by itself, by 0.5.14's staged
wheels or by a package the lock says the image has; and it packs into one part.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from kit.paths import REPO
from kit.sglang_src import stage
from kit.sglang_src.wheelfile import wheel_metadata
from kit.sglang_src.wheels import fetch_file

STAGE = REPO / "data" / "stage"
BASE, NOTEBOOKS = STAGE / "sglang-0.5.14-h200.json", STAGE / "notebooks-h200.json"
# what `kit batch --runner notebooks` imports on the host: papermill runs the .ipynb in an ipykernel kernel,
# nbconvert writes report.html
ROOTS = ("papermill", "nbclient", "nbformat", "nbconvert", "jupyter-client", "jupyter-core", "ipykernel")


def _versions(lock: dict, staged_only: bool = True) -> dict[str, str]:
    out = {}
    for r in lock["wheels"]:
        if staged_only and "drop" in r:
            continue
        name, version, *_ = parse_wheel_filename(r["file"])
        out[str(name)] = str(version)
    return out


def test_the_notebooks_lock_adds_only_what_0514_and_the_image_lack() -> None:
    nb = stage.load_lock(NOTEBOOKS)
    assert nb["python"] == "3.12" and not any("drop" in r or "trim" in r for r in nb["wheels"])
    assert all(len(r["sha256"]) == 64 and r["size"] > 0 for r in nb["wheels"])
    assert not set(_versions(nb)) & set(_versions(stage.load_lock(BASE)))  # one version of each on PYTHONPATH
    assert all(canonicalize_name(n) not in _versions(nb) for n in nb["image"])
    assert sum(r["size"] for r in nb["wheels"]) < stage.DEFAULT_PART_MIB << 20  # one part


def _requirements(wheel: Path) -> list[Requirement]:
    msg = wheel_metadata(wheel)
    env = {
        **default_environment(),
        "python_version": "3.12",
        "python_full_version": "3.12.3",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "extra": "",
    }
    reqs = [Requirement(r) for r in msg.get_all("Requires-Dist") or []]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(env)]


@pytest.mark.network
def test_the_notebooks_set_resolves_with_0514s_wheels_and_the_image(tmp_path: Path) -> None:
    nb = stage.load_lock(NOTEBOOKS)
    have = {**_versions(stage.load_lock(BASE)), **_versions(nb)}
    image = {canonicalize_name(n) for n in nb["image"]}
    assert all(canonicalize_name(r) in have for r in ROOTS)
    cache = REPO / ".cache" / "stage-wheels"
    unmet = []
    for r in nb["wheels"]:
        for req in _requirements(fetch_file(r["file"], r["sha256"], cache)):
            name = canonicalize_name(req.name)
            if name in image:
                continue
            if name not in have or not req.specifier.contains(have[name], prereleases=True):
                unmet.append(f"{r['file']}: {req} (have {have.get(name)})")
    assert unmet == []
    manifest = stage.pack(NOTEBOOKS, cache, tmp_path / "parts", [])
    assert len(manifest["parts"]) == 1 and {w["folder"] for w in manifest["wheels"]} == {"deps"}
