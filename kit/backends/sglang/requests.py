"""One cell's requests: its prompts, checked for their length, and the /generate requests in order (the
warm-ups, then the measured prompts), which the plan shows and the launcher sends. Above both the
parameters (`SglangParams`) and the prompt sources (kit.backends.sglang.workload) they join."""

from __future__ import annotations

from dataclasses import dataclass

from kit.backends.sglang.params import SglangParams
from kit.backends.sglang.workload import WARMUP_INPUT_LEN, WARMUP_NEW_TOKENS, Tokenizer, get_workload
from kit.errors import InternalError
from kit.prompt import Prompt


def make_prompt(tok: Tokenizer, p: SglangParams, prompt_id: int) -> Prompt:
    """Prompt `prompt_id` of one cell (p: that cell's parameters), checked for its length."""
    model = {**p.model, "path": p.model_path}
    source = get_workload(p.workload)
    prompt = source.prompt(tok, p.context_len, prompt_id, p.seed, model, p.max_new_tokens)
    if len(prompt.input_ids) != p.context_len:
        raise InternalError(  # a prompt source's own bug: the run would not measure the context it names
            f"workload {p.workload!r} returned {len(prompt.input_ids)} input ids for prompt {prompt_id}, "
            f"not context_len {p.context_len}"
        )
    return prompt


@dataclass(frozen=True)
class Request:
    """One /generate request of a run before its token ids exist: the plan shows it, the launcher sends it."""

    purpose: str  # warmup | measure
    prompt_id: int  # warm-up prompts count down from -1, so they never share a measured prompt's text
    input_len: int
    max_new_tokens: int
    profiled: bool  # the request the profile window is opened on (streamed)
    # with concurrency > 1, in flight beside the profiled request from the start: streamed too, and the
    # window waits until it decodes, so the window's rounds run at that batch size
    companion: bool = False
    # time_decode: streamed without a window, so that its decode rounds are timed as a profiled one's are
    timed: bool = False

    @property
    def stream(self) -> bool:
        """Streamed (the kit watches it decode): the profiled request, its companions, a timed one."""
        return self.profiled or self.companion or self.timed


def requests(p: SglangParams) -> list[Request]:
    """Every request of one cell, in order: the warm-ups, then the measured prompts (the first profiled)."""
    warm = [
        Request("warmup", -1 - w, WARMUP_INPUT_LEN, WARMUP_NEW_TOKENS, False)
        for w in range(p.warmup_requests)
    ]
    in_flight = p.concurrency
    measure = [
        Request(
            "measure",
            i,
            p.context_len,
            p.max_new_tokens,
            p.profile and i == 0,
            companion=p.profile and 0 < i < in_flight,
            timed=bool(p.time_decode) and i == 0,
        )
        for i in range(p.num_requests)
    ]
    return warm + measure
