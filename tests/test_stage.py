"""kit.sglang_src.stage: pack -> receive (any order, repeats) -> install, on small real wheels built here.

The real wheel set is cp312 for an H200 host; pip on this machine installs these py3-none-any
wheels the same way, so the whole hand-over runs for real except the PyPI download (the cache is
pre-filled, as `pack` finds it after a first fetch).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from kit.errors import ExistsError, InputError, UsageError
from kit.paths import REPO
from kit.sglang_src import stage
from kit.sglang_src.wheels import sha256_file


def _wheel(folder: Path, dist: str, ver: str, files: dict[str, bytes]) -> Path:
    di = f"{dist}-{ver}.dist-info"
    files = {
        **files,
        f"{di}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {ver}\n".encode(),
        f"{di}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    rows = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append([name, f"sha256={digest}", str(len(data))])
    rows.append([f"{di}/RECORD", "", ""])
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    path = folder / f"{dist}-{ver}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{di}/RECORD", buf.getvalue())
    return path


@pytest.fixture
def packed(tmp_path: Path) -> dict:
    cache = tmp_path / "cache"
    cache.mkdir()
    big = random.Random(0).randbytes(1 << 20)  # 1 MiB per "arch build", incompressible like a cubin
    kern = _wheel(
        cache,
        "fakekernel",
        "1.0",
        {
            "fakekernel/__init__.py": b"ARCH = 'sm90'\n",
            "fakekernel/sm90/ops.bin": big,
            "fakekernel/sm100/ops.bin": big + b"x",
            "fakekernel/fa3.bin": big + b"y",
        },
    )
    dep = _wheel(cache, "fakedep", "2.0", {"fakedep/__init__.py": b"V = 2\n"})
    fb = _wheel(cache, "fakefallback", "3.0", {"fakefallback/__init__.py": b"V = 3\n"})
    dropped = _wheel(cache, "fakedropped", "4.0", {"fakedropped/__init__.py": b""})
    sgl_dir = tmp_path / "build"
    sgl_dir.mkdir()
    init = b"__version__ = '0.5.14+pr29654'\n"
    sgl = _wheel(sgl_dir, "sglang", "0.5.14+pr29654", {"sglang/__init__.py": init})
    lock = {
        "about": "test",
        "python": "3",
        "wheels": [
            {
                "file": kern.name,
                "sha256": sha256_file(kern),
                "size": kern.stat().st_size,
                "trim": ["fakekernel/sm100/", "fakekernel/fa3.bin"],
                "why": "other GPUs",
            },
            {"file": dep.name, "sha256": sha256_file(dep), "size": dep.stat().st_size},
            {
                "file": fb.name,
                "sha256": sha256_file(fb),
                "size": fb.stat().st_size,
                "fallback": "maybe present",
            },
            {"file": dropped.name, "sha256": sha256_file(dropped), "size": 1, "drop": "unused"},
        ],
    }
    lock_path = tmp_path / "lock.json"
    lock_path.write_text(json.dumps(lock))
    out = tmp_path / "stage"
    manifest = stage.pack(lock_path, cache, out, [sgl], part_bytes=300_000)
    return {"tmp": tmp_path, "out": out, "manifest": manifest, "lock": lock_path, "cache": cache}


def test_pack_trims_drops_and_splits(packed: dict) -> None:
    m = packed["manifest"]
    names = [w["file"] for w in m["wheels"]]
    assert not any(n.startswith("fakedropped") for n in names)
    assert {w["folder"] for w in m["wheels"]} == {"deps", "fallback", "sglang-0.5.14+pr29654"}
    trimmed = m["trimmed"]["fakekernel-1.0-py3-none-any.whl"]
    assert trimmed["bytes_unpacked"] == 2 * (1 << 20) + 2
    assert len(m["parts"]) >= 2 and all(p["size"] <= 300_000 for p in m["parts"])
    assert sum(p["size"] for p in m["parts"]) == m["payload_size"]
    assert (packed["out"] / stage.MANIFEST).is_file()


def test_pack_refuses_existing_out_and_stale_trim(packed: dict, tmp_path: Path) -> None:
    with pytest.raises(ExistsError, match="exists; pick a new folder"):
        stage.pack(packed["lock"], packed["cache"], packed["out"], [])
    lock = json.loads(packed["lock"].read_text())
    lock["wheels"][0]["trim"] = ["fakekernel/sm120/"]
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps(lock))
    with pytest.raises(InputError, match=r"nothing matches trim prefix \['fakekernel/sm120/'\]"):
        stage.pack(stale, packed["cache"], tmp_path / "stage2", [])
    assert not (tmp_path / "stage2").exists()  # a failed pack leaves nothing to send by mistake
    with pytest.raises(InputError, match="not a wheel file"):
        stage.pack(packed["lock"], packed["cache"], tmp_path / "stage3", [tmp_path / "missing.whl"])


def test_receive_in_pieces_then_install(packed: dict) -> None:
    out, tmp = packed["out"], packed["tmp"]
    parts = [p["name"] for p in packed["manifest"]["parts"]]
    store, target = tmp / "host-store", tmp / "host-target"
    # one transfer carries the manifest and the last part only
    carry = tmp / "carry1"
    carry.mkdir()
    shutil.copy(out / stage.MANIFEST, carry)
    shutil.copy(out / parts[-1], carry)
    st = stage.receive(carry, store)
    assert st["have"] == 1 and st["missing"] == parts[:-1]
    with pytest.raises(InputError, match=f"send {parts[0]}"):
        stage.install(store, target)
    # a corrupted part is refused and never enters the store
    bad = tmp / "carry2"
    bad.mkdir()
    shutil.copy(out / stage.MANIFEST, bad)
    (bad / parts[0]).write_bytes(b"\0" * (out / parts[0]).stat().st_size)
    with pytest.raises(InputError, match=f"{parts[0]}: size or sha256 differs"):
        stage.receive(bad, store)
    assert stage.status(store)["have"] == 1
    # the rest, with a repeat of the last part
    st = stage.receive(out, store)
    assert st == {"parts": len(parts), "have": len(parts), "missing": []}
    res = stage.install(store, target)
    assert set(res["folders"]) == {"deps", "fallback", "sglang-0.5.14+pr29654"}
    kern = target / "deps" / "fakekernel"
    assert (kern / "sm90" / "ops.bin").is_file()
    assert not (kern / "sm100").exists() and not (kern / "fa3.bin").exists()
    # bytecode written at install: no GPU host's server process wrote any (stage._compile)
    assert res["bytecode"]["exit"] == 0 and res["bytecode"]["files_failed"] == 0
    for folder in res["folders"].values():
        sources = {p.stem for p in Path(folder).rglob("*.py")}
        assert sources and sources == {p.name.split(".")[0] for p in Path(folder).rglob("*.pyc")}, folder
    code = "import fakekernel, fakedep, fakefallback, sglang; print(sglang.__version__, fakedep.V)"
    env_path = ":".join(str(target / f) for f in ("sglang-0.5.14+pr29654", "deps", "fallback"))
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0.5.14+pr29654", "2"]
    # the trimmed wheel's RECORD lists exactly what it holds, so pip uninstall / check stay honest
    rec = next((target / "deps").glob("fakekernel-1.0.dist-info/RECORD")).read_text()
    assert "sm100" not in rec and "fakekernel/sm90/ops.bin" in rec
    assert stage.install(store, target) == res  # idempotent: the stamp answers


def test_receive_refuses_parts_of_another_pack(packed: dict, tmp_path: Path) -> None:
    store = tmp_path / "store"
    stage.receive(packed["out"], store)
    other = tmp_path / "other"
    other.mkdir()
    m = json.loads((packed["out"] / stage.MANIFEST).read_text())
    m["payload_sha256"] = "0" * 64
    (other / stage.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(ExistsError, match="holds parts of another pack"):
        stage.receive(other, store)


def test_cli_status_names_missing_parts(packed: dict, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    shutil.copy(packed["out"] / stage.MANIFEST, store)
    r = subprocess.run(
        [sys.executable, "-m", "kit.cli", "stage", "status", str(store)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["have"] == 0
    r = subprocess.run(
        [sys.executable, "-m", "kit.cli", "stage", "install", str(store), str(tmp_path / "t")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert r.returncode == 2 and "parts; send part-000" in r.stderr


def test_committed_lock_is_consistent() -> None:
    """The lock the H200 run uses: every row pinned, drops explained, the kernels trimmed not dropped."""
    lock = stage.load_lock(REPO / "data" / "stage" / "sglang-0.5.14-h200.json")
    rows = {r["file"].split("-")[0]: r for r in lock["wheels"]}
    assert all(len(r["sha256"]) == 64 for r in lock["wheels"])
    assert all(r["drop"] for r in lock["wheels"] if "drop" in r)
    assert "drop" not in rows["sglang"] and "drop" not in rows["sgl_deep_gemm"]
    assert rows["sglang_kernel"]["trim"] == ["sgl_kernel/sm100/", "sgl_kernel/flash_ops.abi3.so"]
    assert "drop" in rows["flashinfer_cubin"]


def test_pack_is_reproducible(packed: dict, tmp_path: Path) -> None:
    """Same lock and wheels, same bytes: a part sent in an earlier session still fits a new pack."""
    again = stage.pack(packed["lock"], packed["cache"], tmp_path / "again", [], part_bytes=300_000)
    wheels = packed["manifest"]["wheels"]
    first = {w["file"]: w["sha256"] for w in wheels if not w["file"].startswith("sglang")}
    assert {w["file"]: w["sha256"] for w in again["wheels"]} == first  # the trimmed wheel included
    repeat = stage.pack(packed["lock"], packed["cache"], tmp_path / "again2", [], part_bytes=300_000)
    assert repeat["payload_sha256"] == again["payload_sha256"]


def test_a_tree_stage_refuses_what_it_cannot_pack_and_leaves_out_absolute_links(tmp_path: Path) -> None:
    """The JIT caches' stage (kind "tree"): an existing OUT or no folder to pack is a one-line error; a link
    to an absolute path (which the unpacking's "data" filter would refuse) is left out, the rest unpacks."""
    root = tmp_path / "root"
    (root / "c").mkdir(parents=True)
    (root / "c" / "k.so").write_bytes(b"kernel")
    (root / "c" / "inside").symlink_to("k.so")
    (root / "c" / "outside").symlink_to("/etc/hostname")
    with pytest.raises(InputError, match="nothing to pack"):
        stage.pack_tree(root, ["absent"], tmp_path / "none")
    m = stage.pack_tree(root, ["c", "absent"], tmp_path / "s")
    assert m["kind"] == "tree" and m["dirs"] == ["c"] and m["files"] == 1
    with pytest.raises(ExistsError):
        stage.pack_tree(root, ["c"], tmp_path / "s")
    stage.receive(tmp_path / "s", tmp_path / "store")
    there = tmp_path / "there"
    got = stage.install(tmp_path / "store", there)
    assert got["files"] == 1 and (there / "c" / "k.so").read_bytes() == b"kernel"
    assert (there / "c" / "inside").is_symlink() and not (there / "c" / "outside").exists()
    assert stage.install(tmp_path / "store", there) == got  # once: the stamp in the store


def test_a_stage_packed_beside_another_leaves_out_their_shared_wheels(packed: dict, tmp_path: Path) -> None:
    """A later release's stage (0.5.16 beside 0.5.14's) carries only the wheels the first lacks; install
    takes the shared ones from the first's install and checks them like the rest, and refuses without it."""
    tmp, cache = packed["tmp"], packed["cache"]
    dep = next(cache.glob("fakedep-*.whl"))
    newer = _wheel(cache, "fakenew", "1.0", {"fakenew/__init__.py": b"N = 1\n"})
    lock = {
        "about": "a later release",
        "python": "3",
        "wheels": [
            {"file": w.name, "sha256": sha256_file(w), "size": w.stat().st_size} for w in (dep, newer)
        ],
    }
    lock_path = tmp_path / "lock2.json"
    lock_path.write_text(json.dumps(lock))
    first = packed["out"] / stage.MANIFEST
    m = stage.pack(lock_path, cache, tmp_path / "stage2", [], part_bytes=300_000, beside=first)
    assert m["beside"]["wheels"] == 1
    assert m["beside"]["payload_sha256"] == packed["manifest"]["payload_sha256"]
    with tarfile.open(fileobj=io.BytesIO((tmp_path / "stage2" / "part-000").read_bytes())) as tar:
        assert tar.getnames() == [newer.name]  # fakedep travels once, in the first stage
    store2 = tmp_path / "store2"
    stage.receive(tmp_path / "stage2", store2)
    with pytest.raises(InputError, match="install that one first and name its target with --beside"):
        stage.install(store2, tmp_path / "t2")
    with pytest.raises(InputError, match="holds no install of it"):
        stage.install(store2, tmp_path / "t2", beside=tmp_path / "nowhere")
    store1, target1 = tmp / "host-store", tmp / "host-target"
    stage.receive(packed["out"], store1)
    stage.install(store1, target1)
    res = stage.install(store2, tmp_path / "t2", beside=target1)
    assert res["wheels"] == 2 and (tmp_path / "t2" / "deps" / "fakedep" / "__init__.py").is_file()
    assert (tmp_path / "t2" / "deps" / "fakenew" / "__init__.py").is_file()


def test_carry_makes_a_folder_per_part_that_receive_takes_in_any_order(packed: dict) -> None:
    """What one call carries (the manifest and one part), made beside the stage; received in any order they
    make the whole store; a second carry or a prefix with '/' is refused."""
    out, tmp = packed["out"], packed["tmp"]
    folders = stage.carry(out, ".stage-call")
    assert [d.name for d in folders] == [f".stage-call{i}" for i in range(len(packed["manifest"]["parts"]))]
    for d in folders:
        assert sorted(p.name for p in d.iterdir()) == sorted(
            [stage.MANIFEST, *[p.name for p in d.glob("part-*")]]
        )
        assert len(list(d.glob("part-*"))) == 1
    store = tmp / "carried-store"
    for d in reversed(folders):
        st = stage.receive(d, store)
    assert st["missing"] == []
    with pytest.raises(ExistsError):
        stage.carry(out, ".stage-call")
    with pytest.raises(UsageError):
        stage.carry(out, "../elsewhere")


def test_carry_cuts_a_stage_again_for_a_smaller_call_and_install_takes_it(tmp_path: Path) -> None:
    """A stage cut for another limit (a host returns its JIT caches in 15 MiB parts; a call here carries about
    12 beside the repository): `carry --part-mib` cuts the same payload smaller, every part under the size,
    the payload's sha256 unchanged, and the host installs the tree from the new parts."""
    tree = tmp_path / "root"
    (tree / "cache" / "k").mkdir(parents=True)
    (tree / "cache" / "k" / "kernel.bin").write_bytes(os.urandom(5 << 20))
    big = stage.pack_tree(tree, ["cache"], tmp_path / "jit-stage", part_bytes=4 << 20)
    assert [p["size"] for p in big["parts"]] == [4 << 20, big["payload_size"] - (4 << 20)]
    folders = stage.carry(tmp_path / "jit-stage", ".stage-jit-", part_bytes=1 << 20)
    assert len(folders) == 6 and not (tmp_path / "jit-stage" / "part-002").exists()
    store = tmp_path / "store"
    for d in folders:
        m = json.loads((d / stage.MANIFEST).read_text())
        assert m["payload_sha256"] == big["payload_sha256"] and len(list(d.glob("part-*"))) == 1
        assert all(p["size"] <= 1 << 20 for p in m["parts"])
        stage.receive(d, store)
    stage.install(store, tmp_path / "there")
    assert (tmp_path / "there" / "cache" / "k" / "kernel.bin").read_bytes() == (
        tree / "cache" / "k" / "kernel.bin"
    ).read_bytes()
    (tmp_path / ".late-5").mkdir()  # the sixth folder of the new cut: refused before any cutting
    with pytest.raises(ExistsError, match=".late-5 exists"):
        stage.carry(tmp_path / "jit-stage", ".late-", part_bytes=1 << 20)
    assert not (tmp_path / ".late-0").exists() and not list(tmp_path.glob("kit-carry-*"))
    (tmp_path / "jit-stage" / "part-001").write_bytes(b"damaged")
    with pytest.raises(InputError, match="re-send the parts"):
        stage.carry(tmp_path / "jit-stage", ".again-", part_bytes=1 << 20)
    assert not list(tmp_path.glob(".again-*"))
    with pytest.raises(UsageError):
        stage.carry(tmp_path / "jit-stage", ".again-", part_bytes=0)


def test_carry_cuts_a_stage_again_into_fewer_parts_when_the_tree_leaves_more_room(tmp_path: Path) -> None:
    """A stage cut small for a large tree, carried after the tree shrank: `--part-mib` larger than its parts
    gives fewer folders (fewer calls), the same payload; a size that would not change the count keeps the
    parts as they are."""
    tree = tmp_path / "root"
    (tree / "cache").mkdir(parents=True)
    (tree / "cache" / "blob").write_bytes(os.urandom(5 << 20))
    small = stage.pack_tree(tree, ["cache"], tmp_path / "st", part_bytes=1 << 20)
    assert len(small["parts"]) == 6
    folders = stage.carry(tmp_path / "st", ".big-", part_bytes=3 << 20)
    assert len(folders) == 2
    store = tmp_path / "store"
    for d in folders:
        assert json.loads((d / stage.MANIFEST).read_text())["payload_sha256"] == small["payload_sha256"]
        stage.receive(d, store)
    stage.install(store, tmp_path / "there")
    assert (tmp_path / "there" / "cache" / "blob").read_bytes() == (tree / "cache" / "blob").read_bytes()
    same = stage.carry(tmp_path / "st", ".same-", part_bytes=(1 << 20) + 1)  # still 6 parts: as packed
    assert len(same) == 6 and all((d / f"part-{i:03d}").exists() for i, d in enumerate(same))


def test_a_store_hashes_each_part_once_and_again_only_when_it_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One receive call per part: the store's earlier parts are not hashed again each call (they were, about
    0.5 s a call on the H200), but a part changed since it was received is hashed and refused."""
    tree = tmp_path / "tree"
    (tree / "d").mkdir(parents=True)
    (tree / "d" / "f").write_bytes(os.urandom(3_000_000))
    m = stage.pack_tree(tree, ["d"], tmp_path / "stage", part_bytes=1 << 20)
    store = tmp_path / "store"
    hashed: list[str] = []
    real = stage.sha256_file
    monkeypatch.setattr(stage, "sha256_file", lambda p: hashed.append(Path(p).parent.name) or real(p))
    for part in m["parts"]:
        call = tmp_path / f"call-{part['name']}"
        call.mkdir()
        shutil.copy(tmp_path / "stage" / stage.MANIFEST, call)
        shutil.copy(tmp_path / "stage" / part["name"], call)
        hashed.clear()
        st = stage.receive(call, store)
        assert hashed.count("store") == 1, hashed  # the part just kept; not the earlier ones
    assert st["missing"] == []
    hashed.clear()
    assert stage.status(store)["missing"] == [] and hashed == []
    p = store / m["parts"][0]["name"]
    p.write_bytes(b"x" + p.read_bytes()[1:])  # same size, new content (and mtime)
    assert stage.status(store)["missing"] == [m["parts"][0]["name"]]


def test_fit_sizes_a_part_to_what_travels_beside_the_checkout(tmp_path: Path) -> None:
    """What a call copies: tracked files and untracked ones git does not ignore, plus what it carries; the
    part is what is left under the call's limit (the refusals of 2026-12-05: a tree grown under 17 MiB
    parts cut earlier)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitignore").write_text("/.stage*/\n.whl/\n")
    (repo / "tracked.bin").write_bytes(b"t" * 3_000_000)
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    (repo / "new.bin").write_bytes(b"n" * 1_000_000)  # untracked, not ignored: it travels
    (repo / ".stage").mkdir()
    (repo / ".stage" / "part-000").write_bytes(b"s" * 9_000_000)  # ignored: only when carried
    (repo / ".whl").mkdir()
    (repo / ".whl" / "w.whl").write_bytes(b"w" * 500_000)  # ignored, carried
    tree = 3_000_000 + 1_000_000 + len("/.stage*/\n.whl/\n")
    got = stage.fit(repo, [repo / ".whl"], limit_mb=10)
    assert (got["tree_bytes"], got["carried_bytes"]) == (tree, 500_000)
    assert got["part_mib"] == (10_000_000 - tree - 500_000 - stage.MANIFEST_ROOM) >> 20 == 5
    with pytest.raises(InputError, match="over the 4 MB a call takes"):
        stage.fit(repo, [repo / ".whl"], limit_mb=4)
    r = subprocess.run(
        [sys.executable, "-m", "kit.cli", "stage", "fit", str(tmp_path / "nothing")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "nothing there to carry" in r.stderr
