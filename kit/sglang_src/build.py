"""Build the kit's "fix" arm: sglang 0.5.14 + the kit's own PR #29654 patch, repacked as a valid wheel.

Two jobs, both all-or-nothing so a failure never leaves a half-patched tree or a half-written out dir:
- `apply_patch`: a small pure-Python unified-diff applier (exact context, hunk offsets allowed; no
  dependency on the `patch` binary, which is missing on many GPU images).
- `build_patched_wheel`: fetch the pinned wheel, patch it, give it the local version `+pr29654`
  (METADATA, dist-info dir, RECORD hashes per the wheel spec), write it and a manifest into out_dir.
"""

from __future__ import annotations

import base64
import csv
import datetime as _dt
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import kit
from kit.errors import KitError
from kit.paths import BUILD, PR_PATCH
from kit.sglang_src.wheels import fetch_wheel, pinned, sha256_file

PATCH_PATH = PR_PATCH
LOCAL_LABEL = "pr29654"
MANIFEST = "manifest.json"

# ---------------------------------------------------------------------------------------------------
# Unified diff: parse


@dataclass
class Hunk:
    number: int  # 1-based, per file, as a human counts them in the patch
    header: str
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: list[tuple[str, str]] = field(default_factory=list)  # (" " | "-" | "+", text)
    old_no_eol: bool = False  # "\ No newline at end of file" after the last old-side line
    new_no_eol: bool = False

    @property
    def old_lines(self) -> list[str]:
        return [t for op, t in self.lines if op != "+"]

    @property
    def new_lines(self) -> list[str]:
        return [t for op, t in self.lines if op != "-"]


@dataclass
class FilePatch:
    old_path: str | None  # None: /dev/null (file creation)
    new_path: str | None  # None: /dev/null (deletion, not supported)
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or "?"


_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def _patch_path(raw: str) -> str | None:
    name = raw.split("\t", 1)[0].strip()
    if name == "/dev/null":
        return None
    parts = PurePosixPath(name).parts
    if parts and parts[0] in ("a", "b") and len(parts) > 1:
        parts = parts[1:]
    if not parts or PurePosixPath(name).is_absolute() or ".." in parts:
        raise KitError(
            f"patch names an unsafe path {name!r}; only relative paths inside the tree are allowed"
        )
    return "/".join(parts)


