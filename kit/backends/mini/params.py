"""Parameters of a `mini` run: defaults, validation (one-line UsageError naming the parameter), warnings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit.arms import ARMS, SHARING_RULE, check_eagle_topk
from kit.backends.mini import presets
from kit.backends.mini.workload import PROMPT_MIN
from kit.checks import at_least, choice, string
from kit.errors import KitError, UsageError
from kit.params import DEVICES, PROFILERS, RunParams, param

NVTX_SINKS = ("nvtx", "recorder", "off", "torch")
# Which lightning indexer runs (kit/mini/dsa_kernels.py): auto = sglang's own kernels (deep_gemm +
# sgl_kernel) when they import and the device is an sm90/sm100 GPU and the preset's indexer fits them,
# else the pure-torch indexer. `indexer_path` picks sglang's decode (paged) or extend (ragged) logits kernel.
INDEXER_IMPLS = ("auto", "torch", "sglang")
INDEXER_PATHS = ("paged", "ragged")
# The model the mini runs: `random` (seeded random weights of a preset, kit/backends/mini/model.py) or
# `task` (a kit.task retrieval checkpoint whose answers depend on what the indexer selects, computed by
# kit.task's reference layers: kit/backends/mini/task_model.py), with its `workload` and optionally a
# `task_checkpoint` directory (else the checkpoint is made in memory from `seed`).
MODELS = ("random", "task")
TASK_MAX_CONTEXT = 65536  # on CPU: two float32 caches of (512 + 128) values per position and request


@dataclass(kw_only=True)
class MiniParams(RunParams):
    """A mini run: the base's parameters (their defaults are the mini's) and the miniature's own."""

    model: str = param(
        "random",
        "mini: random weights or a task checkpoint",
        group="run",
        cli={"choices": list(MODELS)},
        matrix="param",
        check=choice(*MODELS),
        note="random or task (a kit.task retrieval checkpoint)",
    )
    preset: str | None = param(
        "tiny",
        "mini: model shapes (tiny, dsv32, glm5, ...)",
        group="run",
        matrix="param",
        check=string,
        note="tiny, dsv32 or glm5",
    )
    index_topk: int = param(
        2048,
        "the indexer's top-k (DeepSeek-V3.2 and GLM-5 use 2048)",
        flag=None,
        matrix="param",
        check=at_least(1),
        note="mini only",
    )
    indexer_impl: str = param(
        "auto",
        "mini: the lightning indexer: sglang's kernels (deep_gemm + sgl_kernel), the torch one, or auto",
        group="run",
        cli={"choices": list(INDEXER_IMPLS)},
        matrix="param",
        check=choice(*INDEXER_IMPLS),
        note="auto, torch or sglang (the sglang kernels)",
    )
    indexer_path: str = param(
        "paged",
        "mini, sglang indexer: decode's paged logits kernel (default) or extend's ragged one",
        group="run",
        cli={"choices": list(INDEXER_PATHS)},
        matrix="param",
        check=choice(*INDEXER_PATHS),
        note="paged or ragged (with the sglang kernels)",
    )
    task_checkpoint: str | None = param(
        None,
        "mini, model task: its directory (default: made from --seed)",
        group="run",
        matrix="param",
        check=string,
        note="mini, model task: a task checkpoint directory (default: made from seed)",
        written="set",
    )
    # The CUDA-graph runner's object lifetime without the graph (CPU too): one static batch and spec_info
    # per batch size, warm-up runs, then every round runs draft_forward on that batch. What a mistake that
    # leans on per-round objects (no-clear) meets under graphs; the kernels still run eagerly each round.
    static_batch: bool = param(False, "the CUDA-graph runner's static batch without the graph", flag=None)
    nvtx_sink: str = param("nvtx", "where the NVTX ranges go (the run stage sets it)", flag=None)
    mutant: str | None = param(
        None, "a wrong fix (kit.backends.mini.mistakes) run as the fix arm", flag=None, written="set"
    )
    corrupt: dict[str, Any] | None = param(
        None,
        "a corruption of the shared top-k (kit.backends.mini.corrupt, its json) run as the fix arm",
        flag=None,
        written="set",
    )


_INT_RANGES: dict[str, tuple[int, int, str]] = {
    "num_steps": (2, 16, "sglang needs --speculative-num-steps > 1"),
    "eagle_topk": (1, 8, "the mini drafts a greedy chain; topk only gates index sharing"),
    "num_requests": (1, 64, ""),
    "max_new_tokens": (1, 4096, ""),
    "seed": (0, 2**31 - 1, ""),
    "index_topk": (16, 65536, "DeepSeek-V3.2 and GLM-5 use 2048"),
}


