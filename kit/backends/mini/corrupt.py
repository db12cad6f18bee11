"""Corruptions of the shared top-k the fix arm hands its later draft steps: the wrong fixes of issue 32 that
hand the later steps a PART of the right top-k (some slots dropped, shifted, or taken from another row),
made on the mini so the gate can be shown to kill them (kit.compare.fuzz draws them at random; `NAMED`
holds the six the H200 mutant patches make, for the registry's `mini` field: {"corrupt": NAME}).

On the fix arm, draft step 0 computes its top-k and the carrier hands it to the later steps. A corruption
changes what some later steps read (`steps`), for some requests (`requests`), in some slots of the row
(`slots`), in one way (`how`). Step 0 computes and uses its own top-k, and the carrier keeps the clean one
(`Corrupter` puts it back after every corrupted step), so every application starts from the clean row.

The carrier holds [B, T, K] int64 draft-cache positions padded with -1 (kit/backends/mini/task_model.py);
a slot is a column of K. With the kernel's order (kit.task.topk) a fact's slot is its rank by position
among the entries the indexer scores above the tie.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from kit.backends.mini.forward_batch_info import ForwardBatch
from kit.backends.mini.index_topk_share import TopkCarrier
from kit.errors import UsageError

REQUESTS = ("all", "one", "fraction", "indices")
SLOTS = ("fraction", "block", "scattered")
HOWS = ("dropped", "shifted", "other-request", "other-round", "rejected-branch")
# The class a corruption belongs to on each axis, as the fuzzer counts kill rates.
AXES = ("steps", "requests", "slots", "how")


def _fail(why: str) -> UsageError:
    return UsageError(f"invalid corruption: {why}", param="corrupt")


def _rng(seed: int, stream: int) -> np.random.Generator:
    """A corruption's own random draws (which slots, which requests), the same in every process."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, stream])))


