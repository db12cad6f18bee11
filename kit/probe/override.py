"""The control override of a probed sglang (KIT_PROBE_TARGET_TOPK=last): the target model's DSA indexer
hands topk_transform a ramp over key positions instead of its logits, so its top-k is the last index_topk
keys; the MTP draft's indexer is left alone. A run whose answers then change shows that they depend on the
indexer's selection.

Pure tensor ops on the logits' own device, so under CUDA-graph capture they are recorded into the graph
like the rest of the forward, with no host sync. Runs inside sglang's processes: stdlib only at import
(torch is sglang's, imported when an indexer first runs).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from kit.errors import OverrideRefused
from kit.probe import ENV_TARGET_TOPK
from kit.probe.targets import Target

ROLE_ATTR = "_kit_probe_role"  # set on every Indexer at construction: "target" | "draft"
APPLIED = "first target top-k replaced"  # in the server log once the override has run (per process)
_announced: set[str] = set()


def indexer_role(prefix: str) -> str:
    """`target` or `draft` from an Indexer's module prefix; OverrideRefused when it says neither.

    The MTP draft (NextN) builds its one decoder layer with layer_id 0, like the target's first layer, so
    the layer id cannot tell them apart; its modules live under `model.decoder`, the target's under
    `model.layers.<i>`.
    """
    parts = prefix.split(".")
    if "decoder" in parts and "layers" not in parts:
        return "draft"
    if "layers" in parts and "decoder" not in parts:
        return "target"
    raise OverrideRefused(
        f"kit probe: {ENV_TARGET_TOPK} is set but Indexer prefix {prefix!r} is neither the target's "
        "(model.layers.<i>...) nor the MTP draft's (model.decoder...): refusing to guess which to override"
    )


def _say_once(key: str, message: str) -> None:
    """One line per process in the server log: the evidence that the override was installed and ran."""
    if key not in _announced:
        _announced.add(key)
        print(f"[kit probe] {message} (pid {os.getpid()})", file=sys.stderr, flush=True)


def role_wrapper(fn: Callable, t: Target) -> Callable:
    """Indexer.__init__: remember the role its prefix names."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = fn(self, *args, **kwargs)
        bound = sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        prefix = str(bound.arguments.get("prefix") or "")
        role = indexer_role(prefix)
        setattr(self, ROLE_ATTR, role)
        what = "its top-k is overridden" if role == "target" else "left alone"
        _say_once(f"role:{role}", f"{ENV_TARGET_TOPK}: Indexer {prefix!r} is the {role}'s: {what}")
        return out

    return wrapper


def ramp_like(logits: Any) -> Any:
    """The logits overwritten by their key positions (0, 1, 2, ... along the last axis): every top-k of
    them is the last k valid keys of each row. In place, so shape, strides and device stay the kernels'."""
    import torch

    ramp = torch.arange(logits.shape[-1], device=logits.device, dtype=logits.dtype)
    return logits.copy_(ramp.expand_as(logits))


class LastKeysMetadata:
    """The indexer metadata of one call, except that topk_transform is handed the ramp instead of the
    logits; everything else (page tables, lengths, offsets) is the real metadata's."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Any):
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def topk_transform(self, logits: Any, topk: int, *args: Any, **kwargs: Any) -> Any:
        return self._inner.topk_transform(ramp_like(logits), topk, *args, **kwargs)


def override_wrapper(fn: Callable, t: Target) -> Callable:
    """Indexer._get_topk_paged / _ragged: on the target's indexers, the metadata argument replaced."""
    sig = inspect.signature(fn)
    if "metadata" not in sig.parameters:
        raise OverrideRefused(
            f"kit probe: {t.key} takes no `metadata` argument; the override cannot reach it"
        )

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        role = getattr(self, ROLE_ATTR, None)
        if role == "draft":
            return fn(self, *args, **kwargs)
        if role != "target":
            raise OverrideRefused(f"kit probe: {t.key} called on an Indexer whose role was never recorded")
        bound = sig.bind(self, *args, **kwargs)
        bound.arguments["metadata"] = LastKeysMetadata(bound.arguments["metadata"])
        _say_once(f"applied:{t.method}", f"{ENV_TARGET_TOPK}: {APPLIED} in {t.qualname}")
        return fn(*bound.args, **bound.kwargs)

    return wrapper
