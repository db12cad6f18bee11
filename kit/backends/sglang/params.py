"""The sglang backend's parameters: defaults, every value checked, the model's config read (the flags the
kit owns or refuses: kit.backends.sglang.server_args). Nothing here starts or creates anything.

Everything sglang receives is an argument list built from these validated parameters (kit.backends.sglang
.plan); flags the kit owns cannot be smuggled in through extra args.

One server runs one or more cells: `context_len` and `workload` may each be a list, and every
(context_len, workload) pair is a cell with its own run directory, run in order on the same server.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit.arms import ARMS, SHARING_RULE
from kit.backends.sglang.ports import SGLANG_PORT_MAX
from kit.backends.sglang.server_args import checked_extra_args
from kit.backends.sglang.workload import DEFAULT_WORKLOAD, MAX_INPUT_LEN, MIN_INPUT_LEN, get_workload
from kit.checks import at_least, boolean, string, string_list
from kit.errors import InputError, UsageError
from kit.params import PROFILERS, RunParams, own_default, param
from kit.probe import TARGET_TOPK_MODES, classifier_only_warning, target_topk_warning

FEATURE = "index_share_for_mtp_iteration"

PROFILE_FROM = ("auto", "window", "capture")


def _overrides(items: list[str]) -> dict[str, Any]:
    """`--model-override KEY=JSON` (repeatable) as the object for --json-model-override-args."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--model-override {item!r}: use KEY=JSON", param="model_overrides")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _sg(default: Any = None, help: str = "", **spec: Any) -> Any:
    """An sglang-only parameter: its option is in the sglang group."""
    return param(default, help, **{"group": "sglang", **spec})


