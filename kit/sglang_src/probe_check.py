"""Resolve every probe target in an sglang wheel, tree or install by reading source (never importing it).

The probe refuses to run when a target is missing, and this is how it knows: sglang cannot be imported
without a GPU stack, and a renamed method must be found before a multi-hour run, not after. For a
missing target the whole tree is searched for where the class or method went, so an sglang upgrade
says what moved instead of only "not found".
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from kit.errors import KitError
from kit.probe.targets import TARGETS, Target
from kit.sglang_src.releases import probed_releases

_MAX_CANDIDATES = 8

# Look-alikes known to be off the path of DSA + EAGLE on CUDA (still listed, but not as warnings).
OFF_PATH = {
    "MultiLayerEagleDraftWorker": "multi-layer EAGLE (MiMoV2/Step3p5 or --enable-multi-layer-eagle, which "
    "the "
    "launcher refuses)",
    "MultiLayerEagleDraftExtendCudaGraphRunner": "multi-layer EAGLE only",
    "EAGLEDraftNpuGraphRunner": "Ascend NPU only",
    "FrozenKVMTPCudaGraphRunner": "the FROZEN_KV_MTP algorithm, not EAGLE",
}


class SglangSource:
    """Read-only view of one sglang package: files addressed as 'sglang/srt/...py'."""

    def __init__(self, path: Path):
        self.label = str(path)
        self._zip: zipfile.ZipFile | None = None
        self._root: Path | None = None  # directory that contains the sglang package
        if path.is_file():
            try:
                self._zip = zipfile.ZipFile(path)
            except (zipfile.BadZipFile, OSError) as e:
                raise KitError(f"{path}: not a readable wheel/zip ({e})") from None
            if not any(n.startswith("sglang/") for n in self._zip.namelist()):
                self._zip.close()
                raise KitError(f"{path}: no sglang/ package inside the archive")
            return
        if path.name == "sglang" and (path / "srt").is_dir():
            self._root = path.parent  # the package dir itself (an install, or tree/sglang)
            return
        for root in (path, path / "python"):  # an unpacked wheel, or a git checkout
            if (root / "sglang" / "srt").is_dir():
                self._root = root
                return
        raise KitError(
            f"{path}: no sglang package here (expected a .whl, a dir holding sglang/ or python/sglang/, "
            "or the sglang package dir itself)"
        )

    def read(self, rel: str) -> str | None:
        if self._zip is not None:
            try:
                return self._zip.read(rel).decode("utf-8", errors="replace")
            except KeyError:
                return None
        p = self._root / rel
        return p.read_text(encoding="utf-8", errors="replace") if p.is_file() else None

    def files(self) -> Iterator[str]:
        if self._zip is not None:
            yield from (n for n in self._zip.namelist() if n.startswith("sglang/") and n.endswith(".py"))
            return
        for dirpath, dirs, names in os.walk(self._root / "sglang"):
            dirs.sort()
            rel_dir = Path(dirpath).relative_to(self._root).as_posix()
            yield from (f"{rel_dir}/{n}" for n in sorted(names) if n.endswith(".py"))

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()


def _scoped(body: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements of a module/class body, looking through if/try blocks (conditional definitions)."""
    for node in body:
        if isinstance(node, ast.If):
            yield from _scoped(node.body)
            yield from _scoped(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _scoped(block)
        else:
            yield node


def _classes(tree: ast.Module, name: str) -> list[ast.ClassDef]:
    return [n for n in _scoped(tree.body) if isinstance(n, ast.ClassDef) and n.name == name]


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    for n in _scoped(cls.body):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name:
            return n
    return None


def _parse(src: SglangSource, rel: str, cache: dict[str, ast.Module | None]) -> ast.Module | None:
    if rel not in cache:
        text = src.read(rel)
        try:
            cache[rel] = ast.parse(text) if text is not None else None
        except SyntaxError:
            cache[rel] = None
    return cache[rel]


def resolve(src: SglangSource, target: Target, cache: dict[str, ast.Module | None] | None = None) -> dict:
    """{status: found|missing, file, line[, reason, moved_to]} for one target (its own module only)."""
    cache = {} if cache is None else cache
    tree = _parse(src, target.relpath, cache)
    if tree is None:
        reason = (
            f"module file {target.relpath} is missing"
            if src.read(target.relpath) is None
            else (f"{target.relpath} does not parse")
        )
        return _missing(src, target, None, reason, cache)
    classes = _classes(tree, target.cls)
    if not classes:
        return _missing(
            src, target, target.relpath, f"class {target.cls} is not defined in {target.relpath}", cache
        )
    for cls in classes:
        fn = _method(cls, target.method)
        if fn is not None:
            return {"status": "found", "file": target.relpath, "line": fn.lineno}
    return _missing(
        src,
        target,
        target.relpath,
        f"{target.qualname} is not defined in the body of class {target.cls} "
        f"({target.relpath}:{classes[0].lineno})",
        cache,
    )


def _missing(src: SglangSource, target: Target, file: str | None, reason: str, cache: dict) -> dict:
    moved = find_elsewhere(src, target, cache)
    exact = [m for m in moved if not m["match"].startswith("similar")]
    where = "; ".join(f"{m['qualname']} at {m['file']}:{m['line']} ({m['match']})" for m in moved)
    if exact:
        note = f"{reason}; moved? candidates: {where}"
    else:
        note = f"{reason}; nothing named {target.method} in any class of the tree: removed, not moved" + (
            f" (similar names, probably unrelated: {where})" if moved else ""
        )
    return {"status": "missing", "file": file, "line": None, "reason": note, "moved_to": moved}


def _base_names(cls: ast.ClassDef) -> set[str]:
    return {
        b.id if isinstance(b, ast.Name) else b.attr
        for b in cls.bases
        if isinstance(b, (ast.Name, ast.Attribute))
    }


def find_elsewhere(src: SglangSource, target: Target, cache: dict | None = None) -> list[dict]:
    """Where a missing class / method went: exact names first, then similar method names."""
    cache = {} if cache is None else cache
    cls_re = re.compile(rf"^\s*class\s+{re.escape(target.cls)}\b", re.M)
    meth_re = re.compile(rf"def\s+\w*{re.escape(target.method.strip('_'))}\w*\s*\(")
    exact: list[dict] = []
    similar: list[dict] = []
    for rel in src.files():
        text = src.read(rel) or ""
        if not (cls_re.search(text) or meth_re.search(text)):
            continue
        tree = _parse(src, rel, cache)
        for node in ast.walk(tree) if tree is not None else ():
            if not isinstance(node, ast.ClassDef):
                continue
            same_cls = node.name == target.cls
            if same_cls:
                fn = _method(node, target.method)
                if fn is not None:
                    exact.append(_cand(rel, fn.lineno, f"{node.name}.{fn.name}", "same class and method"))
                    continue
                if rel != target.relpath:
                    exact.append(_cand(rel, node.lineno, node.name, "same class, method absent"))
            for fn in _scoped(node.body):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                qual = f"{node.name}.{fn.name}"
                if fn.name == target.method:
                    exact.append(_cand(rel, fn.lineno, qual, "same method name, other class"))
                elif target.method.strip("_") in fn.name:
                    where = "same class" if same_cls else "other class"
                    similar.append(_cand(rel, fn.lineno, qual, f"similar method name, {where}"))
    return (exact + similar)[:_MAX_CANDIDATES]


def lookalikes(
    src: SglangSource, targets: Iterable[Target], cache: dict | None = None
) -> dict[str, list[dict]]:
    """Per target key: classes the probe does NOT wrap that define the same method and look like the
    target class (a name containing it, like IndexerKPool next to Indexer, or a direct subclass that
    overrides it). Calls through them would be missed silently, so they are reported. One pass over
    the tree for all targets."""
    cache = {} if cache is None else cache
    targets = list(targets)
    probed = {(t.relpath, t.cls, t.method) for t in TARGETS}
    out: dict[str, list[dict]] = {t.key: [] for t in targets}
    for rel in src.files():
        text = src.read(rel) or ""
        hits = [t for t in targets if t.cls in text and f"def {t.method}(" in text]
        if not hits:
            continue
        tree = _parse(src, rel, cache)
        for node in ast.walk(tree) if tree is not None else ():
            if not isinstance(node, ast.ClassDef):
                continue
            for t in hits:
                if (rel, node.name, t.method) in probed:
                    continue
                if t.cls not in node.name and t.cls not in _base_names(node):
                    continue
                fn = _method(node, t.method)
                if fn is not None and len(out[t.key]) < _MAX_CANDIDATES:
                    cand = _cand(rel, fn.lineno, f"{node.name}.{fn.name}", "not probed")
                    if node.name in OFF_PATH:
                        cand["off_path"] = OFF_PATH[node.name]
                    out[t.key].append(cand)
    return out


def _cand(file: str, line: int, qualname: str, match: str) -> dict:
    return {"file": file, "line": line, "qualname": qualname, "match": match}


def probe_check(path: Path | str, targets: Iterable[Target] = TARGETS, scan_tree: bool = True) -> dict:
    """{target key: {status, file, line, ...}} for a .whl, an unpacked tree / checkout, or an install.

    scan_tree: also search the whole tree for unprobed look-alikes of found targets (a few seconds on a
    large tree); the in-process start-up check skips it.
    """
    path = Path(path)
    if not path.exists():
        raise KitError(f"{path}: no such file or directory")
    src = SglangSource(path)
    try:
        cache: dict[str, ast.Module | None] = {}
        targets = list(targets)
        report = {t.key: resolve(src, t, cache) for t in targets}
        if scan_tree:
            found = [t for t in targets if report[t.key]["status"] == "found"]
            for key, extra in lookalikes(src, found, cache).items():
                if extra:
                    report[key]["unprobed_lookalikes"] = extra
        return report
    finally:
        src.close()


def warnings(report: dict) -> list[str]:
    """One line per unprobed look-alike (the probe still runs; these calls would not be counted)."""
    return [
        f"{k}: {c['qualname']} ({c['file']}:{c['line']}) also defines {k.rsplit('.', 1)[-1]} "
        "and is not probed"
        for k, v in report.items()
        for c in v.get("unprobed_lookalikes", ())
        if "off_path" not in c
    ]


def missing(report: dict) -> list[str]:
    return [k for k, v in report.items() if v.get("status") != "found"]


def refusal(report: dict, where: str) -> str | None:
    """One message naming every missing target (None when all are found)."""
    gone = missing(report)
    if not gone:
        return None
    details = "; ".join(f"{k}: {report[k].get('reason', 'missing')}" for k in gone)
    return (
        f"kit probe: {len(gone)} probe target(s) missing in the sglang at {where}, refusing to run "
        f"(supported: {', '.join(probed_releases())}): {details}"
    )


_FIND_SPEC_SNIPPET = (
    "import importlib.util, json; s = importlib.util.find_spec('sglang'); "
    "print(json.dumps(list(s.submodule_search_locations or []) if s else None))"
)


def installed_sglang_dir(python: str | None = None) -> Path:
    """The installed sglang package dir, located with find_spec (sglang itself is never imported).

    `python`: another interpreter (the sglang env); asked in a subprocess that only runs find_spec.
    """
    if python is None or Path(python).resolve() == Path(sys.executable).resolve():
        spec = importlib.util.find_spec("sglang")
        locations = list(spec.submodule_search_locations or []) if spec else None
    else:
        try:
            out = subprocess.run(
                [python, "-c", _FIND_SPEC_SNIPPET], capture_output=True, text=True, timeout=60
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise KitError(f"cannot run {python} to locate sglang: {e}") from None
        if out.returncode != 0:
            raise KitError(f"{python} failed to locate sglang: {(out.stderr or out.stdout).strip()[-300:]}")
        locations = json.loads(out.stdout.strip().splitlines()[-1])
    if not locations:
        who = python or sys.executable
        raise KitError(f"sglang is not installed for {who}: install sglang 0.5.14 (see docs/gpu-node.md)")
    return Path(locations[0])
