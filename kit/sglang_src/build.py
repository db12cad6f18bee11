"""Build the kit's "fix" arm: the baseline sglang wheel + the kit's own PR #29654 patch, repacked as a valid
wheel with the local version `+pr29654` (METADATA, dist-info dir, RECORD hashes per the wheel spec). Any
other patch file builds the same way as `+<its name>` (the mutants: kit.sglang_src.mutants).

All-or-nothing: a hunk that does not apply (kit.sglang_src.patch) leaves no half-written out dir, and an
existing output is never overwritten.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

import kit
from kit.errors import ExistsError, InputError, UsageError
from kit.paths import BUILD, PR_PATCH
from kit.rundir import check_folder
from kit.sglang_src.patch import apply_patch
from kit.sglang_src.releases import BASELINE, LOCAL_LABEL, PR_COMMIT, PR_REF, pinned
from kit.sglang_src.wheelfile import check_wheel, record_bytes, record_row, split_wheel_name
from kit.sglang_src.wheels import fetch_wheel, sha256_file

MANIFEST = "manifest.json"


def local_label(name: str) -> str:
    """A patch file's name as a PEP 440 local version label: lowercase alphanumerics joined by dots
    (`no-clear.patch` -> `no.clear`), the form pip and the wheel's file name keep."""
    label = ".".join(re.findall(r"[a-z0-9]+", Path(name).name.removesuffix(".patch").lower()))
    if not label:
        raise UsageError(f"cannot make a version label from the patch name {name!r}", param="patch")
    return label


def _safe_members(zf: zipfile.ZipFile, wheel: Path) -> None:
    for name in zf.namelist():
        p = PurePosixPath(name)
        if p.is_absolute() or ".." in p.parts:
            raise InputError(
                f"{wheel.name} contains an unsafe member {name!r}; refusing to unpack it", path=wheel
            )


def _bump_metadata(data: bytes, old: str, new: str, where: Path) -> bytes:
    text = data.decode("utf-8")
    head, sep, body = text.partition("\n\n")
    head, n = re.subn(rf"^Version: {re.escape(old)}$", f"Version: {new}", head, count=1, flags=re.M)
    if n != 1:
        raise InputError(
            f"{where.name}: METADATA has no 'Version: {old}' line; is this the pinned wheel?", path=where
        )
    return (head + sep + body).encode("utf-8")


def _clone_info(info: zipfile.ZipInfo, name: str) -> zipfile.ZipInfo:
    zi = zipfile.ZipInfo(name, date_time=info.date_time)
    zi.external_attr = info.external_attr
    zi.create_system = info.create_system
    zi.compress_type = zipfile.ZIP_STORED if info.is_dir() else zipfile.ZIP_DEFLATED
    return zi


def _repack(src: Path, tree: Path, dest: Path, old_ver: str, new_ver: str, changed: list[str]) -> None:
    """Rewrite `src` into `dest` with file contents from `tree` and the dist-info renamed to `new_ver`.

    Entry order, timestamps and permissions are kept, so the same input and patch give the same bytes.
    """
    dist = split_wheel_name(src.name)[0]
    old_di, new_di = f"{dist}-{old_ver}.dist-info", f"{dist}-{new_ver}.dist-info"
    rows: list[tuple[str, str, str]] = []
    record_info: zipfile.ZipInfo | None = None
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zout:
        names = set(zin.namelist())
        for info in zin.infolist():
            name = info.filename
            new_name = new_di + name[len(old_di) :] if name.split("/", 1)[0] == old_di else name
            if name == f"{old_di}/RECORD":
                record_info = info
                continue
            if name in (f"{old_di}/RECORD.jws", f"{old_di}/RECORD.p7s"):
                continue  # a signature over the old RECORD would be false for the new one
            if info.is_dir():
                zout.writestr(_clone_info(info, new_name), b"")
                continue
            data = (tree / name).read_bytes()
            if name == f"{old_di}/METADATA":
                data = _bump_metadata(data, old_ver, new_ver, src)
            zout.writestr(_clone_info(info, new_name), data)
            rows.append(record_row(new_name, data))
        if record_info is None:
            raise InputError(f"{src.name} has no {old_di}/RECORD; not a valid wheel", path=src)
        for rel in changed:  # files the patch created (none for pr29654.patch, but keep RECORD honest)
            if rel not in names:
                data = (tree / rel).read_bytes()
                zi = zipfile.ZipInfo(rel, date_time=record_info.date_time)
                zi.external_attr = 0o100644 << 16
                zi.compress_type = zipfile.ZIP_DEFLATED
                zout.writestr(zi, data)
                rows.append(record_row(rel, data))
        record = f"{new_di}/RECORD"
        zout.writestr(_clone_info(record_info, record), record_bytes(rows, record))


