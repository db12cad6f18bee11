"""Before an arm starts: the installed sglang must be the build the arm needs, a release whose probe
targets the registry has checked, every target of its set must exist in it, and nvtx, nsys and the port must
be there. Each refusal is one line that names the fix.

Each arm needs a different sglang build installed (0.5.14 for "bug", 0.5.14+pr29654 for "fix"), so the
installed build's state is read by AST (kit.sglang_src.verify), never by importing sglang. A release the
registry does not know is refused with the probe-check report of every target set, unless the run asks
for classifier_only: then nothing is probed and every artifact says so.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from kit.arms import EXPECTED_STATE
from kit.backends.sglang.http import HOST
from kit.backends.sglang.ports import port_busy
from kit.errors import BuildStateError, ProbeTargetError, ToolMissing, UsageError
from kit.paths import BUILD
from kit.probe.targets import OVERRIDE_TARGETS
from kit.sglang_src import releases
from kit.trace import nsys as capture

if TYPE_CHECKING:
    from kit.backends.sglang.params import SglangParams

KNOWN_STATES = ("absent", "bug", "fix")  # what `kit verify` can tell apart ("unknown" is refused)


def _install_hint(arm: str) -> str:
    built = sorted(BUILD.glob(f"*/sglang-{releases.PATCHED}-*.whl"))
    return releases.install_hint(arm, str(built[-1]) if built else None)


def check_state(arm: str, state: dict, where: str) -> None:
    """One-line refusal when the installed sglang's state does not match the arm.

    `fix` and `upstream` both need a fixed build; the carrier tells the kit's patch (the PR's naming)
    from the later release that renamed it. `off` runs on any build the kit can read.
    """
    st, carrier, ver = state.get("state"), state.get("carrier"), state.get("version")
    if st == "unknown":
        raise BuildStateError(
            f"cannot tell whether the sglang at {where} ({ver}) has the bug or the fix: "
            f"{'; '.join(state.get('reasons') or [])}",
            arm=arm,
            state=st,
        )
    expected = EXPECTED_STATE[arm]
    ok = st in KNOWN_STATES if expected is None else st == expected
    if ok and expected == "fix":
        ok = (carrier == releases.PR_CARRIER) == (arm == "fix")
    if not ok:
        raise BuildStateError(
            f"arm {arm!r} cannot run on the installed sglang {ver} (state {st}, carrier {carrier}, "
            f"{where}): {_install_hint(arm)}",
            arm=arm,
            state=st,
        )


def check_port(port: int | None) -> None:
    """A port the user chose must be free (the kit picks a free one itself otherwise)."""
    if port is not None and port_busy(port):
        raise UsageError(
            f"port {port} on {HOST} is already in use: stop what holds it or leave port unset", param="port"
        )


def preflight(p: SglangParams, arm: str) -> dict:
    """State guard, the release's probe-target set and its targets (and the control override's), nvtx and
    nsys, port; a KitError before anything is started."""
    from kit.probe.check import choose, missing, probe_check, refusal, unknown_release, warnings
    from kit.sglang_src.source import installed_sglang_dir, module_locations
    from kit.sglang_src.verify import detect_state

    python = p.python or sys.executable
    pkg = installed_sglang_dir(python)
    state = detect_state(pkg)
    check_state(arm, state, str(pkg))
    choice = choose(pkg)
    report = choice.report
    out: dict[str, Any] = {
        "sglang_dir": str(pkg),
        "state": state,
        "sglang_version": choice.version,
        "target_set": choice.target_set,
        "target_set_chosen_by": choice.chosen_by,
        "probe_check": report,
        "warnings": warnings(report),
        "nsys": None,
        "nsys_version": None,
    }
    if choice.target_set is None:
        out["probe_check_missing"] = {k: missing(r) for k, r in choice.reports.items()}
        if p.classifier_only:
            out["warnings"] = [f"classifier_only: sglang {choice.version} ({choice.chosen_by}), not probed"]
        elif p.profile or p.target_topk:
            raise ProbeTargetError(
                f"{unknown_release(choice, str(pkg))}. To run it anyway without the probe, counting launches "
                "with the NVTX-free kernel classifier only: classifier_only (kit run --classifier-only)",
                missing=missing(report),
            )
    elif p.classifier_only:
        out["warnings"].append(f"classifier_only although probe-target set {choice.target_set} applies")
    if p.target_topk:  # a control run: the override's targets must be there, profiled or not
        override = probe_check(pkg, OVERRIDE_TARGETS, scan_tree=False)
        out["override_check"] = override
        message = refusal(override, str(pkg))
        if message:
            raise ProbeTargetError(f"target_topk={p.target_topk}: {message}", missing=missing(override))
    if p.profile:
        message = None if p.classifier_only else refusal(report, str(pkg))
        if message:
            raise ProbeTargetError(message, missing=missing(report))
    if p.under_nsys:  # (torch: sglang's own profiler, record_function ranges)
        if not p.classifier_only and module_locations("nvtx", python) is None:
            raise ToolMissing(
                f"the nvtx package is missing for {python}: pip install nvtx (into the sglang env); "
                "without it the probe's ranges would be silently absent",
                tool="nvtx",
            )
        nsys = capture.find_nsys()
        if nsys is None:
            raise ToolMissing(
                "nsys not found: put Nsight Systems on PATH or set KIT_NSYS (or run with profile off)",
                tool="nsys",
            )
        out["nsys"], out["nsys_version"] = nsys, capture.nsys_version(nsys)
    check_port(p.port)
    return out
