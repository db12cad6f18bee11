"""Write kit/sglang_src/patches/mutants/*.patch: plausible WRONG fixes of PR #29654 against sglang 0.5.14.

    python scripts/mutant_patches.py [OUT_DIR]      # default kit/sglang_src/patches/mutants

Each mutant is the kit's own fix (kit/sglang_src/patches/pr29654.patch) plus one mistake, written as exact
edits of the fixed files and diffed against the pinned 0.5.14 wheel, so every patch applies to the same
wheel `kit build` starts from. The first line of each patch says the mistake it models (kit.sglang_src.mutants
reads it from there); what each must do on CPU and on the H200 is in that registry. A test checks that this
script reproduces the committed files byte for byte.
"""

from __future__ import annotations

import difflib
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kit.paths import PATCHES, PR_PATCH  # noqa: E402
from kit.sglang_src.patch import apply_patch  # noqa: E402
from kit.sglang_src.releases import BASELINE  # noqa: E402
from kit.sglang_src.wheels import fetch_wheel  # noqa: E402

OUT = PATCHES / "mutants"
WORKER = "sglang/srt/speculative/eagle_worker_v2.py"
NEXTN = "sglang/srt/models/deepseek_nextn.py"
INFO = "sglang/srt/speculative/eagle_info.py"
MLA = "sglang/srt/models/deepseek_common/attention_forward_methods/forward_mla.py"
FBI = "sglang/srt/model_executor/forward_batch_info.py"

# --- pieces of the fixed files that the mutants edit ---------------------------------------------------

LOOP_START = """\
        if self.index_share_for_mtp_iteration:
            forward_batch.reuse_mtp_topk_indices = True
            spec_info.mtp_topk_indices = None
"""
LOOP_END = """\
        if self.index_share_for_mtp_iteration:
            spec_info.mtp_topk_indices = None
            forward_batch.reuse_mtp_topk_indices = False
"""
STEP_FORWARD = """\
                logits_output = self.draft_runner.forward(forward_batch).logits_output
"""
STEP_END = """\
            hidden_states = logits_output.hidden_states
            forward_batch.positions.add_(1)
"""
WORKER_INIT = """\
            and self.topk == 1
        )
        self.draft_tp_context = (
"""
VERIFY_INPUT = """\
            draft_probs=draft_probs,
        )

    def draft_forward(self, forward_batch: ForwardBatch):
"""
INDEXER_CALL = """\
                        x=hidden_states,
                        q_lora=q_lora,
                        positions=positions,
                        forward_batch=forward_batch,
                        layer_id=self.layer_id,
                    )
"""
CAPTURE_GATE = """\
                if not self.skip_topk or (self.is_nextn and prev_topk_indices is None):
                    topk_indices = self.indexer(
"""
EAGER_GATE = """\
                    if not self.skip_topk or (
                        self.is_nextn and prev_topk_indices is None
                    ):
                        topk_indices = self.indexer(
"""
NEXTN_WRITE = """\
                if forward_batch.reuse_mtp_topk_indices:
                    forward_batch.spec_info.mtp_topk_indices = topk_indices
"""


def _eager_gate_edit() -> tuple[str, str]:
    call = "".join("    " + line + "\n" for line in INDEXER_CALL.splitlines())
    old = EAGER_GATE + call
    new = (
        "                    if not self.skip_topk or self.is_nextn:\n"
        "                        topk_indices = self.indexer(\n" + call + "                        "
        "if prev_topk_indices is not None:  # the shared top-k wins\n"
        "                            topk_indices = prev_topk_indices\n"
    )
    return old, new


def _capture_gate_edit() -> tuple[str, str]:
    old = CAPTURE_GATE + INDEXER_CALL
    new = (
        "                if not self.skip_topk or self.is_nextn:\n"
        "                    topk_indices = self.indexer(\n" + INDEXER_CALL + "                    "
        "if prev_topk_indices is not None:  # the shared top-k wins\n"
        "                        topk_indices = prev_topk_indices\n"
    )
    return old, new


def _worker_init(line: str) -> tuple[str, str, str]:
    """A new attribute on EagleDraftWorker, set right after index_share_for_mtp_iteration."""
    return WORKER, WORKER_INIT, WORKER_INIT.replace("        )\n", "        )\n" + line, 1)


