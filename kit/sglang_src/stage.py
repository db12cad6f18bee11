"""Stage a pinned wheel set on an offline GPU host that only accepts small transfers.

Why: the GPU host has no network, each transfer to it carries at most 64 MiB, and the wheels sglang needs
there weigh far more. `pack` (here) fetches the locked wheels by sha256, drops those the DSA path never
loads, trims members built for other GPUs, and cuts one tar stream into numbered parts with a manifest.
`receive` (there) keeps each part whose sha256 matches, so a lost or repeated transfer costs only that
part; `install` re-joins, re-verifies every wheel and installs with `pip --no-deps --no-index` into a
target folder (sglang builds each into their own folder).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

from kit.errors import ExistsError, InputError, InstallError, UsageError
from kit.sglang_src.wheelfile import dist_info, record_bytes, record_row, split_wheel_name
from kit.sglang_src.wheels import fetch_file, sha256_file

MANIFEST = "manifest.json"
# One part per transfer to a host that takes 64 MiB per call, the copy of this repository included: the
# rest of the 64 MiB is left for the repository, which grows with its results (data/stage/README.md).
DEFAULT_PART_MIB = 32
_CHUNK = 1 << 20


def load_lock(path: Path) -> dict:
    try:
        lock = json.loads(Path(path).read_text())
        rows = lock["wheels"]
        assert all({"file", "sha256", "size"} <= set(r) for r in rows)
    except (OSError, ValueError, KeyError, AssertionError, TypeError) as e:
        raise InputError(
            f"{path}: not a stage lock ({e}); see data/stage/*.json for the format", path=path
        ) from None
    return lock


def fetch(lock: dict, cache: Path) -> list[Path]:
    """Every staged (not dropped) wheel of the lock, from the cache or PyPI, sha256-verified."""
    return [fetch_file(r["file"], r["sha256"], cache) for r in lock["wheels"] if "drop" not in r]


def trim_wheel(src: Path, dest: Path, drop: list[str]) -> int:
    """Copy `src` to `dest` without members under the `drop` prefixes; RECORD rewritten. Returns bytes saved
    (uncompressed). A prefix that matches nothing is an error: the lock no longer fits the wheel."""
    record = f"{dist_info(src.name)}/RECORD"
    hit = dict.fromkeys(drop, False)
    saved = 0
    rows: list[tuple[str, str, str]] = []
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zout:
        rec_info = None
        for info in zin.infolist():
            prefix = next((p for p in drop if info.filename.startswith(p)), None)
            if prefix is not None:
                hit[prefix] = True
                saved += info.file_size
                continue
            if info.filename == record:
                rec_info = info
                continue
            data = zin.read(info)
            zout.writestr(info, data)
            if not info.is_dir():
                rows.append(record_row(info.filename, data))
        if rec_info is None:
            raise InputError(f"{src.name} has no {record}; not a valid wheel", path=src)
        zout.writestr(rec_info, record_bytes(rows, record))
    missing = [p for p, seen in hit.items() if not seen]
    if missing:
        dest.unlink()
        raise InputError(
            f"{src.name}: nothing matches trim prefix {missing}; update the lock's 'trim' list", path=src
        )
    return saved


def pack(
    lock_path: Path,
    cache: Path,
    out: Path,
    extra: list[Path],
    part_bytes: int = DEFAULT_PART_MIB << 20,
    beside: Path | None = None,
) -> dict:
    """Build `out/part-NNN` + `out/manifest.json` from the lock (plus `extra` local wheels, e.g. the
    kit's patched sglang build). `out` must not exist: parts already sent stay as they were. `beside`:
    another stage's manifest.json; the wheels it carries (same sha256) stay out of the payload, and
    `install` takes them from that stage's install (0.5.16 shares 88 wheels, 115 MiB, with 0.5.14's)."""
    other = _manifest(beside if beside.is_dir() else beside.parent) if beside is not None else None
    shared = {w["sha256"] for w in other["wheels"]} if other else set()
    if out.exists():
        raise ExistsError(
            f"{out} exists; pick a new folder (parts already sent must not change under you)", path=out
        )
    for whl in extra:
        if not (whl.is_file() and whl.name.endswith(".whl")):
            raise InputError(
                f"--extra {whl}: not a wheel file (build the patched one with `kit build`)", path=whl
            )
    lock = load_lock(lock_path)
    rows = {r["file"]: r for r in lock["wheels"]}
    wheels = fetch(lock, cache)
    listed, saved = [], {}
    with tempfile.TemporaryDirectory(prefix="kit-pack-") as tmp:
        staged = Path(tmp) / "parts"  # moved to `out` only when complete: a failed pack leaves nothing
        staged.mkdir()
        payload = Path(tmp) / "payload.tar"
        with tarfile.open(payload, "w", format=tarfile.PAX_FORMAT) as tar:
            for whl in [*wheels, *extra]:
                lock_row = rows.get(whl.name, {})
                digest = (lock_row.get("sha256") or sha256_file(whl)) if shared else None
                if digest in shared and not lock_row.get("trim"):  # fetched sha256-checked: the lock's digest
                    row = {"file": whl.name, "sha256": digest, "size": whl.stat().st_size}
                    listed.append({**row, "folder": _folder(whl.name, lock_row), "beside": True})
                    continue
                src = whl
                drop = rows.get(whl.name, {}).get("trim")
                if drop:
                    src = Path(tmp) / whl.name
                    saved[whl.name] = {
                        "bytes_unpacked": trim_wheel(whl, src, drop),
                        "wheel_before": whl.stat().st_size,
                        "wheel_after": src.stat().st_size,
                    }
                info = tar.gettarinfo(str(src), arcname=whl.name)
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                with open(src, "rb") as f:
                    tar.addfile(info, f)
                listed.append(
                    {
                        "file": whl.name,
                        "sha256": sha256_file(src),
                        "size": src.stat().st_size,
                        "folder": _folder(whl.name, rows.get(whl.name, {})),
                    }
                )
        parts = _split(payload, staged, part_bytes)
        dropped = [r for r in lock["wheels"] if "drop" in r]
        manifest = {
            "lock": Path(lock_path).name,
            "payload_sha256": sha256_file(payload),
            "payload_size": payload.stat().st_size,
            "parts": parts,
            "wheels": listed,
            "trimmed": saved,
            "dropped": {"count": len(dropped), "bytes": sum(r["size"] for r in dropped)},
            "closure": {"count": len(lock["wheels"]), "bytes": sum(r["size"] for r in lock["wheels"])},
        }
        if other is not None:  # what install takes from the other stage's install (install --beside)
            manifest["beside"] = {
                "payload_sha256": other["payload_sha256"],
                "wheels": sum(bool(w.get("beside")) for w in listed),
                "bytes": sum(w["size"] for w in listed if w.get("beside")),
            }
        (staged / MANIFEST).write_text(json.dumps(manifest, indent=1))
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staged), out)
    return manifest


def pack_tree(root: Path, dirs: list[str], out: Path, part_bytes: int = DEFAULT_PART_MIB << 20) -> dict:
    """A folder tree as a stage (kind "tree"): `dirs` (relative to `root`; those missing skipped) in one gzip
    tar cut into parts with sha256, like the wheels, so it travels and is verified the same way; `kit stage
    install` unpacks it under a root. Why: sglang's JIT caches (scripts/jit_cache.sh) spare a GPU host the
    kernel compiles of its first servers. `out` must not exist; written whole or not at all."""
    if out.exists():
        raise ExistsError(f"{out} exists; pick a new folder (parts already sent must not change)", path=out)
    have = [d for d in dirs if (root / d).is_dir()]
    if not have:
        raise InputError(f"none of {', '.join(dirs)} is a folder under {root}: nothing to pack", path=root)
    with tempfile.TemporaryDirectory(
        prefix="kit-pack-", dir=out.parent if out.parent.is_dir() else None
    ) as tmp:
        staged = Path(tmp) / "parts"
        staged.mkdir()
        payload = Path(tmp) / "payload.tar.gz"
        files = size = 0
        with tarfile.open(payload, "w:gz") as tar:
            for d in have:
                for path in sorted((root / d).rglob("*")):
                    if path.is_file() and not path.is_symlink():
                        files, size = files + 1, size + path.stat().st_size
                tar.add(root / d, arcname=d, filter=_relative_links)
        manifest = {
            "kind": "tree",
            "dirs": have,
            "payload_sha256": sha256_file(payload),
            "payload_size": payload.stat().st_size,
            "parts": _split(payload, staged, part_bytes),
            "files": files,
            "bytes": size,
        }
        (staged / MANIFEST).write_text(json.dumps(manifest, indent=1))
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staged), out)
    return manifest


def _relative_links(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Leave out links to absolute paths: `install` unpacks with tarfile's "data" filter (it refuses them)."""
    return None if (info.issym() or info.islnk()) and info.linkname.startswith("/") else info


