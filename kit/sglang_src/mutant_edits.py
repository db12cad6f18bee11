"""Where the mutants' patches edit the kit's fix (sglang 0.5.14 + pr29654.patch): the fixed files, the pieces
of them each edit replaces, and the edits several mutants share. What each mutant edits is its row of
kit.sglang_src.mutants.MUTANTS; scripts/mutant_patches.py writes the patches from those rows.

Each piece must occur exactly once in its fixed file (the script refuses otherwise). Stdlib only.
"""

from __future__ import annotations

Edit = tuple[str, str, str]  # (file in wheel layout, old text of the fixed file, new text)

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


def eager_gate_edit() -> Edit:
    """forward_mla's eager branch runs the NextN's indexer even when handed a shared top-k (which wins)."""
    call = "".join("    " + line + "\n" for line in INDEXER_CALL.splitlines())
    old = EAGER_GATE + call
    new = (
        "                    if not self.skip_topk or self.is_nextn:\n"
        "                        topk_indices = self.indexer(\n" + call + "                        "
        "if prev_topk_indices is not None:  # the shared top-k wins\n"
        "                            topk_indices = prev_topk_indices\n"
    )
    return MLA, old, new


def capture_gate_edit() -> Edit:
    """The same in forward_mla's CUDA-graph (alt stream) branch."""
    old = CAPTURE_GATE + INDEXER_CALL
    new = (
        "                if not self.skip_topk or self.is_nextn:\n"
        "                    topk_indices = self.indexer(\n" + INDEXER_CALL + "                    "
        "if prev_topk_indices is not None:  # the shared top-k wins\n"
        "                        topk_indices = prev_topk_indices\n"
    )
    return MLA, old, new


def shared_topk_edit(*lines: str) -> Edit:
    """The NextN hands its later draft steps a damaged copy of step 0's top-k: `lines` edit `shared` (a
    clone of the [tokens, index_topk] KV locations step 0 selected and attended with itself)."""
    body = "".join(f"                        {line}\n" for line in lines)
    new = (
        "                if forward_batch.reuse_mtp_topk_indices:\n"
        "                    if topk_indices is not None and (\n"
        "                        forward_batch.spec_info.mtp_topk_indices is None\n"
        "                    ):\n"
        "                        shared = topk_indices.clone()  # step 0's selection, for the later steps\n"
        + body
        + "                        topk_indices = shared\n"
        "                    forward_batch.spec_info.mtp_topk_indices = topk_indices\n"
    )
    return NEXTN, NEXTN_WRITE, new


def worker_init(line: str) -> Edit:
    """A new attribute on EagleDraftWorker, set right after index_share_for_mtp_iteration."""
    return WORKER, WORKER_INIT, WORKER_INIT.replace("        )\n", "        )\n" + line, 1)


FILES = (FBI, NEXTN, INFO, WORKER, MLA)  # every file a mutant edits, in the patches' order
