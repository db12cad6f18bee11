"""`python -m kit.backends.mini.kernel_check [--json PATH] [--no-timing]`: do sglang's indexer kernels
run here, and right?

A short pre-flight for a GPU window (scripts/h200_evidence.sh runs it first), so that a broken import costs
seconds, not the window. It
1. loads deep_gemm + sgl_kernel (kit/mini/dsa_kernels.py) on an sm90/sm100 GPU;
2. runs the mini's kernel indexer (kit/mini/dsa_indexer_sglang.py) on random indexer weights at the real
   indexer shapes (64 and 32 heads x 128), paged and ragged, decode (T=1) and verify-like (T=6) rows, over
   a cache with a shuffled page table, and compares each row's top-k set with the torch stand-in
   (ReferenceKernels: the same fp8 inputs, fp32 math): overlap >= MIN_OVERLAP required (fp8/accumulation
   order only moves near-ties); this also JIT-compiles every DeepGEMM kernel the runs will use;
   (first, four processes in parallel make DeepGEMM JIT-compile the kernels of each shape: nvcc is slow);
3. captures one indexer call per path in a CUDA graph and checks its replays against eager calls;
4. times one indexer call (CUDA events) at 128k and 512k: the whole call, its logits + top-k kernels
   alone, and the torch indexer, for 64/32 heads, 1/4 requests, paged/ragged.
Last line: `indexer_impl=sglang ok` (exit 0) or `indexer_impl=torch (sglang unusable: ...)` (exit 3).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from kit.backends.mini.dsa_indexer import Indexer, IndexerWeights, Rope
from kit.backends.mini.dsa_indexer_sglang import SglangIndexer
from kit.backends.mini.dsa_kernels import ReferenceKernels, SglangKernels, device_problem, load_kernels
from kit.backends.mini.index_buf_accessor import PAGE_SIZE, IndexKWithScaleBuffer
from kit.errors import KitError, ToolMissing
from kit.probe import ranges as nr

MIN_OVERLAP = 0.95
HIDDEN, Q_LORA, HEAD_DIM, TOPK = 1024, 512, 128, 2048  # the kernels see only heads x 128 and the cache


def indexer_weights(heads: int, seed: int, device: torch.device | str) -> IndexerWeights:
    g = torch.Generator(device="cpu").manual_seed(seed)

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * shape[-1] ** -0.5).to(device=device, dtype=torch.bfloat16)

    return IndexerWeights(
        wq_b=w(heads * HEAD_DIM, Q_LORA), wk=w(HEAD_DIM, HIDDEN), weights_proj=w(heads, HIDDEN)
    )


def shuffled_cache(batch: int, max_len: int, device: torch.device | str, seed: int) -> IndexKWithScaleBuffer:
    """A cache whose pages are a random permutation (the block table must really be followed)."""
    blocks = max_len // PAGE_SIZE
    g = torch.Generator(device="cpu").manual_seed(seed)
    table = torch.randperm(batch * blocks, generator=g).to(torch.int32).view(batch, blocks)
    return IndexKWithScaleBuffer.allocate(batch, max_len, device, HEAD_DIM, page_table_64=table.to(device))


def fill_keys(cache: IndexKWithScaleBuffer, upto: int, seed: int, chunk: int = 65536) -> None:
    """Random keys (bf16, about unit scale, a few outliers) for positions [0, upto) of every request."""
    g = torch.Generator(device=cache.buf.device).manual_seed(seed)
    for s in range(0, upto, chunk):
        e = min(upto, s + chunk)
        pos = torch.arange(s, e, device=cache.buf.device).expand(cache.batch, -1)
        k = torch.randn(cache.batch, e - s, HEAD_DIM, generator=g, device=cache.buf.device)
        cache.store(k.to(torch.bfloat16), pos)


def topk_overlap(got: torch.Tensor, want: torch.Tensor) -> float:
    """Smallest per-row |got & want| / |want| over the rows of two [..., K] index sets (-1 = empty)."""
    got, want = got.reshape(-1, got.shape[-1]).cpu(), want.reshape(-1, want.shape[-1]).cpu()
    worst = 1.0
    for g, w in zip(got, want, strict=True):
        ws = set(w[w >= 0].tolist())
        if ws:
            worst = min(worst, len(ws & set(g[g >= 0].tolist())) / len(ws))
    return worst


class Case:
    """One indexer call's inputs: B requests x T query tokens over a cache filled up to ctx."""

    def __init__(
        self, heads: int, batch: int, tokens: int, ctx: int, device: torch.device | str, seed: int = 0
    ):
        self.heads, self.batch, self.tokens, self.ctx = heads, batch, tokens, ctx
        self.max_len = -(-(ctx + tokens + 64) // PAGE_SIZE) * PAGE_SIZE
        self.weights = indexer_weights(heads, seed, device)
        self.rope = Rope(HEAD_DIM // 2, self.max_len, torch.device(device))
        self.cache = shuffled_cache(batch, self.max_len, device, seed)
        fill_keys(self.cache, ctx, seed)
        g = torch.Generator(device="cpu").manual_seed(seed + 1)
        self.x = torch.randn(batch, tokens, HIDDEN, generator=g).to(device=device, dtype=torch.bfloat16)
        self.q_lora = torch.randn(batch, tokens, Q_LORA, generator=g).to(device=device, dtype=torch.bfloat16)
        # requests end at different lengths (ctx, ctx - 999, ...); tokens sit right after, causally
        ends = torch.tensor([ctx - 999 * b for b in range(batch)], device=device)
        self.positions = ends[:, None] + torch.arange(tokens, device=device)
        self.limit = self.positions + 1

    def indexer(self, kernels: SglangKernels, path: str) -> SglangIndexer:
        return SglangIndexer(self.weights, self.heads, HEAD_DIM, TOPK, self.rope, kernels, path)

    def run(self, indexer: Indexer, cache=None) -> torch.Tensor:
        with torch.no_grad():
            cache = self.cache if cache is None else cache
            return indexer.forward(self.x, self.q_lora, self.positions, cache, self.limit)


def compare(kernels: SglangKernels, device: str, ctx: int = 8192) -> list[dict[str, Any]]:
    """Kernel indexer vs the torch stand-in on identical inputs, for every shape the evidence runs use."""
    rows = []
    reference = ReferenceKernels(num_sms=kernels.num_sms)
    for heads in (64, 32):
        for batch, tokens in ((1, 1), (2, 1), (2, 6)):
            case = Case(heads, batch, tokens, ctx, device, seed=heads + batch + tokens)
            for path in ("paged", "ragged"):
                t0 = time.perf_counter()
                got = case.run(case.indexer(kernels, path))
                want = case.run(case.indexer(reference, path))
                rows.append(
                    {
                        "heads": heads,
                        "batch": batch,
                        "tokens": tokens,
                        "ctx": ctx,
                        "path": path,
                        "overlap": round(topk_overlap(got, want), 4),
                        "identical": bool(torch.equal(got, want)),
                        "first_call_s": round(time.perf_counter() - t0, 2),
                    }
                )
    return rows


def graph_check(kernels: SglangKernels, device: str) -> list[dict[str, Any]]:
    """One indexer call captured in a CUDA graph; replays with new lengths must match eager calls."""
    rows = []
    for path in ("paged", "ragged"):
        case = Case(64, 2, 1, 16384, device, seed=7)
        indexer = case.indexer(kernels, path)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                case.run(indexer)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = case.run(indexer)
        worst, equal = 1.0, True
        for shift in (0, 1500, 7000):
            case.limit.copy_(case.positions + 1 - shift)
            graph.replay()
            torch.cuda.synchronize()
            eager = case.run(indexer)
            worst = min(worst, topk_overlap(out, eager))
            equal = equal and torch.equal(out, eager)
        rows.append({"path": path, "overlap": round(worst, 4), "identical": equal})
    return rows


def _time_ms(fn, iters: int = 20) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return round(start.elapsed_time(end) / iters, 4)


def _time_case(kernels: SglangKernels, case: Case, device: str) -> dict[str, float]:
    out: dict[str, float] = {}
    R = case.batch
    lengths = case.limit.reshape(R).to(torch.int32)
    cu = torch.arange(R + 1, dtype=torch.int32, device=device)
    q_fp8 = torch.randn(R, case.heads, HEAD_DIM, device=device).to(torch.float8_e4m3fn)
    w = torch.rand(R, case.heads, device=device)
    for path in ("paged", "ragged"):
        ix = case.indexer(kernels, path)
        out[f"{path}_call_ms"] = _time_ms(lambda: case.run(ix))  # noqa: B023 (called right away)
        get = ix._get_topk_paged if path == "paged" else ix._get_topk_ragged
        out[f"{path}_kernels_ms"] = _time_ms(lambda: get(case.cache, q_fp8, w, lengths, cu, R, 1))  # noqa: B023
    # the torch indexer over a float32 cache of the same size (timing only: its keys are not rotated)
    dense = case.cache.dequantize()
    torch_ix = Indexer(case.weights, case.heads, HEAD_DIM, TOPK, case.rope)
    out["torch_call_ms"] = _time_ms(lambda: case.run(torch_ix, dense))
    return out


def timing(kernels: SglangKernels, device: str, contexts=(131072, 524288)) -> list[dict[str, Any]]:
    """ms per indexer call (T=1): whole SglangIndexer.forward, its logits + top-k alone, the torch indexer."""
    rows = []
    for ctx in contexts:
        for heads in (64, 32):
            for batch in (1, 4):
                case = Case(heads, batch, 1, ctx, device, seed=3)
                rows.append({"ctx": ctx, "heads": heads, "batch": batch, **_time_case(kernels, case, device)})
                del case
                torch.cuda.empty_cache()
    return rows


WARM_SHAPES = ("64:paged", "64:ragged", "32:paged", "32:ragged")


def warm_one(spec: str) -> None:
    """One small indexer call of one shape: makes DeepGEMM JIT-compile (or load) its kernels for it."""
    heads, path = spec.split(":")
    case = Case(int(heads), 1, 1, 4096, "cuda", seed=11)
    case.run(case.indexer(load_kernels(), path))
    torch.cuda.synchronize()


def warm_jit(timeout_s: float = 240) -> list[str]:
    """Compile every DeepGEMM kernel the runs use in parallel processes (nvcc is the slow part; one
    DG_JIT_CACHE_DIR serves them all and every later process); returns one line per shape."""
    procs = {
        spec: subprocess.Popen(
            [sys.executable, "-m", "kit.backends.mini.kernel_check", "--warm-one", spec],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for spec in WARM_SHAPES
    }
    lines, t0 = [], time.perf_counter()
    for spec, proc in procs.items():
        try:
            out, _ = proc.communicate(timeout=max(1.0, timeout_s - (time.perf_counter() - t0)))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        tail = " ".join(out.strip().splitlines()[-1:])[:200]
        lines.append(f"warm {spec} rc={proc.returncode} {time.perf_counter() - t0:.1f}s {tail}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m kit.backends.mini.kernel_check", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--json", help="write the findings here")
    ap.add_argument("--no-timing", action="store_true", help="skip the 128k/512k timings")
    ap.add_argument("--no-warm", action="store_true", help="compile the kernels in this process only")
    ap.add_argument("--budget-s", type=float, default=300.0, help="the caller's limit (bounds warm-up)")
    ap.add_argument("--warm-one", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    nr.configure("off")
    if a.warm_one:
        warm_one(a.warm_one)
        print(f"warm {a.warm_one} ok")
        return 0
    report: dict[str, Any] = {"ok": False}
    t0 = time.perf_counter()
    try:
        problem = device_problem("cuda")
        if problem:
            raise ToolMissing(problem, tool="cuda")
        kernels = load_kernels()
        report["kernels"] = kernels.describe()
        report["device"] = torch.cuda.get_device_name()
        print(f"kernels: {kernels.describe()} on {report['device']}", flush=True)
        if not a.no_warm:
            report["warm"] = warm_jit(timeout_s=max(10.0, a.budget_s - 40))
            print("\n".join(report["warm"]), flush=True)
        report["compare"] = compare(kernels, "cuda")
        for r in report["compare"]:
            print(f"compare {r}", flush=True)
        worst = min(r["overlap"] for r in report["compare"])
        if worst < MIN_OVERLAP:
            raise ToolMissing(
                f"top-k overlap with the torch reference {worst} < {MIN_OVERLAP}", tool="sgl_kernel"
            )
        report["graph"] = graph_check(kernels, "cuda")
        for r in report["graph"]:
            print(f"graph {r}", flush=True)
        if min(r["overlap"] for r in report["graph"]) < MIN_OVERLAP:
            raise ToolMissing(
                f"CUDA-graph replay differs from eager calls: {report['graph']}", tool="sgl_kernel"
            )
        report["ok"] = True
    except Exception as exc:  # anything: the caller falls back to the torch indexer
        msg = " ".join(f"{type(exc).__name__}: {exc}".split())[:400]
        report["error"] = msg
        if not isinstance(exc, KitError):  # an unexpected failure: keep the whole story
            report["traceback"] = traceback.format_exc()
            print(report["traceback"], file=sys.stderr)
    if report["ok"] and not a.no_timing:
        try:
            report["timing"] = timing(kernels, "cuda")
            for r in report["timing"]:
                print(f"timing {r}", flush=True)
        except Exception as exc:  # timings are informative only
            report["timing_error"] = " ".join(f"{type(exc).__name__}: {exc}".split())[:400]
            print(f"timing failed: {report['timing_error']}", flush=True)
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    if report["ok"]:
        print(f"indexer_impl=sglang ok ({report['wall_s']} s)")
        return 0
    print(f"indexer_impl=torch (sglang unusable: {report['error']})")
    return 3


if __name__ == "__main__":
    sys.exit(main())