def parse_patch(text: str) -> list[FilePatch]:
    """Parse a unified diff; text outside file sections (e.g. a '#' header) is ignored."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        if not (lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")):
            i += 1
            continue
        fp = FilePatch(_patch_path(lines[i][4:]), _patch_path(lines[i + 1][4:]))
        i += 2
        while i < len(lines) and lines[i].startswith("@@ "):
            hunk, i = _parse_hunk(lines, i, fp, len(fp.hunks) + 1)
            fp.hunks.append(hunk)
        if not fp.hunks:
            raise KitError(f"malformed patch: {fp.path} has a file header but no hunks")
        files.append(fp)
    if not files:
        raise KitError("malformed patch: no '--- a/<file>' / '+++ b/<file>' sections found")
    return files


def _parse_hunk(lines: list[str], i: int, fp: FilePatch, number: int) -> tuple[Hunk, int]:
    m = _HUNK_RE.match(lines[i])
    if not m:
        raise KitError(f"malformed patch: {fp.path} hunk #{number}: bad header {lines[i]!r}")
    old_start, new_start = int(m.group(1)), int(m.group(3))
    old_len = int(m.group(2)) if m.group(2) is not None else 1
    new_len = int(m.group(4)) if m.group(4) is not None else 1
    hunk = Hunk(number, m.group(0), old_start, old_len, new_start, new_len)
    i += 1
    old_left, new_left = old_len, new_len
    last_op = ""
    while old_left > 0 or new_left > 0 or (i < len(lines) and lines[i].startswith("\\")):
        if i >= len(lines):
            raise KitError(f"malformed patch: {fp.path} hunk #{number} ends early ({hunk.header})")
        line = lines[i]
        i += 1
        if line.startswith("\\"):  # "\ No newline at end of file" applies to the previous line
            if last_op in (" ", "-"):
                hunk.old_no_eol = True
            if last_op in (" ", "+"):
                hunk.new_no_eol = True
            continue
        op, text = (line[:1], line[1:]) if line else (" ", "")  # tolerate stripped blank context
        if op == " " and old_left > 0 and new_left > 0:
            old_left, new_left = old_left - 1, new_left - 1
        elif op == "-" and old_left > 0:
            old_left -= 1
        elif op == "+" and new_left > 0:
            new_left -= 1
        else:
            raise KitError(
                f"malformed patch: {fp.path} hunk #{number} ({hunk.header}): unexpected line {line[:80]!r}"
            )
        hunk.lines.append((op, text))
        last_op = op
    return hunk, i


# ---------------------------------------------------------------------------------------------------
# Unified diff: apply


def _split(content: str) -> tuple[list[str], bool]:
    """Lines without terminators (only \\n splits: form feeds in sources are not line breaks)."""
    lines = content.split("\n")
    ends_nl = content.endswith("\n")
    if ends_nl or content == "":
        lines.pop()
    return lines, ends_nl


def _find(lines: list[str], old: list[str], want: int, lo: int) -> int | None:
    """Position nearest to `want` (not before `lo`) where `old` matches exactly."""
    hi = len(lines) - len(old)
    if hi < lo:
        return None
    want = min(max(want, lo), hi)
    for delta in range(0, max(want - lo, hi - want) + 1):
        for pos in (want - delta, want + delta) if delta else (want,):
            if lo <= pos <= hi and lines[pos : pos + len(old)] == old:
                return pos
    return None


def _short(s: str) -> str:
    return repr(s if len(s) <= 90 else s[:87] + "...")


def _mismatch(path: str, hunk: Hunk, lines: list[str], want: int) -> KitError:
    old, new = hunk.old_lines, hunk.new_lines
    if new and _find(lines, new, want, 0) is not None:
        return KitError(
            f"patch does not apply: {path} hunk #{hunk.number} ({hunk.header}) appears to be applied "
            "already; start from an unpatched tree"
        )
    want = max(0, min(want, len(lines)))
    for k, expected in enumerate(old):
        found = lines[want + k] if want + k < len(lines) else None
        if found != expected:
            got = "end of file" if found is None else _short(found)
            return KitError(
                f"patch does not apply: {path} hunk #{hunk.number} ({hunk.header}): context not found; "
                f"first mismatching line {want + k + 1}: expected {_short(expected)}, found {got}"
            )
    return KitError(f"patch does not apply: {path} hunk #{hunk.number} ({hunk.header}): context not found")


def _apply_file(path: str, content: str, fp: FilePatch) -> str:
    lines, ends_nl = _split(content)
    out: list[str] = []
    pos_src, offset = 0, 0
    for hunk in fp.hunks:
        old = hunk.old_lines
        # An empty old side (pure insertion) names the line *after which* to insert.
        want = (hunk.old_start if hunk.old_len == 0 else hunk.old_start - 1) + offset
        pos = _find(lines, old, want, pos_src)
        if pos is not None and hunk.old_no_eol and (pos + len(old) != len(lines) or ends_nl):
            pos = None
        if pos is None:
            raise _mismatch(path, hunk, lines, want)
        out.extend(lines[pos_src:pos])
        out.extend(hunk.new_lines)
        pos_src = pos + len(old)
        offset = pos - (hunk.old_start if hunk.old_len == 0 else hunk.old_start - 1)
        if pos_src == len(lines) and hunk.old_no_eol != hunk.new_no_eol:
            ends_nl = not hunk.new_no_eol
    out.extend(lines[pos_src:])
    if not out:
        return ""
    return "\n".join(out) + ("\n" if ends_nl else "")


def _locate(tree: Path, rel: str) -> tuple[Path, str]:
    """The file for a patch path: wheel layout (sglang/...) or a git checkout (python/sglang/...)."""
    for prefix in ("", "python/"):
        if (tree / prefix / rel).is_file():
            return tree / prefix / rel, prefix + rel
    if (tree / "python" / rel.split("/", 1)[0]).is_dir() and not (tree / rel.split("/", 1)[0]).is_dir():
        return tree / "python" / rel, "python/" + rel
    return tree / rel, rel


def apply_patch(tree: Path, patch_text: str) -> list[str]:
    """Apply a unified diff to `tree`; returns the changed files (posix paths relative to `tree`).

    All hunks of all files are checked against the tree first; nothing is written unless every hunk
    applies. A failure raises KitError naming the file, the hunk and the first mismatching line.
    """
    tree = Path(tree)
    if not tree.is_dir():
        raise KitError(f"cannot patch {tree}: not a directory")
    pending: dict[str, tuple[Path, str]] = {}
    for fp in parse_patch(patch_text):
        if fp.new_path is None:
            raise KitError(f"patch deletes {fp.old_path}; the kit's patcher does not delete files")
        target, rel = _locate(tree, fp.new_path)
        if rel in pending:
            content = pending[rel][1]
        elif fp.old_path is None:
            if target.exists():
                raise KitError(f"patch creates {rel}, but it already exists in {tree}")
            content = ""
        elif target.is_file():
            try:
                content = target.read_bytes().decode("utf-8")
            except UnicodeDecodeError:
                raise KitError(f"cannot patch {rel}: not UTF-8 text") from None
        else:
            raise KitError(f"patch does not apply: {fp.path} is missing from {tree}")
        pending[rel] = (target, _apply_file(rel, content, fp))
    for target, content in pending.values():
        _write_atomic(target, content.encode("utf-8"))
    return list(pending)


def _write_atomic(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    mode = target.stat().st_mode & 0o7777 if target.exists() else 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------------------------------------------
# Wheel: unpack, re-version, repack


def split_wheel_name(filename: str) -> tuple[str, str, str]:
    """(distribution, version, tags) of a wheel filename; tags keep any build tag."""
    stem = filename[:-4] if filename.endswith(".whl") else filename
    parts = stem.split("-")
    if len(parts) not in (5, 6):
        raise KitError(f"{filename} is not a wheel filename (name-version[-build]-py-abi-platform.whl)")
    return parts[0], parts[1], "-".join(parts[2:])


def record_hash(data: bytes) -> str:
    """RECORD hash field per the wheel spec: urlsafe base64 sha256 without padding."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
    return f"sha256={digest}"


