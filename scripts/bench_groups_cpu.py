"""Benchmark (no assertions): what one server per arm saves in `kit batch` against a server per cell, on CPU.

The whole batch path runs for real on the tests' fake GPU stack (tests/fake_gpu_helpers.py): fake sglang
builds whose `python -m sglang.launch_server` is the stand-in HTTP server (answering /health after
--ready-after seconds, as sglang does once loaded), a fake nsys whose report holds one window per cell,
the kit's profile stage (pre-flight, tokenizer, server, workload), its analysis and comparisons. Each
repeat runs the same matrix twice in alternating order, once with servers shared by arm (the default) and
once with --server-per-cell; the batch wall times and the server starts are printed as a markdown table.

    .venv/bin/python scripts/bench_groups_cpu.py [--arms bug,fix] [--contexts 4096,8192,16384,32768]
        [--ready-after 0.2] [--runner plain] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _checkout  # noqa: F401  (this checkout's kit first on sys.path)

from kit.paths import REPO

sys.path.insert(0, str(REPO / "tests"))  # the tests' helpers

from fake_gpu_helpers import fake_build, fake_nsys, tokenizer_model  # noqa: E402

from kit.pipeline import batch as kb  # noqa: E402
from kit.pipeline import matrix  # noqa: E402


def _matrix(root: Path, args: argparse.Namespace) -> matrix.Matrix:
    builds = {
        "bug": fake_build(root / "sgl" / "bug", "bug", ready_after=args.ready_after),
        "fix": fake_build(root / "sgl" / "fix", "fix", ready_after=args.ready_after),
    }
    builds["off"] = builds["fix"]
    arms = args.arms.split(",")
    doc = {
        "batch": "bench",
        "axes": {
            "backend": ["sglang"],
            "arm": arms,
            "context_len": [int(c) for c in args.contexts.split(",")],
            "cuda_graph": [False],
            "device": ["cuda"],
        },
        "params": {
            "model_path": str(tokenizer_model(root)),
            "num_requests": 2,
            "max_new_tokens": 32,
            "profile_skip": 1,
            "profile_steps": 3,
        },
        "builds": {a: {"pythonpath": [str(builds[a])]} for a in arms},
    }
    path = root / "m.yaml"
    path.write_text(json.dumps(doc))
    return matrix.load(path)


def _once(share: bool, args: argparse.Namespace) -> tuple[float, int, int]:
    with tempfile.TemporaryDirectory(prefix="kit-bench-groups-") as tmp:
        root = Path(tmp)
        os.environ["KIT_NSYS"] = str(fake_nsys(root / "nsys"))
        m = _matrix(root, args)
        t0 = time.perf_counter()
        res = kb.run_batch(m, root / "runs", progress=False, runner=args.runner, share_server=share)
        wall = time.perf_counter() - t0
        if res.failures:
            sys.exit(f"the batch failed: {[(f.run_id, f.message) for f in res.failures]}")
        starts = sum(
            p.read_text().count("[stand-in] pid ")
            for p in (root / "runs").rglob("server.log")
            if not p.is_symlink()
        )
        return wall, starts, len(m.cells)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", default="bug,fix")
    ap.add_argument("--contexts", default="4096,8192,16384,32768")
    ap.add_argument("--ready-after", type=float, default=0.2, help="seconds the stand-in takes to start")
    ap.add_argument("--runner", default="plain", choices=["plain", "notebooks"])
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    os.chdir(REPO)  # the stages' processes import this checkout's kit
    walls: dict[bool, list[float]] = {True: [], False: []}
    starts: dict[bool, int] = {}
    cells = 0
    for k in range(args.repeats):
        for share in (True, False) if k % 2 == 0 else (False, True):
            wall, starts[share], cells = _once(share, args)
            walls[share].append(wall)
    load = os.getloadavg()[0]
    print(
        f"kit batch --runner {args.runner}, {cells} cells ({args.arms} x {args.contexts}), "
        f"stand-in ready after "
        f"{args.ready_after} s, median of {args.repeats}; {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, load average at end {load:.2f}\n"
    )
    print("| servers | starts | batch wall s (each repeat) | median s | per cell s |")
    print("|---|---:|---|---:|---:|")
    for share, label in ((False, "one per cell (--server-per-cell)"), (True, "one per arm (default)")):
        med = statistics.median(walls[share])
        each = ", ".join(f"{w:.1f}" for w in walls[share])
        print(f"| {label} | {starts[share]} | {each} | {med:.1f} | {med / cells:.2f} |")
    saved = statistics.median(walls[False]) - statistics.median(walls[True])
    per_start = saved / max(starts[False] - starts[True], 1)
    print(f"\nsaved: {saved:.1f} s, {per_start:.2f} s per server start avoided")


if __name__ == "__main__":
    main()
