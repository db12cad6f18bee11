"""Run parameters: one typed model per backend over a shared base, in the spirit of sglang's `ServerArgs`.

Each parameter is a dataclass field declared once: its default and a `Spec` (its help line, its `kit run`
option, whether a matrix makes it an axis or a fixed parameter, the matrix's check of a value). The CLI
(kit.cli.parsers), the matrix (kit.pipeline.matrix), notebooks/01_profile's `parameters` cell (written by
`python -m kit.pipeline.notebooks`) and papermill's parameter check all derive from these models. The base
holds what every backend has, with one default; a backend that needs another default redeclares the field
with `own_default` and says why. The backends' models and their validation (which reads the machine and
the model's config) are kit/backends/mini/params.py and kit/backends/sglang/params.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from kit.arms import ARMS
from kit.checks import Check, at_least, boolean, choice

T = TypeVar("T", bound="RunParams")

# Where a parameter's `kit run` option goes: both `kit run` and `kit plan` (shared), `kit run` alone (run),
# the sglang group of both (sglang); None: no option.
GROUPS = ("shared", "run", "sglang")
# What profiles a run: Nsight Systems (NVTX ranges), or the PyTorch profiler (a Kineto trace); where it runs.
PROFILERS = ("nsys", "torch")
DEVICES = ("cpu", "cuda")
# How a field goes into params.json: always; only when it is not None; never (derived, not a parameter).
WRITTEN = ("always", "set", "never")


@dataclass(frozen=True)
class Spec:
    """What the kit derives from one parameter besides its default."""

    help: str
    flag: str | None = ""  # the option: "" = --name-with-dashes, None = none
    group: str | None = None  # GROUPS
    cli: Mapping[str, Any] = field(default_factory=dict)  # argparse keywords (type, choices, action, ...)
    matrix: str | None = None  # "axis" (its values make cells) | "param" (one value for every cell) | None
    check: Check | None = None  # the matrix's check of one value
    note: str = ""  # the notebook cell's comment
    written: str = "always"  # WRITTEN
    why: str = ""  # a backend's own default: why it is not the base's

    def option(self, name: str) -> str | None:
        if self.flag is None:
            return None
        return self.flag or "--" + name.replace("_", "-")


def param(
    default: Any = None, help: str = "", *, factory: Callable[[], Any] | None = None, **spec: Any
) -> Any:
    """A parameter field: its default (or factory, for a list or dict) and its Spec."""
    meta = {"spec": Spec(help, **spec)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def own_default(base: type[RunParams], name: str, default: Any, why: str, **spec_changes: Any) -> Any:
    """A backend's own default for a parameter of `base`, with the reason in one line."""
    spec = dataclasses.replace(base.spec(name), why=why, **spec_changes)
    return field(default=default, metadata={"spec": spec})


def ints(text: str) -> int | list[int]:
    """An integer, or a comma-separated list of them (several cells on one sglang server)."""
    import argparse

    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer or a comma-separated list") from None
    if not values:
        raise argparse.ArgumentTypeError("expected an integer or a comma-separated list")
    return values[0] if len(values) == 1 else values