@dataclass(kw_only=True)
class SglangParams(RunParams):
    """One sglang server (one arm, one or more cells) and what the kit does with it."""

    # the base's parameters whose default is not the mini's
    backend: str = own_default(RunParams, "backend", "sglang", "the model of the sglang backend")
    context_len: Any = own_default(  # or a list: one cell per value (x workload)
        RunParams, "context_len", 81920, "PR #29654's long-context case (~80k tokens), a real model's scale"
    )
    num_requests: int = own_default(
        RunParams, "num_requests", 4, "the PR's benchmark sends 4 requests (data/matrices/gpu_pr29654.yaml)"
    )
    max_new_tokens: int = own_default(
        RunParams,
        "max_new_tokens",
        256,
        "the default window (skip 4 + 24 forwards) needs 28 decode rounds: 256 // 6 = 42",
    )
    cuda_graph: bool = own_default(
        RunParams, "cuda_graph", True, "sglang serves with CUDA graphs unless told not to, as the PR measured"
    )
    device: str = own_default(
        RunParams,
        "device",
        "cuda",
        "sglang runs on CUDA only (its params.json never says so)",
        written="never",
    )
    workload: Any = own_default(  # or a list: one cell per value (x context_len)
        RunParams, "workload", DEFAULT_WORKLOAD, "every sglang request needs a prompt source"
    )

    model_path: str | None = _sg(
        None,
        "local DSA checkpoint (GLM-5.x, DeepSeek-V3.2)",
        matrix="param",
        check=string,
        note="a local GLM-5.x / DeepSeek-V3.2 checkpoint",
    )
    tp_size: int = _sg(1, "tensor-parallel ranks", cli={"type": int}, matrix="param", check=at_least(1))
    concurrency: int = _sg(
        1, "requests of a cell in flight at once", cli={"type": int}, matrix="param", check=at_least(1)
    )
    # "last": a control run, the target's indexer keeps the last index_topk tokens
    target_topk: str | None = _sg(
        None,
        "CONTROL RUN: the target model's indexer keeps the last index_topk tokens, not its top-k",
        cli={"choices": list(TARGET_TOPK_MODES)},
    )
    # True: no probe at all; launches per round from the NVTX-free kernel classifier only (the explicit way to
    # run an sglang release whose probe targets the registry has not checked)
    classifier_only: bool = _sg(
        False,
        "run without the probe (an sglang release the registry has not checked): launches per round from "
        "the NVTX-free kernel classifier only, said in every artifact (needs CUDA graphs)",
        cli={"action": "store_true"},
    )
    profile: bool = _sg(
        True,
        "under nsys with the probe (default) or plain (outputs only)",
        cli={"action": "bool"},
        matrix="axis",
        check=boolean,
        note="False: no nsys, no probes (outputs and timings only)",
    )
    time_decode: bool = _sg(  # stream prompt 0 without a window too: its decode rounds timed from the client
        False,
        "stream prompt 0 without a window too (its decode rounds timed client-side)",
        flag=None,
        matrix="param",
        check=boolean,
        note="True: prompt 0 streamed without a window too, timed client-side",
    )
    profile_from: str = _sg("auto", "where the report starts", cli={"choices": list(PROFILE_FROM)})
    profile_skip: int = _sg(
        4,
        "decode chunks before the capture window opens",
        cli={"type": int},
        matrix="param",
        check=at_least(0),
        note="decode chunks before the capture window opens",
    )
    profile_steps: int = _sg(
        24,
        "forwards inside the capture window",
        cli={"type": int},
        matrix="param",
        check=at_least(1),
        note="forwards inside the capture window",
    )
    warmup_requests: int = _sg(1, "short requests before the measured ones", cli={"type": int})
    health_timeout_s: float = _sg(
        3600.0, "seconds to wait for /health", flag="--health-timeout", cli={"type": float}
    )
    request_timeout_s: float = _sg(
        3600.0, "seconds per request", flag="--request-timeout", cli={"type": float}
    )
    shutdown_timeout_s: float = _sg(1800.0, "seconds to wait for the server to stop", flag=None)
    port: int | None = _sg(None, "server port on 127.0.0.1 (default: a free one)", cli={"type": int})
    nnodes: int = _sg(1, "nodes of a multi-node server", cli={"type": int})
    node_rank: int = _sg(0, "this node's rank (0 drives the workload)", cli={"type": int})
    dist_init_addr: str | None = _sg(None, "HOST:PORT of node 0, as sglang takes it")
    extra_args: list[str] = param(
        help="passed to sglang as is (repeatable)",
        factory=list,
        flag="--sglang-arg",
        group="sglang",
        cli={"action": "append", "metavar": "ARG"},
        matrix="param",
        check=string_list,
        note="more server flags, one list item per argument",
    )
    model_overrides: dict[str, Any] = param(
        help="into --json-model-override-args",
        factory=dict,
        flag="--model-override",
        group="sglang",
        cli={"action": "append", "metavar": "KEY=JSON", "convert": _overrides},
    )
    python: str | None = _sg(None, "interpreter of the sglang env (default: this one)")
    trust_remote_code: bool = _sg(False, "passed to sglang", cli={"action": "store_true"})
    # derived by validate: what the kit read from the model's config.json, and the arms of a plan
    model: dict[str, Any] = param(help="the model's config, as the kit reads it", factory=dict, flag=None)
    arms: list[str] = param(help="the arms of a plan", factory=list, flag=None, written="never")

    @property
    def under_nsys(self) -> bool:
        return self.profile and self.profiler == "nsys"

    @property
    def cells(self) -> list[Cell]:
        """The cells of validated parameters, in the order they run: context lengths outer, workloads
        inner."""
        return [Cell(c, w) for c in _as_list(self.context_len) for w in _as_list(self.workload)]

    def for_cell(self, cell: Cell) -> SglangParams:
        """One cell's parameters: the server's, with this cell's context length and workload (its
        params.json)."""
        return self.replace(context_len=cell.context_len, workload=cell.workload)


@dataclass(frozen=True)
class Cell:
    """One (context length, workload) of a server: one run directory, one profile window."""

    context_len: int
    workload: str

    @property
    def tag(self) -> str:
        return f"ctx{self.context_len}-{self.workload}"


