"""Which runs may be compared: the same workload and computation, differing only in the arm (the build).

A 4k bug run against an 8k fix run gives a latency ratio that measures the context, not the fix, and
outputs that differ because the prompts do; such a pair is refused (kit compare --allow-mismatch
compares it anyway, loudly, and the gate then fails).
"""

from __future__ import annotations

from typing import Any

from kit.errors import UsageError

FEATURE = "index_share_for_mtp_iteration"  # an arm may switch it; the model is the same either way

# params.json keys that must agree (either backend's; a key neither run has is not compared)
SAME = (
    "backend",
    "model_path",
    "model",
    "preset",
    "device",
    "workload",
    "context_len",
    "num_steps",
    "eagle_topk",
    "num_draft_tokens",
    "num_requests",
    "concurrency",
    "max_new_tokens",
    "seed",
    "cuda_graph",
    "static_batch",
    "tp_size",
    "index_topk",
    "indexer_impl",
    "indexer_path",
    "target_topk",
)


def _value(params: dict[str, Any], key: str) -> Any:
    value = params.get(key)
    if key == "static_batch":  # runs from before the key existed ran without it
        return bool(value)
    if key == "model" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k != FEATURE}
    return value


def _shared_fields(va: Any, vb: Any) -> tuple[Any, Any]:
    """The model's fields both runs recorded: a field one lacks was not read by the kit that made it
    (num_attention_heads came with the TP checks), which says nothing about the checkpoint."""
    if not (isinstance(va, dict) and isinstance(vb, dict)):
        return va, vb
    both = va.keys() & vb.keys()
    return {k: va[k] for k in both}, {k: vb[k] for k in both}


def differences(pa: dict[str, Any], pb: dict[str, Any]) -> dict[str, list[Any]]:
    """key -> [a's value, b's value] for every SAME key the two runs disagree on."""
    diff = {}
    for k in SAME:
        va, vb = _value(pa, k), _value(pb, k)
        if k == "model":
            va, vb = _shared_fields(va, vb)
        if va != vb:
            diff[k] = [va, vb]
    return diff


def describe(diff: dict[str, list[Any]], la: str = "a", lb: str = "b") -> str:
    return ", ".join(f"{k} ({la} {va!r}, {lb} {vb!r})" for k, (va, vb) in diff.items())


def check(
    pa: dict[str, Any],
    pb: dict[str, Any],
    labels: tuple[str, str],
    allow: bool,
    why: str = "they are not one workload run by two builds; compare runs that differ only in the arm",
) -> dict[str, list[Any]]:
    """The differences, refused unless `allow` (then the caller warns and the gate fails)."""
    diff = differences(pa, pb)
    if diff and not allow:
        raise UsageError(
            f"{labels[0]} and {labels[1]} differ in {describe(diff, *labels)}: {why}, or pass "
            "--allow-mismatch to compare them anyway (then judged failed: the gate, kit noise)",
            param="--allow-mismatch",
        )
    return diff


def check_runs(
    pa: dict[str, Any],
    pb: dict[str, Any],
    pc: dict[str, Any] | None,
    repeat_of: str,
    allow: bool,
    labels: tuple[str, str, str] = ("a", "b", "control"),
) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    """kit compare's and kit noise's one check: a and b one workload run by two builds, and the third run
    (`pc`: kit compare's control, kit noise's repeat; None: none) a second run of the workload of the side
    it repeats (`repeat_of`, "a" or "b"). Returns (a vs b, that side vs the third run), each refused
    unless `allow`."""
    diff = check(pa, pb, labels[:2], allow)
    if pc is None:
        return diff, {}
    side = labels[0] if repeat_of == "a" else labels[1]
    why = f"the {labels[2]} must be a second run of {side}'s workload, differing at most in the arm"
    return diff, check(pa if repeat_of == "a" else pb, pc, (side, labels[2]), allow, why)
