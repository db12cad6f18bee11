"""The mutation suite's registry: plausible WRONG fixes of PR #29654, what each gets wrong, and what must kill
it, on CPU (the mini engine, eager) and on real sglang (the H200, CUDA graphs and eager).

MUTANTS is the one table keyed by mutant name. Each row is a patch against sglang 0.5.14
(patches/mutants/<name>.patch: its mistake line and its edits of the kit's fix, kit.sglang_src.mutant_edits,
which scripts/mutant_patches.py turns into the file), built by `kit build --patch` as 0.5.14+<label>, and
the same mistake as the mini engine makes it (`mini`: kit.backends.mini.mistakes, params `mutant`). The
gate's checks (kit.compare.gate.CHECKS) that kill it are measured by kit.compare.mutation; `cpu` and `h200`
below are what they must be. Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kit.errors import UsageError
from kit.paths import PATCHES
from kit.sglang_src import mutant_edits as E

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
    "part": "a top-k shared but damaged in part: slots today's task workloads never read (issue 32)",
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
    # The mistake, once for each place that makes it: in words (the patch's first line), as the patch's edits
    # of the kit's fix (scripts/mutant_patches.py writes patches/mutants/<name>.patch from them), and as the
    # mini engine makes it (the fields of kit.backends.mini.mistakes.Mistakes that differ from the fix).
    mistake: str = ""
    edits: tuple[E.Edit, ...] = ()
    mini: dict[str, bool | str] = field(default_factory=dict)

    @property
    def patch(self) -> Path:
        return MUTANT_PATCHES / f"{self.name}.patch"

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
            mistake="clears the carried top-k after every draft step (beside positions.add_), so no step "
            "finds one: sharing never happens",
            edits=(
                (
                    E.WORKER,
                    E.STEP_END,
                    E.STEP_END + "            if self.index_share_for_mtp_iteration:\n"
                    "                spec_info.mtp_topk_indices = None  # used once: drop it\n",
                ),
            ),
            mini={"clear_each_step": True},
        ),
        Mutant(
            "spec-info-replaced",
            "never-shares",
            "unknown",
            _s(LAUNCHES, SHARE),
            {"graph": "preflight", "eager": "preflight"},
            mistake="writes the top-k into a new spec_info (dataclasses.replace) set on the per-step "
            "ForwardBatch copy, which is thrown away: sharing never happens, and kit verify cannot call it a "
            "fix",
            edits=(
                (E.NEXTN, "import logging\n", "import dataclasses\nimport logging\n"),
                (
                    E.NEXTN,
                    E.NEXTN_WRITE,
                    "                if forward_batch.reuse_mtp_topk_indices:\n"
                    "                    forward_batch.spec_info = dataclasses.replace(\n"
                    "                        forward_batch.spec_info, mtp_topk_indices=topk_indices\n"
                    "                    )\n",
                ),
            ),
            mini={"replace_spec_info": True},
        ),
        Mutant(
            "indexer-still-called",
            "no-saving",
            "fix",
            _s(LAUNCHES),
            {"graph": _s(LAUNCHES), "eager": _s(LAUNCHES)},
            mistake="shares the first step's top-k, but forward_mla still runs the NextN's indexer on every "
            "draft step and throws its result away: no launch saved",
            edits=(E.capture_gate_edit(), E.eager_gate_edit()),
            mini={"indexer_despite_reuse": "always"},
        ),
        Mutant(
            "indexer-called-eager",
            "eager-only",
            "fix",
            _s(LAUNCHES),
            {"graph": _s(), "eager": _s(LAUNCHES)},
            mistake="edits only forward_mla's eager branch (the one without the alt stream) to run the "
            "NextN's indexer anyway: right under CUDA graphs, no launch saved in eager mode",
            edits=(E.eager_gate_edit(),),
            mini={"indexer_despite_reuse": "eager"},
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
            mistake="drops both clears of the carried top-k (each round's spec_info is a fresh object); "
            "the CUDA-graph capture reuses one spec_info, so the graph replays the warm-up's top-k and never "
            "runs the indexer",
            edits=(
                (
                    E.WORKER,
                    E.LOOP_START,
                    E.LOOP_START.replace("            spec_info.mtp_topk_indices = None\n", ""),
                ),
                (
                    E.WORKER,
                    E.LOOP_END,
                    E.LOOP_END.replace("            spec_info.mtp_topk_indices = None\n", ""),
                ),
            ),
            mini={"clear_per_round": False},
        ),
        Mutant(
            "worker-kept",
            "when",
            "fix",
            _s(LAUNCHES, SHARE),
            {"graph": "crash", "eager": _s(LAUNCHES, ACCEPTANCE, SHARE)},
            why_h200=_KEPT_IN_CAPTURE,
            mistake="keeps the top-k on the draft worker (it outlives every ForwardBatch copy) and hands it "
            "to each step; only spec_info is cleared, so later rounds reuse an old top-k and run no indexer",
            edits=(
                E.worker_init(
                    "        self.mtp_topk_indices = None  # the shared top-k, kept across steps\n"
                ),
                (
                    E.WORKER,
                    E.STEP_FORWARD,
                    "                if self.index_share_for_mtp_iteration:\n"
                    "                    spec_info.mtp_topk_indices = self.mtp_topk_indices\n"
                    + E.STEP_FORWARD
                    + "                if self.index_share_for_mtp_iteration:\n"
                    "                    self.mtp_topk_indices = spec_info.mtp_topk_indices\n",
                ),
            ),
            mini={"worker_keeps": "every"},
        ),
        Mutant(
            "first-topk-kept",
            "where",
            "fix",
            _s(SHARE),
            {"graph": "crash", "eager": _s(ACCEPTANCE, SHARE)},
            why_h200=_KEPT_IN_CAPTURE,
            mistake="the first draft step always runs the indexer, but the worker keeps only the first "
            "top-k it ever sees and hands it to the later steps: one launch per round, a stale top-k",
            edits=(
                E.worker_init("        self.mtp_topk_indices = None  # the first step's top-k\n"),
                (
                    E.WORKER,
                    E.STEP_FORWARD,
                    "                if self.index_share_for_mtp_iteration:  # step 0 computes its own\n"
                    "                    spec_info.mtp_topk_indices = "
                    "None if i == 0 else self.mtp_topk_indices\n"
                    + E.STEP_FORWARD
                    + "                if self.index_share_for_mtp_iteration "
                    "and self.mtp_topk_indices is None:\n"
                    "                    self.mtp_topk_indices = spec_info.mtp_topk_indices\n",
                ),
            ),
            mini={"worker_keeps": "first"},
        ),
        Mutant(
            "pool-slot-mixup",
            "whose",
            "fix",
            _s(ACCEPTANCE, SHARE),
            {"graph": _s(ACCEPTANCE, SHARE), "eager": _s(ACCEPTANCE, SHARE)},
            mistake="keeps each request's top-k in a CUDA-graph-safe buffer written at rows req_pool_indices "
            "but read back as rows [:bs]: requests get another request's top-k, or none",
            edits=(
                E.worker_init(
                    "        self.mtp_topk_buf = None  # [req_pool_size, index_topk], one row per slot\n"
                ),
                (
                    E.WORKER,
                    E.STEP_FORWARD,
                    "                if self.index_share_for_mtp_iteration and i > 0:\n"
                    "                    spec_info.mtp_topk_indices = self.mtp_topk_buf"
                    "[: forward_batch.batch_size]\n"
                    + E.STEP_FORWARD
                    + "                if self.index_share_for_mtp_iteration and i == 0:\n"
                    "                    topk = spec_info.mtp_topk_indices\n"
                    "                    if self.mtp_topk_buf is None:\n"
                    "                        rows = self.req_to_token_pool.req_to_token.shape[0]\n"
                    "                        self.mtp_topk_buf = topk.new_full((rows, topk.shape[-1]), -1)\n"
                    "                    self.mtp_topk_buf[forward_batch.req_pool_indices] = topk\n",
                ),
            ),
            mini={"slot_buffer": True},
        ),
        Mutant(
            "verify-leak",
            "leak",
            "fix",
            _s(ACCEPTANCE, ACCURACY, TOKENS, SHARE),
            {"graph": _s(), "eager": _s(ACCEPTANCE, ACCURACY, TOKENS, SHARE)},
            mistake="hands the round's shared top-k on to the target's verify, which reuses it for the "
            "drafted tokens instead of running its own indexer: the target reads what the draft selected",
            edits=(
                (
                    E.INFO,
                    "    # Shape info for padding\n    num_tokens_per_req: int = -1  # -1 auto-fills from "
                    "draft_token_num.\n",
                    "    # Shape info for padding\n    num_tokens_per_req: int = -1  # -1 auto-fills from "
                    "draft_token_num.\n"
                    "    # The draft round's shared DSA top-k, reused by the target's verify.\n"
                    "    draft_topk_indices: Optional[torch.Tensor] = None\n",
                ),
                E.worker_init(
                    "        self.round_topk_indices = None  # the last draft round's shared top-k\n"
                ),
                (
                    E.WORKER,
                    E.VERIFY_INPUT,
                    E.VERIFY_INPUT.replace(
                        "            draft_probs=draft_probs,\n",
                        "            draft_probs=draft_probs,\n"
                        "            draft_topk_indices=self.round_topk_indices,\n",
                    ),
                ),
                (
                    E.WORKER,
                    E.LOOP_END,
                    E.LOOP_END.replace(
                        "        if self.index_share_for_mtp_iteration:\n",
                        "        if self.index_share_for_mtp_iteration:\n"
                        "            self.round_topk_indices = spec_info.mtp_topk_indices\n",
                    ),
                ),
                (
                    E.MLA,
                    E.EAGER_GATE,
                    "                    shared = "
                    'getattr(forward_batch.spec_info, "draft_topk_indices", None)\n'
                    "                    if shared is not None and "
                    "forward_batch.forward_mode.is_target_verify():\n"
                    "                        # the drafted tokens' selection, reused for their verification\n"
                    "                        per_req = q_lora.shape[0] // shared.shape[0]\n"
                    "                        topk_indices = shared.repeat_interleave(per_req, dim=0)\n"
                    "                    elif not self.skip_topk or (\n"
                    "                        self.is_nextn and prev_topk_indices is None\n"
                    "                    ):\n"
                    "                        topk_indices = self.indexer(\n",
                ),
            ),
            mini={"topk_to_verify": True},
        ),
    )
}


# Issue 32: wrong fixes that damage only part of the shared top-k. sgl-kernel's radix top-k writes the
# selected positions that beat the threshold first (slots 0.., roughly in position order) and the tied rest
# after them, so on same-target and moving-target every fact a draft reads sits in slots 0..15 and each of
# these passes the gate there; the any-slot workload spreads the deciding fact over every slot.
# On the mini the carrier holds draft-cache positions, and at 4k the tied fillers of the tail are the earliest
# positions, where the facts lie: another request's tail positions, or the tail shifted by one, land on this
# request's facts, and on moving-target a draft answers right where sharing must miss (the share model).
_TAIL_LANDS_ON_FACTS = _s(SHARE)
_PART_WHY_CPU = (
    "the CPU suite's workloads (4k, same-target and moving-target) hold every fact a draft reads in slots "
    "0..15; any-slot is where they die (the H200 set, data/results/mutants/h200-part)"
)


def _part(name: str, mistake: str, *lines: str, why_h200: str = "", cpu: frozenset[str] = _s()) -> Mutant:
    return Mutant(
        name,
        "part",
        "fix",
        cpu,
        {"graph": _s(SHARE), "eager": _s(SHARE)},  # it acts in both modes: graphs are run
        why_cpu=_PART_WHY_CPU,
        mistake=mistake,
        edits=(E.shared_topk_edit(*lines),),
        why_h200=why_h200,
        mini={"corrupt": name},
    )


PART_MUTANTS = (
    _part(
        "topk-tail-dropped",
        "hands the later draft steps only the first half of step 0's top-k (slots 1024.. set to -1), as a "
        "buffer sized index_topk // 2 would",
        "shared[:, 1024:] = -1  # a half-sized buffer",
    ),
    _part(
        "topk-quarter-dropped",
        "loses the second of four 512-slot chunks of step 0's top-k (slots 512..1023 set to -1), as a "
        "chunked copy with an off-by-one chunk index would",
        "shared[:, 512:1024] = -1  # chunk 1 of 4 never copied",
    ),
    _part(
        "topk-scattered-dropped",
        "drops every fourth slot of step 0's top-k from slot 16 on (-1), as a strided copy would",
        "shared[:, 16::4] = -1  # a strided copy",
    ),
    _part(
        "topk-head-kept",
        "hands the later draft steps only the first 64 slots of step 0's top-k (the rest -1), as a truncated "
        "share would",
        "shared[:, 64:] = -1  # a truncated share",
    ),
    _part(
        "topk-tail-other-request",
        "fills slots 1024.. of each request's shared top-k from the next request's row, as an off-by-one "
        "row offset in a batched copy of the second half would",
        "shared[:, 1024:] = topk_indices.roll(-1, 0)[:, 1024:]  # the neighbouring row",
        cpu=_TAIL_LANDS_ON_FACTS,
    ),
    _part(
        "topk-tail-shifted",
        "shifts slots 1024.. of step 0's top-k by one KV location (+1; -1 stays -1), as an off-by-one in "
        "the second half's location map would",
        "tail = shared[:, 1024:]",
        "shared[:, 1024:] = torch.where(tail >= 0, tail + 1, tail)  # off by one location",
        why_h200="predicted to pass the old workloads like the others; on moving-target the gate (b3e44e1's "
        "too) killed it: the tail's tied fillers are the earliest positions, and one shifted onto a fact "
        "that "
        "the fix's shared top-k lacked, so a draft was right where sharing must miss (prompt 6: 34 verify "
        "rounds, 36 predicted): it is not new to the old workloads",
        cpu=_TAIL_LANDS_ON_FACTS,
    ),
)
MUTANTS.update({m.name: m for m in PART_MUTANTS})


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


if __name__ == "__main__":  # the plan, one `name mode` line each (kit.pipeline.mutant_cells uses h200_plan)
    for name, mode in h200_plan():
        print(name, mode)
