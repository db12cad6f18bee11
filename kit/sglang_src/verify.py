"""Tell whether an sglang wheel, tree or install has PR #29654's bug, its fix, or neither, by reading source.

Nothing here imports sglang (a GPU-only package): files are parsed with `ast`. The verdict follows
the data flow the PR is about, not version strings. In the NextN (MTP draft) model's forward we find
where `prev_topk_indices` comes from and where the new top-k is written:
- an attribute of the ForwardBatch itself -> "bug": each draft step runs on a shallow copy of the
  ForwardBatch, so the write-back is lost;
- an attribute of `forward_batch.spec_info`, directly or through a state object that stores there
  (0.5.23's IndexTopKShareState) -> "fix": spec_info is shared by reference between the copies;
- no reuse at all, or a reuse gate that nothing in sglang/srt ever switches on -> "absent";
- anything else -> "unknown", with reasons.
"""

from __future__ import annotations

import ast
import os
import re
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kit.errors import KitError

NEXTN = "srt/models/deepseek_nextn.py"
FEATURE_FLAG = "index_share_for_mtp_iteration"
_MAX_GATE_EVIDENCE = 3

# ---------------------------------------------------------------------------------------------------
# Sources: a wheel, an unpacked tree / git checkout, or an installed package, all read-only.


class _Source:
    """Files of one sglang package, addressed relative to the package dir (e.g. 'srt/models/x.py')."""

    label: str

    def read(self, rel: str) -> str | None:
        raise NotImplementedError

    def py_files(self, under: str) -> list[str]:
        raise NotImplementedError

    def metadata_versions(self) -> list[str]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _ZipSource(_Source):
    def __init__(self, path: Path):
        self.label = str(path)
        try:
            self.zf = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as e:
            raise KitError(f"{path}: not a readable zip/wheel ({e})") from None
        self.names = [n for n in self.zf.namelist() if n.startswith("sglang/")]
        if not self.names:
            self.zf.close()
            raise KitError(f"{path}: no sglang package inside (the archive has no sglang/ directory)")

    def read(self, rel: str) -> str | None:
        try:
            return self.zf.read(f"sglang/{rel}").decode("utf-8", errors="replace")
        except KeyError:
            return None

    def py_files(self, under: str) -> list[str]:
        pre = f"sglang/{under.rstrip('/')}/"
        return [n[len("sglang/") :] for n in self.names if n.startswith(pre) and n.endswith(".py")]

    def metadata_versions(self) -> list[str]:
        out = []
        for n in self.zf.namelist():
            if re.fullmatch(r"sglang-[^/]+\.dist-info/METADATA", n):
                out.append(self.zf.read(n).decode("utf-8", errors="replace"))
        return out

    def close(self) -> None:
        self.zf.close()


class _DirSource(_Source):
    def __init__(self, path: Path, pkg: Path):
        self.label = str(path)
        self.pkg = pkg

    def read(self, rel: str) -> str | None:
        p = self.pkg / rel
        try:
            return p.read_bytes().decode("utf-8", errors="replace") if p.is_file() else None
        except OSError as e:
            raise KitError(f"{self.label}: cannot read {p} ({e})") from None

    def py_files(self, under: str) -> list[str]:
        base = self.pkg / under
        out = []
        for dirpath, _dirs, files in os.walk(base):
            rel_dir = Path(dirpath).relative_to(self.pkg).as_posix()
            out.extend(f"{rel_dir}/{f}" for f in files if f.endswith(".py"))
        return sorted(out)

    def metadata_versions(self) -> list[str]:
        out = []
        for meta in sorted(self.pkg.parent.glob("sglang-*.dist-info/METADATA")):
            try:
                out.append(meta.read_text(encoding="utf-8", errors="replace"))
            except OSError:
                continue
        return out


def _is_pkg_dir(p: Path) -> bool:
    return p.is_dir() and ((p / "srt").is_dir() or (p / "__init__.py").is_file())