def _as_list(v: Any) -> list:
    return list(v) if isinstance(v, (list, tuple)) else [v]


# ---------------------------------------------------------------------------------------------------
# Parameters


def model_info(model_path: Path) -> dict[str, Any]:
    """What the kit needs from config.json; refuses a model without a DSA indexer or an MTP layer."""
    cfg_path = Path(model_path) / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text())
    except FileNotFoundError:
        raise InputError(
            f"{cfg_path} not found: --model-path must be a local model directory", path=cfg_path
        ) from None
    except json.JSONDecodeError as e:
        raise InputError(
            f"{cfg_path} is not valid JSON ({e.msg} at line {e.lineno})", path=cfg_path
        ) from None
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    merged = {**text, **cfg}
    if "index_topk" not in merged:
        indexer_keys = sorted(k for k in merged if k.startswith("index_"))
        raise UsageError(
            f"{model_path} is not a DSA model (config.json has no index_topk"
            + (f"; index keys: {indexer_keys}" if indexer_keys else "")
            + "): PR #29654 concerns the DSA indexer of GLM-5.x / DeepSeek-V3.2",
            param="model_path",
        )
    nextn = merged.get("num_nextn_predict_layers")
    if not nextn:
        raise UsageError(
            f"{model_path}: config.json has no num_nextn_predict_layers >= 1: the model has no MTP layer "
            "to draft with",
            param="model_path",
        )
    return {
        "architectures": merged.get("architectures"),
        "index_topk": int(merged["index_topk"]),
        "index_head_dim": merged.get("index_head_dim"),
        "index_n_heads": merged.get("index_n_heads"),
        "num_nextn_predict_layers": nextn,
        "num_attention_heads": merged.get("num_attention_heads"),
        "max_position_embeddings": merged.get("max_position_embeddings"),
        FEATURE: merged.get(FEATURE),
    }


