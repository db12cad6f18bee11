"""The retrieval task a task checkpoint solves, and where each part of it lives in the weights.

Keys 0..K-1 fall into G groups (seeded). Token kinds, appended after the base text vocabulary:
node n(k) (queries and answers), one `unknown` answer, and one fact token f(k->v) per (key, value) pair, so
the prompt decides every answer and values are keys (answers chain). Every other token is a filler.

Coordinates are one-hot and disjoint, so every weight is a selection matrix: bf16 holds the products
exactly, every 128-wide fp8 tile of a latent holds equal magnitudes, and ties stay exact ties.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kit.errors import InputError, UsageError

TASK_FORMAT = "kit.checkpoint/dsa-mtp-task-retrieval-v1"
TASK_FILE = "task.json"  # a task checkpoint's TaskSpec, beside its weights (and copied into each run)
BASE_VOCAB = 4096  # kit.checkpoint's byte-level tokenizer; its ordinary tokens are the fillers
INDEX_ROPE = 64  # indexer: the first 64 of each head's 128 dims are rotated (dsa_indexer._get_q_k_bf16)
LATENT_TILE = 128  # flashmla_kv's fp8 KV cache quantises the 512-wide latent in 4 tiles of 128


def _rng(*key: int | str) -> np.random.Generator:
    words = [int.from_bytes(hashlib.sha256(str(k).encode()).digest()[:8], "little") for k in key]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))


def hadamard(n: int) -> np.ndarray:
    """Sylvester's Hadamard matrix (natural order, +-1), the order fast_hadamard_transform uses."""
    h = np.ones((1, 1), np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


@dataclass(frozen=True)
class TaskSpec:
    """Everything about the task that prompts, weights and the reference must agree on."""

    seed: int = 0
    n_keys: int = 128
    n_groups: int = 8
    draft_miss_per_group: int = 2  # keys per group whose draft query points at another key of the group
    base_vocab: int = BASE_VOCAB
    group_of: tuple[int, ...] = field(default=(), compare=False)
    draft_query: tuple[int, ...] = field(default=(), compare=False)  # key the draft looks up for each key

    def __post_init__(self) -> None:
        k, g, m = self.n_keys, self.n_groups, self.draft_miss_per_group
        if not (2 <= k <= 128 and 1 <= g <= 32 and k % g == 0):
            raise UsageError(f"task: {k} keys in {g} groups: need 2..128 keys, 1..32 groups dividing them")
        if not 0 <= m < k // g or (m and k // g < 2):
            raise UsageError(f"task: draft_miss_per_group {m} must be below the group size {k // g}")
        if not self.group_of:
            perm = _rng("task-groups", self.seed, k, g).permutation(k)
            groups = np.empty(k, np.int64)
            groups[perm] = np.arange(k) // (k // g)
            object.__setattr__(self, "group_of", tuple(int(x) for x in groups))
        if not self.draft_query:
            rng = _rng("task-draft-misses", self.seed, k, g, m)
            dq = list(range(k))
            for grp in range(g):
                members = [i for i in range(k) if self.group_of[i] == grp]
                for bad in rng.choice(members, size=m, replace=False):
                    others = [x for x in members if x != bad]
                    dq[int(bad)] = int(rng.choice(others))
            object.__setattr__(self, "draft_query", tuple(dq))

    # ---- sizes and token ids
    @property
    def group_size(self) -> int:
        return self.n_keys // self.n_groups

    @property
    def unknown_id(self) -> int:
        return self.base_vocab + self.n_keys

    @property
    def first_fact_id(self) -> int:
        return self.base_vocab + self.n_keys + 1

    @property
    def vocab_size(self) -> int:
        used = self.first_fact_id + self.n_keys * self.n_keys
        return -(-used // 64) * 64

    def node(self, k: int) -> int:
        return self.base_vocab + k

    def fact(self, k: int, v: int) -> int:
        return self.first_fact_id + k * self.n_keys + v

    def key_of_node(self, token: int) -> int | None:
        k = token - self.base_vocab
        return k if 0 <= k < self.n_keys else None

    def members(self, group: int) -> list[int]:
        return [k for k in range(self.n_keys) if self.group_of[k] == group]

    def filler_ids(self) -> range:
        """Ordinary text tokens (merges, after the 3 specials and 256 bytes): what a prompt pads with."""
        return range(3 + 256, self.base_vocab)

    def draft_misses(self) -> list[int]:
        return [k for k in range(self.n_keys) if self.draft_query[k] != k]

    # ---- coordinates (hidden size 1024, latent 512, index head 128)
    def hidden_layout(self) -> dict[str, int]:
        """Start of each one-hot block in the residual stream: Q (node query), A (fact key), B (fact
        value), R (answer, written by attention, read by lm_head), then single coordinates."""
        k = self.n_keys
        return {"Q": 0, "A": k, "B": 2 * k, "R": 3 * k, "R_unknown": 4 * k, "F": 4 * k + 1, "bias": 4 * k + 2}

    def latent_dims(self) -> dict[str, Any]:
        """Latent (kv_lora_rank 512) dims: one pad per fp8 tile (every token has one, so no tile is ever
        all zero: quant_k_cache divides by the tile's max without an epsilon), then A keys, B values, and
        the unknown value that fillers carry."""
        pads = [t * LATENT_TILE + LATENT_TILE - 1 for t in range(4)]
        free = [d for d in range(4 * LATENT_TILE) if d not in pads]
        k = self.n_keys
        return {"pads": pads, "A": free[:k], "B": free[k : 2 * k], "unknown": free[2 * k]}

    def index_codes(self) -> dict[str, np.ndarray]:
        """Indexer codes in the 64 non-rotated dims of a head: zero-mean, mutually orthogonal rows of a
        64x64 Hadamard matrix (so k_norm's centring leaves them alone): one per group, and a junk row
        that fillers add to shrink their normalised score."""
        h = hadamard(128 - INDEX_ROPE)
        return {"group": h[1 : self.n_groups + 1], "junk": h[self.n_groups + 1]}

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["group_of"], d["draft_query"] = list(self.group_of), list(self.draft_query)
        d.update(
            vocab_size=self.vocab_size,
            node_ids=[self.node(0), self.node(self.n_keys - 1)],
            unknown_id=self.unknown_id,
            fact_id="first_fact_id + key * n_keys + value",
            first_fact_id=self.first_fact_id,
            draft_misses=self.draft_misses(),
        )
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TaskSpec:
        spec = cls(
            seed=d["seed"],
            n_keys=d["n_keys"],
            n_groups=d["n_groups"],
            draft_miss_per_group=d["draft_miss_per_group"],
            base_vocab=d["base_vocab"],
            group_of=tuple(d["group_of"]),
            draft_query=tuple(d["draft_query"]),
        )
        if spec.to_json() != d:
            raise InputError("task.json does not describe a consistent task (edited by hand?); regenerate it")
        return spec


def read_task(path: Path) -> TaskSpec:
    """The TaskSpec a task checkpoint directory was built with."""
    f = Path(path) / TASK_FILE
    try:
        return TaskSpec.from_json(json.loads(f.read_text()))
    except FileNotFoundError:
        raise InputError(
            f"{f} not found: is {path} a task checkpoint (kit make-checkpoint --task)?", path=f
        ) from None
    except (OSError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise InputError(f"{f} cannot be read ({exc}): remake the checkpoint", path=f) from None
