"""The layer order of kit/, stated once (LAYERS; README's "Where things are" says it too) and checked.

The import graph is read from the source, not from what an import happens to load: every `import` and
`from ... import` anywhere in a module (inside functions and `if TYPE_CHECKING:` too), and every string that
names a kit module the way importlib is handed one ("kit.trace.kineto:open_kineto", "kit.pipeline.cell").
A module may import its own package and the layers below its own; never a layer above, never a sibling on
its own layer, and no two modules may import each other, directly or around a circle.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kit.paths import KIT, REPO

# Top to bottom. A layer may import any layer below it; packages on one layer do not import each other. BASE
# is kit/__init__.py and every module directly in kit/ (errors, paths, arms, rundir, proc, provenance, ...).
BASE = "kit"
LAYERS: tuple[tuple[str, ...], ...] = (
    ("kit.cli",),
    ("kit.pipeline",),
    ("kit.report",),
    ("kit.compare",),
    ("kit.backends", "kit.analysis"),
    ("kit.trace",),
    ("kit.probe", "kit.task"),
    ("kit.sglang_src",),
    ("kit.checkpoint",),
    (BASE,),
)
# What kit.probe.site loads inside sglang's own processes: stdlib only, and of the kit only these packages.
PROBE_ENTRY = "kit.probe.site.sitecustomize"
PROBE_MAY_LOAD = ("kit.probe", "kit.sglang_src.source", "kit.sglang_src.releases", "kit.errors", "kit.paths")

_NAMED = re.compile(r"kit(\.\w+)+(:\w+)?")


@dataclass(frozen=True)
class Import:
    """One edge of the graph: `source` names `target` at `where` (kind: import, lazy or string)."""

    source: str
    target: str
    where: str
    kind: str

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({self.where}, {self.kind})"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(KIT.rglob("*.py"))}


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring constants (prose that may name modules, not imports)."""
    scopes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    nodes = [n for n in ast.walk(tree) if isinstance(n, scopes)]
    return {
        id(n.body[0].value)
        for n in nodes
        if n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)
    }


def imports_of(name: str, path: Path, known: dict[str, Path]) -> Iterator[Import]:
    """Every kit module `name` imports, with where and how."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top_level = {id(n) for n in tree.body}
    rel = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    docs = _docstrings(tree)

    def resolve(dotted: str) -> str:
        while dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted

    for node in ast.walk(tree):
        kind = "import" if id(node) in top_level else "lazy"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == BASE:
                    yield Import(name, resolve(alias.name), f"{rel}:{node.lineno}", kind)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            if base.split(".")[0] != BASE:
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield Import(name, full if full in known else resolve(base), f"{rel}:{node.lineno}", kind)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if _NAMED.fullmatch(node.value) and node.value.partition(":")[0] in known:
                yield Import(name, node.value.partition(":")[0], f"{rel}:{node.lineno}", "string")


@functools.cache
def graph() -> tuple[Import, ...]:
    known = modules()
    edges = {e for n, p in known.items() for e in imports_of(n, p, known) if e.target != n}
    return tuple(sorted(edges, key=str))


def group(module: str) -> str:
    """The package of LAYERS a module belongs to (BASE: the modules directly in kit/)."""
    parts = module.split(".")
    return BASE if len(parts) <= 2 and not (KIT / parts[-1]).is_dir() else ".".join(parts[:2])


def rank(group_name: str) -> int:
    found = [i for i, layer in enumerate(LAYERS) if group_name in layer]
    assert found, f"{group_name} is on no layer of LAYERS: add it to the table (and README's line)"
    return found[0]


def against_the_order(edges: tuple[Import, ...] | list[Import]) -> list[str]:
    bad = []
    for e in edges:
        a, b = group(e.source), group(e.target)
        if a == b:
            continue
        if rank(b) < rank(a):
            bad.append(f"{e}: {b} is a layer above {a}")
        elif rank(b) == rank(a):
            bad.append(f"{e}: {a} and {b} share a layer and must not import each other")
    return bad


def circles(edges: tuple[Import, ...] | list[Import]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    succ: dict[str, set[str]] = {}
    for e in edges:
        succ.setdefault(e.source, set()).add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(succ):
        if root in index:
            continue
        work = [(root, iter(sorted(succ.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(succ.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_readme_states_this_order() -> None:
    """README's "Where things are" says the order in one line; it is this table's."""
    short = {BASE: "base"}
    line = " → ".join(" | ".join(short.get(g, g.removeprefix("kit.")) for g in layer) for layer in LAYERS)
    section = (REPO / "README.md").read_text().split("## Where things are", 1)[1].split("\n## ", 1)[0]
    assert f"**{line}**" in section, f"README's layer order is not LAYERS': {line}"


def test_every_package_of_kit_is_on_a_layer() -> None:
    placed = {g for layer in LAYERS for g in layer}
    unplaced = sorted({group(m) for m in modules()} - placed)
    assert not unplaced, f"packages on no layer of LAYERS (add each to the table and README): {unplaced}"


def test_no_import_against_the_layer_order() -> None:
    bad = against_the_order(graph())
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def test_no_import_circles() -> None:
    edges = graph()
    found = circles(edges)
    detail = [
        ", ".join(c) + ":\n    " + "\n    ".join(str(e) for e in edges if e.source in c and e.target in c)
        for c in found
    ]
    assert not found, "import circles:\n" + "\n".join(detail)


def test_the_probe_loads_only_stdlib_and_its_own_modules() -> None:
    """kit.probe.site runs inside sglang's processes: what it loads, transitively, is the probe, the two
    source readers its start-up check needs and the base's errors and paths, each with stdlib imports only."""
    edges = graph()
    seen, todo = set(), [PROBE_ENTRY]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += [e.target for e in edges if e.source == m]
    outside = sorted(m for m in seen if m != BASE and not m.startswith(PROBE_MAY_LOAD))
    assert not outside, f"the probe loads {outside} inside sglang's processes"
    heavy = []
    for m in sorted(seen):
        tree = ast.parse(modules()[m].read_text())
        for node in tree.body:  # top level: what loading the module imports
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            heavy += [f"{m}: {n}" for n in names if n.split(".")[0] not in (*sys.stdlib_module_names, BASE)]
    assert not heavy, f"the probe's modules import more than the stdlib at load: {heavy}"