def _tp_heads(p: SglangParams) -> None:
    """sglang splits the attention heads across TP ranks (the indexer's it replicates on each), and its DSA
    prefill (MHA_ONE_SHOT) asserts more than one head per rank: refuse a tp_size that leaves fewer."""
    heads, tp = p.model.get("num_attention_heads"), p.tp_size
    if isinstance(heads, int) and tp > 1 and (heads % tp or heads // tp < 2):
        raise UsageError(
            f"tp_size={tp} does not fit the model's {heads} attention heads: sglang splits them across the "
            f"ranks and needs at least 2 per rank; use a tp_size that divides {heads} into 2 or more",
            param="tp_size",
        )


def _int(p: SglangParams, key: str, lo: int, hi: int | None = None) -> int:
    return _int_value(getattr(p, key), key, lo, hi)


def _int_value(v: Any, key: str, lo: int, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise UsageError(f"{key} must be an integer, got {v!r}", param=key)
    if v < lo or (hi is not None and v > hi):
        raise UsageError(f"{key}={v} is out of range ({lo}..{hi if hi is not None else 'inf'})", param=key)
    return v


def _cells(p: SglangParams) -> None:
    """context_len / workload: one value or a list of distinct ones; a single-item list becomes the value."""
    for key in ("context_len", "workload"):
        values = _as_list(getattr(p, key))
        if not values:
            raise UsageError(f"{key} is an empty list", param=key)
        if len(set(map(str, values))) != len(values):
            raise UsageError(f"{key} lists a value twice: {values} (each cell needs its own)", param=key)
        setattr(p, key, values if len(values) > 1 else values[0])
    for ctx in _as_list(p.context_len):
        _int_value(ctx, "context_len", MIN_INPUT_LEN, MAX_INPUT_LEN)
    for name in _as_list(p.workload):
        if not isinstance(name, str):
            raise UsageError(f"workload must be a name, got {name!r}", param="workload")
        get_workload(name)


def validate(params: dict[str, Any] | SglangParams) -> SglangParams:
    """Defaults filled, every value checked, model config read. Nothing is started or created."""
    if isinstance(params, SglangParams):  # checked again as its parameters (not the config read from them)
        params = {**{k: v for k, v in params.to_json().items() if k != "model"}, "arms": params.arms or None}
    params = dict(params)
    if params.pop("device", None) not in (None, "cuda"):  # the notebooks' shared parameter
        raise UsageError(
            "the sglang backend runs on CUDA: set device='cuda' (or leave it unset)", param="device"
        )
    known = set(SglangParams.specs()) - {"device", "model", "extras"}
    unknown = {k for k, v in params.items() if v is not None} - known
    if unknown:
        raise UsageError(
            f"unknown sglang-backend parameter(s): {sorted(unknown)} (mini-backend ones like "
            "preset do not apply)",
            param=sorted(unknown)[0],
        )
    p = SglangParams.from_json({k: v for k, v in params.items() if v is not None})
    if p.backend != "sglang":
        raise UsageError(f"kit.backends.sglang handles backend 'sglang', not {p.backend!r}", param="backend")
    arms = p.arms or [p.arm]
    for arm in arms:
        if arm not in ARMS:
            raise UsageError(f"unknown arm {arm!r} for the sglang backend: use one of {ARMS}", param="arm")
    p.arms = list(arms)
    p.arm = arms[0]
    if not p.model_path:
        raise UsageError(
            "the sglang backend needs --model-path (a local GLM-5.x / DeepSeek-V3.2 checkpoint)",
            param="model_path",
        )
    p.model_path = str(Path(p.model_path).expanduser().resolve())
    p.model = model_info(Path(p.model_path))
    for key, lo in (
        ("tp_size", 1),
        ("num_steps", 2),
        ("num_requests", 1),
        ("max_new_tokens", 1),
        ("profile_skip", 0),
        ("profile_steps", 1),
        ("warmup_requests", 0),
        ("nnodes", 1),
        ("node_rank", 0),
        ("seed", 0),
    ):
        _int(p, key, lo)
    _tp_heads(p)
    _cells(p)
    _int(p, "concurrency", 1, p.num_requests)
    if p.target_topk not in (None, *TARGET_TOPK_MODES):
        raise UsageError(
            f"target_topk={p.target_topk!r}: use one of {list(TARGET_TOPK_MODES)} (or leave it unset)",
            param="target_topk",
        )
    if _int(p, "eagle_topk", 1) != 1:
        raise UsageError(
            f"eagle_topk={p.eagle_topk}: {SHARING_RULE}; the kit runs sglang with topk 1 only (the PR's "
            "5/1/6)",
            param="eagle_topk",
        )
    if p.num_draft_tokens is None:  # the only value a topk-1 chain verifies
        p.num_draft_tokens = p.num_steps + 1
    if _int(p, "num_draft_tokens", 2) != p.num_steps + 1:
        raise UsageError(
            f"num_draft_tokens={p.num_draft_tokens} with topk 1 must be num_steps + 1 = "
            f"{p.num_steps + 1} (the PR used 5/1/6)",
            param="num_draft_tokens",
        )
    if p.node_rank >= p.nnodes:
        raise UsageError(f"node_rank={p.node_rank} must be below nnodes={p.nnodes}", param="node_rank")
    if p.nnodes > 1 and not p.dist_init_addr:
        raise UsageError(
            "nnodes > 1 needs dist_init_addr (host:port of node 0), as sglang does", param="dist_init_addr"
        )
    if p.port is not None:
        _int(p, "port", 1024, SGLANG_PORT_MAX)  # sglang adds 10000 for its gRPC port
    for key in ("cuda_graph", "profile", "time_decode", "trust_remote_code", "classifier_only"):
        if not isinstance(getattr(p, key), bool):
            raise UsageError(f"{key} must be true or false, got {getattr(p, key)!r}", param=key)
    if p.classifier_only:
        _classifier_only(p)
    if p.profiler not in PROFILERS:
        raise UsageError(f"profiler={p.profiler!r}: use {' or '.join(PROFILERS)}", param="profiler")
    if p.profiler == "torch" and not p.profile:
        raise UsageError("profiler=torch needs profile on (it records the window)", param="profiler")
    if p.profile_from not in ("auto", "window", "capture"):
        raise UsageError(
            f"profile_from={p.profile_from!r}: use auto, window or capture", param="profile_from"
        )
    if p.profile_from == "auto":  # nsys sees capture-time ranges only when it records from the capture
        p.profile_from = "capture" if p.cuda_graph and p.profiler == "nsys" else "window"
    if p.profile_from == "capture" and not p.cuda_graph:
        raise UsageError(
            "profile_from=capture needs CUDA graphs (there is no graph capture to start from)",
            param="profile_from",
        )
    min_rounds = p.max_new_tokens // (p.num_steps + 1)  # every draft accepted: fewest decode rounds
    if p.profile and p.profile_skip + p.profile_steps > min_rounds:
        raise UsageError(
            f"profile window (skip {p.profile_skip} + {p.profile_steps} steps) may outlast the "
            f"request: {p.max_new_tokens} new tokens can finish in {min_rounds} rounds; raise "
            "max_new_tokens or shorten the window",
            param="profile_steps",
        )
    longest = max(_as_list(p.context_len)) + p.max_new_tokens
    max_pos = p.model["max_position_embeddings"]
    if max_pos and longest > max_pos:
        raise UsageError(
            f"context_len + max_new_tokens = {longest} exceeds the model's max_position_embeddings {max_pos}",
            param="context_len",
        )
    p.extra_args = checked_extra_args(p.extra_args, p.concurrency, p.cuda_graph, longest)
    if not isinstance(p.model_overrides, dict):
        raise UsageError("model_overrides must be a JSON object", param="model_overrides")
    if FEATURE in p.model_overrides:
        raise UsageError(
            f"{FEATURE} is set by the arm (bug/fix/upstream: on, off: off), not by model_overrides",
            param="model_overrides",
        )
    return p


def _classifier_only(p: SglangParams) -> None:
    """A run without the probe: the classifier needs a report (profile) of draft-loop graph replays
    (cuda_graph), the window must be sglang's own (the probe starts collection at capture otherwise), and
    the control override lives in the probe."""
    why = {
        "profile": "there is no report to classify without profile",
        "cuda_graph": "the classifier finds draft rounds as draft-loop CUDA-graph replays",
    }
    for key, reason in why.items():
        if not getattr(p, key):
            raise UsageError(f"classifier_only needs {key}: {reason}", param="classifier_only")
    if p.target_topk:
        raise UsageError(
            "classifier_only cannot run a control (target_topk): the override is part of the probe",
            param="target_topk",
        )
    if p.profile_from == "capture":
        raise UsageError(
            "profile_from=capture is the probe's (it starts collection at graph capture); classifier_only "
            "runs use sglang's own window: leave profile_from unset or set window",
            param="profile_from",
        )
    if p.profile_from == "auto":
        p.profile_from = "window"


def feature_override(p: SglangParams, arm: str) -> dict[str, Any]:
    """The --json-model-override-args object for one arm (empty: nothing to override)."""
    in_config = p.model[FEATURE]
    want = arm != "off"
    over = dict(p.model_overrides)
    if bool(in_config) != want:
        over[FEATURE] = want
    return over


def warnings_for(p: SglangParams) -> list[str]:
    """Valid parameters that still cannot show the bug here, that make this node a follower, or that make
    the run a control. `p`: one cell's parameters."""
    w = []
    topk = p.model["index_topk"]
    if p.context_len <= topk:
        w.append(
            f"context_len {p.context_len} <= index_topk {topk}: the indexer selects every token, so "
            "reuse and recompute are identical and this run cannot show the bug"
        )
    if p.nnodes > 1 and p.node_rank > 0:
        w.append("node_rank > 0: this node only serves its ranks; node 0 drives the workload and the window")
    if p.target_topk:
        w.append(target_topk_warning(p.target_topk))
    if p.classifier_only:
        w.append(classifier_only_warning())
    return w