def _exists(path: Path) -> ExistsError:
    return ExistsError(
        f"{path} already exists and is never overwritten; choose another out dir "
        "(or remove the old build yourself)",
        path=path,
    )


def _refuse_existing(out_dir: Path, names: list[str]) -> None:
    for name in names:
        if (out_dir / name).exists():
            raise _exists(out_dir / name)


def _publish(out_dir: Path, items: list[tuple[Path, str]]) -> None:
    """Move finished files into out_dir without ever replacing one; undo everything on failure."""
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    placed: list[Path] = []
    try:
        for src, name in items:
            final = out_dir / name
            part = out_dir / f".{name}.{os.getpid()}.part"
            shutil.copyfile(src, part)
            try:
                os.link(part, final)  # fails if `final` exists: no check-then-write race
            except FileExistsError:
                raise _exists(final) from None
            except OSError:  # file system without hard links
                if final.exists():
                    raise _exists(final) from None
                os.replace(part, final)
            finally:
                part.unlink(missing_ok=True)
            placed.append(final)
    except BaseException:
        for p in placed:
            p.unlink(missing_ok=True)
        if created and not any(out_dir.iterdir()):
            out_dir.rmdir()
        raise


def _header(text: str) -> str | None:
    """The patch's first comment line: what it is (a mutant's says which mistake it models)."""
    first = text.split("\n", 1)[0]
    if not first.startswith("#"):
        return None
    return first.lstrip("# ").strip() or None


def build_patched_wheel(
    version: str = BASELINE,
    out_dir: Path | str | None = None,
    cache_dir: Path | str | None = None,
    *,
    patch_text: str | None = None,
    patch: Path | str | None = None,
) -> dict:
    """Fetch the pinned sglang wheel, apply pr29654.patch (or `patch`), repack as `<version>+<label>`.

    Writes `<out_dir>/sglang-<version>+<label>-<tags>.whl` and `<out_dir>/manifest.json` and returns the
    manifest. The label is `pr29654` for the kit's patch, else local_label(patch's file name). Default
    out_dir: `<repo>/build/sglang-<version>+<label>`. `patch_text` overrides the shipped patch's text (tests
    use it to feed a corrupted copy).
    """
    patch_path = Path(patch) if patch is not None else PR_PATCH
    if not patch_path.is_file():
        raise InputError(f"patch {patch_path} not found", path=patch_path)
    is_pr = patch_path.resolve() == PR_PATCH.resolve()
    label = LOCAL_LABEL if is_pr else local_label(patch_path.name)
    in_name, _ = pinned(version)
    dist, ver, tags = split_wheel_name(in_name)
    new_ver = f"{ver}+{label}"
    out_name = f"{dist}-{new_ver}-{tags}.whl"
    out = check_folder(Path(out_dir) if out_dir is not None else BUILD / f"{dist}-{new_ver}", "the build")
    _refuse_existing(out, [out_name, MANIFEST])
    text = patch_text if patch_text is not None else patch_path.read_text(encoding="utf-8")
    wheel = fetch_wheel(version, Path(cache_dir) if cache_dir is not None else None)
    with tempfile.TemporaryDirectory(prefix="kit-build-") as tmp:
        tree = Path(tmp) / "tree"
        with zipfile.ZipFile(wheel) as zf:
            _safe_members(zf, wheel)
            zf.extractall(tree)
        changed = apply_patch(tree, text)
        built = Path(tmp) / out_name
        _repack(wheel, tree, built, ver, new_ver, changed)
        check_wheel(built)
        manifest = {
            "kit_version": kit.__version__,
            "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "sglang_version": ver,
            "local_version": new_ver,
            "input_wheel": in_name,
            "input_sha256": sha256_file(wheel),
            "output_wheel": out_name,
            "output_sha256": sha256_file(built),
            "output_path": str((out / out_name).resolve()),
            "patch": patch_path.name if patch_text is None else "<patch_text argument>",
            "patch_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
            "patch_header": _header(text),
            "files_changed": changed,
            "upstream": f"{PR_REF} (commit {PR_COMMIT})" if is_pr else f"a variant of {PR_REF}",
        }
        mpath = Path(tmp) / MANIFEST
        mpath.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        _publish(out, [(built, out_name), (mpath, MANIFEST)])  # manifest last: it marks completion
    return manifest