def _folder(wheel: str, row: dict) -> str:
    """Install folder: each sglang build alone (one PYTHONPATH per arm), fallbacks last, the rest in deps."""
    dist, ver, _ = split_wheel_name(wheel)
    if dist == "sglang":
        return f"sglang-{ver}"
    return "fallback" if "fallback" in row else "deps"


def _split(payload: Path, out: Path, size: int) -> list[dict]:
    parts = []
    with open(payload, "rb") as f:
        for i, chunk in enumerate(iter(lambda: f.read(size), b"")):
            name = f"part-{i:03d}"
            (out / name).write_bytes(chunk)
            parts.append({"name": name, "size": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    return parts


def carry(stage: Path, prefix: str, part_bytes: int | None = None) -> list[Path]:
    """One folder per part beside `stage` (`<prefix>0`, `<prefix>1`, ...), each the manifest and one part
    (hard links where the file system allows): what one call to the host carries, since a call takes the
    repository and one part. Folders already there are refused: parts already sent must not change.
    With `part_bytes`, the payload is cut again (its sha256 checked, and unchanged in the manifest) where a
    part is larger, or where fewer parts would do: a stage cut for another limit (the JIT caches a host
    returns in 15 MiB parts) would be refused beside the repository, or cost more calls than the tree now
    leaves room for."""
    if not prefix or "/" in prefix:
        raise UsageError(f"prefix {prefix!r}: a folder name without '/', e.g. .stage16_", param="prefix")
    if part_bytes is not None and part_bytes < 1 << 20:
        raise UsageError(f"--part-mib must be >= 1, got {part_bytes >> 20}", param="--part-mib")
    m = _manifest(stage)
    fewest = -(-m["payload_size"] // part_bytes) if part_bytes else len(m["parts"])
    recut = part_bytes is not None and (
        max(p["size"] for p in m["parts"]) > part_bytes or fewest < len(m["parts"])
    )
    count = fewest if recut else len(m["parts"])
    made = [stage.parent / f"{prefix}{i}" for i in range(count)]
    for d in made:  # before any cutting: a refused carry costs nothing
        if d.exists():
            raise ExistsError(f"{d} exists; remove the earlier call folders first", path=d)
    with tempfile.TemporaryDirectory(prefix="kit-carry-", dir=stage.parent) as tmp:
        src = stage
        if recut:
            src = Path(tmp) / "parts"
            src.mkdir()
            joined = _join(stage, m, Path(tmp) / "payload")
            m = {**m, "parts": _split(joined, src, part_bytes)}
            joined.unlink()
        for d, part in zip(made, m["parts"], strict=True):
            try:
                d.mkdir()
            except FileExistsError:  # another carry made it since the check
                raise ExistsError(f"{d} exists; remove the earlier call folders first", path=d) from None
            if src is stage:
                shutil.copyfile(stage / MANIFEST, d / MANIFEST)
            else:
                (d / MANIFEST).write_text(json.dumps(m, indent=1))
            try:
                os.link(src / part["name"], d / part["name"])
            except OSError:
                shutil.copyfile(src / part["name"], d / part["name"])
    return made


CALL_LIMIT_MB = 64  # what one call to the H200 here carries, in MB (decimal): measured, data/stage/README.md
MANIFEST_ROOM = 64 << 10  # a part travels with its stage's manifest (0.5.14's: 22 KB)


def fit(repo: Path, carried: list[Path], limit_mb: int = CALL_LIMIT_MB) -> dict:
    """The largest --part-mib that travels in one call beside the checkout's files (tracked, and untracked
    but not ignored: what a call copies) and the `carried` paths: the tree grows with its results, and a
    part cut for last month's tree is refused at the first transfer."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        raise InputError(
            f"{repo}: not a git checkout; run it in the repository that travels", path=repo
        ) from None
    files = [repo / os.fsdecode(n) for n in listed.split(b"\0") if n]
    tree = sum(f.lstat().st_size for f in files if f.is_file() or f.is_symlink())
    extra = 0
    for c in carried:
        if not c.exists():
            raise InputError(f"{c}: nothing there to carry; name the folder or file each call takes", path=c)
        extra += (
            sum(f.stat().st_size for f in c.rglob("*") if f.is_file()) if c.is_dir() else c.stat().st_size
        )
    free = limit_mb * 1000**2 - tree - extra - MANIFEST_ROOM
    part_mib = free >> 20
    if part_mib < 1:
        raise InputError(
            f"{tree + extra} bytes travel before any part, over the {limit_mb} MB a call takes; carry less",
            path=repo,
        )
    return {"tree_bytes": tree, "carried_bytes": extra, "limit_mb": limit_mb, "part_mib": part_mib}


def _manifest(folder: Path) -> dict:
    try:
        return json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise InputError(
            f"{folder / MANIFEST}: {e}; carry the manifest written by `kit stage pack`",
            path=folder / MANIFEST,
        ) from None


def status(store: Path) -> dict:
    m = _manifest(store)
    seen = _verified(store)
    have = [p["name"] for p in m["parts"] if _part_ok(store / p["name"], p, seen)]
    missing = [p["name"] for p in m["parts"] if p["name"] not in have]
    _remember(store, seen)
    return {"parts": len(m["parts"]), "have": len(have), "missing": missing}


# A store's parts already hashed, by (size, mtime_ns): a receive call per part would otherwise re-hash every
# part the store holds (about 0.5 s a call with 13 parts on the H200); a part changed since is hashed again.
VERIFIED = ".verified.json"


def _verified(store: Path) -> dict:
    try:
        return json.loads((store / VERIFIED).read_text())
    except (OSError, ValueError):
        return {}


def _remember(store: Path, seen: dict) -> None:
    tmp = store / f"{VERIFIED}.{os.getpid()}"
    tmp.write_text(json.dumps(seen))
    tmp.replace(store / VERIFIED)


def _part_ok(path: Path, part: dict, seen: dict | None = None) -> bool:
    """`path` is `part` (size and sha256); with `seen`, a file hashed before and unchanged is not hashed
    again, and one hashed now is added to it."""
    if not path.is_file() or path.stat().st_size != part["size"]:
        return False
    st = path.stat()
    key = [st.st_size, st.st_mtime_ns, part["sha256"]]
    if seen is not None and seen.get(path.name) == key:
        return True
    ok = sha256_file(path) == part["sha256"]
    if ok and seen is not None:
        seen[path.name] = key
    return ok


def receive(src: Path, store: Path) -> dict:
    """Copy the verified parts found in `src` into `store` (the host's folder that outlives calls)."""
    m = _manifest(src)
    store.mkdir(parents=True, exist_ok=True)
    if (store / MANIFEST).exists() and _manifest(store)["payload_sha256"] != m["payload_sha256"]:
        raise ExistsError(
            f"{store} holds parts of another pack; use a new store folder or remove it", path=store
        )
    shutil.copyfile(src / MANIFEST, store / MANIFEST)
    seen = _verified(store)
    for part in m["parts"]:
        p = src / part["name"]
        if p.exists() and not _part_ok(store / part["name"], part, seen):
            if not _part_ok(p, part):
                raise InputError(f"{p}: size or sha256 differs from the manifest; re-send this part", path=p)
            shutil.copyfile(p, store / part["name"])
    return status(store)


def install(store: Path, target: Path, python: str = sys.executable, beside: Path | None = None) -> dict:
    """Join, verify and install: sglang wheels each into `target/sglang-<version>`, fallbacks into
    `target/fallback`, the rest into `target/deps`; a tree stage (`pack_tree`) unpacked under `target`.
    Idempotent: a finished install leaves a stamp (a tree's in the store: its target may be /)."""
    m = _manifest(store)
    tree = m.get("kind") == "tree"
    stamp = (store if tree else target) / f"installed-{m['payload_sha256'][:16]}.json"
    if stamp.exists():
        return json.loads(stamp.read_text())
    st = status(store)
    if st["missing"]:
        raise InputError(
            f"{store}: {st['have']}/{st['parts']} parts; send {', '.join(st['missing'])} first", path=store
        )
    if tree:
        joined = _join(store, m, store / "payload.tar.gz")
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(joined) as tar:
            tar.extractall(target, filter="data")
        joined.unlink()
        result = {"payload_sha256": m["payload_sha256"], "dirs": m["dirs"], "files": m["files"]}
        result["under"] = str(target)
        stamp.write_text(json.dumps(result, indent=1))
        return result
    wheels_dir = target / "wheels"
    wheels_dir.mkdir(parents=True, exist_ok=True)
    joined = _join(store, m, target / "payload.tar")
    with tarfile.open(joined) as tar:
        tar.extractall(wheels_dir, filter="data")
    joined.unlink()
    _take_beside(m, wheels_dir, beside)
    for w in m["wheels"]:
        if sha256_file(wheels_dir / w["file"]) != w["sha256"]:
            raise InputError(
                f"{w['file']}: sha256 differs from the manifest after re-joining", path=wheels_dir / w["file"]
            )
    groups: dict[str, list[str]] = {}
    for w in m["wheels"]:
        groups.setdefault(w["folder"], []).append(w["file"])
    folders = {name: _pip_target(python, wheels_dir, files, target / name) for name, files in groups.items()}
    result = {"payload_sha256": m["payload_sha256"], "wheels": len(m["wheels"]), "folders": folders}
    result["bytecode"] = _compile(python, [Path(f) for f in folders.values()])
    stamp.write_text(json.dumps(result, indent=1))
    return result


def _take_beside(m: dict, wheels_dir: Path, beside: Path | None) -> None:
    """The wheels a stage packed `beside` another, copied from that stage's install (its target's wheels/,
    checked by the stamp it left and, after copying, by each wheel's sha256 like the rest)."""
    if "beside" not in m:
        return
    want = m["beside"]["payload_sha256"]
    if beside is None or not (beside / f"installed-{want[:16]}.json").is_file():
        where = f" ({beside} holds no install of it)" if beside is not None else ""
        raise InputError(
            f"this stage leaves {m['beside']['wheels']} wheels to the stage with payload {want[:16]}..."
            f"{where}: install that one first and name its target with --beside",
            path=beside,
        )
    for w in m["wheels"]:
        if w.get("beside"):
            shutil.copyfile(beside / "wheels" / w["file"], wheels_dir / w["file"])


def _join(store: Path, m: dict, joined: Path) -> Path:
    """The parts as one payload file, checked against the manifest's sha256 (removed if it differs)."""
    h = hashlib.sha256()
    with open(joined, "wb") as out:
        for part in m["parts"]:
            with open(store / part["name"], "rb") as f:
                for chunk in iter(lambda: f.read(_CHUNK), b""):
                    h.update(chunk)
                    out.write(chunk)
    if h.hexdigest() != m["payload_sha256"]:
        joined.unlink()
        raise InputError(
            "the joined payload's sha256 differs from the manifest; re-send the parts", path=store
        )
    return joined


def _compile(python: str, dirs: list[Path]) -> dict:
    """Every installed module's bytecode, written once here on all cores: no GPU host's server wrote any
    (every committed server.log, later servers of a call included, holds torchao's compile-time warning
    from each of its three processes), so each compiled sglang and its dependencies from source again. A
    file that does not compile (a dependency's test data) is counted, not an error: importing it would fail
    the same way with or without bytecode."""
    t0 = time.monotonic()
    cmd = [python, "-m", "compileall", "-q", "-j", "0", *map(str, dirs)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    failed = sum(ln.startswith("***") for ln in r.stdout.splitlines())
    return {"seconds": round(time.monotonic() - t0, 1), "exit": r.returncode, "files_failed": failed}


def _pip_target(python: str, wheels_dir: Path, files: list[str], dest: Path) -> str:
    flags = ["-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade"]
    cmd = [
        python,
        "-m",
        "pip",
        "install",
        *flags,
        "--target",
        str(dest),
        *[str(wheels_dir / f) for f in files],
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise InstallError(f"pip install into {dest} failed: {tail[0]}")
    return str(dest)
