"""README's "Where things are" map matches the tree: every module of kit/ is named in it, every path it names
exists (a map that drifts from the tree misleads the maintainer it is for)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from kit.paths import REPO


def _map_rows() -> dict[str, str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Where things are", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            rows[cells[0]] = cells[1]
    return rows


def test_every_module_is_on_the_map_and_every_named_path_exists() -> None:
    rows = _map_rows()
    named: set[Path] = set()
    for where, what in rows.items():
        dirs = [d for d in re.findall(r"`([^`]+)`", where)]
        for d in dirs:
            assert (REPO / d).exists(), f"the map names {d}, which is not in the tree"
            named.add(REPO / d)
        base = REPO / dirs[0] if len(dirs) == 1 and dirs[0].endswith("/") else None
        for name in re.findall(r"`([\w./-]+\.py|[\w-]+/)`", what):
            if base is None:
                continue
            candidates = [p for p in base.rglob(name.rstrip("/")) if p.exists()]
            assert candidates, f"{where}: names {name}, not found under {base.relative_to(REPO)}"
            named.update(candidates)
    modules = [
        p
        for p in (REPO / "kit").rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py") and "site" not in p.parts
    ]
    missing = sorted(str(p.relative_to(REPO)) for p in modules if p not in named)
    assert not missing, f"modules the README map does not name: {missing}"


def _kit_modules(under: str = "kit") -> list[Path]:
    return sorted(p for p in (REPO / under).rglob("*.py") if "site" not in p.parts)


def test_no_module_of_the_kit_is_over_500_lines() -> None:
    """One job per module: the report's rungs grew into one 886-line module before they were split into
    kit/report/, one module per rung."""
    long = {
        str(p.relative_to(REPO)): n for p in _kit_modules() if (n := len(p.read_text().splitlines())) > 500
    }
    assert not long, f"modules over 500 lines: {long}"


def test_the_report_imports_no_private_name_of_another_module() -> None:
    """A name with a leading underscore is its module's own: the report read kit.compare.equivalence's
    _pooled_accept, which that module could rename or change at will; it reads pooled_accept now."""
    found = []
    for path in _kit_modules("kit/report"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kit"):
                found += [
                    f"{path.relative_to(REPO)}: {node.module}.{a.name}"
                    for a in node.names
                    if a.name[0] == "_"
                ]
    assert not found, f"private names imported across modules: {found}"


def test_every_gpu_result_readme_says_which_raw_files_stayed_on_the_host() -> None:
    """A reviewer who looks for a set's `.nsys-rep` must learn from its README that it stayed on the GPU host,
    and why (issue 33 item 6): a set measured on a GPU host has a README that says what was left there."""
    results = REPO / "data" / "results"
    silent = [
        str(readme.relative_to(results))
        for readme in sorted(results.rglob("README.md"))
        if not re.search(r"(stayed|left) on the host", readme.read_text())
    ]
    assert not silent, f"result READMEs that do not say which raw files stayed on the host: {silent}"


def test_no_export_is_committed_unpacked() -> None:
    """Every call to the GPU host carries the tracked tree (64 MB a call, the staged builds beside it), so a
    SQLite export is committed xz-packed (`X.sqlite.xz`, read in memory by kit.trace.sqlite)."""
    import subprocess

    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "*.sqlite"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert not listed, f"pack these (kit.trace.sqlite.pack, or xz -9): {listed}"
