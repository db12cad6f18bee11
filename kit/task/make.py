"""`kit make-checkpoint --task`: write the task checkpoint (kit.task.weights' values in kit.checkpoint's
files) and label it by the float32 reference's self-check (kit.task.reference), which is why it sits above
both: the reference builds its model from the weights, never the other way round.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kit.checkpoint import files as ckfiles
from kit.checkpoint import layout
from kit.errors import ToolMissing, UsageError
from kit.task.spec import TASK_FILE, TASK_FORMAT, TaskSpec
from kit.task.weights import TASK_GAINS, TaskValues, task_config, task_tokenizer

# sha256 of what make_task_checkpoint(out) writes with the default arguments (tests/test_task_checkpoint.py
# checks it on CPU): a GPU host's manifest says in "reference_match" whether it built the very same weights.
REFERENCE_SHA256: dict[str, str] = {
    "config.json": "479311461821a2264420643625280bb0761b1a1bf04c4e2cd5e25db80e0f00ca",
    "generation_config.json": "9c8879c84d1093ea0930a5550de42c3e631861858d04287380550f5f04cd44c2",
    "model.safetensors": "80b50a773c3a4b96f905a4d0009e4362bc6c4debfe5bf01806dc3b91d6430f9e",
    "special_tokens_map.json": "c3974182ae9574047e7fdacdbabf9702ddf43331af733e3d58bd438edb4af4c2",
    "task.json": "a9518c9a8e4b5d5eafc75a1945f7fb5b222ba57a8f27824a8a033467728b9cd3",
    "tokenizer.json": "b0ff980e9853233091eec05c461b4ed3e4a81e7e67986275150d57062695e60f",
    "tokenizer_config.json": "6a3b8122bd42e929b8c5a64e9047795bccb250ac03af22f3ae4a1731aed815d7",
}
SELF_CHECK_BAR = 0.95
_GAINS0 = dict(TASK_GAINS)


def _check_task_tokenizer(path: Path, spec: TaskSpec) -> str | None:
    try:
        import tokenizers
    except ImportError:
        return None
    tok = tokenizers.Tokenizer.from_file(str(path))
    ids = [5, spec.node(3), spec.unknown_id, spec.fact(1, 2), spec.vocab_size - 1]
    text = tok.decode(ids)
    if tok.get_vocab_size() != spec.vocab_size or tok.encode(text, add_special_tokens=False).ids != ids:
        raise ToolMissing(
            f"{path}: tokenizers {tokenizers.__version__} does not read the task tokens back",
            tool="tokenizers",
        )
    return tokenizers.__version__


def make_task_checkpoint(
    out_dir: Path,
    seed: int = 0,
    *,
    n_keys: int = 128,
    n_groups: int = 8,
    draft_miss_per_group: int = 2,
    overrides: dict[str, Any] | None = None,
    self_check: bool = True,
    check_context: int = 4096,
    check_prompts: int = 2,
    check_new_tokens: int = 32,
) -> dict[str, Any]:
    """Write the task checkpoint into `out_dir` (new or empty); return the manifest (kit-checkpoint.json).

    The self-check runs the float32 reference (kit.task.reference) on `check_prompts` prompts of each
    workload; only at accuracy >= SELF_CHECK_BAR on all of them does `format` name the task.
    """
    from kit import __version__
    from kit.provenance import git_sha

    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UsageError(f"seed must be a non-negative integer, got {seed!r}", param="seed")
    spec = TaskSpec(seed=seed, n_keys=n_keys, n_groups=n_groups, draft_miss_per_group=draft_miss_per_group)
    cfg = task_config(spec, overrides)
    specs = layout.tensor_specs(cfg)

    def manifest(tmp: Path, files: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
        check: dict[str, Any] = {"ran": False}
        if self_check:
            from kit.task.reference import self_check as run_self_check

            check = run_self_check(tmp, check_context, check_prompts, check_new_tokens, SELF_CHECK_BAR)
        passed = bool(check.get("passed"))
        return {
            "format": TASK_FORMAT if passed else ckfiles.FORMAT,
            "task_checkpoint": passed,
            "task_note": (
                "self-check passed: the reference answers the retrieval task"
                if passed
                else "NOT a task checkpoint: the self-check did not run or did not reach the accuracy bar"
            ),
            "seed": seed,
            "overrides": overrides or {},
            "task": spec.to_json(),
            "gains": TASK_GAINS,
            "self_check": check,
            "tokenizer_checked_with": facts["tokenizer_checked_with"],
            "summary": ckfiles.summary(cfg, specs),
            "files": files,
            "reference_match": (
                all(files[n]["sha256"] == h for n, h in REFERENCE_SHA256.items())
                if REFERENCE_SHA256
                and (seed, n_keys, n_groups, draft_miss_per_group) == (0, 128, 8, 2)
                and not overrides
                and TASK_GAINS == _GAINS0
                else None
            ),
            "kit_version": __version__,
            "git_sha": git_sha(),
            "generation_seconds": facts["generation_seconds"],
            "self_check_seconds": check.get("seconds"),
        }

    return ckfiles.publish(
        Path(out_dir),
        cfg,
        specs,
        TaskValues(spec, cfg),
        task_tokenizer(spec, cfg["max_position_embeddings"]),
        lambda path: _check_task_tokenizer(path, spec),
        {TASK_FILE: spec.to_json()},
        manifest,
    )
