"""Where sglang's REAL top-k kernel puts the facts the draft needs, on the any-slot prompts (issue 32).

kit.task.topk models the slot order of sgl-kernel's `fast_topk_transform_fused` with one assumption (the
atomic order of its threads is ascending position). This measures it: for each any-slot prompt it builds the
task checkpoint NextN's index keys of the prompt (the draft cache: draft position i holds prompt token i + 1)
in sglang's fp8 index-K cache (kit/backends/mini/index_buf_accessor.py, the layout sglang 0.5.14 writes), and
for each round whose later draft steps read the shared top-k, the round's first draft query (the node of
keys[p + 1]); runs `deep_gemm.fp8_paged_mqa_logits` and `sgl_kernel.fast_topk_transform_fused` (identity page
table: the output is positions); and records, per top-k row, the kernel's slot order against kernel_topk's on
the SAME logits (equal? share of slots with the same position, largest displacement) and against the CPU
emulation end to end (kit.task.slots.reference_topk_of), plus every deciding slot per request and their spread
(kit.task.slots.spread). The draft cache is the prompt's (context_len - 1 positions): tokens generated later
score below every filler (nodes have no index key), so they change no slot of the group's entries.

On the H200 (after `bash scripts/h200_task.sh OUT install`: the staged 0.5.14 closure and /tmp/kit-task):
    PYTHONPATH=/tmp/kit-site:/tmp/kit-sgl/sglang-0.5.14:/tmp/kit-sgl/deps:$PWD:/tmp/kit-sgl/fallback \\
      python3 scripts/topk_slots.py OUT/topk_slots.json
On CPU, the same code path through the torch stand-in (kit.backends.mini.dsa_kernels.ReferenceKernels):
    python scripts/topk_slots.py OUT.json --kernels torch --checkpoint CKPT --context-len 8192 --prompts 2

Writes one JSON (a new file; rewritten after every prompt, so a run cut short keeps what it measured) and
prints a summary. Exit 0 when every prompt was measured, 2 with one line on stderr otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import _checkout  # noqa: F401  (this checkout's kit first on sys.path)
import torch

from kit.errors import ExistsError, InputError, KitError, UsageError

DEFAULT_CHECKPOINT = "/tmp/kit-task"  # h200_task.sh install writes it there (kit make-checkpoint --task)


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="topk_slots.py", description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="the JSON to write (must not exist)")
    ap.add_argument("--kernels", choices=("sglang", "torch"), default="sglang")
    ap.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT, help="task checkpoint directory")
    ap.add_argument("--context-len", type=int, default=65536)
    ap.add_argument("--prompts", type=int, default=8, help="prompt ids 0..N-1")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--num-steps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def _kernels(which: str) -> tuple[Any, torch.device]:
    """sglang's kernels on the GPU (one-line ToolMissing/UsageError if they cannot run), or the stand-in."""
    from kit.backends.mini import dsa_kernels as dk

    if which == "torch":
        return dk.ReferenceKernels(), torch.device("cpu")
    problem = dk.device_problem("cuda")
    if problem:
        raise UsageError(
            f"--kernels sglang: {problem}; run on an H200 or use --kernels torch", param="kernels"
        )
    return dk.load_kernels(), torch.device("cuda")