def _fail(name: str, value: Any, allowed: str) -> UsageError:
    return UsageError(f"invalid mini parameter {name}={value!r}: allowed {allowed}", param=name)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def validate(params: dict[str, Any] | MiniParams) -> MiniParams:
    """The checked model, defaults filled; keys the mini does not know are kept in `extras` (so written to
    params.json untouched). A model is checked again as its params.json object."""
    if isinstance(params, MiniParams):
        params = params.to_json()
    if not isinstance(params, dict):
        raise UsageError(f"mini parameters must be a JSON object, got {type(params).__name__}")
    p = MiniParams.from_json(params)
    if p.backend != "mini":
        raise _fail("backend", p.backend, "'mini' for this engine")
    if p.model not in MODELS:
        raise _fail("model", p.model, " | ".join(MODELS))
    if p.profiler not in PROFILERS:
        raise _fail("profiler", p.profiler, " | ".join(PROFILERS))
    if p.model == "task":
        return _validate_task(params, p)
    for name in ("workload", "task_checkpoint", "mutant", "corrupt"):
        if getattr(p, name) is not None:
            raise _fail(name, getattr(p, name), "unset unless model is task")
    for name, choices in (
        ("arm", ARMS),
        ("device", DEVICES),
        ("nvtx_sink", NVTX_SINKS),
        ("indexer_impl", INDEXER_IMPLS),
        ("indexer_path", INDEXER_PATHS),
    ):
        if getattr(p, name) not in choices:
            raise _fail(name, getattr(p, name), " | ".join(choices))
    if p.preset not in presets.PRESETS:
        raise _fail("preset", p.preset, " | ".join(presets.PRESETS))
    if not isinstance(p.cuda_graph, bool):
        raise _fail("cuda_graph", p.cuda_graph, "true | false")
    _check_counts(p)
    _check_static(p)
    preset = presets.get(p.preset)
    device = p.device
    hi = preset.max_context[device]
    if not _is_int(p.context_len) or not PROMPT_MIN <= p.context_len <= hi:
        raise _fail(
            "context_len",
            p.context_len,
            f"an integer in {PROMPT_MIN}..{hi} for preset {preset.name} on {device}",
        )
    if device == "cuda" and not _cuda_available():
        raise _fail("device", device, "cpu here: torch sees no CUDA GPU on this machine")
    if p.cuda_graph and device != "cuda":
        raise _fail("cuda_graph", True, "false unless device is cuda")
    if p.indexer_path == "ragged" and p.indexer_impl != "sglang":
        raise _fail(
            "indexer_path", "ragged", "paged unless indexer_impl is sglang (ragged runs sglang's kernels)"
        )
    if p.indexer_impl == "sglang":
        _check_sglang_kernels(device, preset, p.index_topk)
    return p


def _check_counts(p: MiniParams) -> None:
    """What every model shares: the EAGLE shape and the counts (fills num_draft_tokens)."""
    for name, (lo, hi, why) in _INT_RANGES.items():
        v = getattr(p, name)
        if not _is_int(v) or not lo <= v <= hi:
            raise _fail(name, v, f"an integer in {lo}..{hi}" + (f" ({why})" if why else ""))
    check_eagle_topk(p.arm, p.eagle_topk)
    if p.num_draft_tokens is None:
        p.num_draft_tokens = p.num_steps + 1
    if not _is_int(p.num_draft_tokens) or p.num_draft_tokens != p.num_steps + 1:
        raise _fail(
            "num_draft_tokens",
            p.num_draft_tokens,
            f"num_steps + 1 = {p.num_steps + 1} (a greedy chain verifies the root and num_steps drafts)",
        )


def _check_static(p: MiniParams) -> None:
    if not isinstance(p.static_batch, bool):
        raise _fail("static_batch", p.static_batch, "true | false")
    if p.static_batch and p.cuda_graph:
        raise _fail("static_batch", True, "false with cuda_graph (a captured graph already keeps its batch)")


