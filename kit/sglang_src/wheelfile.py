"""The wheel format as the kit rewrites it (build: re-versioned sglang; stage: trimmed wheels): the filename,
RECORD rows and their hashes per the wheel spec, and a check of a wheel against its own RECORD."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile
import zlib
from pathlib import Path

from kit.errors import InputError


def split_wheel_name(filename: str) -> tuple[str, str, str]:
    """(distribution, version, tags) of a wheel filename; tags keep any build tag."""
    stem = filename[:-4] if filename.endswith(".whl") else filename
    parts = stem.split("-")
    if len(parts) not in (5, 6):
        raise InputError(
            f"{filename} is not a wheel filename (name-version[-build]-py-abi-platform.whl)", path=filename
        )
    return parts[0], parts[1], "-".join(parts[2:])


def dist_info(filename: str) -> str:
    """The .dist-info dir a wheel's filename implies: 'sglang-0.5.14.dist-info'."""
    dist, ver, _ = split_wheel_name(filename)
    return f"{dist}-{ver}.dist-info"


def record_hash(data: bytes) -> str:
    """RECORD hash field per the wheel spec: urlsafe base64 sha256 without padding."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
    return f"sha256={digest}"


def record_row(name: str, data: bytes) -> tuple[str, str, str]:
    return name, record_hash(data), str(len(data))


def record_bytes(rows: list[tuple[str, str, str]], record: str) -> bytes:
    """The RECORD file: `rows`, then RECORD's own row (no hash, no size)."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([*rows, (record, "", "")])
    return buf.getvalue().encode("utf-8")


def check_wheel(path: Path) -> dict:
    """Validate a wheel against its own RECORD (hash + size of every file); return name/version/count."""
    name = Path(path).name
    dist, ver, _ = split_wheel_name(name)
    di = dist_info(name)
    try:
        with zipfile.ZipFile(path) as zf:
            record = zf.read(f"{di}/RECORD").decode("utf-8")
            files = {i.filename for i in zf.infolist() if not i.is_dir()}
            listed: set[str] = set()
            for row in csv.reader(io.StringIO(record)):
                if not row:
                    continue
                member, digest, size = row
                listed.add(member)
                if member == f"{di}/RECORD":
                    continue
                if record_row(member, zf.read(member)) != (member, digest, size):
                    raise InputError(f"{name}: RECORD hash/size wrong for {member}", path=path)
            meta = zf.read(f"{di}/METADATA").decode("utf-8").partition("\n\n")[0]
    except (zipfile.BadZipFile, zlib.error, EOFError, KeyError, ValueError) as e:
        raise InputError(f"{path}: not a valid wheel ({e})", path=path) from None
    if files != listed:
        extra = sorted(files ^ listed)[:3]
        raise InputError(f"{name}: RECORD and archive disagree on {extra}", path=path)
    if f"\nVersion: {ver}\n" not in f"\n{meta}\n":
        raise InputError(f"{name}: METADATA version is not {ver}", path=path)
    return {"name": dist, "version": ver, "files": len(files)}