def _safe_members(zf: zipfile.ZipFile, wheel: Path) -> None:
    for name in zf.namelist():
        p = PurePosixPath(name)
        if p.is_absolute() or ".." in p.parts:
            raise KitError(f"{wheel.name} contains an unsafe member {name!r}; refusing to unpack it")


def _bump_metadata(data: bytes, old: str, new: str, where: str) -> bytes:
    text = data.decode("utf-8")
    head, sep, body = text.partition("\n\n")
    head, n = re.subn(rf"^Version: {re.escape(old)}$", f"Version: {new}", head, count=1, flags=re.M)
    if n != 1:
        raise KitError(f"{where}: METADATA has no 'Version: {old}' line; is this the pinned wheel?")
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
                data = _bump_metadata(data, old_ver, new_ver, src.name)
            zout.writestr(_clone_info(info, new_name), data)
            rows.append((new_name, record_hash(data), str(len(data))))
        if record_info is None:
            raise KitError(f"{src.name} has no {old_di}/RECORD; not a valid wheel")
        for rel in changed:  # files the patch created (none for pr29654.patch, but keep RECORD honest)
            if rel not in names:
                data = (tree / rel).read_bytes()
                zi = zipfile.ZipInfo(rel, date_time=record_info.date_time)
                zi.external_attr = 0o100644 << 16
                zi.compress_type = zipfile.ZIP_DEFLATED
                zout.writestr(zi, data)
                rows.append((rel, record_hash(data), str(len(data))))
        rows.append((f"{new_di}/RECORD", "", ""))
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        zout.writestr(_clone_info(record_info, f"{new_di}/RECORD"), buf.getvalue().encode("utf-8"))