# name -> (one-line mistake, [(file, old, new), ...]); `old` must occur exactly once in the fixed file.
MUTANTS: dict[str, tuple[str, list[tuple[str, str, str]]]] = {
    "clear-each-step": (
        "clears the carried top-k after every draft step (beside positions.add_), so no step finds one: "
        "sharing never happens",
        [
            (
                WORKER,
                STEP_END,
                STEP_END + "            if self.index_share_for_mtp_iteration:\n"
                "                spec_info.mtp_topk_indices = None  # used once: drop it\n",
            )
        ],
    ),
    "indexer-still-called": (
        "shares the first step's top-k, but forward_mla still runs the NextN's indexer on every draft step "
        "and throws its result away: no launch saved",
        [(MLA, *_capture_gate_edit()), (MLA, *_eager_gate_edit())],
    ),
    "indexer-called-eager": (
        "edits only forward_mla's eager branch (the one without the alt stream) to run the NextN's indexer "
        "anyway: right under CUDA graphs, no launch saved in eager mode",
        [(MLA, *_eager_gate_edit())],
    ),
    "no-clear": (
        "drops both clears of the carried top-k (each round's spec_info is a fresh object); the CUDA-graph "
        "capture reuses one spec_info, so the graph replays the warm-up's top-k and never runs the indexer",
        [
            (WORKER, LOOP_START, LOOP_START.replace("            spec_info.mtp_topk_indices = None\n", "")),
            (WORKER, LOOP_END, LOOP_END.replace("            spec_info.mtp_topk_indices = None\n", "")),
        ],
    ),
    "worker-kept": (
        "keeps the top-k on the draft worker (it outlives every ForwardBatch copy) and hands it to each "
        "step; only spec_info is cleared, so later rounds reuse an old top-k and run no indexer",
        [
            _worker_init("        self.mtp_topk_indices = None  # the shared top-k, kept across steps\n"),
            (
                WORKER,
                STEP_FORWARD,
                "                if self.index_share_for_mtp_iteration:\n"
                "                    spec_info.mtp_topk_indices = self.mtp_topk_indices\n"
                + STEP_FORWARD
                + "                if self.index_share_for_mtp_iteration:\n"
                "                    self.mtp_topk_indices = spec_info.mtp_topk_indices\n",
            ),
        ],
    ),
    "first-topk-kept": (
        "the first draft step always runs the indexer, but the worker keeps only the first top-k it ever "
        "sees and hands it to the later steps: one launch per round, a stale top-k",
        [
            _worker_init("        self.mtp_topk_indices = None  # the first step's top-k\n"),
            (
                WORKER,
                STEP_FORWARD,
                "                if self.index_share_for_mtp_iteration:  # step 0 computes its own\n"
                "                    spec_info.mtp_topk_indices = None if i == 0 else self.mtp_topk_indices\n"
                + STEP_FORWARD
                + "                if self.index_share_for_mtp_iteration and self.mtp_topk_indices is None:\n"
                "                    self.mtp_topk_indices = spec_info.mtp_topk_indices\n",
            ),
        ],
    ),
    "pool-slot-mixup": (
        "keeps each request's top-k in a CUDA-graph-safe buffer written at rows req_pool_indices but read "
        "back as rows [:bs]: requests get another request's top-k, or none",
        [
            _worker_init(
                "        self.mtp_topk_buf = None  # [req_pool_size, index_topk], one row per slot\n"
            ),
            (
                WORKER,
                STEP_FORWARD,
                "                if self.index_share_for_mtp_iteration and i > 0:\n"
                "                    spec_info.mtp_topk_indices = self.mtp_topk_buf"
                "[: forward_batch.batch_size]\n"
                + STEP_FORWARD
                + "                if self.index_share_for_mtp_iteration and i == 0:\n"
                "                    topk = spec_info.mtp_topk_indices\n"
                "                    if self.mtp_topk_buf is None:\n"
                "                        rows = self.req_to_token_pool.req_to_token.shape[0]\n"
                "                        self.mtp_topk_buf = topk.new_full((rows, topk.shape[-1]), -1)\n"
                "                    self.mtp_topk_buf[forward_batch.req_pool_indices] = topk\n",
            ),
        ],
    ),
    "verify-leak": (
        "hands the round's shared top-k on to the target's verify, which reuses it for the drafted tokens "
        "instead of running its own indexer: the target reads what the draft selected",
        [
            (
                INFO,
                "    # Shape info for padding\n    num_tokens_per_req: int = -1  # -1 auto-fills from "
                "draft_token_num.\n",
                "    # Shape info for padding\n    num_tokens_per_req: int = -1  # -1 auto-fills from "
                "draft_token_num.\n    # The draft round's shared DSA top-k, reused by the target's verify.\n"
                "    draft_topk_indices: Optional[torch.Tensor] = None\n",
            ),
            _worker_init("        self.round_topk_indices = None  # the last draft round's shared top-k\n"),
            (
                WORKER,
                VERIFY_INPUT,
                VERIFY_INPUT.replace(
                    "            draft_probs=draft_probs,\n",
                    "            draft_probs=draft_probs,\n"
                    "            draft_topk_indices=self.round_topk_indices,\n",
                ),
            ),
            (
                WORKER,
                LOOP_END,
                LOOP_END.replace(
                    "        if self.index_share_for_mtp_iteration:\n",
                    "        if self.index_share_for_mtp_iteration:\n"
                    "            self.round_topk_indices = spec_info.mtp_topk_indices\n",
                ),
            ),
            (
                MLA,
                EAGER_GATE,
                '                    shared = getattr(forward_batch.spec_info, "draft_topk_indices", None)\n'
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
        ],
    ),
    "spec-info-replaced": (
        "writes the top-k into a new spec_info (dataclasses.replace) set on the per-step ForwardBatch copy, "
        "which is thrown away: sharing never happens, and kit verify cannot call it a fix",
        [
            (NEXTN, "import logging\n", "import dataclasses\nimport logging\n"),
            (
                NEXTN,
                NEXTN_WRITE,
                "                if forward_batch.reuse_mtp_topk_indices:\n"
                "                    forward_batch.spec_info = dataclasses.replace(\n"
                "                        forward_batch.spec_info, mtp_topk_indices=topk_indices\n"
                "                    )\n",
            ),
        ],
    ),
}

FILES = (FBI, NEXTN, INFO, WORKER, MLA)


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
    mistake, edits = MUTANTS[name]
    files = dict(fixed)
    for rel, old, new in edits:
        n = files[rel].count(old)
        if n != 1:
            raise SystemExit(f"{name}: the edit's old text occurs {n} times in {rel}, not once")
        files[rel] = files[rel].replace(old, new)
    out = [f"# {name}: {mistake}\n"]
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
