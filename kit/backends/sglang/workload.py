"""The real-sglang workload: prompts of an exact token length from a named prompt source, greedy requests,
and the outputs.jsonl rows every later stage reads.

Prompts are sent as `input_ids`, not text: the length is then exactly what was asked, measured with the
model's own tokenizer, and identical across arms (the sha256 of the ids is recorded to prove it).

Prompt sources are a registry keyed by workload name (`records`, the deterministic shipping records, is
the default). A source may also say which output it expects; rows then carry `expected_ids` and `correct`.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kit.errors import InputError, ServerError, ToolMissing, UsageError
from kit.prompt import Prompt

GENERATOR = "kit.sglang_workload/records-v1"
MIN_INPUT_LEN = 64
MAX_INPUT_LEN = 524288  # 512k
WARMUP_INPUT_LEN = 256
WARMUP_NEW_TOKENS = 16

_CITIES = [
    "Lisbon",
    "Oslo",
    "Nairobi",
    "Lima",
    "Osaka",
    "Tunis",
    "Quito",
    "Perth",
    "Riga",
    "Hanoi",
    "Accra",
    "Porto",
]
_GOODS = [
    "copper wire",
    "rice",
    "glass panes",
    "wool",
    "coffee",
    "bearings",
    "paper",
    "olive oil",
    "cement",
    "salt",
]
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_STATES = [
    "arrived intact",
    "was delayed by weather",
    "was inspected twice",
    "was split into two loads",
    "was rerouted",
    "arrived early",
    "was held at customs",
]


class Tokenizer(Protocol):
    bos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


def load_tokenizer(model_path: Path, trust_remote_code: bool = False) -> Tokenizer:
    """The model's tokenizer from local files only (GPU nodes are often offline; no silent download)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ToolMissing(
            "transformers is not installed: it comes with sglang; run the kit in the sglang env",
            tool="transformers",
        ) from None
    try:
        return AutoTokenizer.from_pretrained(
            str(model_path), local_files_only=True, trust_remote_code=trust_remote_code
        )
    except Exception as e:  # transformers raises many types (OSError, ValueError, ...)
        raise InputError(
            f"cannot load the tokenizer of {model_path} from local files: {e}", path=model_path
        ) from None


def _paragraph(rng: random.Random, first_record: int, n: int) -> str:
    lines = []
    for k in range(first_record, first_record + n):
        lines.append(
            f"Record {k}: a shipment of {rng.randint(2, 990)} crates of {rng.choice(_GOODS)} left "
            f"{rng.choice(_CITIES)} on {rng.choice(_DAYS)} for {rng.choice(_CITIES)} and "
            f"{rng.choice(_STATES)}."
        )
    return "\n".join(lines) + "\n"