def _validate_task(given: dict[str, Any], p: MiniParams) -> MiniParams:
    """model task: the checkpoint decides the shapes, kit.task's reference runs on CPU, in eager mode."""
    from kit.task.workload import ANY_SLOT, ANY_SLOT_MIN_CONTEXT, INDEX_TOPK, WORKLOADS

    for name, choices in (("arm", ARMS), ("nvtx_sink", NVTX_SINKS)):
        if getattr(p, name) not in choices:
            raise _fail(name, getattr(p, name), " | ".join(choices))
    _check_counts(p)
    _check_static(p)
    for name, only in (("preset", None), ("device", "cpu"), ("cuda_graph", False), ("indexer_path", "paged")):
        if name in given and given[name] is not None and given[name] != only:
            why = {
                "preset": "unset with model task (the task checkpoint's config sets every shape)",
                "device": "cpu with model task (kit.task's float32 reference runs on CPU)",
                "cuda_graph": "false with model task (the reference's positions are host integers)",
                "indexer_path": "paged with model task (the reference has its own indexer)",
            }[name]
            raise _fail(name, given[name], why)
    p.preset = None
    if p.indexer_impl not in ("auto", "torch"):
        raise _fail("indexer_impl", p.indexer_impl, "auto | torch with model task (the reference's indexer)")
    if p.index_topk != INDEX_TOPK:
        raise _fail("index_topk", p.index_topk, f"{INDEX_TOPK} with model task (the checkpoint's)")
    _check_mutant(p)
    p.workload = p.workload or WORKLOADS[0]
    if p.workload not in WORKLOADS:
        raise _fail("workload", p.workload, " | ".join(WORKLOADS))
    n_keys = 128
    ckpt = p.task_checkpoint
    if ckpt is not None:
        from kit.task.spec import read_task

        if not isinstance(ckpt, str) or not ckpt:
            raise _fail("task_checkpoint", ckpt, "a task checkpoint directory (kit make-checkpoint --task)")
        try:
            n_keys = read_task(Path(ckpt)).n_keys
        except KitError as exc:
            raise _fail("task_checkpoint", ckpt, f"a task checkpoint directory ({exc})") from None
    lo = n_keys + INDEX_TOPK + 2  # one fact per key, all before the last index_topk + 1 positions
    if p.workload == ANY_SLOT:
        lo = ANY_SLOT_MIN_CONTEXT  # two groups of up to 2040 entries before the last index_topk + 1
    if not _is_int(p.context_len) or not lo <= p.context_len <= TASK_MAX_CONTEXT:
        raise _fail(
            "context_len",
            p.context_len,
            f"an integer in {lo}..{TASK_MAX_CONTEXT} for model task and workload {p.workload} (its facts "
            "before the last index_topk + 1 tokens; CPU memory)",
        )
    return p


def _check_mutant(p: MiniParams) -> None:
    """`mutant`: a wrong fix (kit.backends.mini.mistakes) run in place of the fix arm's code; `corrupt`: a
    corruption of the shared top-k (kit.backends.mini.corrupt), a wrong fix too."""
    from kit.backends.mini.corrupt import Corruption
    from kit.backends.mini.mistakes import MISTAKES

    if p.corrupt is not None:
        Corruption.from_json(p.corrupt).check_steps(p.num_steps)
        if p.arm != "fix":
            raise _fail(
                "arm", p.arm, "fix with corrupt (a corrupted share is a wrong fix: it runs as the fix arm)"
            )
    name = p.mutant
    if name is None:
        return
    if name not in MISTAKES:
        raise _fail("mutant", name, " | ".join(MISTAKES))
    if p.arm != "fix":
        raise _fail(
            "arm", p.arm, f"fix with mutant {name!r} (a mutant is a wrong fix: it runs as the fix arm)"
        )


def _check_sglang_kernels(device: str, preset: presets.Preset, index_topk: int) -> None:
    """Refuse indexer_impl=sglang where it cannot run, cheaply (no kernel import; the engine imports them)."""
    from kit.backends.mini import dsa_kernels  # imports torch

    problem = dsa_kernels.device_problem(device) or dsa_kernels.shape_problem(
        preset.index_n_heads, preset.index_head_dim, index_topk
    )
    fix = "run on an sm90/sm100 GPU (device cuda) with preset dsv32 | glm5"
    if problem is None and dsa_kernels.missing_modules():
        problem = f"{' and '.join(dsa_kernels.missing_modules())} not importable"
        fix = dsa_kernels.INSTALL_HINT
    if problem is not None:
        raise _fail("indexer_impl", "sglang", f"torch | auto here: {problem}; to use sglang's kernels, {fix}")


def warnings_for(params: MiniParams) -> list[str]:
    """What a validated run cannot show; every artifact of the run should carry these lines."""
    out: list[str] = []
    if params.context_len <= params.index_topk:
        out.append(
            f"context_len={params.context_len} <= index_topk={params.index_topk}: the indexer keeps "
            "every token, so reuse and recompute select the same tokens; this run cannot show the bug's cost"
        )
    if params.eagle_topk != 1:
        out.append(
            f"eagle_topk={params.eagle_topk} != 1 disables index sharing ({SHARING_RULE}): the indexer "
            "runs in every draft step"
        )
    if params.num_steps == 2:
        out.append(
            "num_steps=2: one draft forward per round, so bug and fix both launch the indexer once per "
            "round; the launch count cannot tell them apart"
        )
    if params.device == "cpu" and params.preset not in ("tiny", None):
        out.append(f"preset {params.preset} on cpu: real-model widths, expect a slow run")
    if params.indexer_path == "ragged":
        out.append(
            "indexer_path=ragged: every indexer call takes sglang's extend path (K gathered from the paged "
            "cache, deep_gemm.fp8_mqa_logits); sglang 0.5.14 uses it only for prefill, never for decode, "
            "target_verify or draft_extend: a counterfactual that measures that path's cost"
        )
    return out