def check_wheel(path: Path) -> dict:
    """Validate a wheel against its own RECORD (hash + size of every file); return name/version/count."""
    dist, ver, _ = split_wheel_name(Path(path).name)
    di = f"{dist}-{ver}.dist-info"
    try:
        with zipfile.ZipFile(path) as zf:
            record = zf.read(f"{di}/RECORD").decode("utf-8")
            files = {i.filename for i in zf.infolist() if not i.is_dir()}
            listed: set[str] = set()
            for row in csv.reader(io.StringIO(record)):
                if not row:
                    continue
                name, digest, size = row
                listed.add(name)
                if name == f"{di}/RECORD":
                    continue
                data = zf.read(name)
                if record_hash(data) != digest or str(len(data)) != size:
                    raise KitError(f"{Path(path).name}: RECORD hash/size wrong for {name}")
            meta = zf.read(f"{di}/METADATA").decode("utf-8").partition("\n\n")[0]
    except (zipfile.BadZipFile, KeyError, ValueError) as e:
        raise KitError(f"{path}: not a valid wheel ({e})") from None
    if files != listed:
        extra = sorted(files ^ listed)[:3]
        raise KitError(f"{Path(path).name}: RECORD and archive disagree on {extra}")
    if f"\nVersion: {ver}\n" not in f"\n{meta}\n":
        raise KitError(f"{Path(path).name}: METADATA version is not {ver}")
    return {"name": dist, "version": ver, "files": len(files)}


# ---------------------------------------------------------------------------------------------------
# Build


def _refuse_existing(out_dir: Path, names: list[str]) -> None:
    for name in names:
        if (out_dir / name).exists():
            raise KitError(
                f"{out_dir / name} already exists and is never overwritten; "
                "choose another out dir (or remove the old build yourself)"
            )


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
                raise KitError(
                    f"{final} already exists and is never overwritten; choose another out dir"
                ) from None
            except OSError:  # file system without hard links
                if final.exists():
                    raise KitError(
                        f"{final} already exists and is never overwritten; choose another out dir"
                    ) from None
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


def build_patched_wheel(
    version: str = "0.5.14",
    out_dir: Path | str | None = None,
    cache_dir: Path | str | None = None,
    *,
    patch_text: str | None = None,
) -> dict:
    """Fetch the pinned sglang wheel, apply pr29654.patch, repack as `<version>+pr29654`.

    Writes `<out_dir>/sglang-<version>+pr29654-<tags>.whl` and `<out_dir>/manifest.json` and returns the
    manifest. Default out_dir: `<repo>/build/sglang-<version>+pr29654`. `patch_text` overrides the
    shipped patch (tests use it to feed a corrupted copy).
    """
    in_name, _ = pinned(version)
    dist, ver, tags = split_wheel_name(in_name)
    new_ver = f"{ver}+{LOCAL_LABEL}"
    out_name = f"{dist}-{new_ver}-{tags}.whl"
    out = Path(out_dir) if out_dir is not None else BUILD / f"{dist}-{new_ver}"
    _refuse_existing(out, [out_name, MANIFEST])
    text = patch_text if patch_text is not None else PATCH_PATH.read_text(encoding="utf-8")
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
            "patch": PATCH_PATH.name if patch_text is None else "<patch_text argument>",
            "patch_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
            "files_changed": changed,
            "upstream": "sgl-project/sglang PR #29654 (commit 45314a9fcb1b70a764f7d1f6c4238560fc524a25)",
        }
        mpath = Path(tmp) / MANIFEST
        mpath.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        _publish(out, [(built, out_name), (mpath, MANIFEST)])  # manifest last: it marks completion
    return manifest