def open_source(path: Path) -> _Source:
    """Open a .whl, an unpacked tree (sglang/ or python/sglang/ inside) or an sglang package dir."""
    path = Path(path)
    if not path.exists():
        raise KitError(f"{path}: no such file or directory")
    if path.is_file():
        if not zipfile.is_zipfile(path):
            raise KitError(
                f"{path}: not a zip file (expected an sglang .whl, an unpacked tree or an install)"
            )
        return _ZipSource(path)
    for pkg in (path / "sglang", path / "python" / "sglang"):
        if _is_pkg_dir(pkg):
            return _DirSource(path, pkg)
    if (path.name == "sglang" and _is_pkg_dir(path)) or (path / "srt" / "models").is_dir():
        return _DirSource(path, path)
    raise KitError(
        f"{path}: no sglang package inside (looked for sglang/, python/sglang/ or an sglang package dir)"
    )


def _version(src: _Source, reasons: list[str]) -> str:
    """dist-info METADATA first (it carries local versions like +pr29654), then sglang/_version.py."""
    found = set()
    for text in src.metadata_versions():
        head = text.partition("\n\n")[0]
        name = re.search(r"^Name: (.+)$", head, re.M)
        ver = re.search(r"^Version: (.+)$", head, re.M)
        if ver and (not name or name.group(1).strip().lower() == "sglang"):
            found.add(ver.group(1).strip())
    if len(found) == 1:
        return found.pop()
    if len(found) > 1:
        reasons.append(
            f"several sglang dist-info dirs ({', '.join(sorted(found))}); version taken from sources"
        )
    for rel in ("_version.py", "version.py"):
        text = src.read(rel)
        if not text:
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                names = {t.id for t in node.targets if isinstance(t, ast.Name)}
                if "__version__" in names and isinstance(node.value.value, str):
                    return node.value.value
    return "unknown"


# ---------------------------------------------------------------------------------------------------
# AST helpers


@dataclass
class _Module:
    rel: str
    tree: ast.Module
    lines: list[str]

    def ev(self, node: ast.AST) -> dict:
        n = getattr(node, "lineno", 0)
        src = self.lines[n - 1].strip() if 0 < n <= len(self.lines) else ""
        return {"file": f"sglang/{self.rel}", "line": n, "source": src}


@dataclass
class _Access:
    storage: str  # "forward_batch" | "spec_info" | "param" | "other"
    attr: str | None
    ev: dict
    gate: str | None = None
    via: str | None = None  # state class the access goes through, e.g. IndexTopKShareState


