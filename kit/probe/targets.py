"""What the probe wraps inside sglang, and why each place was chosen: one target set per stretch of
releases whose code puts the draft round, draft step, indexer call, graph capture and profile window in the
same methods.

The sets are data keyed by the release they were first written against (TARGET_SETS); the release registry
(kit.sglang_src.releases, `probe_targets`) says which set each release uses, and the runtime probe
(kit.probe.install) and the AST check (kit.probe.check) pick it from the installed sglang's
version. Line numbers in the reasons are those of the release a set is keyed by (python/sglang/srt/...);
`kit probe-check` gives them for any other release.

- "0.5.14": 0.5.14, 0.5.14+pr29654, 0.5.15, 0.5.16.
- "0.5.17": 0.5.17. The non-paged indexer entry (Indexer.forward_indexer) is gone: forward_cuda is the
  indexer call. Draft round, step, capture and window methods are the same as in 0.5.14.
- "0.5.21": 0.5.21, 0.5.23. As 0.5.17 (Indexer is a BaseFusedOp that still dispatches to forward_cuda on
  CUDA), and DSA models whose config sets index_kpool > 1 build IndexerKPool (dsa_indexer_kpool.py)
  instead of Indexer: its forward_cuda is the indexer call there.

Range semantics, per thread:
- "plain":   push the range unless the same range is already open on this thread (so
             Indexer.forward_cuda -> Indexer.forward_indexer is ONE `indexer` range, not two).
- "round":   one `draft_round` per draft round, whichever entry point runs it. Eager mode:
             EagleDraftWorker.draft() calls draft_forward; CUDA-graph mode: draft() calls
             EAGLEDraftCudaGraphRunner.execute -> _replay_graph instead (draft_forward is NOT called
             at replay, only inside capture_one_shape). A round entry nested in an open round pushes
             nothing, and inside a graph capture it pushes nothing (that draft_forward is capture-time
             work, not a round) but still opens the draft-step gate so capture-time `draft_step`
             and `indexer` ranges exist for graph-node attribution.
- "step":    `draft_step` around ModelRunner.forward, only while a round (or captured round) is
             open on this thread; the same method runs the target model and draft extend, which
             must not count as draft steps.
- "capture": `graph_capture` around a CUDA-graph capture; not nested.
A "plain" target with `mark` set pushes a zero-length range after ("after") or before ("before") the call
instead of one around it: the profile window's edges, each recorded even when the call itself starts or
stops collection.

OVERRIDE_TARGETS are wrapped only for a control run (KIT_PROBE_TARGET_TOPK): kinds "role" (remember, at
construction, whether an Indexer belongs to the target model or the MTP draft) and "override" (hand the
target's indexer a top-k selection that ignores its scores). They push no ranges.
"""

from __future__ import annotations

from dataclasses import dataclass

from kit.probe import ranges as nr

KINDS = ("plain", "round", "step", "capture")
# Not in kit.probe.ranges: zero-length marks where sglang's profiler window starts and stops. With
# profile_from=capture the report begins at graph capture, and a server that runs several cells keeps
# collecting to the end (nsys --capture-range-end=none), so the report also holds rounds outside any window
# (sglang's own warm-up request, the kit's, the skipped rounds, other cells); these mark each window.
WINDOW_START = "profile_window_start"
WINDOW_END = "profile_window_end"


@dataclass(frozen=True)
class Target:
    module: str  # dotted module path inside the sglang package
    qualname: str  # "Class.method": the method must be defined in that class's own body
    range: str  # NVTX range name (kit.probe.ranges)
    kind: str  # one of KINDS
    why: str
    starts_profiler: bool = False  # profile_from=capture: cudaProfilerStart before the first call
    mark: str | None = None  # "after" | "before": a zero-length range there instead of one around the call

    @property
    def key(self) -> str:
        return f"{self.module}:{self.qualname}"

    @property
    def cls(self) -> str:
        return self.qualname.split(".", 1)[0]

    @property
    def method(self) -> str:
        return self.qualname.split(".", 1)[1]

    @property
    def relpath(self) -> str:
        """Path of the module file relative to the directory that holds the sglang package."""
        return self.module.replace(".", "/") + ".py"


