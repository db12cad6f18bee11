"""Deterministic prompts of an exact input length, the same on every device and in every arm.

Template (token ids; there is no tokenizer): a fixed header, a body of seeded random tokens in which a
few "needle" motifs recur (so the attention and the indexer have repeated content to find at any
distance), and a tail that restates a needle. Generation has no stop token: every request decodes
exactly `max_new_tokens` (like sglang's `ignore_eos`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

BOS = 0
HEADER_LEN = 16
TAIL_LEN = 16
MOTIF_LEN = 8
MIN_BODY = 32
PROMPT_MIN = HEADER_LEN + MIN_BODY + TAIL_LEN  # the smallest context_len the template can fill


@dataclass(frozen=True)
class Prompt:
    prompt_id: int
    input_ids: list[int]


def _gen(*key: int) -> torch.Generator:
    import torch

    seed = 0
    for k in key:
        seed = (seed * 1_000_003 + int(k)) % (2**62)
    return torch.Generator(device="cpu").manual_seed(seed)


def make_prompt(prompt_id: int, context_len: int, vocab_size: int, seed: int) -> Prompt:
    """One prompt of exactly `context_len` tokens; depends only on (prompt_id, context_len, vocab, seed)."""
    import torch

    if context_len < PROMPT_MIN:
        raise ValueError(f"context_len {context_len} is below the template minimum {PROMPT_MIN}")
    header = torch.randint(1, vocab_size, (HEADER_LEN - 1,), generator=_gen(7, vocab_size))
    g = _gen(seed, prompt_id, context_len, vocab_size)
    body_len = context_len - HEADER_LEN - TAIL_LEN
    body = torch.randint(1, vocab_size, (body_len,), generator=g)
    motifs = torch.randint(1, vocab_size, (4, MOTIF_LEN), generator=g)
    n_needles = max(1, body_len // 256)
    where = torch.randint(0, max(1, body_len - MOTIF_LEN), (n_needles,), generator=g)
    which = torch.randint(0, 4, (n_needles,), generator=g)
    for pos, m in zip(where.tolist(), which.tolist(), strict=True):
        span = min(MOTIF_LEN, body_len - pos)
        body[pos : pos + span] = motifs[m, :span]
    question = torch.randint(1, vocab_size, (TAIL_LEN - MOTIF_LEN // 2,), generator=_gen(11, vocab_size))
    tail = torch.cat([question, motifs[int(which[0]), : MOTIF_LEN // 2]])
    ids = torch.cat([torch.tensor([BOS]), header, body, tail])
    assert ids.numel() == context_len
    return Prompt(prompt_id=prompt_id, input_ids=ids.tolist())


def make_prompts(num_requests: int, context_len: int, vocab_size: int, seed: int) -> list[Prompt]:
    return [make_prompt(i, context_len, vocab_size, seed) for i in range(num_requests)]
