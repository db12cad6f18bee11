"""A small pure-Python unified-diff applier: all-or-nothing, exact context, hunk offsets allowed.

No dependency on the `patch` binary, which is missing on many GPU images. A hunk that does not apply raises
PatchError naming the file, the hunk and the first mismatching line; nothing is written unless every hunk
of every file applies. A damaged patch (bad header, unsafe path, no file sections) is an InputError.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from kit.errors import InputError, PatchError
from kit.sglang_src.source import layout_root


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
        raise InputError(
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
            raise InputError(f"malformed patch: {fp.path} has a file header but no hunks")
        files.append(fp)
    if not files:
        raise InputError("malformed patch: no '--- a/<file>' / '+++ b/<file>' sections found")
    return files


def _parse_hunk(lines: list[str], i: int, fp: FilePatch, number: int) -> tuple[Hunk, int]:
    m = _HUNK_RE.match(lines[i])
    if not m:
        raise InputError(f"malformed patch: {fp.path} hunk #{number}: bad header {lines[i]!r}")
    old_start, new_start = int(m.group(1)), int(m.group(3))
    old_len = int(m.group(2)) if m.group(2) is not None else 1
    new_len = int(m.group(4)) if m.group(4) is not None else 1
    hunk = Hunk(number, m.group(0), old_start, old_len, new_start, new_len)
    i += 1
    old_left, new_left = old_len, new_len
    last_op = ""
    while old_left > 0 or new_left > 0 or (i < len(lines) and lines[i].startswith("\\")):
        if i >= len(lines):
            raise InputError(f"malformed patch: {fp.path} hunk #{number} ends early ({hunk.header})")
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
            raise InputError(
                f"malformed patch: {fp.path} hunk #{number} ({hunk.header}): unexpected line {line[:80]!r}"
            )
        hunk.lines.append((op, text))
        last_op = op
    return hunk, i


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


def _mismatch(path: str, hunk: Hunk, lines: list[str], want: int) -> PatchError:
    old, new = hunk.old_lines, hunk.new_lines
    if new and _find(lines, new, want, 0) is not None:
        return PatchError(
            f"patch does not apply: {path} hunk #{hunk.number} ({hunk.header}) appears to be applied "
            "already; start from an unpatched tree",
            file=path,
            hunk=hunk.number,
        )
    want = max(0, min(want, len(lines)))
    for k, expected in enumerate(old):
        found = lines[want + k] if want + k < len(lines) else None
        if found != expected:
            got = "end of file" if found is None else _short(found)
            return PatchError(
                f"patch does not apply: {path} hunk #{hunk.number} ({hunk.header}): context not found; "
                f"first mismatching line {want + k + 1}: expected {_short(expected)}, found {got}",
                file=path,
                hunk=hunk.number,
            )
    return PatchError(
        f"patch does not apply: {path} hunk #{hunk.number} ({hunk.header}): context not found",
        file=path,
        hunk=hunk.number,
    )


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
    """The file for a patch path (wheel layout: `sglang/...`) in a tree of either layout (layout_root)."""
    root = layout_root(tree, rel.split("/", 1)[0]) or tree
    target = root / rel
    return target, target.relative_to(tree).as_posix()


def apply_patch(tree: Path, patch_text: str) -> list[str]:
    """Apply a unified diff to `tree`; returns the changed files (posix paths relative to `tree`).

    All hunks of all files are checked against the tree first; nothing is written unless every hunk
    applies. A hunk that does not apply raises PatchError naming the file, the hunk and the first
    mismatching line.
    """
    tree = Path(tree)
    if not tree.is_dir():
        raise InputError(f"cannot patch {tree}: not a directory", path=tree)
    pending: dict[str, tuple[Path, str]] = {}
    for fp in parse_patch(patch_text):
        if fp.new_path is None:
            raise PatchError(
                f"patch deletes {fp.old_path}; the kit's patcher does not delete files", file=fp.path
            )
        target, rel = _locate(tree, fp.new_path)
        if rel in pending:
            content = pending[rel][1]
        elif fp.old_path is None:
            if target.exists():
                raise PatchError(f"patch creates {rel}, but it already exists in {tree}", file=rel)
            content = ""
        elif target.is_file():
            try:
                content = target.read_bytes().decode("utf-8")
            except UnicodeDecodeError:
                raise PatchError(f"cannot patch {rel}: not UTF-8 text", file=rel) from None
        else:
            raise PatchError(f"patch does not apply: {fp.path} is missing from {tree}", file=fp.path)
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
