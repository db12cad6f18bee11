"""Resolve every probe target in an sglang wheel, tree or install by reading source (never importing it).

The probe refuses to run when a target is missing, and this is how it knows: sglang cannot be imported
without a GPU stack, and a renamed method must be found before a multi-hour run, not after. For a
missing target the whole tree is searched for where the class or method went, so an sglang upgrade
says what moved instead of only "not found".

Which targets: the set the release registry names for the source's version (`choose`). A version the
registry does not know is refused with every set's report (what is missing, where it moved); a source
whose version cannot be read (a git checkout) gets the set all of whose targets it defines.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kit.probe.targets import TARGET_SETS, TARGETS, Target, target_set
from kit.sglang_src import releases
from kit.sglang_src.releases import probed_releases
from kit.sglang_src.source import SglangSource, package_rel, shown

_MAX_CANDIDATES = 8

# Look-alikes known to be off the path of DSA + EAGLE on CUDA (still listed, but not as warnings).
OFF_PATH = {
    "MultiLayerEagleDraftWorker": "multi-layer EAGLE (MiMoV2/Step3p5 or --enable-multi-layer-eagle, which "
    "the launcher refuses)",
    "MultiLayerEagleDraftExtendCudaGraphRunner": "multi-layer EAGLE only",
    "EAGLEDraftNpuGraphRunner": "Ascend NPU only",
    "FrozenKVMTPCudaGraphRunner": "the FROZEN_KV_MTP algorithm, not EAGLE",
    "UnoDecodeCudaGraphRunner": "the UNO speculative algorithm, not EAGLE",
    "QSAIndexer": "Qwen4-Exp's QSA attention, not DSA",
}


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


def resolve(src: SglangSource, target: Target) -> dict:
    """{status: found|missing, file, line[, reason, moved_to]} for one target (its own module only)."""
    rel = package_rel(target.relpath)
    tree = src.parse(rel)
    if tree is None:
        reason = (
            f"{target.relpath} does not parse"
            if src.syntax_error(rel)
            else f"module file {target.relpath} is missing"
        )
        return _missing(src, target, None, reason)
    classes = _classes(tree, target.cls)
    if not classes:
        return _missing(src, target, target.relpath, f"class {target.cls} is not defined in {target.relpath}")
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
    )


def _missing(src: SglangSource, target: Target, file: str | None, reason: str) -> dict:
    moved = find_elsewhere(src, target)
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


def find_elsewhere(src: SglangSource, target: Target) -> list[dict]:
    """Where a missing class / method went: exact names first, then similar method names."""
    cls_re = re.compile(rf"^\s*class\s+{re.escape(target.cls)}\b", re.M)
    meth_re = re.compile(rf"def\s+\w*{re.escape(target.method.strip('_'))}\w*\s*\(")
    exact: list[dict] = []
    similar: list[dict] = []
    for rel in src.files():
        text = src.read(rel) or ""
        if not (cls_re.search(text) or meth_re.search(text)):
            continue
        tree, file = src.parse(rel), shown(rel)
        for node in ast.walk(tree) if tree is not None else ():
            if not isinstance(node, ast.ClassDef):
                continue
            same_cls = node.name == target.cls
            if same_cls:
                fn = _method(node, target.method)
                if fn is not None:
                    exact.append(_cand(file, fn.lineno, f"{node.name}.{fn.name}", "same class and method"))
                    continue
                if file != target.relpath:
                    exact.append(_cand(file, node.lineno, node.name, "same class, method absent"))
            for fn in _scoped(node.body):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                qual = f"{node.name}.{fn.name}"
                if fn.name == target.method:
                    exact.append(_cand(file, fn.lineno, qual, "same method name, other class"))
                elif target.method.strip("_") in fn.name:
                    where = "same class" if same_cls else "other class"
                    similar.append(_cand(file, fn.lineno, qual, f"similar method name, {where}"))
    return (exact + similar)[:_MAX_CANDIDATES]


def lookalikes(
    src: SglangSource, targets: Iterable[Target], probed_set: Iterable[Target] = TARGETS
) -> dict[str, list[dict]]:
    """Per target key: classes the probe does NOT wrap (`probed_set`: what it does) that define the same
    method and look like the target class (a name containing it, like IndexerKPool next to Indexer, or a
    direct subclass that overrides it). Calls through them would be missed silently, so they are reported.
    One pass over the tree for all targets."""
    targets = list(targets)
    probed = {(t.relpath, t.cls, t.method) for t in probed_set}
    out: dict[str, list[dict]] = {t.key: [] for t in targets}
    for rel in src.files():
        text = src.read(rel) or ""
        hits = [t for t in targets if t.cls in text and f"def {t.method}(" in text]
        if not hits:
            continue
        tree, file = src.parse(rel), shown(rel)
        for node in ast.walk(tree) if tree is not None else ():
            if not isinstance(node, ast.ClassDef):
                continue
            for t in hits:
                if (file, node.name, t.method) in probed:
                    continue
                if t.cls not in node.name and t.cls not in _base_names(node):
                    continue
                fn = _method(node, t.method)
                if fn is not None and len(out[t.key]) < _MAX_CANDIDATES:
                    cand = _cand(file, fn.lineno, f"{node.name}.{fn.name}", "not probed")
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
    with SglangSource(path) as src:
        return _check(src, list(targets), scan_tree)


def _check(src: SglangSource, targets: list[Target], scan_tree: bool) -> dict:
    report = {t.key: resolve(src, t) for t in targets}
    if scan_tree:
        found = [t for t in targets if report[t.key]["status"] == "found"]
        for key, extra in lookalikes(src, found, targets).items():
            if extra:
                report[key]["unprobed_lookalikes"] = extra
    return report


@dataclass
class Choice:
    """Which target set a source gets, and why. `target_set` None: refused (an unknown release, or a
    version-less tree no set fits); `reports` then holds every set's report, else only the chosen one's."""

    version: str
    target_set: str | None
    chosen_by: str  # "registry" | "fit" | "unknown release" | "unprobed release" | "no set fits"
    reports: dict[str, dict] = field(default_factory=dict)

    @property
    def report(self) -> dict:
        """The chosen set's report, else the closest set's (fewest missing targets)."""
        return self.reports[self.target_set or closest(self.reports)]

    def describe(self) -> str:
        if self.target_set is None:
            return f"sglang {self.version}: {self.chosen_by}; no probe-target set applies"
        how = (
            "the release registry's"
            if self.chosen_by == "registry"
            else "the only set whose targets all exist there"
        )
        return f"sglang {self.version}: probe-target set {self.target_set} ({how})"

    def as_json(self) -> dict:
        """What `kit probe-check` prints when no set applies (a chosen set prints its flat report)."""
        best = closest(self.reports)
        return {
            "version": self.version,
            "target_set": None,
            "why": self.chosen_by,
            "probed_releases": probed_releases(),
            "closest_set": best,
            "missing": {k: missing(r) for k, r in self.reports.items()},
            "reports": self.reports,
        }


def closest(reports: dict[str, dict]) -> str:
    """The set with the fewest missing targets (ties: the one that finds more, since a set can be another's
    subset, as 0.5.17's is 0.5.14's less one entry; then the newer set, the last in TARGET_SETS)."""
    order = list(TARGET_SETS)

    def rank(k: str) -> tuple[int, int, int]:
        gone = len(missing(reports[k]))
        return gone, gone - len(reports[k]), -order.index(k)

    return min(reports, key=rank)


def _richest(fits: list[str]) -> list[str]:
    """The fitting sets no other fitting set contains: a tree that has every target of a larger set is
    probed by it (with forward_indexer present, the 0.5.14 set, not its 0.5.17 subset)."""
    keys = {k: {t.key for t in TARGET_SETS[k]} for k in fits}
    return [k for k in fits if not any(keys[k] < keys[j] for j in fits if j != k)]


def choose(path: Path | str, scan_tree: bool = True) -> Choice:
    """The probe-target set for a wheel, tree or install, with its report (see the module docstring)."""
    with SglangSource(path) as src:
        version, _ = src.version()
        key = releases.probe_set(version)
        if key is not None:
            return Choice(version, key, "registry", {key: _check(src, list(target_set(key)), scan_tree)})
        reports = {k: _check(src, list(ts), scan_tree) for k, ts in TARGET_SETS.items()}
        if version == "unknown":
            fits = _richest([k for k, r in reports.items() if not missing(r)])
            if len(fits) == 1:
                return Choice(version, fits[0], "fit", {fits[0]: reports[fits[0]]})
            why = "no set fits" if not fits else f"sets {', '.join(fits)} all fit"
            return Choice(version, None, f"version unknown and {why}", reports)
        if releases.lookup(version) is not None:
            why = "unprobed release (in the registry, its targets never checked)"
            return Choice(version, None, why, reports)
        return Choice(version, None, "unknown release (not in the kit's release registry)", reports)


def unknown_release(choice: Choice, where: str) -> str:
    """The refusal for a source no set applies to: what each set misses there and where it moved."""
    best = closest(choice.reports)
    lines = []
    for k in sorted(choice.reports, key=lambda k: k != best):
        gone = missing(choice.reports[k])
        what = "; ".join(f"{g}: {choice.reports[k][g].get('reason', 'missing')}" for g in gone) or "all found"
        lines.append(f"set {k}{' (closest)' if k == best else ''}: {len(gone)} missing: {what}")
    return (
        f"kit probe: sglang {choice.version} at {where}: {choice.chosen_by}; its probe targets have not been "
        f"checked against its code, refusing to run (probed releases: {', '.join(probed_releases())}). "
        + " | ".join(lines)
    )


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
