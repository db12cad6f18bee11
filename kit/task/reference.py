"""Greedy generation on the float32 reference of a task checkpoint (kit.task.forward), plain or with
EAGLE/MTP speculative decoding simulated the way sglang 0.5.14's EAGLEWorkerV2 runs it with topk 1:

- prefill: the target over the prompt gives the first token; the draft extend runs the NextN over the prompt
  shifted by one (draft position i holds embed(token[i+1]) with target hidden i), so its last position
  proposes draft token 1;
- each round: num_steps - 1 draft forwards propose tokens 2..num_steps; the target verifies the last token
  plus the num_steps drafts; the longest agreeing prefix is accepted, plus the target's bonus token; the
  draft extend re-runs the NextN over the accepted tokens and proposes the next round's draft token 1;
- the draft forwards' indexer: arm "bug"/"off" recomputes it at every draft forward, "fix" computes it at
  the first and reuses that top-k (index_share_for_mtp_iteration with the PR's fix).

Outputs are the target's greedy tokens whatever the draft does; accept length = completion_tokens /
spec_verify_ct, as sglang reports it. `target_topk` replaces the target's indexer selection ("last": the
last index_topk positions, "random": seeded) to show the answers need what the indexer selects.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from kit import checkpoint as ck
from kit.errors import InputError, InternalError, KitError, UsageError
from kit.task.forward import KVCache, Layer, LMHead, Numerics, read_safetensors, rms_norm
from kit.task.spec import TaskSpec, read_task

ARMS = ("bug", "off", "fix")


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """The reference's tensors are one row to a few thousand: intra-op threads only cost (measured: 5x CPU
    time with 2 threads on a busy 2-core machine). The caller's setting comes back afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class TaskModel:
    """Target layers + NextN layer of a checkpoint directory, float32 (or, through `made`, of the same
    weights built in memory)."""

    def __init__(self, path: Path, numerics: Numerics | None = None) -> None:
        path = Path(path)
        spec = read_task(path)  # first: a checkpoint without task.json is refused, saying what it needs
        try:
            cfg = json.loads((path / "config.json").read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise InputError(
                f"{path}: config.json unreadable ({exc}): remake the checkpoint", path=path
            ) from None
        self._build(cfg, spec, read_safetensors(path / ck.WEIGHTS), numerics)

    @classmethod
    def made(
        cls,
        seed: int = 0,
        *,
        overrides: dict[str, Any] | None = None,
        numerics: Numerics | None = None,
        **task: int,
    ) -> TaskModel:
        """The model make_task_checkpoint(dir, seed, overrides=..., **task) writes, built in memory without
        the files (the same bf16-rounded values the directory's weights read back as)."""
        from kit.task.weights import task_tensors

        cfg, spec, w = task_tensors(seed, overrides=overrides, **task)
        m = cls.__new__(cls)
        m._build(cfg, spec, w, numerics)
        return m

    def _build(
        self, cfg: dict[str, Any], spec: TaskSpec, w: dict[str, torch.Tensor], numerics: Numerics | None
    ) -> None:
        numerics = numerics or Numerics()
        self.cfg, self.spec = cfg, spec
        n, self.eps = cfg["num_hidden_layers"], cfg["rms_norm_eps"]
        self.embed, self.norm = w["model.embed_tokens.weight"], w["model.norm.weight"]
        # tokens with identical embedding rows (all fillers here) get identical per-token keys
        uniq, self.embed_class = torch.unique(self.embed, dim=0, return_inverse=True)
        self.class_token = torch.zeros(len(uniq), dtype=torch.long).scatter_(
            0, self.embed_class, torch.arange(len(self.embed))
        )
        self.lm_head = LMHead(w["lm_head.weight"])  # the NextN shares it (and the embedding)
        self.layers = [
            Layer(w, f"model.layers.{i}", cfg, i >= cfg["first_k_dense_replace"], numerics) for i in range(n)
        ]
        p = f"model.layers.{n}"
        self.enorm, self.hnorm = w[f"{p}.enorm.weight"], w[f"{p}.hnorm.weight"]
        self.eh_proj, self.head_norm = w[f"{p}.eh_proj.weight"], w[f"{p}.shared_head.norm.weight"]
        self.draft = Layer(w, p, cfg, True, numerics)
        h = cfg["hidden_size"]
        self.draft_needs_hidden = bool(self.eh_proj[:, h:].any())
        # Prompt keys are per-token only if no attention after layer 0 is live and the draft ignores hidden.
        self.per_token_prefill = not self.draft_needs_hidden and not any(x.attn.live for x in self.layers[1:])

    def token_inputs(self, layer: Layer, tokens: torch.Tensor, draft: bool) -> torch.Tensor:
        """Attention inputs of `layer` for tokens whose keys depend on the token alone (per_token_prefill):
        target layer 0's, or with `draft` the NextN's (its hidden half of eh_proj is zero)."""
        r = self.embed[tokens]
        if draft:
            r = rms_norm(r, self.enorm, self.eps) @ self.eh_proj[:, : self.cfg["hidden_size"]].T
        return rms_norm(r, layer.in_norm, self.eps)


class Session:
    """Caches of one request; target cache position i holds token i, draft cache position i token i+1."""

    def __init__(self, m: TaskModel, capacity: int, target_topk: str = "indexer", seed: int = 0) -> None:
        c = m.cfg
        self.m, self.mode = m, target_topk
        self.gen = torch.Generator().manual_seed(seed)
        self.tcache = [  # a dead attention keeps no cache
            KVCache(capacity, c["kv_lora_rank"], c["index_head_dim"]) if x.attn.live else None
            for x in m.layers
        ]
        self.dcache = KVCache(capacity, c["kv_lora_rank"], c["index_head_dim"])
        self.stats: list[dict[str, float]] = []

    def target(self, tokens: list[int], start: int, stats: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Target forward of tokens at positions start..; returns logits and final-norm hidden [T, *]."""
        return target_forward([self], [tokens], [start], stats)[0]

    def draft(
        self, tokens: list[int], hidden: torch.Tensor, start: int, topk: list[torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """NextN forward (DeepseekModelNextN): logits, shared_head.norm hidden, the selections used."""
        return draft_forward([self], [tokens], [hidden], [start], None if topk is None else [topk])[0]

    def _per_token_keys(self, layer: Layer, cache: KVCache, tokens: torch.Tensor, draft: bool) -> None:
        """Keys of positions whose attention input depends on their token alone, once per distinct token."""
        m = self.m
        uniq, inv = torch.unique(m.embed_class[tokens], return_inverse=True)
        lat, key = layer.attn.kv(m.token_inputs(layer, m.class_token[uniq], draft))
        cache.write(0, lat[inv], key[inv])

    def target_prompt(self, tokens: list[int], chunk: int = 256) -> torch.Tensor | None:
        """Target cache positions 0..len(tokens)-1 (a prompt less its last token); their final-norm hidden
        states, or None where the draft does not read them (the per-token shortcut)."""
        m = self.m
        if m.per_token_prefill:
            if m.layers[0].attn.live:
                self._per_token_keys(m.layers[0], self.tcache[0], torch.tensor(tokens), draft=False)
            return None
        # generic: every position through every layer (slow; checks the shortcut at small context)
        return torch.cat([self.target(tokens[a : a + chunk], a)[1] for a in range(0, len(tokens), chunk)])

    def draft_prompt(self, tokens: list[int], hidden: torch.Tensor | None, chunk: int = 256) -> None:
        """Draft cache positions 0..len(tokens)-1: tokens[i] (the prompt shifted by one) with target hidden
        i, as target_prompt returned it."""
        if self.m.per_token_prefill:
            self._per_token_keys(self.m.draft, self.dcache, torch.tensor(tokens), draft=True)
            return
        assert hidden is not None and len(hidden) == len(tokens)
        for a in range(0, len(tokens), chunk):
            self.draft(tokens[a : a + chunk], hidden[a : a + chunk], a)

    @_one_thread()
    def prefill(self, prompt: list[int], chunk: int = 256) -> tuple[int, torch.Tensor, torch.Tensor, int]:
        """Target prefill + draft extend: (first token, its target hidden, draft hidden, draft token 1)."""
        n = len(prompt)
        hids = self.target_prompt(prompt[:-1], chunk)
        logits, hid = self.target(prompt[-1:], n - 1, stats=True)
        first = int(logits[-1].argmax())
        self.draft_prompt(prompt[1:], hids, chunk)
        dl, dh, _ = self.draft([first], hid[-1:], n - 1)
        return first, hid[-1:], dh, int(dl[-1].argmax())


def target_forward(
    sessions: list[Session], tokens: list[list[int]], starts: list[int], stats: bool = False
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Session.target of several requests at once: each computed on its own, but each layer's indexer
    runs for all of them inside one indexer scope (Layer.forward_batch), as a batched engine launches it."""
    m = sessions[0].m
    if any(s.m is not m or s.mode != sessions[0].mode for s in sessions):
        raise InternalError("a batch of sessions must share one model and one target_topk mode")
    rs = [m.embed[torch.tensor(t)] for t in tokens]
    for i, layer in enumerate(m.layers):
        rs, _ = layer.forward_batch(
            rs,
            [s.tcache[i] for s in sessions],
            starts,
            mode=sessions[0].mode,
            gens=[s.gen for s in sessions],
            stats=[s.stats if stats else None for s in sessions],
        )
    hids = [rms_norm(r, m.norm, m.eps) for r in rs]
    return [(m.lm_head(h), h) for h in hids]


def draft_forward(
    sessions: list[Session],
    tokens: list[list[int]],
    hiddens: list[torch.Tensor],
    starts: list[int],
    topks: list[list[torch.Tensor]] | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]]:
    """Session.draft of several requests at once (one indexer scope for all of them, or none with `topks`)."""
    m = sessions[0].m
    rs = []
    for t, hidden in zip(tokens, hiddens, strict=True):
        e = rms_norm(m.embed[torch.tensor(t)], m.enorm, m.eps)
        rs.append(torch.cat([e, rms_norm(hidden, m.hnorm, m.eps)], -1) @ m.eh_proj.T)
    rs, used = m.draft.forward_batch(rs, [s.dcache for s in sessions], starts, topks=topks)
    hids = [rms_norm(r, m.head_norm, m.eps) for r in rs]
    return [(m.lm_head(h), h, u) for h, u in zip(hids, used, strict=True)]


def load(model: TaskModel | Path | str) -> TaskModel:
    return model if isinstance(model, TaskModel) else TaskModel(Path(model))


@_one_thread()
def generate(
    model: TaskModel | Path | str,
    prompt: list[int],
    max_new_tokens: int,
    *,
    speculative: bool = True,
    arm: str = "bug",
    num_steps: int = 5,
    num_draft_tokens: int | None = None,
    target_topk: str = "indexer",
    seed: int = 0,
) -> dict[str, Any]:
    """Greedy tokens of one request, and with `speculative` the EAGLE figures sglang reports."""
    m = load(model)
    if arm not in ARMS:
        raise UsageError(f"arm {arm!r}: one of {', '.join(ARMS)}")
    if num_steps < 1 or (num_draft_tokens is not None and num_draft_tokens != num_steps + 1):
        raise UsageError("the reference simulates EAGLE topk 1 only: num_draft_tokens = num_steps + 1")
    if max_new_tokens < 1:
        raise UsageError("max_new_tokens must be >= 1")
    n = len(prompt)
    sess = Session(m, n + max_new_tokens + num_steps + 2, target_topk, seed)
    t0 = time.monotonic()
    first, hid, dh, d1 = sess.prefill(prompt)
    out = [first]
    row: dict[str, Any] = {"input_len": n, "arm": arm if speculative else None, "target_topk": target_topk}
    if not speculative:
        while len(out) < max_new_tokens:
            logits, _ = sess.target(out[-1:], n + len(out) - 1)
            out.append(int(logits[-1].argmax()))
        return {**row, "output_ids": out, "completion_tokens": len(out), "seconds": time.monotonic() - t0}
    accept, drafts_all, length = [], [], n + 1  # committed tokens; the last one is not in the target cache
    while len(out) < max_new_tokens:
        drafts, h, shared = [d1], dh, None
        for s in range(num_steps - 1):  # EagleDraftWorker.draft_forward: num_steps - 1 forwards
            logits, h, used = sess.draft(drafts[-1:], h, length - 1 + s, topk=shared)
            if arm == "fix" and shared is None:
                shared = used
            drafts.append(int(logits[-1].argmax()))
        logits, vhid = sess.target([out[-1]] + drafts, length - 1)  # verify
        pred = logits.argmax(-1).tolist()
        a = 0
        while a < num_steps and drafts[a] == pred[a]:
            a += 1
        new = drafts[:a] + [pred[a]]
        out += new
        accept.append(a + 1)
        drafts_all.append(drafts)
        dlogits, dhid, _ = sess.draft(new, vhid[: a + 1], length - 1)  # draft extend
        d1, dh = int(dlogits[-1].argmax()), dhid[-1:]
        length += a + 1
    out = out[:max_new_tokens]
    return {
        **row,
        "output_ids": out,
        "completion_tokens": len(out),
        "spec_verify_ct": len(accept),
        "accept_length": len(out) / len(accept) if accept else None,
        "accept_lens": accept,
        "draft_ids": drafts_all,
        "num_steps": num_steps,
        "seconds": time.monotonic() - t0,
    }


@_one_thread()
def hop_accuracy(
    model: TaskModel | Path | str, prompt: list[int], expected_ids: list[int], target_topk: str = "indexer"
) -> float:
    """Teacher-forced accuracy: the target reads the expected chain and each next node is checked, so one
    miss does not derail the rest (generation's accuracy counts every token after a miss as wrong)."""
    m = load(model)
    sess = Session(m, len(prompt) + len(expected_ids) + 1, target_topk)
    first, *_ = sess.prefill(prompt)
    logits, _ = sess.target(expected_ids[:-1], len(prompt)) if len(expected_ids) > 1 else (None, None)
    preds = [first] + ([] if logits is None else logits.argmax(-1).tolist())
    return sum(int(p == e) for p, e in zip(preds, expected_ids, strict=True)) / len(expected_ids)


@_one_thread()
def probe(model: TaskModel | Path | str, prompt: list[int], target_topk: str = "indexer") -> dict[str, float]:
    """Margins at the prompt's last position: layer-0 attention logit gap (best key minus the next) and the
    best key's softmax weight, and the first token's top-1 minus top-2 logprob."""
    m = load(model)
    sess = Session(m, len(prompt) + 2, target_topk)
    first, hid, _, _ = sess.prefill(prompt)
    lp = torch.log_softmax(m.lm_head(hid), -1)[-1]
    top2 = torch.topk(lp, 2).values
    return {**sess.stats[0], "first_token": first, "logprob_margin": float(top2[0] - top2[1])}


def self_check(path: Path, context: int, prompts: int, new_tokens: int, bar: float) -> dict[str, Any]:
    """Accuracy of the reference on every workload the context holds (any-slot from 8192 tokens: below, it
    is listed in `not_run`), bug and fix arms (their outputs must be identical): what labels a task
    checkpoint as one. Never raises on a failed check; `passed` and `problem` say."""
    from kit.task.workload import WORKLOADS, accuracy, task_prompt, workloads_at

    t0 = time.monotonic()
    res: dict[str, Any] = {
        "ran": True,
        "context_len": context,
        "prompts": prompts,
        "max_new_tokens": new_tokens,
    }
    skipped = [w for w in WORKLOADS if w not in workloads_at(context)]
    if skipped:
        res["not_run"] = {w: f"context_len {context} is too short for it" for w in skipped}
    problems = []
    try:
        m = TaskModel(Path(path))
        for wl in workloads_at(context):
            rows = []
            for pid in range(prompts):
                p = task_prompt(m.spec, wl, context, pid, seed=0, max_new_tokens=new_tokens)
                bug = generate(m, p.ids, new_tokens, arm="bug")
                fix = generate(m, p.ids, new_tokens, arm="fix")
                if bug["output_ids"] != fix["output_ids"]:
                    problems.append(f"{wl} prompt {pid}: bug and fix outputs differ")
                acc = accuracy(p.expected_ids, bug["output_ids"])
                rows.append((acc, bug["accept_length"], fix["accept_length"]))
            acc = sum(r[0] for r in rows) / len(rows)
            res[wl] = {
                "accuracy": round(acc, 4),
                "accept_length_bug": round(sum(r[1] for r in rows) / len(rows), 3),
                "accept_length_fix": round(sum(r[2] for r in rows) / len(rows), 3),
            }
            if acc < bar:
                problems.append(f"{wl}: accuracy {acc:.3f} below {bar}")
    except KitError as e:
        problems.append(str(e))
    res.update(passed=not problems, bar=bar, problem="; ".join(problems) or None)
    res["seconds"] = round(time.monotonic() - t0, 2)
    return res
