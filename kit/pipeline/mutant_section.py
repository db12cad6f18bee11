"""A matrix's `mutants:` section: which wrong fixes of the registry (kit.sglang_src.mutants) run beside which
cells, in which build. The matrix (kit.pipeline.matrix) reads it through expand() and makes the cells; how
each is judged is kit.pipeline.mutant_cells, which the module doc there describes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kit.arms import ARMS
from kit.checks import mapping, string, string_list, unknown_key
from kit.errors import UsageError

KEYS = ("arm", "pythonpath", "python", "names")
# what expand() asks the matrix to make: (the cell copied, the mutant's name, its PYTHONPATH, its python)
Mutant = tuple[Any, str, tuple[str, ...], "str | None"]


def version(name: str) -> str:
    """The mutant's build: the bug's release with the patch's label (kit build --patch names it so)."""
    from kit.sglang_src.build import local_label
    from kit.sglang_src.releases import BASELINE

    return f"{BASELINE}+{local_label(name)}"


def planned(mode: str) -> list[str]:
    """The registry's mutants in a mode of the H200 plan; the preflight ones run with CUDA graphs."""
    from kit.sglang_src.mutants import h200_plan

    return [n for n, m in h200_plan() if m == mode or (m == "preflight" and mode == "graph")]


def names_given(raw: Any, where: str) -> list[str]:
    """A list of registry names (a single name, or [] for none); an unknown or repeated one refused."""
    from kit.sglang_src.mutants import MUTANTS

    names = [raw] if isinstance(raw, str) else string_list(where, raw)
    for n in names:
        if n not in MUTANTS:
            raise UsageError(f"{where}: unknown mutant {n!r}: one of {', '.join(MUTANTS)}", param=where)
        if names.count(n) > 1:
            raise UsageError(f"{where} lists {n!r} more than once", param=where)
    return names


def expand(cells: Sequence[Any], raw: Any, where: str, override: Any = None) -> list[Mutant]:
    """The mutant cells to make beside `cells` (kit.pipeline.matrix's, each with its `params`): for each,
    the cell it copies, the mutant's name, its build's PYTHONPATH and python; `override`: --set
    mutants=NAMES. The matrix makes the cells (this module does not import it)."""
    if raw is None:
        if override is not None:
            raise UsageError("--set mutants: the matrix has no mutants: section", param="--set.mutants")
        return []
    spec = mapping(where, raw, "arm, pythonpath with {version}, python, names")
    for k in spec:
        if k not in KEYS:
            raise unknown_key(str(k), f"under {where}", KEYS, f"{where}.{k}")
    arm = string(f"{where}.arm", spec.get("arm", "fix"))
    if arm not in ARMS:
        raise UsageError(f"{where}.arm: {arm!r} is not an arm; allowed: {', '.join(ARMS)}", param=where)
    paths = string_list(f"{where}.pythonpath", spec.get("pythonpath", []))
    if not any("{version}" in p for p in paths):
        raise UsageError(
            f"{where}.pythonpath: no folder names {{version}}: every mutant would run the same build",
            param=f"{where}.pythonpath",
        )
    python = string(f"{where}.python", spec["python"]) if "python" in spec else None
    chosen = override if override is not None else spec.get("names")
    names = (
        []
        if chosen is None
        else names_given(chosen, "--set.mutants" if override is not None else f"{where}.names")
    )
    out = []
    for c in cells:
        if c.params["arm"] != arm or c.params.get("profile") is False:
            continue
        for name in planned(mode_of(c.params)) if chosen is None else names:
            out.append((c, name, tuple(p.replace("{version}", version(name)) for p in paths), python))
    return out


def mode_of(params: dict[str, Any]) -> str:
    """The H200 plan's mode of a cell: graph (CUDA graphs) or eager."""
    return "graph" if params.get("cuda_graph", True) else "eager"