def prompt_ids(tok: Tokenizer, input_len: int, prompt_id: int, seed: int = 0) -> list[int]:
    """Exactly `input_len` token ids: BOS (if any), shipping records, then a question about them."""
    if not MIN_INPUT_LEN <= input_len <= MAX_INPUT_LEN:
        raise UsageError(
            f"input length {input_len} is outside {MIN_INPUT_LEN}..{MAX_INPUT_LEN} tokens",
            param="context_len",
        )
    rng = random.Random(seed * 1_000_003 + prompt_id)
    target = rng.randint(1, max(1, input_len // 40))
    suffix = tok.encode(
        f"\nQuestion: summarise record {target} above in one sentence, "
        "then list the cities it names.\nAnswer:",
        add_special_tokens=False,
    )
    head = [tok.bos_token_id] if getattr(tok, "bos_token_id", None) is not None else []
    body_len = input_len - len(head) - len(suffix)
    if body_len < 1:
        raise UsageError(
            f"input length {input_len} is too short for the prompt's question ({len(suffix)} tokens)",
            param="context_len",
        )
    body: list[int] = []
    record = 1
    while len(body) < body_len:
        body.extend(tok.encode(_paragraph(rng, record, 64), add_special_tokens=False))
        record += 64
    return head + body[:body_len] + suffix


# ---------------------------------------------------------------------------------------------------
# Prompt sources


class Workload(Protocol):
    """A prompt source. `prompt` must be deterministic in its arguments (both arms get the same ids) and
    return exactly `context_len` input ids; `version` names the generator in plans and rows.

    `model`: what the kit read from the model's config.json (index_topk, ...) plus `path`, the local model
    directory (a task checkpoint keeps its task there); `max_new_tokens`: how many tokens each request
    generates (an expected answer need not be that long: rows are judged over the tokens both have)."""

    name: str
    version: str

    def prompt(
        self,
        tok: Tokenizer,
        context_len: int,
        prompt_id: int,
        seed: int,
        model: dict[str, Any],
        max_new_tokens: int,
    ) -> Prompt: ...


@dataclass(frozen=True)
class Records:
    """Shipping records and a question about one of them (the default workload)."""

    name: str = "records"
    version: str = GENERATOR

    def prompt(
        self,
        tok: Tokenizer,
        context_len: int,
        prompt_id: int,
        seed: int,
        model: dict[str, Any],
        max_new_tokens: int,
    ) -> Prompt:
        return Prompt(prompt_ids(tok, context_len, prompt_id, seed))


DEFAULT_WORKLOAD = "records"
_REGISTRY: dict[str, Workload] = {DEFAULT_WORKLOAD: Records()}
# Sources defined elsewhere in the kit, imported on first use: name -> "module:attribute" of a Workload
# (e.g. a retrieval task's workloads), so that naming one is enough and nothing heavy loads otherwise.
_LAZY: dict[str, str] = {
    "same-target": "kit.task.workload:SAME_TARGET",
    "moving-target": "kit.task.workload:MOVING_TARGET",
    "any-slot": "kit.task.workload:ANY_SLOT_WORKLOAD",
}


def register(workload: Workload) -> Workload:
    """Add a prompt source under its name (a name is taken once: two sources would make runs ambiguous)."""
    known = _REGISTRY.get(workload.name)
    if known is not None and known is not workload:
        raise ValueError(f"workload {workload.name!r} is already registered ({known!r})")
    _REGISTRY[workload.name] = workload
    return workload


def workload_names() -> list[str]:
    return sorted({*_REGISTRY, *_LAZY})


def get_workload(name: str) -> Workload:
    """The registered source called `name`; a UsageError naming the known ones otherwise."""
    if name not in _REGISTRY and name in _LAZY:
        module, _, attr = _LAZY[name].partition(":")
        register(getattr(importlib.import_module(module), attr))
    if name not in _REGISTRY:
        raise UsageError(f"unknown workload {name!r}: use one of {workload_names()}", param="workload")
    return _REGISTRY[name]


def ids_sha256(ids: Sequence[int]) -> str:
    return hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest()


def generate_body(input_ids: list[int] | str, max_new_tokens: int, stream: bool) -> dict[str, Any]:
    """Greedy and a fixed length (ignore_eos), so both arms decode the same number of rounds. The top-2
    logprobs of every output token come back too: how far each greedy choice was from a tie, and how
    closely two runs' target logits agree where their tokens do."""
    return {
        "input_ids": input_ids,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
        "return_logprob": True,
        "top_logprobs_num": 2,
        "stream": stream,
    }


def output_logprobs(meta: dict[str, Any], output_ids: list[int]) -> dict[str, list[float] | None]:
    """Per output token: its logprob, and the margin of the greedy choice (top-1 minus top-2 logprob).

    sglang's meta_info holds `output_token_logprobs` as (logprob, token_id, text) and `output_top_logprobs`
    as one list of such per token. None where the server sent none (not every backend does), or where the
    lists do not line up with the output tokens (then they cannot be trusted per position).
    """
    tokens = meta.get("output_token_logprobs")
    tops = meta.get("output_top_logprobs")
    logprobs = margins = None
    if tokens and len(tokens) == len(output_ids) and [t[1] for t in tokens] == list(output_ids):
        logprobs = [float(t[0]) for t in tokens]
    if tops and len(tops) == len(output_ids) and all(t and len(t) >= 2 for t in tops):
        margins = [float(t[0][0]) - float(t[1][0]) for t in tops]
    return {"output_logprobs": logprobs, "output_margins": margins}


def matches_expected(output_ids: Sequence[int], expected_ids: Sequence[int]) -> bool:
    """The output is the expected one over the tokens both have (generation runs to max_new_tokens, past
    a shorter answer; a longer expectation is judged on what was generated)."""
    n = min(len(output_ids), len(expected_ids))
    return n > 0 and list(output_ids[:n]) == list(expected_ids[:n])


def output_row(
    prompt_id: int,
    prompt: Prompt,
    response: dict,
    index_topk: int,
    profiled: bool,
    workload: str = DEFAULT_WORKLOAD,
    chunks: list[list[Any]] | None = None,
) -> dict:
    """One outputs.jsonl line; accept length = completion_tokens / spec_verify_ct (sglang's definition).
    `chunks`: a streamed request's [seconds since it was sent, completion_tokens, spec_verify_ct] per
    chunk (`stream_chunks`: its decode rounds timed from the client)."""
    input_ids = prompt.input_ids
    meta = response.get("meta_info") or {}
    completion = meta.get("completion_tokens")
    verify_ct = meta.get("spec_verify_ct")
    if completion is None:
        raise ServerError(f"prompt {prompt_id}: the /generate response has no meta_info.completion_tokens")
    output_ids = response.get("output_ids")
    if output_ids is None:
        raise ServerError(f"prompt {prompt_id}: the /generate response has no output_ids")
    finish = meta.get("finish_reason")
    row = {
        "prompt_id": prompt_id,
        "workload": workload,
        "input_len": len(input_ids),
        "prompt_sha256": ids_sha256(input_ids),
        "output_ids": list(output_ids),
        "text": response.get("text"),
        "completion_tokens": completion,
        "spec_verify_ct": verify_ct,
        "accept_length": (completion / verify_ct) if verify_ct else None,
        "finish_reason": finish.get("type") if isinstance(finish, dict) else finish,
        "e2e_latency": meta.get("e2e_latency"),
        "profiled": profiled,
        "bug_visible": len(input_ids) > index_topk,
        **output_logprobs(meta, list(output_ids)),
    }
    if chunks is not None:
        row["stream_chunks"] = chunks
    if prompt.expected_ids is not None:
        row["expected_ids"] = list(prompt.expected_ids)
        row["correct"] = matches_expected(output_ids, prompt.expected_ids)
    return row
