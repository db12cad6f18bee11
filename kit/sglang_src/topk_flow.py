"""Where sglang's NextN (MTP draft) model reads and writes the carried top-k, by AST data flow.

Chains like `forward_batch.spec_info.x` are followed through local aliases, through state objects built
from the ForwardBatch (0.5.23's IndexTopKShareState: its methods that store or load the carrier), and
into the `if` / conditional expression that gates them (a `reuse_*topk*` flag). `kit.sglang_src.verify`
turns what is found here into a state.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath

from kit.sglang_src.source import SglangSource, shown


@dataclass
class Module:
    rel: str
    tree: ast.Module
    lines: list[str]

    def ev(self, node: ast.AST) -> dict:
        n = getattr(node, "lineno", 0)
        src = self.lines[n - 1].strip() if 0 < n <= len(self.lines) else ""
        return {"file": shown(self.rel), "line": n, "source": src}


@dataclass
class Access:
    storage: str  # "forward_batch" | "spec_info" | "param" | "other"
    attr: str | None
    ev: dict
    gate: str | None = None
    via: str | None = None  # state class the access goes through, e.g. IndexTopKShareState


def chain(node: ast.AST) -> list[str] | None:
    """['forward_batch', 'spec_info', 'x'] for forward_batch.spec_info.x; None for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def is_none(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def is_carrier_attr(attr: str) -> bool:
    return "topk" in attr and not attr.startswith("reuse")


def gate_of(test: ast.AST) -> str | None:
    for sub in ast.walk(test):
        c = chain(sub)
        if c and len(c) > 1 and c[-1].startswith("reuse") and "topk" in c[-1]:
            return c[-1]
    return None


class Fn:
    """One function: its ForwardBatch roots and local aliases, so chains can be read through them."""

    def __init__(self, mod: Module, fn: ast.FunctionDef | ast.AsyncFunctionDef, fb_roots: set[str]):
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
        sub = chain(value) if value is not None else None
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
                gate = gate_of(node.test)
                if gate:
                    return gate
        return None


def functions(tree: ast.AST) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item


class Analysis:
    """One sglang source under study: parsed modules, the reasons gathered so far, state-object calls."""

    def __init__(self, src: SglangSource):
        self.src = src
        self.mods: dict[str, Module | None] = {}
        self.reasons: list[str] = []
        self.calls: list[dict] = []  # call sites on a state object that lead to a write-back

    def module(self, rel: str) -> Module | None:
        """The parsed file (None when missing); a file that does not parse is named in `reasons` once."""
        if rel not in self.mods:
            tree = self.src.parse(rel)
            mod = None
            if tree is not None:
                mod = Module(rel, tree, (self.src.read(rel) or "").split("\n"))
            else:
                err = self.src.syntax_error(rel)
                if err is not None:
                    self.reasons.append(f"{shown(rel)} does not parse ({err.msg}, line {err.lineno})")
            self.mods[rel] = mod
        return self.mods[rel]

    def reuse_sites(self, mod: Module) -> list[tuple[str, Fn, ast.keyword]]:
        """(Class.method, function, keyword) for every call in `mod` that passes prev_topk_indices."""
        sites = []
        for qual, fdef in functions(mod.tree):
            fn = Fn(mod, fdef, set())
            for node in ast.walk(fdef):
                if isinstance(node, ast.Call):
                    sites += [(qual, fn, kw) for kw in node.keywords if kw.arg == "prev_topk_indices"]
        return sites

    # -- state classes (IndexTopKShareState and the like) -------------------------------------------

    def find_class(self, mod: Module, name: str) -> tuple[Module, ast.ClassDef] | None:
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

    def _class_fns(self, mod: Module, cls: ast.ClassDef) -> dict[str, Fn]:
        roots: set[str] = set()
        for item in cls.body:  # self._forward_batch = forward_batch  ->  root "self._forward_batch"
            if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                fb = Fn(mod, item, set()).fb_roots
                for node in ast.walk(item):
                    if (
                        isinstance(node, ast.Assign)
                        and isinstance(node.value, ast.Name)
                        and node.value.id in fb
                    ):
                        for t in node.targets:
                            c = chain(t)
                            if c and c[0] == "self":
                                roots.add(".".join(c))
        fns = {}
        for item in cls.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                fns[item.name] = Fn(mod, item, roots)
        return fns

    def _reachable(self, fns: dict[str, Fn], start: list[str]) -> list[Fn]:
        seen: list[str] = []
        todo = [m for m in start if m in fns]
        while todo:
            m = todo.pop()
            if m in seen:
                continue
            seen.append(m)
            for node in ast.walk(fns[m].fn):
                if isinstance(node, ast.Call):
                    c = chain(node.func)
                    if c and len(c) == 2 and c[0] in ("self", "cls") and c[1] in fns:
                        todo.append(c[1])
                    elif c == ["cls"]:
                        todo.append("__init__")
        return [fns[m] for m in seen]

    # -- reads and writes ----------------------------------------------------------------------------

    def loads_in(self, fn: Fn) -> list[Access]:
        out = []
        for node in ast.walk(fn.fn):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                if isinstance(fn.parents.get(node), ast.Attribute):
                    continue  # only whole chains
                parts = chain(node)
                hit = fn.classify(fn.expand(parts, node.lineno)) if parts else None
                if hit and is_carrier_attr(hit[1]) and "seed" not in hit[1]:
                    out.append(Access(hit[0], hit[1], fn.mod.ev(node), fn.enclosing_gate(node)))
        return out

    def stores_in(self, fn: Fn) -> list[Access]:
        out = []
        for node in ast.walk(fn.fn):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and not is_none(node.value):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    parts = chain(t)
                    hit = fn.classify(fn.expand(parts, node.lineno)) if parts and len(parts) > 1 else None
                    if hit and not hit[1].startswith("reuse"):  # any store; gates are not carriers
                        out.append(Access(hit[0], hit[1], fn.mod.ev(node), fn.enclosing_gate(node)))
        return out

    def resolve_read(self, fn: Fn, expr: ast.AST, line: int, depth: int = 0) -> list[Access]:
        """Where the value passed as prev_topk_indices comes from."""
        if is_none(expr) or depth > 5:
            return []
        if isinstance(expr, ast.IfExp):
            gate = gate_of(expr.test)
            out = self.resolve_read(fn, expr.body, line, depth + 1)
            out += self.resolve_read(fn, expr.orelse, line, depth + 1)
            for a in out:
                a.gate = a.gate or gate
            return out
        parts = chain(expr)
        if parts is None:
            return [Access("other", None, fn.mod.ev(expr))]
        parts = fn.expand(parts, line)
        hit = fn.classify(parts)
        if hit:
            return [Access(hit[0], hit[1], fn.mod.ev(expr))]
        value = fn.assigned(parts[0], line)
        if len(parts) == 1 and value is not None:
            return self.resolve_read(fn, value, line, depth + 1)
        if len(parts) > 1 and isinstance(value, ast.Call):
            return self.state_reads(fn, value)
        if len(parts) == 1 and parts[0] in fn.params:
            return [Access("param", parts[0], fn.mod.ev(expr))]
        return [Access("other", ".".join(parts), fn.mod.ev(expr))]

    def _state_class(self, fn: Fn, call: ast.Call) -> tuple[str, str, Module, ast.ClassDef] | None:
        c = chain(call.func)
        if not c or len(c) > 2:
            return None
        name, method = c[0], (c[1] if len(c) == 2 else "__init__")
        found = self.find_class(fn.mod, name)
        return (name, method, *found) if found else None

    def state_reads(self, fn: Fn, call: ast.Call) -> list[Access]:
        st = self._state_class(fn, call)
        if st is None:
            return [Access("other", ast.unparse(call.func), fn.mod.ev(call))]
        name, method, mod, cls = st
        fns = self._class_fns(mod, cls)
        out = [a for f in self._reachable(fns, [method]) for a in self.loads_in(f)]
        for a in out:
            a.via = name
        return out or [Access("other", f"{name}.{method}", fn.mod.ev(call), via=name)]

    def writes_in(self, fn: Fn) -> list[Access]:
        """Stores of the new top-k: direct, or through methods called on a state object."""
        out = self.stores_in(fn)
        for node in ast.walk(fn.fn):
            if not isinstance(node, ast.Call):
                continue
            c = chain(node.func)
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
        for rel in self.src.files("srt"):
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
