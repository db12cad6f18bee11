"""Benchmark (no assertions): mini engine draft-step time, bug vs fix, across context lengths on CPU.

Draft-step time = wall time of one draft round (EagleDraftWorker.draft_forward) / its draft forwards
(num_steps - 1), the PR's "per draft step" figure. For each context both arms are built and prefilled,
then their draft rounds are interleaved (bug, fix, bug, fix, ...) on the same state so that load from
other processes hits both alike; medians are reported.

    .venv/bin/python scripts/bench_mini_cpu.py [--contexts 4096,16384,65536] [--rounds 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import _checkout  # noqa: F401  (this checkout's kit first on sys.path)
import torch

from kit.backends.mini.engine import Engine, cpu_threads
from kit.backends.mini.forward_batch_info import ForwardBatch, ForwardMode
from kit.backends.mini.params import validate
from kit.probe import ranges as nr


def _prefilled(arm: str, context: int, args: argparse.Namespace) -> tuple[Engine, ForwardBatch]:
    params = validate(
        {
            "arm": arm,
            "context_len": context,
            "num_requests": args.num_requests,
            "num_steps": args.num_steps,
            "max_new_tokens": 8,
            "nvtx_sink": "off",
        }
    )
    engine = Engine(params)
    ids = torch.tensor([p.input_ids for p in engine.prompts])
    spec_info, seq_lens = engine.worker.prefill(ids, engine.preset.prefill_chunk)
    fb = ForwardBatch(
        ForwardMode.DECODE,
        ids.shape[0],
        spec_info.topk_index,
        seq_lens[:, None],
        seq_lens,
        spec_info=spec_info,
    )
    return engine, fb


@torch.no_grad()
def bench_context(context: int, args: argparse.Namespace) -> dict:
    engines = {arm: _prefilled(arm, context, args) for arm in ("bug", "fix")}
    hidden = {arm: fb.spec_info.hidden_states for arm, (_, fb) in engines.items()}
    for _ in range(args.warmup):
        for arm, (engine, fb) in engines.items():
            fb.spec_info.hidden_states = hidden[arm]
            engine.draft_worker.draft(fb)
    for engine, _ in engines.values():
        engine.draft_worker.round_wall_s.clear()
        engine.draft_worker.round_indexer_calls.clear()
    for _ in range(args.rounds):
        for arm, (engine, fb) in engines.items():
            fb.spec_info.hidden_states = hidden[arm]  # same state every round
            engine.draft_worker.draft(fb)
    forwards = args.num_steps - 1
    out = {"context": context}
    for arm, (engine, _) in engines.items():
        dw = engine.draft_worker
        out[arm] = statistics.median(dw.round_wall_s) * 1e3 / forwards
        out[f"{arm}_indexer_per_round"] = statistics.median(dw.round_indexer_calls)
    out["ratio"] = out["bug"] / out["fix"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="4096,16384,65536")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--num-steps", type=int, default=5)
    ap.add_argument("--num-requests", type=int, default=1)
    args = ap.parse_args()
    nr.configure("off")
    with cpu_threads(torch.device("cpu")):
        threads = torch.get_num_threads()
    print(
        f"mini engine, preset tiny, cpu, torch {torch.__version__}, {threads} intra-op thread(s), "
        f"num_steps {args.num_steps} ({args.num_steps - 1} draft forwards per round), "
        f"{args.num_requests} request(s), index_topk 2048, median of {args.rounds} interleaved rounds; "
        f"load average at start {os.getloadavg()[0]:.2f}"
    )
    print()
    print("| context | bug ms/step | fix ms/step | bug/fix | indexer calls/round bug, fix |")
    print("|---:|---:|---:|---:|---|")
    t0 = time.perf_counter()
    for context in (int(c) for c in args.contexts.split(",")):
        with cpu_threads(torch.device("cpu")):
            r = bench_context(context, args)
        print(
            f"| {context} | {r['bug']:.3f} | {r['fix']:.3f} | {r['ratio']:.2f}x | "
            f"{r['bug_indexer_per_round']:g}, {r['fix_indexer_per_round']:g} |",
            flush=True,
        )
    print()
    print(f"total {time.perf_counter() - t0:.1f} s; load average now {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
