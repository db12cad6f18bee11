"""The wheel format as the kit rewrites it (build: re-versioned sglang; stage: trimmed wheels): the filename,
RECORD rows and their hashes per the wheel spec, a check of a wheel against its own RECORD, and the one
reader of a wheel's METADATA (its Version, its Requires-Dist: scripts and tests ask here)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile
import zlib
from email.message import Message
from email.parser import Parser
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


def _metadata(zf: zipfile.ZipFile, filename: str) -> Message:
    """METADATA of an open wheel: in the dist-info dir its filename implies, else the one it has (older
    wheels spell the name there as the project does, `PyYAML-6.0.dist-info`)."""
    member = f"{dist_info(filename)}/METADATA"
    if member not in zf.NameToInfo:
        found = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        member = found[0] if len(found) == 1 else member
    return Parser().parsestr(zf.read(member).decode("utf-8"), headersonly=True)


def wheel_metadata(path: Path | str) -> Message:
    """A wheel's METADATA headers (Name, Version, Requires-Dist, ...; `get_all` for repeated ones)."""
    try:
        with zipfile.ZipFile(path) as zf:
            return _metadata(zf, Path(path).name)
    except (zipfile.BadZipFile, zlib.error, EOFError, KeyError, ValueError, OSError) as e:
        raise InputError(f"{path}: not a wheel whose METADATA can be read ({e})", path=path) from None


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
            meta = _metadata(zf, name)
    except (zipfile.BadZipFile, zlib.error, EOFError, KeyError, ValueError) as e:
        raise InputError(f"{path}: not a valid wheel ({e})", path=path) from None
    if files != listed:
        extra = sorted(files ^ listed)[:3]
        raise InputError(f"{name}: RECORD and archive disagree on {extra}", path=path)
    if meta["Version"] != ver:
        raise InputError(f"{name}: METADATA version is not {ver}", path=path)
    return {"name": dist, "version": ver, "files": len(files)}