def _chain(node: ast.AST) -> list[str] | None:
    """['forward_batch', 'spec_info', 'x'] for forward_batch.spec_info.x; None for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def _is_none(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _is_carrier_attr(attr: str) -> bool:
    return "topk" in attr and not attr.startswith("reuse")


def _gate_of(test: ast.AST) -> str | None:
    for sub in ast.walk(test):
        c = _chain(sub)
        if c and len(c) > 1 and c[-1].startswith("reuse") and "topk" in c[-1]:
            return c[-1]
    return None


class _Fn:
    """One function: its ForwardBatch roots and local aliases, so chains can be read through them."""

    def __init__(self, mod: _Module, fn: ast.FunctionDef | ast.AsyncFunctionDef, fb_roots: set[str]):
        self.mod, self.fn = mod, fn
        args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
        self.params = {a.arg for a in args}
        self.fb_roots = set(fb_roots)
        for a in args:
            ann = ast.unparse(a.annotation) if a.annotation is not None else ""
            if a.arg == "forward_batch" or "ForwardBatch" in ann:
                self.fb_roots.add(a.arg)
        self.assigns: dict[str, list[tuple[int, ast.expr]]] = {}
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(fn):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                self.assigns.setdefault(node.targets[0].id, []).append((node.lineno, node.value))

    def assigned(self, name: str, before: int) -> ast.expr | None:
        cands = [v for line, v in self.assigns.get(name, []) if line <= before]
        return cands[-1] if cands else None

    def expand(self, parts: list[str], line: int, depth: int = 0) -> list[str]:
        value = self.assigned(parts[0], line) if depth < 5 else None
        sub = _chain(value) if value is not None else None
        return self.expand(sub + parts[1:], line, depth + 1) if sub else parts

    def classify(self, parts: list[str]) -> tuple[str, str] | None:
        if "spec_info" in parts[:-1]:
            return "spec_info", parts[parts.index("spec_info") + 1]
        dotted = ".".join(parts)
        for root in self.fb_roots:
            rest = dotted[len(root) + 1 :] if dotted.startswith(root + ".") else None
            if rest and "." not in rest:
                return "forward_batch", rest
        return None

    def enclosing_gate(self, node: ast.AST) -> str | None:
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, (ast.If, ast.IfExp)):
                gate = _gate_of(node.test)
                if gate:
                    return gate
        return None


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item


# ---------------------------------------------------------------------------------------------------
# The analysis


class _Analysis:
    def __init__(self, src: _Source):
        self.src = src
        self.mods: dict[str, _Module | None] = {}
        self.reasons: list[str] = []
        self.calls: list[dict] = []  # call sites on a state object that lead to a write-back

    def module(self, rel: str) -> _Module | None:
        if rel not in self.mods:
            text = self.src.read(rel)
            mod = None
            if text is not None:
                try:
                    mod = _Module(rel, ast.parse(text), text.split("\n"))
                except SyntaxError as e:
                    self.reasons.append(f"sglang/{rel} does not parse ({e.msg}, line {e.lineno})")
            self.mods[rel] = mod
        return self.mods[rel]

    # -- state classes (IndexTopKShareState and the like) -------------------------------------------

    def find_class(self, mod: _Module, name: str) -> tuple[_Module, ast.ClassDef] | None:
        for node in mod.tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return mod, node
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
                orig = next(a.name for a in node.names if (a.asname or a.name) == name)
                base = PurePosixPath(mod.rel).parent
                if node.level:
                    for _ in range(node.level - 1):
                        base = base.parent
                    dotted = (node.module or "").split(".") if node.module else []
                    path = base.joinpath(*dotted) if dotted else base
                elif node.module and node.module.startswith("sglang."):
                    path = PurePosixPath(*node.module.split(".")[1:])
                else:
                    return None
                for rel in (f"{path}.py", f"{path}/__init__.py"):
                    other = self.module(rel)
                    if other is not None:
                        for cls in other.tree.body:
                            if isinstance(cls, ast.ClassDef) and cls.name == orig:
                                return other, cls
        return None

    def _class_fns(self, mod: _Module, cls: ast.ClassDef) -> dict[str, _Fn]:
        roots: set[str] = set()
        for item in cls.body:  # self._forward_batch = forward_batch  ->  root "self._forward_batch"
            if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                fb = _Fn(mod, item, set()).fb_roots
                for node in ast.walk(item):
                    if (
                        isinstance(node, ast.Assign)
                        and isinstance(node.value, ast.Name)
                        and node.value.id in fb
                    ):
                        for t in node.targets:
                            c = _chain(t)
                            if c and c[0] == "self":
                                roots.add(".".join(c))
        fns = {}
        for item in cls.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                fns[item.name] = _Fn(mod, item, roots)
        return fns

    def _reachable(self, fns: dict[str, _Fn], start: list[str]) -> list[_Fn]:
        seen: list[str] = []
        todo = [m for m in start if m in fns]
        while todo:
            m = todo.pop()
            if m in seen:
                continue
            seen.append(m)
            for node in ast.walk(fns[m].fn):
                if isinstance(node, ast.Call):
                    c = _chain(node.func)
                    if c and len(c) == 2 and c[0] in ("self", "cls") and c[1] in fns:
                        todo.append(c[1])
                    elif c == ["cls"]:
                        todo.append("__init__")
        return [fns[m] for m in seen]

    # -- reads and writes ----------------------------------------------------------------------------

    def loads_in(self, fn: _Fn) -> list[_Access]:
        out = []
        for node in ast.walk(fn.fn):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                if isinstance(fn.parents.get(node), ast.Attribute):
                    continue  # only whole chains
                parts = _chain(node)
                hit = fn.classify(fn.expand(parts, node.lineno)) if parts else None
                if hit and _is_carrier_attr(hit[1]) and "seed" not in hit[1]:
                    out.append(_Access(hit[0], hit[1], fn.mod.ev(node), fn.enclosing_gate(node)))
        return out

    def stores_in(self, fn: _Fn) -> list[_Access]:
        out = []
        for node in ast.walk(fn.fn):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and not _is_none(node.value):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    parts = _chain(t)
                    hit = fn.classify(fn.expand(parts, node.lineno)) if parts and len(parts) > 1 else None
                    if hit and not hit[1].startswith("reuse"):  # any store; gates are not carriers
                        out.append(_Access(hit[0], hit[1], fn.mod.ev(node), fn.enclosing_gate(node)))
        return out

    def resolve_read(self, fn: _Fn, expr: ast.AST, line: int, depth: int = 0) -> list[_Access]:
        """Where the value passed as prev_topk_indices comes from."""
        if _is_none(expr) or depth > 5:
            return []
        if isinstance(expr, ast.IfExp):
            gate = _gate_of(expr.test)
            out = self.resolve_read(fn, expr.body, line, depth + 1)
            out += self.resolve_read(fn, expr.orelse, line, depth + 1)
            for a in out:
                a.gate = a.gate or gate
            return out
        parts = _chain(expr)
        if parts is None:
            return [_Access("other", None, fn.mod.ev(expr))]
        parts = fn.expand(parts, line)
        hit = fn.classify(parts)
        if hit:
            return [_Access(hit[0], hit[1], fn.mod.ev(expr))]
        value = fn.assigned(parts[0], line)
        if len(parts) == 1 and value is not None:
            return self.resolve_read(fn, value, line, depth + 1)
        if len(parts) > 1 and isinstance(value, ast.Call):
            return self.state_reads(fn, value)
        if len(parts) == 1 and parts[0] in fn.params:
            return [_Access("param", parts[0], fn.mod.ev(expr))]
        return [_Access("other", ".".join(parts), fn.mod.ev(expr))]

    def _state_class(self, fn: _Fn, call: ast.Call) -> tuple[str, str, _Module, ast.ClassDef] | None:
        c = _chain(call.func)
        if not c or len(c) > 2:
            return None
        name, method = c[0], (c[1] if len(c) == 2 else "__init__")
        found = self.find_class(fn.mod, name)
        return (name, method, *found) if found else None

    def state_reads(self, fn: _Fn, call: ast.Call) -> list[_Access]:
        st = self._state_class(fn, call)
        if st is None:
            return [_Access("other", ast.unparse(call.func), fn.mod.ev(call))]
        name, method, mod, cls = st
        fns = self._class_fns(mod, cls)
        out = [a for f in self._reachable(fns, [method]) for a in self.loads_in(f)]
        for a in out:
            a.via = name
        return out or [_Access("other", f"{name}.{method}", fn.mod.ev(call), via=name)]

    def writes_in(self, fn: _Fn) -> list[_Access]:
        """Stores of the new top-k: direct, or through methods called on a state object."""
        out = self.stores_in(fn)
        for node in ast.walk(fn.fn):
            if not isinstance(node, ast.Call):
                continue
            c = _chain(node.func)
            if not c or len(c) != 2:
                continue
            value = fn.assigned(c[0], node.lineno)
            st = self._state_class(fn, value) if isinstance(value, ast.Call) else None
            if st is None:
                continue
            name, _method, mod, cls = st
            fns = self._class_fns(mod, cls)
            stores = [a for f in self._reachable(fns, [c[1]]) for a in self.stores_in(f)]
            if stores:
                self.calls.append(fn.mod.ev(node))
            for a in stores:
                a.via = name
                out.append(a)
        return out

    # -- the rest of the tree ------------------------------------------------------------------------

    def gate_setters(self, gate: str) -> list[dict]:
        """Code in sglang/srt that switches the reuse gate on (`x.<gate> = <not False/None>`)."""
        out = []
        for rel in self.src.py_files("srt"):
            text = self.src.read(rel)
            if not text or gate not in text:
                continue
            mod = self.module(rel)
            if mod is None:
                continue
            for node in ast.walk(mod.tree):
                if isinstance(node, ast.Assign) and not (
                    isinstance(node.value, ast.Constant) and node.value.value in (False, None)
                ):
                    for t in node.targets:
                        if isinstance(t, ast.Attribute) and t.attr == gate:
                            out.append(mod.ev(node))
        return out

    def feature_mentions(self) -> list[dict]:
        out = []
        for rel in self.src.py_files("srt"):
            text = self.src.read(rel) or ""
            if FEATURE_FLAG in text or re.search(r"reuse_\w*topk_indices", text):
                n = next(
                    i for i, ln in enumerate(text.split("\n"), 1) if FEATURE_FLAG in ln or "reuse_" in ln
                )
                out.append({"file": f"sglang/{rel}", "line": n, "source": text.split("\n")[n - 1].strip()})
        return out

    def field_decl(self, attr: str, rels: list[str]) -> tuple[str, dict] | None:
        for rel in rels:
            text = self.src.read(rel)
            if not text or attr not in text:
                continue
            mod = self.module(rel)
            for node in ast.walk(mod.tree) if mod else []:
                if isinstance(node, ast.ClassDef):
                    for item in node.body:
                        if (
                            isinstance(item, ast.AnnAssign)
                            and isinstance(item.target, ast.Name)
                            and item.target.id == attr
                        ):
                            return node.name, mod.ev(item)
        return None


def _carrier(an: _Analysis, acc: _Access) -> tuple[str, dict | None]:
    if acc.via:  # the state object is the carrier; its backing field is evidence
        return acc.via, _carrier(an, _Access(acc.storage, acc.attr, acc.ev))[1]
    if acc.storage == "forward_batch":
        decl = an.field_decl(acc.attr or "", ["srt/model_executor/forward_batch_info.py"])
        return f"ForwardBatch.{acc.attr}", decl[1] if decl else None
    if acc.storage == "spec_info":
        rels = sorted(an.src.py_files("srt/speculative"), key=lambda r: not r.endswith("eagle_info.py"))
        decl = an.field_decl(acc.attr or "", rels)
        return (f"{decl[0]}.{acc.attr}", decl[1]) if decl else (f"spec_info.{acc.attr}", None)
    return f"{acc.storage}:{acc.attr}", None


def _result(state: str, version: str, carrier: str | None, evidence: list[dict], reasons: list[str]) -> dict:
    seen, ev = set(), []
    for e in evidence:
        key = (e["file"], e["line"])
        if key not in seen:
            seen.add(key)
            ev.append(e)
    return {"state": state, "version": version, "carrier": carrier, "evidence": ev, "reasons": reasons}


def _classify(an: _Analysis, version: str) -> dict:
    reasons = an.reasons
    mod = an.module(NEXTN)
    if mod is None:
        if not any("does not parse" in r for r in reasons):
            reasons.append(f"sglang/{NEXTN} not found: no DeepSeek NextN (MTP draft) model to inspect")
        return _result("unknown", version, None, [], reasons)

    sites: list[tuple[str, _Fn, ast.keyword]] = []
    for qual, fdef in _functions(mod.tree):
        fn = _Fn(mod, fdef, set())
        for node in ast.walk(fdef):
            if isinstance(node, ast.Call):
                sites += [(qual, fn, kw) for kw in node.keywords if kw.arg == "prev_topk_indices"]

    if not sites:
        mentions = an.feature_mentions()
        if mentions:
            reasons.append(
                f"{FEATURE_FLAG} / a reuse_*topk_indices gate appears in sglang/srt, but the NextN model "
                "passes no prev_topk_indices: layout not understood"
            )
            return _result("unknown", version, None, mentions[:5], reasons)
        reasons.append(
            "the NextN model passes no prev_topk_indices to its decoder layer and nothing in sglang/srt "
            f"mentions {FEATURE_FLAG}: the indexer runs on every draft step by design"
        )
        return _result("absent", version, None, [], reasons)

    reads: list[_Access] = []
    writes: list[_Access] = []
    quals = []
    evidence = []
    for qual, fn, kw in sites:
        quals.append(qual)
        evidence.append(mod.ev(kw.value))
        reads += an.resolve_read(fn, kw.value, kw.value.lineno)
        writes += an.writes_in(fn)
    where = ", ".join(sorted(set(quals)))
    evidence += [a.ev for a in reads] + an.calls + [a.ev for a in writes]

    if not reads:
        reasons.append(f"{where} passes prev_topk_indices=None: no reuse")
        return _result("absent", version, None, evidence, reasons)
    odd = [a for a in reads if a.storage not in ("forward_batch", "spec_info")]
    if odd:
        reasons.append(f"{where}: prev_topk_indices comes from {odd[0].attr!r}, which is not understood")
        return _result("unknown", version, None, evidence, reasons)
    read_keys = {(a.storage, a.attr) for a in reads}
    if len(read_keys) > 1:
        reasons.append(f"{where} reads prev_topk_indices from several places: {sorted(read_keys)}")
        return _result("unknown", version, None, evidence, reasons)
    read = reads[0]
    carrier, decl = _carrier(an, read)
    if decl:
        evidence.append(decl)
    storage_txt = (
        f"forward_batch.{read.attr}" if read.storage == "forward_batch" else f"spec_info.{read.attr}"
    )
    via_txt = f" (through {read.via})" if read.via else ""

    gates = sorted({a.gate for a in reads if a.gate})
    if gates:
        setters = [e for g in gates for e in an.gate_setters(g)]
        if not setters:
            reasons.append(
                f"{where} would reuse {storage_txt}{via_txt} when ForwardBatch.{gates[0]} is set, "
                "but nothing in sglang/srt sets it: index sharing can never switch on"
            )
            return _result("absent", version, carrier, evidence, reasons)
        evidence += setters[:_MAX_GATE_EVIDENCE]
    else:
        reasons.append(f"{where}: the read of {storage_txt} is not behind a reuse_*topk_indices gate")

    same = [w for w in writes if (w.storage, w.attr) == (read.storage, read.attr)]
    if not same:
        others = sorted({f"{w.storage}.{w.attr}" for w in writes if _is_carrier_attr(w.attr or "")})
        reasons.append(
            f"{where} reads prev_topk_indices from {storage_txt}{via_txt} but never writes the new top-k "
            "there" + (f" (writes: {', '.join(others)})" if others else "")
        )
        return _result("unknown", version, carrier, evidence, reasons)
    if read.storage == "forward_batch":
        reasons.append(
            f"{where} reads prev_topk_indices from and writes the new top-k to {storage_txt}{via_txt}: an "
            "attribute of the per-step ForwardBatch copy, so the write-back is lost and every draft step "
            "re-runs the indexer (the bug fixed by PR #29654)"
        )
        return _result("bug", version, carrier, evidence, reasons)
    reasons.append(
        f"{where} reads prev_topk_indices from and writes the new top-k to forward_batch.{storage_txt}"
        f"{via_txt}: spec_info is shared by reference across the per-step ForwardBatch copies, so the "
        "first draft step's top-k reaches the later ones (fixed)"
    )
    return _result("fix", version, carrier, evidence, reasons)


def detect_state(path: Path | str) -> dict:
    """Classify an sglang .whl / unpacked tree / installed package; see the module docstring.

    Returns {state, version, carrier, evidence: [{file, line, source}], reasons}. Raises KitError only
    when the input cannot be read as sglang at all.
    """
    src = open_source(Path(path))
    try:
        an = _Analysis(src)
        version = _version(src, an.reasons)
        return _classify(an, version)
    finally:
        src.close()