# ---- the check itself: each rule fails on the graph it forbids ------------------------------------------


def _edges(*pairs: tuple[str, str]) -> list[Import]:
    return [Import(a, b, "-", "import") for a, b in pairs]


def test_the_check_fails_on_an_upward_import_a_sibling_and_a_circle() -> None:
    assert against_the_order(_edges(("kit.sglang_src.probe_check", "kit.probe.targets")))
    assert against_the_order(_edges(("kit.task.workload", "kit.backends.sglang.workload")))
    assert against_the_order(_edges(("kit.analysis.rounds", "kit.backends.mini.run")))  # siblings
    assert against_the_order(_edges(("kit.report.rungs", "kit.pipeline.summary")))
    assert not against_the_order(
        _edges(("kit.pipeline.stages", "kit.report.rungs"), ("kit.task.x", "kit.errors"))
    )
    assert circles(_edges(("kit.a", "kit.b"), ("kit.b", "kit.c"), ("kit.c", "kit.a"))) == [
        ["kit.a", "kit.b", "kit.c"]
    ]
    assert circles(_edges(("kit.a", "kit.b"), ("kit.b", "kit.c"))) == []


def test_imports_inside_functions_and_importlib_strings_are_edges(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        '"""Docstring naming kit.cli is prose."""\n'
        "from typing import TYPE_CHECKING\n"
        "from kit.errors import UsageError\n"
        "if TYPE_CHECKING:\n    from kit.trace import source\n"
        "def f():\n    from kit.probe.targets import TARGETS\n"
        'OPENER = "kit.trace.kineto:open_kineto"\n'
        'ENTRY = ("-m", "kit.pipeline.cell")\n'
    )
    found = {(e.target, e.kind) for e in imports_of("kit.x.m", src, modules())}
    assert found == {
        ("kit.errors", "import"),
        ("kit.trace.source", "lazy"),
        ("kit.probe.targets", "lazy"),
        ("kit.trace.kineto", "string"),
        ("kit.pipeline.cell", "string"),
    }


# ---- one home for the repository root ---------------------------------------------------------------------

# kit.paths is where the root is; scripts/_checkout.py puts the checkout on sys.path for the scripts, and
# conftest.py puts tests/ there for the helpers. Nothing else finds the checkout by itself.
ROOT_HOMES = ("kit/paths.py", "scripts/_checkout.py", "tests/conftest.py")


def _finds_a_place(node: ast.AST) -> bool:
    """A folder climbed to from the file itself (`Path(__file__).parent`, `dirname(__file__)`) or from the
    command line's script (`sys.argv[0]`), or the working directory taken for one."""

    def from_self(n: ast.AST) -> bool:
        return any(
            (isinstance(x, ast.Name) and x.id == "__file__")
            or (isinstance(x, ast.Subscript) and ast.unparse(x) == "sys.argv[0]")
            for x in ast.walk(n)
        )

    if isinstance(node, ast.Attribute) and node.attr in ("parent", "parents"):
        return from_self(node.value)
    if isinstance(node, ast.Call):
        name = ast.unparse(node.func)
        if name.endswith("dirname"):
            return any(from_self(a) for a in node.args)
        return name in ("Path.cwd", "os.getcwd", "pathlib.Path.cwd")
    return False


def places_found(path: Path) -> list[int]:
    return sorted({n.lineno for n in ast.walk(ast.parse(path.read_text())) if _finds_a_place(n)})


def test_no_script_or_test_computes_the_repo_root() -> None:
    files = [*(REPO / "scripts").glob("*.py"), *(REPO / "tests").rglob("*.py")]
    bad = [
        f"{rel}:{line}"
        for p in sorted(files)
        if (rel := p.relative_to(REPO).as_posix()) not in ROOT_HOMES
        for line in places_found(p)
    ]
    assert not bad, f"take the root from kit.paths (scripts: import _checkout first): {bad}"


def test_the_root_check_sees_each_way_of_computing_it(tmp_path: Path) -> None:
    lines = {
        "REPO = Path(__file__).resolve().parents[1]": True,
        "HERE = Path(__file__).parent / 'fixtures'": True,
        "ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))": True,
        "ROOT = Path(sys.argv[0]).resolve().parent.parent": True,
        "ROOT = Path.cwd()": True,
        "ROOT = os.getcwd()": True,
        "SELF = Path(__file__).resolve()": False,  # the file itself, run again as a program
        "PKG = Path(json.__file__).parent": False,  # another module's folder
        "FIXTURES = REPO / 'tests' / 'fixtures'": False,
    }
    for line, found in lines.items():
        (tmp_path / "x.py").write_text(line + "\n")
        assert bool(places_found(tmp_path / "x.py")) is found, line
