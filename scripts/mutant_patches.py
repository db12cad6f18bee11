"""Write kit/sglang_src/patches/mutants/*.patch: plausible WRONG fixes of PR #29654 against sglang 0.5.14.

    python scripts/mutant_patches.py [OUT_DIR]      # default kit/sglang_src/patches/mutants

Each mutant is the kit's own fix (kit/sglang_src/patches/pr29654.patch) plus one mistake. Its row of the
registry (kit.sglang_src.mutants.MUTANTS) says the mistake in one line and as exact edits of the fixed files;
this script diffs them against the pinned 0.5.14 wheel, so every patch applies to the same wheel `kit build`
starts from, with the mistake line first. What each must do on CPU and on the H200 is in the same row. A test
checks that this script reproduces the committed files byte for byte.
"""

from __future__ import annotations

import difflib
import sys
import tempfile
import zipfile
from pathlib import Path

import _checkout  # noqa: F401  (this checkout's kit first on sys.path)

from kit.paths import PATCHES, PR_PATCH
from kit.sglang_src.mutant_edits import FILES
from kit.sglang_src.mutants import MUTANTS
from kit.sglang_src.patch import apply_patch
from kit.sglang_src.releases import BASELINE
from kit.sglang_src.wheels import fetch_wheel

OUT = PATCHES / "mutants"


def _sources() -> dict[str, str]:
    with zipfile.ZipFile(fetch_wheel(BASELINE)) as zf:
        return {rel: zf.read(rel).decode("utf-8") for rel in FILES}


def _fixed(pristine: dict[str, str]) -> dict[str, str]:
    with tempfile.TemporaryDirectory(prefix="kit-mutants-") as tmp:
        for rel, text in pristine.items():
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
            (Path(tmp) / rel).write_text(text, encoding="utf-8")
        apply_patch(Path(tmp), PR_PATCH.read_text(encoding="utf-8"))
        return {rel: (Path(tmp) / rel).read_text(encoding="utf-8") for rel in FILES}


def patch_text(name: str, pristine: dict[str, str], fixed: dict[str, str]) -> str:
    """The mutant's patch: its mistake line, then the diff of (fix + edits) against the pristine files."""
    m = MUTANTS[name]
    files = dict(fixed)
    for rel, old, new in m.edits:
        n = files[rel].count(old)
        if n != 1:
            raise SystemExit(f"{name}: the edit's old text occurs {n} times in {rel}, not once")
        files[rel] = files[rel].replace(old, new)
    out = [f"# {name}: {m.mistake}\n"]
    for rel in FILES:
        if files[rel] == pristine[rel]:
            continue
        a, b = pristine[rel].splitlines(keepends=True), files[rel].splitlines(keepends=True)
        out += difflib.unified_diff(a, b, f"a/{rel}", f"b/{rel}", n=3)
    return "".join(out)


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else OUT
    out.mkdir(parents=True, exist_ok=True)
    pristine = _sources()
    fixed = _fixed(pristine)
    for name in MUTANTS:
        (out / f"{name}.patch").write_text(patch_text(name, pristine, fixed), encoding="utf-8")
        print(out / f"{name}.patch")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