_SPEC = "sglang.srt.speculative"
_PROFILER = "sglang.srt.managers.scheduler_components.profiler_manager"

INDEXER_CUDA = Target(
    "sglang.srt.layers.attention.dsa.dsa_indexer",
    "Indexer.forward_cuda",
    nr.INDEXER,
    "plain",
    "the DSA lightning indexer's CUDA entry (dsa_indexer.py:1352 in 0.5.14); MultiPlatformOp binds "
    "it at __init__, so it is wrapped at import, before any layer is built",
)

INDEXER_NONPAGED = Target(
    "sglang.srt.layers.attention.dsa.dsa_indexer",
    "Indexer.forward_indexer",
    nr.INDEXER,
    "plain",
    "the non-paged indexer path (dsa_indexer.py:1173); called from inside forward_cuda "
    "(dsa_indexer.py:1636), where the open `indexer` range is reused, never nested",
)

ROUND_EAGER = Target(
    f"{_SPEC}.eagle_worker_v2",
    "EagleDraftWorker.draft_forward",
    nr.ROUND,
    "round",
    "one eager draft round: the multi-step draft loop (eagle_worker_v2.py:575), called by "
    "EagleDraftWorker.draft (eagle_worker_v2.py:507) when the round is not replayed from a graph",
)

ROUND_REPLAY = Target(
    f"{_SPEC}.eagle_draft_cuda_graph_runner",
    "EAGLEDraftCudaGraphRunner._replay_graph",
    nr.ROUND,
    "round",
    "one replayed draft round: the graph launch itself (eagle_draft_cuda_graph_runner.py:255), "
    "called once per EAGLEDraftCudaGraphRunner.execute (L610), which draft() calls instead of "
    "draft_forward (eagle_worker_v2.py:495)",
)

STEP = Target(
    "sglang.srt.model_executor.model_runner",
    "ModelRunner.forward",
    nr.STEP,
    "step",
    "each draft step's model forward: draft_forward calls self.draft_runner.forward once per "
    "step, num_steps - 1 times (eagle_worker_v2.py:649); gated to open rounds",
)

EXTEND = Target(
    f"{_SPEC}.eagle_worker_v2",
    "EagleDraftWorker._draft_extend_for_decode",
    nr.EXTEND,
    "plain",
    "the draft extend after verification (eagle_worker_v2.py:809); EagleDraftWorker.draft_extend "
    "(L719) is an empty stub in 0.5.14 and is not what runs",
)

VERIFY = Target(
    f"{_SPEC}.eagle_worker_v2",
    "EAGLEWorkerV2.verify",
    nr.VERIFY,
    "plain",
    "the target model's verification forward (eagle_worker_v2.py:1431)",
)

CAPTURE_DRAFT = Target(
    f"{_SPEC}.eagle_draft_cuda_graph_runner",
    "EAGLEDraftCudaGraphRunner.capture_one_shape",
    nr.GRAPH_CAPTURE,
    "capture",
    "captures the whole multi-step draft_forward as one graph per batch size "
    "(eagle_draft_cuda_graph_runner.py:296, draft_forward at L424)",
    starts_profiler=True,
)

CAPTURE_DRAFT_EXTEND = Target(
    f"{_SPEC}.eagle_draft_extend_cuda_graph_runner",
    "EAGLEDraftExtendCudaGraphRunner.capture_one_shape",
    nr.GRAPH_CAPTURE,
    "capture",
    "captures the draft-extend forward (eagle_draft_extend_cuda_graph_runner.py:285); its capture-time "
    "indexer ranges must not look like eager ones",
)

CAPTURE_DECODE = Target(
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
    "DecodeCudaGraphRunner.capture_one_shape",
    nr.GRAPH_CAPTURE,
    "capture",
    "captures the target model's decode/verify graphs (decode_cuda_graph_runner.py:743); the two EAGLE "
    "runners override it, so each capture is one range",
)