@dataclass(frozen=True)
class Corruption:
    """What a wrong fix does to the shared top-k, one field per class (json: `to_json` / `from_json`)."""

    # HOWS: dropped (-1), shifted by `shift`, another request's, an earlier round's, a rejected one's (an
    # earlier / rejected round: the most recent whose row differs in the corrupted slots)
    how: str
    slots: str  # SLOTS
    slot_fraction: float | None = None  # slots "fraction": each slot with this probability (seeded)
    block: tuple[int, int] | None = None  # slots "block": [a, b)
    every: int | None = None  # slots "scattered": every n-th slot ...
    first: int | None = None  # ... from this one
    steps: tuple[int, ...] | None = None  # later draft steps (draft forward 1, 2, ...); None: every one
    requests: str = "all"  # REQUESTS
    request_ids: tuple[int, ...] = ()  # "one" / "indices": batch rows (taken modulo the batch size)
    request_fraction: float | None = None  # "fraction": this share of the rows, at least one (seeded)
    shift: int = 1  # "shifted": +1 or -1 position (-1 stays -1; a position shifted below 0 is dropped)
    other: int = 1  # "other-request": row (r + other) % B
    seed: int = 0  # the seeded draws of the fraction classes

    def __post_init__(self) -> None:
        if self.how not in HOWS:
            raise _fail(f"how {self.how!r}: one of {', '.join(HOWS)}")
        if self.requests not in REQUESTS:
            raise _fail(f"requests {self.requests!r}: one of {', '.join(REQUESTS)}")
        want = {"fraction": ("slot_fraction",), "block": ("block",), "scattered": ("every", "first")}
        if self.slots not in want:
            raise _fail(f"slots {self.slots!r}: one of {', '.join(SLOTS)}")
        for name in want[self.slots]:
            if getattr(self, name) is None:
                raise _fail(f"slots {self.slots!r} needs {name}")
        if self.slots == "fraction" and not 0 < self.slot_fraction <= 1:
            raise _fail(f"slot_fraction {self.slot_fraction}: in (0, 1]")
        if self.slots == "block" and not 0 <= self.block[0] < self.block[1]:
            raise _fail(f"block {self.block}: [a, b) with 0 <= a < b")
        if self.slots == "scattered" and (self.every < 1 or self.first < 0):
            raise _fail(f"scattered every {self.every} from {self.first}: every >= 1, first >= 0")
        if self.steps is not None and (not self.steps or min(self.steps) < 1):
            raise _fail(f"steps {self.steps}: later draft steps are 1, 2, ... (step 0 computes its own)")
        if self.requests in ("one", "indices") and not self.request_ids:
            raise _fail(f"requests {self.requests!r} needs request_ids")
        if self.requests == "one" and len(self.request_ids) != 1:
            raise _fail(f"requests 'one' takes one request id, got {list(self.request_ids)}")
        if self.requests == "fraction" and not 0 < (self.request_fraction or 0) <= 1:
            raise _fail(f"request_fraction {self.request_fraction}: in (0, 1]")
        if self.how == "shifted" and self.shift not in (1, -1):
            raise _fail(f"shift {self.shift}: +1 or -1")
        if self.how == "other-request" and self.other < 1:
            raise _fail(f"other {self.other}: another row is 1 or more rows on")

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Corruption:
        if not isinstance(d, dict):
            raise _fail(f"a JSON object, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise _fail(f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
        if "how" not in d or "slots" not in d:
            raise _fail("how and slots are required")
        tuples = {"block", "steps", "request_ids"}
        return cls(**{k: tuple(v) if k in tuples and v is not None else v for k, v in d.items()})

    def check_steps(self, num_steps: int) -> None:
        """Refuse later steps a run with `num_steps` does not have (draft forwards 1 .. num_steps - 2)."""
        last = num_steps - 2
        if self.steps is not None and max(self.steps) > last:
            raise _fail(f"steps {list(self.steps)}: num_steps {num_steps} has later draft steps 1..{last}")

    def applies(self, step: int) -> bool:
        return step >= 1 and (self.steps is None or step in self.steps)

    def labels(self) -> dict[str, str]:
        """Its class value on each axis (AXES), as kill rates are counted."""
        steps = "all" if self.steps is None else ",".join(str(s) for s in sorted(self.steps))
        return {"steps": steps, "requests": self.requests, "slots": self.slots, "how": self.how}

    def describe(self) -> str:
        """One short line: how, which slots, steps and requests."""
        how = {"shifted": f"shifted {self.shift:+d}", "other-request": f"other-request +{self.other}"}
        slots = {
            "fraction": f"{self.slot_fraction:.0%} of slots" if self.slot_fraction else "",
            "block": f"slots [{self.block[0]}, {self.block[1]})" if self.block else "",
            "scattered": f"every {_nth(self.every)} slot from {self.first}",
        }[self.slots]
        reqs = {
            "all": "all requests",
            "one": f"request {self.request_ids[0]}" if self.request_ids else "",
            "fraction": f"{self.request_fraction:.0%} of requests" if self.request_fraction else "",
            "indices": f"requests {','.join(str(r) for r in self.request_ids)}",
        }[self.requests]
        return f"{how.get(self.how, self.how)}, {slots}, steps {self.labels()['steps']}, {reqs}"

    def rows(self, batch: int) -> list[int]:
        """The batch rows it corrupts."""
        if self.requests == "all":
            return list(range(batch))
        if self.requests == "fraction":
            n = max(1, round(self.request_fraction * batch))
            return sorted(int(r) for r in _rng(self.seed, 1).permutation(batch)[:n])
        return sorted({r % batch for r in self.request_ids})

    def slot_mask(self, width: int) -> torch.Tensor:
        """[width] bool: the slots it corrupts."""
        if self.slots == "fraction":
            return torch.from_numpy(_rng(self.seed, 0).random(width) < self.slot_fraction)
        mask = torch.zeros(width, dtype=torch.bool)
        if self.slots == "block":
            mask[self.block[0] : self.block[1]] = True
        else:
            mask[self.first :: self.every] = True
        return mask


def _nth(n: int | None) -> str:
    return f"{n}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(n if n is not None and n < 20 else 0, 'th') }"


@dataclass
class Context:
    """What an application may take rows from besides the clean top-k: the step, and per earlier round (oldest
    first) its clean shared top-k [B, T, K] and, per request, whether the verify cut its drafts short."""

    step: int
    history: list[torch.Tensor] = field(default_factory=list)
    cut_short: list[list[bool]] = field(default_factory=list)


def _fit(row: torch.Tensor, width: int) -> torch.Tensor:
    """A [T, K'] row of another round as [T, width] (padded with -1 or cut)."""
    if row.shape[-1] >= width:
        return row[..., :width]
    return torch.nn.functional.pad(row, (0, width - row.shape[-1]), value=-1)


def _source(
    c: Corruption, topk: torch.Tensor, ctx: Context, r: int, cols: torch.Tensor
) -> torch.Tensor | None:
    """Row r's replacement values [T, K] (read at the corrupted slots), or None: nothing to take it from."""
    row, batch, width = topk[r], topk.shape[0], topk.shape[-1]
    if c.how == "dropped":
        return torch.full_like(row, -1)
    if c.how == "shifted":
        moved = row + c.shift
        return torch.where((row >= 0) & (moved >= 0), moved, -1)
    if c.how == "other-request":
        return topk[(r + c.other) % batch]
    if c.how == "other-round":  # the most recent earlier round whose row differs in these slots
        for past in reversed(ctx.history):
            old = _fit(past[r], width)
            if not torch.equal(old[:, cols], row[:, cols]):
                return old
        return None
    # rejected-branch: the most recent round the verify cut short whose row differs in these slots (within a
    # group every round selects the same entries, so the latest rejected round often hands back the same row)
    for past, cut in zip(reversed(ctx.history), reversed(ctx.cut_short), strict=True):
        old = _fit(past[r], width)
        if cut[r] and not torch.equal(old[:, cols], row[:, cols]):
            return old
    return None


def apply(corruption: Corruption, topk: torch.Tensor, context: Context) -> torch.Tensor:
    """The view of the clean shared top-k [B, T, K] a later draft step reads: a corrupted copy, or `topk`
    itself where the corruption leaves this step alone."""
    if not corruption.applies(context.step):
        return topk
    cols = corruption.slot_mask(topk.shape[-1])
    out = topk.clone()
    for r in corruption.rows(topk.shape[0]):
        src = _source(corruption, topk, context, r, cols)
        if src is not None:
            out[r][:, cols] = src[:, cols]
    return out


TAIL: dict[str, Any] = {"slots": "block", "block": (1024, 2048)}
# The five corruptions the H200 mutant patches make, on every later step and every request (the registry's
# `mini` field names them: {"corrupt": NAME}).
NAMED: dict[str, Corruption] = {
    "topk-tail-dropped": Corruption(how="dropped", **TAIL),
    "topk-quarter-dropped": Corruption(how="dropped", slots="block", block=(512, 1024)),
    "topk-scattered-dropped": Corruption(how="dropped", slots="scattered", every=4, first=16),
    "topk-tail-shifted": Corruption(how="shifted", shift=1, **TAIL),
    "topk-tail-other-request": Corruption(how="other-request", other=1, **TAIL),
    "topk-head-kept": Corruption(how="dropped", slots="block", block=(64, 2048)),
}


def resolve(value: Corruption | str | dict[str, Any] | None) -> Corruption | None:
    """A corruption from a NAMED name, its json, or itself."""
    if value is None or isinstance(value, Corruption):
        return value
    if isinstance(value, str):
        if value not in NAMED:
            raise _fail(f"{value!r} is not a named corruption; named: {', '.join(NAMED)}")
        return NAMED[value]
    return Corruption.from_json(value)


# The fact a draft step's lookup needs: (batch row, the step's input token) -> its draft-cache position.
Needs = Callable[[int, int], "int | None"]


class Corrupter:
    """A corruption at work in the draft worker (kit.backends.mini.mistakes.WorkerState calls it around every
    draft step): keeps the earlier rounds' clean top-k and verify outcomes, hands a corrupted step the
    corrupted view and puts the clean top-k back after it, and records each changed row (`summary`)."""

    def __init__(self, corruption: Corruption, num_steps: int) -> None:
        self.c, self.num_steps = corruption, num_steps
        self.history: list[torch.Tensor] = []
        self.cut_short: list[list[bool]] = []
        self.needs: Needs | None = None  # set by the engine on the task model
        self._seq: torch.Tensor | None = None
        self._step0: torch.Tensor | None = None
        self._clean: torch.Tensor | None = None
        self.applications = 0  # (step, round) pairs it applied to
        self.changed = 0  # of those, the ones where some row differs from the clean one
        self.lookups: list[dict[str, Any]] = []  # one per changed row

    def before_step(self, forward_batch: ForwardBatch, i: int, carrier: TopkCarrier) -> None:
        if i == 0:
            self._new_round(forward_batch.seq_lens)
            return
        if not self.c.applies(i):
            return
        clean = carrier.get(forward_batch)
        if clean is None:
            return
        view = apply(self.c, clean, Context(i, self.history, self.cut_short))
        self.applications += 1
        self._record(forward_batch, i, clean, view)
        self._clean = clean
        carrier.put(forward_batch, view)

    def after_step(self, forward_batch: ForwardBatch, i: int, carrier: TopkCarrier) -> None:
        if i == 0:
            self._step0 = carrier.get(forward_batch)
        elif self._clean is not None:  # the carrier keeps the clean top-k
            carrier.put(forward_batch, self._clean)
            self._clean = None

    def end_of_round(self) -> None:
        if self._step0 is not None:
            self.history.append(self._step0)
        self._step0 = None

    def _new_round(self, seq_lens: torch.Tensor) -> None:
        """The last round's verify outcome per request, from how far its committed length moved (accepted
        drafts + 1; a finished request, riding along, commits nothing and was cut short by no one)."""
        seq = seq_lens.clone()
        if self._seq is not None and len(self.cut_short) < len(self.history):
            accepted = (seq - self._seq - 1).tolist()
            self.cut_short.append([0 <= a < self.num_steps for a in accepted])
        self._seq = seq

    def _record(
        self, forward_batch: ForwardBatch, step: int, clean: torch.Tensor, view: torch.Tensor
    ) -> None:
        tokens = forward_batch.input_ids[:, -1].tolist()
        differs = (clean != view).flatten(1).sum(1).tolist()
        if any(differs):
            self.changed += 1
        for r, n in enumerate(differs):
            if not n:
                continue
            need = self.needs(r, tokens[r]) if self.needs is not None else None
            had = need is not None and bool((clean[r] == need).any())
            has = need is not None and bool((view[r] == need).any())
            self.lookups.append(
                {
                    "round": len(self.history),
                    "step": step,
                    "request": r,
                    "token": tokens[r],
                    "slots_changed": int(n),
                    "need": need,
                    "removed": had and not has,
                    "added": has and not had,
                }
            )

    def summary(self) -> dict[str, Any]:
        """What engine.json records: the corruption, how often it applied and changed a row, and each changed
        row's lookup (round, step, request, the step's input token, the fact it needs, and whether the
        corrupted view removed or added that fact)."""
        return {
            "corruption": self.c.to_json(),
            "applications": self.applications,
            "changed": self.changed,
            "no_op": self.changed == 0,
            "lookups": self.lookups,
        }