class Indexer:
    """The NextN's indexer of a task checkpoint, fed to sglang's kernels as sglang 0.5.14 feeds them."""

    def __init__(self, model: Any, kernels: Any, device: torch.device) -> None:
        from kit.backends.mini.dsa_kernels import shape_problem

        self.m, self.k, self.device = model, kernels, device
        self.attn = model.draft.attn
        cfg = model.cfg
        self.heads = cfg["index_n_heads"]
        problem = shape_problem(self.heads, cfg["index_head_dim"], cfg["index_topk"])
        if problem or not model.per_token_prefill:
            why = problem or "its draft keys depend on more than the token"
            raise InputError(f"the task checkpoint cannot be measured: {why}")

    def cache(self, ids: list[int]) -> tuple[Any, int]:
        """The fp8 index-K cache of the draft positions of prompt `ids` (token i + 1 at position i)."""
        from kit.backends.mini.index_buf_accessor import PAGE_SIZE, IndexKWithScaleBuffer

        m = self.m
        tokens = torch.tensor(ids[1:])
        uniq, inv = torch.unique(m.embed_class[tokens], return_inverse=True)
        keys = self.attn.index_key(m.token_inputs(m.draft, m.class_token[uniq], draft=True))[inv]
        n = len(tokens)
        cache = IndexKWithScaleBuffer.allocate(1, -(-n // PAGE_SIZE) * PAGE_SIZE, self.device)
        positions = torch.arange(n, device=self.device)[None]
        cache.store(keys.to(self.device, torch.bfloat16)[None], positions)
        return cache, n

    def topk(self, cache: Any, n: int, query_key: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(the kernel's top-k positions in slot order, the kernel's logits [n]) of the node of query_key."""
        from kit.backends.mini.index_buf_accessor import PAGE_SIZE, act_quant

        m, a, k, dev = self.m, self.attn, self.k, self.device
        x = m.token_inputs(m.draft, torch.tensor([m.spec.node(query_key)]), draft=True)
        q, gates = a.index_query(x, a.q_lora(x))  # [1, active, D], [1, active]: pad to the model's heads
        qh = torch.zeros(1, self.heads, q.shape[-1])
        wh = torch.zeros(1, self.heads)
        qh[:, : q.shape[1]], wh[:, : q.shape[1]] = q, gates
        q_fp8, q_scale = act_quant(qh.to(dev, torch.bfloat16), 128, "ue8m0")  # [1, H, D], [1, H, 1]
        weights = (wh.to(dev) * q_scale.squeeze(-1)).float().contiguous()
        lens = torch.tensor([[n]], dtype=torch.int32, device=dev)
        schedule = k.get_paged_mqa_logits_metadata(lens, PAGE_SIZE, k.num_sms)
        logits = k.fp8_paged_mqa_logits(
            q_fp8.unsqueeze(1).contiguous(),
            cache.kv_cache_fp8(),
            weights,
            lens,
            cache.page_table_64,
            schedule,
            cache.max_len,
            clean_logits=False,
        )
        out = k.fast_topk_transform_fused(
            score=logits,
            lengths=lens.view(1),
            page_table_size_1=cache.page_table_1,
            cu_seqlens_q=torch.tensor([0, 1], dtype=torch.int32, device=dev),
            topk=a.topk,
        )
        row = out[0].long().cpu()
        return row[row >= 0], logits[0, :n].float().cpu()


def compare_rows(kernel: torch.Tensor, emulated: torch.Tensor) -> dict[str, Any]:
    """The kernel's row against an emulated one: equal, same set, share of slots with the same position, and
    the largest slot displacement of a position both hold."""
    a, b = kernel.tolist(), emulated.tolist()
    where = {p: i for i, p in enumerate(b)}
    moved = [abs(i - where[p]) for i, p in enumerate(a) if p in where]
    same = sum(x == y for x, y in zip(a, b, strict=False))
    return {
        "equal": a == b,
        "same_set": set(a) == set(b),
        "same_slot_share": same / max(len(a), 1),
        "largest_displacement": max(moved, default=0),
    }


def measure_prompt(ix: Indexer, pid: int, a: argparse.Namespace) -> dict[str, Any]:
    """One prompt: every shared top-k row the fix's rounds read, compared, and the deciding slots."""
    from kit.task.slots import deciding_slots, draft_rounds, reference_topk_of
    from kit.task.topk import kernel_topk
    from kit.task.workload import task_prompt

    spec = ix.m.spec
    p = task_prompt(spec, "any-slot", a.context_len, pid, a.seed, max_new_tokens=a.max_new_tokens)
    rounds = draft_rounds(spec, p.expected_ids, a.num_steps, a.max_new_tokens, shared=True) or []
    shared = sorted({s.shared_key for r in rounds for s in r if s.reads_shared and s.right})
    cache, n = ix.cache(p.ids)
    cpu = reference_topk_of(ix.m)
    rows, emulated, reference, checks = {}, {}, {}, {}
    for key in shared:
        rows[key], logits = ix.topk(cache, n, key)
        emulated[key], reference[key] = kernel_topk(logits), cpu(key, p)
        checks[key] = {
            "vs_emulation_same_logits": compare_rows(rows[key], emulated[key]),
            "vs_cpu_reference": compare_rows(rows[key], reference[key]),
        }
    slots = {}
    for name, table in (("kernel", rows), ("emulated", emulated), ("cpu_reference", reference)):
        slots[name] = deciding_slots(spec, p, a.num_steps, a.max_new_tokens, lambda k, _p, t=table: t[k])
    out: dict[str, Any] = {
        "prompt_id": pid,
        "shared_keys": shared,
        "rows": {str(k): v for k, v in checks.items()},
        "deciding": [
            {"round": d.round, "step": d.step, "key": d.key, "fact_position": d.fact_position, "slot": d.slot}
            for d in slots["kernel"]
        ],
        "deciding_slots_equal": {
            name: [d.slot for d in slots[name]] == [d.slot for d in slots["kernel"]]
            for name in ("emulated", "cpu_reference")
        },
    }
    if shared:
        first = shared[0]
        out["full_row"] = {
            "query_key": first,
            "kernel": rows[first].tolist(),
            "emulated_same_logits": emulated[first].tolist(),
        }
    return out


def provenance(kernels: Any, device: torch.device, a: argparse.Namespace) -> dict[str, Any]:
    from kit.provenance import git_sha

    return {
        "kit_git_sha": git_sha(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else "none (cpu)",
        "kernels": kernels.describe(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "argv": sys.argv[1:],
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
    }


def summary(prompts: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the prompts measured: how the emulation fared, and the deciding slots' spread, cumulatively."""
    from kit.task.slots import spread

    checks = [c for p in prompts for c in p["rows"].values()]
    same = [c["vs_emulation_same_logits"] for c in checks]
    by_n, slots = [], []
    for p in prompts:
        slots += [d["slot"] for d in p["deciding"]]
        by_n.append({"requests": p["prompt_id"] + 1, **spread(slots)})
    holds = next((s["requests"] for s in by_n if s["holds"]), None)
    return {
        "rows": len(checks),
        "rows_equal_emulation": sum(c["equal"] for c in same),
        "min_same_slot_share": min((c["same_slot_share"] for c in same), default=None),
        "largest_displacement": max((c["largest_displacement"] for c in same), default=None),
        "rows_equal_cpu_reference": sum(c["vs_cpu_reference"]["equal"] for c in checks),
        "deciding_slots_equal_emulation": all(p["deciding_slots_equal"]["emulated"] for p in prompts),
        "spread": by_n[-1] if by_n else None,
        "spread_by_requests": by_n,
        "requests_until_it_holds": holds,
    }


def _write(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def run(a: argparse.Namespace) -> int:
    from kit.task.reference import TaskModel

    if a.out.exists():
        raise ExistsError(f"{a.out} exists: name a new file (results are written once)", path=a.out)
    for name in ("context_len", "prompts", "max_new_tokens", "num_steps"):
        if getattr(a, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1", param=name)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    kernels, device = _kernels(a.kernels)
    ix = Indexer(TaskModel(Path(a.checkpoint)), kernels, device)
    doc: dict[str, Any] = {"provenance": provenance(kernels, device, a), "prompts": [], "complete": False}
    t0 = time.perf_counter()
    for pid in range(a.prompts):
        doc["prompts"].append(measure_prompt(ix, pid, a))
        doc["summary"] = summary(doc["prompts"])
        doc["seconds"] = round(time.perf_counter() - t0, 2)
        _write(a.out, doc)
        s = doc["summary"]
        print(
            f"prompt {pid}: {len(doc['prompts'][-1]['deciding'])} deciding lookups; rows equal to the "
            f"emulation so far {s['rows_equal_emulation']}/{s['rows']}",
            flush=True,
        )
    doc["complete"] = True
    _write(a.out, doc)
    s, sp = doc["summary"], doc["summary"]["spread"]
    print(
        f"{a.kernels} kernels ({doc['provenance']['gpu']}): {s['rows_equal_emulation']}/{s['rows']} top-k "
        f"rows equal kit.task.topk's order on the same logits (min same-slot share "
        f"{s['min_same_slot_share']}, "
        f"largest displacement {s['largest_displacement']}); {s['rows_equal_cpu_reference']}/{s['rows']} "
        "equal the CPU reference end to end"
    )
    print(
        f"deciding slots over {a.prompts} requests: {sp['n']} ({sp['distinct']} distinct), per quarter "
        f"{sp['per_quarter']}, largest gap {sp['largest_gap']}, P(random quarter misses all) "
        f"{sp['p_random_quarter_misses_all']:.3g}, every 512-window hit {sp['every_window_hit']}; "
        f"holds from {s['requests_until_it_holds']} requests"
    )
    print(f"wrote {a.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return run(_args(argv))
    except KeyboardInterrupt:
        print("topk_slots: interrupted", file=sys.stderr)
        return 130
    except KitError as exc:
        print(f"topk_slots: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # on the H200 a traceback costs the session: one line, its type and message
        print(f"topk_slots: error: {type(exc).__name__}: {' '.join(str(exc).split())[:400]}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
