"""The committed stage locks beside 0.5.14's: the notebooks runner's wheels and sglang 0.5.16's delta.

Without network: each is a valid lock, says why for every wheel it drops or trims, adds nothing 0.5.14's lock
already stages, and the notebooks set travels as one part. With network (the wheels, sha256-pinned): the
notebooks set resolves, i.e. every requirement of every wheel in it is met by itself, by 0.5.14's staged
wheels or by a package the lock says the image has; and it packs into one part.
"""

from __future__ import annotations

import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from kit.sglang_src import stage
from kit.sglang_src.wheels import fetch_file

REPO = Path(__file__).resolve().parent.parent
STAGE = REPO / "data" / "stage"
BASE, NOTEBOOKS, UPSTREAM = (
    STAGE / "sglang-0.5.14-h200.json",
    STAGE / "notebooks-h200.json",
    STAGE / "sglang-0.5.16-h200.json",
)
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


def test_the_locks_are_valid_and_add_only_what_0514_lacks() -> None:
    base = stage.load_lock(BASE)
    for path in (NOTEBOOKS, UPSTREAM):
        lock = stage.load_lock(path)
        assert lock["python"] == "3.12"
        for r in lock["wheels"]:
            assert len(r["sha256"]) == 64 and r["size"] > 0, r
            if "trim" in r:
                assert r["why"] and all(p.endswith(("/", ".so")) for p in r["trim"]), r
            if "drop" in r:
                assert len(r["drop"]) > 20, r  # a reason, not a flag
        repeated = {n: v for n, v in _versions(lock).items() if _versions(base).get(n) == v and n != "sglang"}
        assert repeated == {}, path.name
    nb = stage.load_lock(NOTEBOOKS)
    assert not set(_versions(nb)) & set(_versions(base))  # one version of each package on PYTHONPATH
    assert sum(r["size"] for r in nb["wheels"]) < stage.DEFAULT_PART_MIB << 20  # one part
    assert all(canonicalize_name(n) not in _versions(nb) for n in nb["image"])
    up = _versions(stage.load_lock(UPSTREAM))
    assert up["sglang"] == "0.5.16" and up["sglang-kernel"] == "0.4.5" and up["transformers"] == "5.12.1"


def _requirements(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = Parser().parsestr(z.read(meta).decode())
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
