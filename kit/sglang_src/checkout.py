"""The fix arm from an sglang git checkout instead of the kit's wheel: patch the tree, verified by AST."""

from __future__ import annotations

import subprocess
from pathlib import Path

from kit.errors import BuildStateError, InputError
from kit.paths import PR_PATCH
from kit.sglang_src.patch import apply_patch
from kit.sglang_src.releases import PR_CARRIER, PR_COMMIT
from kit.sglang_src.source import CHECKOUT_DIR, layout_root
from kit.sglang_src.verify import detect_state


def patch_git_checkout(checkout: Path | str) -> dict:
    """Apply the kit's PR #29654 patch to an sglang checkout at the parent of 45314a9 (python/sglang/...).

    Refuses unless the tree is in the bug state before, and checks it is in the PR's fix state after.
    """
    checkout = Path(checkout)
    if layout_root(checkout) != checkout / CHECKOUT_DIR:
        raise InputError(f"{checkout}: not an sglang git checkout (no python/sglang/)", path=checkout)
    warn = []
    head = _git(checkout, "rev-parse", "HEAD")
    parent = _git(checkout, "rev-parse", f"{PR_COMMIT}^")
    if head is None:
        warn.append("not a git repository (or git missing): cannot check the commit")
    elif parent is None:
        warn.append(f"commit {PR_COMMIT[:9]} is not in this clone: cannot check HEAD is its parent")
    elif head != parent:
        warn.append(
            f"HEAD {head[:9]} is not the parent of {PR_COMMIT[:9]} ({parent[:9]}): the patch may still apply"
        )
    before = detect_state(checkout)
    if before["state"] != "bug":
        raise BuildStateError(
            f"{checkout} is in state {before['state']!r} (carrier {before['carrier']}), not 'bug': "
            f"nothing to patch (check out the parent of {PR_COMMIT[:7]})"
        )
    changed = apply_patch(checkout, PR_PATCH.read_text(encoding="utf-8"))
    after = detect_state(checkout)
    if after["state"] != "fix" or after["carrier"] != PR_CARRIER:
        raise BuildStateError(
            f"{checkout}: patched, but the detector says {after['state']} ({after['carrier']}); "
            "inspect the tree"
        )
    return {
        "checkout": str(checkout),
        "head": head,
        "changed": changed,
        "before": before["state"],
        "after": after["state"],
        "carrier": after["carrier"],
        "warnings": warn,
    }


def _git(tree: Path, *args: str) -> str | None:
    try:
        res = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.strip() if res.returncode == 0 else None