def names(text: str) -> str | list[str]:
    """A name, or a comma-separated list of them."""
    import argparse

    values = [x.strip() for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError("expected a name or a comma-separated list of names")
    return values[0] if len(values) == 1 else values


@dataclass(kw_only=True)
class RunParams:
    """The parameters every backend has, each with its one default."""

    backend: str = param(
        "mini",
        "the engine that runs",
        flag=None,
        matrix="axis",
        check=choice("mini", "sglang"),
        note="mini or sglang",
    )
    arm: str = param("fix", "off | bug | fix | upstream", flag=None, matrix="axis", check=choice(*ARMS))
    context_len: Any = param(  # sglang: int or a list of them
        4096,
        "input tokens per request; sglang: a comma-separated list runs one cell per value on one server",
        group="shared",
        cli={"type": ints},
        matrix="axis",
        check=at_least(1),
    )
    num_steps: int = param(
        5,
        "speculative_num_steps (draft steps per round)",
        group="shared",
        cli={"type": int},
        matrix="axis",
        check=at_least(2),
    )
    num_requests: int = param(
        1, "requests (prompts) per run", group="shared", cli={"type": int}, matrix="param", check=at_least(1)
    )
    max_new_tokens: int = param(
        32,
        "tokens generated per request",
        group="shared",
        cli={"type": int},
        matrix="param",
        check=at_least(1),
    )
    eagle_topk: int = param(
        1,
        "speculative_eagle_topk (index sharing needs 1)",
        group="shared",
        cli={"type": int},
        matrix="param",
        check=at_least(1),
    )
    cuda_graph: bool = param(
        False,
        "replay the draft loop as a graph",
        group="shared",
        cli={"action": "bool"},
        matrix="axis",
        check=boolean,
    )
    seed: int = param(
        0, "workload seed", group="shared", cli={"type": int}, matrix="param", check=at_least(0)
    )
    device: str = param(
        "cpu",
        "mini: where the engine runs",
        group="run",
        cli={"choices": list(DEVICES)},
        matrix="axis",
        check=choice(*DEVICES),
        note="cpu or cuda (sglang: cuda only)",
    )
    # the task workloads on the mini (model task); sglang's prompt sources (kit.backends.sglang.workload)
    workload: Any = param(
        None,
        "prompt source (sglang default records); a comma-separated list runs one cell per workload x "
        "context; mini --model task: same-target, moving-target or any-slot",
        group="sglang",
        cli={"type": names},
        matrix="axis",
        check=choice("same-target", "moving-target", "any-slot"),
        note="mini model task: same-target, moving-target or any-slot; sglang: a prompt source",
        written="set",
    )
    profiler: str = param(
        "nsys",
        "Nsight Systems (default) or the PyTorch profiler (a Kineto trace; no nsys needed; sglang: its own "
        "/start_profile with CPU and GPU activities)",
        group="run",
        cli={"choices": list(PROFILERS)},
        matrix="axis",
        check=choice(*PROFILERS),
        note="nsys or torch (the PyTorch profiler, a Kineto trace; sglang: /start_profile)",
    )
    num_draft_tokens: int | None = param(
        None,
        "speculative_num_draft_tokens (num_steps + 1)",
        group="sglang",
        cli={"type": int},
        matrix="param",
        check=at_least(2),
        note="None: num_steps + 1",
    )
    # keys of a params.json that no field declares (a cell's window, its server folder, ...): kept as read
    extras: dict[str, Any] = field(default_factory=dict, repr=False)

    # axes a matrix may leave out without a cell taking a value for them
    OPTIONAL_AXES: ClassVar[tuple[str, ...]] = ("workload", "profiler", "profile")

    @property
    def under_nsys(self) -> bool:
        """Profiled by Nsight Systems (not the PyTorch profiler, not unprofiled)."""
        return self.profiler == "nsys"

    @classmethod
    def specs(cls) -> dict[str, Spec]:
        """Every parameter of this model and its Spec, in declaration order."""
        return {f.name: f.metadata["spec"] for f in dataclasses.fields(cls) if "spec" in f.metadata}

    @classmethod
    def spec(cls, name: str) -> Spec:
        return cls.specs()[name]

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every parameter's default (a fresh copy of a list or dict)."""
        out = {}
        for f in dataclasses.fields(cls):
            if "spec" not in f.metadata:
                continue
            out[f.name] = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
        return out

    @classmethod
    def from_json(cls: type[T], data: Mapping[str, Any]) -> T:
        """A model from a params.json object (or any mapping): missing keys take their default, keys no
        field declares are kept in `extras`. Nothing is checked: old runs load as they were written."""
        known = cls.specs()
        return cls(
            **{k: v for k, v in data.items() if k in known},
            extras={k: v for k, v in data.items() if k not in known},
        )

    def to_json(self) -> dict[str, Any]:
        """The params.json object: every parameter (those written only when set, when set), then extras."""
        out: dict[str, Any] = {}
        for name, spec in self.specs().items():
            value = getattr(self, name)
            if spec.written == "never" or (spec.written == "set" and value is None):
                continue
            out[name] = value
        return {**out, **self.extras}

    def replace(self: T, **changes: Any) -> T:
        """A copy with some parameters changed."""
        return dataclasses.replace(self, **changes)
