"""README's "Where things are" map matches the tree: every module of kit/ is named in it, every path it names
exists (a map that drifts from the tree misleads the maintainer it is for)."""

from __future__ import annotations

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
