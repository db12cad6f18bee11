"""The mutation suite's registry: plausible WRONG fixes of PR #29654, what each gets wrong, and what must kill
it, on CPU (the mini engine, eager) and on real sglang (the H200, CUDA graphs and eager).

Each mutant is a patch against sglang 0.5.14 (patches/mutants/<name>.patch, written by
scripts/mutant_patches.py from the kit's own fix; its first line says the mistake), built by
`kit build --patch` as 0.5.14+<label>, and carried by the mini engine as the same mistake
(kit.backends.mini.mistakes, params `mutant`). The gate's checks (kit.compare.gate.CHECKS) that kill it are
measured by kit.compare.mutation; `cpu` and `h200` below are what they must be. Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kit.errors import UsageError
from kit.paths import PATCHES

MUTANT_PATCHES = PATCHES / "mutants"

# What the issue asks the suite to cover, one kind per mutant.
KINDS = {
    "never-shares": "sharing that never happens",
    "no-saving": "sharing with the indexer still called",
    "when": "a top-k shared but wrong for the later steps: when it is cleared",
    "where": "a top-k shared but wrong for the later steps: where it comes from",
    "whose": "a top-k shared but wrong for the later steps: whose it is (requests mixed up)",
    "leak": "a change that leaks into the target's verify forward",
    "eager-only": "a change that breaks only in eager mode",
    "graph-only": "a change that breaks only under CUDA graphs",
}


@dataclass(frozen=True)
class Mutant:
    name: str
    kind: str  # KINDS
    verify_state: str  # what `kit verify` says of the build (fix: it cannot tell the mutant from the fix)
    cpu: frozenset[str]  # gate checks that must kill it on CPU (mini, eager); empty: it must equal the fix
    # real sglang per mode ("graph", "eager"): gate checks expected to fail; "preflight": the kit refuses to
    # run the build as a fix (kit verify is not `fix`); "crash": sglang dies starting it (graph capture)
    h200: dict[str, frozenset[str] | str] = field(default_factory=dict)
    why_cpu: str = ""  # when `cpu` is empty: why an eager CPU run cannot kill it
    # on CPU with the CUDA-graph runner's static batch (mini params static_batch): the checks that must kill
    # it there; None: not run in that mode (its mistake does not depend on the per-round objects)
    cpu_static: frozenset[str] | None = None
    why_h200: str = ""  # where the H200 outcome was not the one predicted before the runs: what happened

    @property
    def patch(self) -> Path:
        return MUTANT_PATCHES / f"{self.name}.patch"

    @property
    def mistake(self) -> str:
        """The patch's one-line header, without its name."""
        first = self.patch.read_text(encoding="utf-8").split("\n", 1)[0]
        return first.removeprefix(f"# {self.name}: ")

    @property
    def eager_differs(self) -> bool:
        """Whether the H200 run must include eager mode (the prediction differs from graphs)."""
        return self.h200.get("eager") != self.h200.get("graph")


def _s(*checks: str) -> frozenset[str]:
    return frozenset(checks)


LAUNCHES, ACCEPTANCE, ACCURACY, TOKENS, SHARE = "launches", "acceptance", "accuracy", "tokens", "share_model"

# Predicted before the H200 runs: 0 launches per round (the graph replays the warm-up's top-k). Measured: the
# worker's kept top-k, made while capturing batch size 2, reaches the capture of batch size 1, and sglang's
# DSA backend asserts (topk_indices rows 2 > num_tokens 1): the server never starts, twice out of two.
_KEPT_IN_CAPTURE = (
    "predicted 0 launches per round under graphs; sglang instead dies in the draft graph capture: the top-k "
    "the worker kept from capturing batch size 2 reaches batch size 1 (topk_indices rows 2 > num_tokens 1)"
)

MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in (
        Mutant(
            "clear-each-step",
            "never-shares",
            "fix",
            _s(LAUNCHES, SHARE),
            {"graph": _s(LAUNCHES, SHARE), "eager": _s(LAUNCHES, SHARE)},
        ),
        Mutant(
            "spec-info-replaced",
            "never-shares",
            "unknown",
            _s(LAUNCHES, SHARE),
            {"graph": "preflight", "eager": "preflight"},
        ),
        Mutant(
            "indexer-still-called",
            "no-saving",
            "fix",
            _s(LAUNCHES),
            {"graph": _s(LAUNCHES), "eager": _s(LAUNCHES)},
        ),
        Mutant(
            "indexer-called-eager",
            "eager-only",
            "fix",
            _s(LAUNCHES),
            {"graph": _s(), "eager": _s(LAUNCHES)},
        ),
        Mutant(
            "no-clear",
            "graph-only",
            "fix",
            _s(),
            {"graph": _s(LAUNCHES, ACCEPTANCE, SHARE), "eager": _s()},
            why_cpu="equal to the fix in eager mode: each round's spec_info is a fresh object, so the "
            "dropped clears change nothing there; only a CUDA-graph capture reuses one spec_info",
            cpu_static=_s(LAUNCHES, SHARE),
        ),
        Mutant(
            "worker-kept",
            "when",
            "fix",
            _s(LAUNCHES, SHARE),
            {"graph": "crash", "eager": _s(LAUNCHES, ACCEPTANCE, SHARE)},
            why_h200=_KEPT_IN_CAPTURE,
        ),
        Mutant(
            "first-topk-kept",
            "where",
            "fix",
            _s(SHARE),
            {"graph": "crash", "eager": _s(ACCEPTANCE, SHARE)},
            why_h200=_KEPT_IN_CAPTURE,
        ),
        Mutant(
            "pool-slot-mixup",
            "whose",
            "fix",
            _s(ACCEPTANCE, SHARE),
            {"graph": _s(ACCEPTANCE, SHARE), "eager": _s(ACCEPTANCE, SHARE)},
        ),
        Mutant(
            "verify-leak",
            "leak",
            "fix",
            _s(ACCEPTANCE, ACCURACY, TOKENS, SHARE),
            {"graph": _s(), "eager": _s(ACCEPTANCE, ACCURACY, TOKENS, SHARE)},
        ),
    )
}


def mutant(name: str) -> Mutant:
    try:
        return MUTANTS[name]
    except KeyError:
        raise UsageError(f"unknown mutant {name!r}: one of {', '.join(MUTANTS)}", param="mutant") from None


def h200_plan() -> list[tuple[str, str]]:
    """(mutant, mode) runs the H200 recipe makes: CUDA graphs for every mutant the kit lets run as a fix,
    eager too where the outcome differs from graphs (a build that dies in graph capture is run eager, where
    the gate itself must kill it)."""
    out = []
    for m in MUTANTS.values():
        if m.h200.get("graph") == "preflight":
            out.append((m.name, "preflight"))
            continue
        out.append((m.name, "graph"))
        if m.eager_differs:
            out.append((m.name, "eager"))
    return out


if __name__ == "__main__":  # the plan, one `name mode` line each (scripts/h200_mutants.sh reads it)
    for name, mode in h200_plan():
        print(name, mode)