WINDOW_START_MARK = Target(
    _PROFILER,
    "SchedulerProfilerManager._start_profile",
    WINDOW_START,
    "plain",
    "where the /start_profile window begins (profiler_manager.py:154; called from the scheduler loop "
    "when forward_ct reaches start_step); marked after the call, which may itself start collection",
    mark="after",
)

WINDOW_END_MARK = Target(
    _PROFILER,
    "SchedulerProfilerManager._stop_profile",
    WINDOW_END,
    "plain",
    "where the window ends (profiler_manager.py:286; the scheduler calls it num_steps forwards after "
    "the start, /stop_profile calls it again as a no-op); marked before the call stops collection",
    mark="before",
)

# 0.5.21 on: DSA models whose config sets index_kpool > 1 build this indexer instead of Indexer.
INDEXER_KPOOL = Target(
    "sglang.srt.layers.attention.dsa.dsa_indexer_kpool",
    "IndexerKPool.forward_cuda",
    nr.INDEXER,
    "plain",
    "the pooled-key DSA indexer's CUDA entry (dsa_indexer_kpool.py:1624 in 0.5.21), built by the "
    "DeepSeek attention in place of Indexer when the config's index_kpool > 1 (deepseek_v2.py:2070); a "
    "MultiPlatformOp like 0.5.14's Indexer, so it is wrapped at import too",
)

_BASE = (
    INDEXER_CUDA,
    INDEXER_NONPAGED,
    ROUND_EAGER,
    ROUND_REPLAY,
    STEP,
    EXTEND,
    VERIFY,
    CAPTURE_DRAFT,
    CAPTURE_DRAFT_EXTEND,
    CAPTURE_DECODE,
    WINDOW_START_MARK,
    WINDOW_END_MARK,
)

# The one table: target set -> targets. Keyed by the release each set was written against; which release
# uses which set is the registry's `probe_targets`.
TARGET_SETS: dict[str, tuple[Target, ...]] = {
    "0.5.14": _BASE,
    "0.5.17": (INDEXER_CUDA, *_BASE[2:]),
    "0.5.21": (INDEXER_CUDA, INDEXER_KPOOL, *_BASE[2:]),
}
BASELINE_SET = "0.5.14"
TARGETS: tuple[Target, ...] = TARGET_SETS[BASELINE_SET]  # the baseline release's set (the bug arm's)

_DSA_INDEXER = "sglang.srt.layers.attention.dsa.dsa_indexer"
OVERRIDE_TARGETS: tuple[Target, ...] = (
    Target(
        _DSA_INDEXER,
        "Indexer.__init__",
        "",
        "role",
        "tells the target model's indexers from the MTP draft's by the module prefix they are built with "
        "(dsa_indexer.py:334, prefix at L349): the NextN layer is built with layer_id 0 like the target's "
        "first layer (deepseek_nextn.py:148), but under `model.decoder`, the target's under `model.layers`",
    ),
    Target(
        _DSA_INDEXER,
        "Indexer._get_topk_paged",
        "",
        "override",
        "decode and target-verify top-k (dsa_indexer.py:590): computes the logits over the paged keys, "
        "then metadata.topk_transform(logits, index_topk) (L728)",
    ),
    Target(
        _DSA_INDEXER,
        "Indexer._get_topk_ragged",
        "",
        "override",
        "prefill top-k (dsa_indexer.py:794): logits over the ragged keys, then metadata.topk_transform "
        "(L903, L965 when chunked); the piecewise-CUDA-graph prefill's custom op calls it too (L166). "
        "Prompts of at most index_topk tokens skip the logits (_forward_cuda_k_only): all keys kept anyway",
    ),
)


def by_module(targets: tuple[Target, ...]) -> dict[str, tuple[Target, ...]]:
    out: dict[str, tuple[Target, ...]] = {}
    for t in targets:
        out[t.module] = (*out.get(t.module, ()), t)
    return out


BY_MODULE = by_module(TARGETS)


def target_set(key: str) -> tuple[Target, ...]:
    """The targets of one set; KeyError names the sets there are (stdlib only: runs inside sglang)."""
    try:
        return TARGET_SETS[key]
    except KeyError:
        raise KeyError(f"no probe-target set {key!r}; sets: {', '.join(TARGET_SETS)}") from None
