"""`kit` command line: one subcommand per stage; every stage reads and writes the run directory."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kit.errors import KitError


def _print_json(obj: object) -> None:
    print(json.dumps(obj, indent=2, default=str))


def cmd_build(a: argparse.Namespace) -> int:
    from kit.sglang_src.build import build_patched_wheel

    _print_json(build_patched_wheel(a.version, Path(a.out)))
    return 0


def cmd_verify(a: argparse.Namespace) -> int:
    from kit.sglang_src.verify import detect_state

    _print_json(detect_state(Path(a.path)))
    return 0


def cmd_run(a: argparse.Namespace) -> int:
    from kit.backends.profile import run_profile

    if a.backend == "sglang":
        from kit.backends.sglang.run import run_arm, sglang_params

        print(run_arm(sglang_params(a), Path(a.out), a.batch, a.run_id))
        return 0

    params = {
        "backend": a.backend,
        "arm": a.arm,
        "context_len": a.context_len,
        "num_steps": a.num_steps,
        "num_requests": a.num_requests,
        "max_new_tokens": a.max_new_tokens,
        "device": a.device,
        "cuda_graph": a.cuda_graph,
        "preset": a.preset,
        "seed": a.seed,
        "eagle_topk": a.eagle_topk,
        "indexer_impl": a.indexer_impl,
        "indexer_path": a.indexer_path,
    }
    params = {k: v for k, v in params.items() if v is not None}
    run_dir = run_profile(params, Path(a.out), a.batch, a.run_id)
    print(run_dir)
    return 0


def cmd_analyze(a: argparse.Namespace) -> int:
    from kit.analysis.analyze import analyze

    verdict = analyze(
        Path(a.target),
        Path(a.out) if a.out else None,
        arm=a.arm,
        num_steps=a.num_steps,
        context_len=a.context_len,
        method=a.method,
        domain=a.domain,
        indexer_range=a.indexer_range,
        round_range=a.round_range,
        step_range=a.step_range,
    )
    _print_json(verdict)
    return 0


def cmd_compare(a: argparse.Namespace) -> int:
    from kit.compare.runs import compare_runs, gate_failures

    result = compare_runs(Path(a.run_a), Path(a.run_b))
    _print_json(result)
    if a.gate:
        failures = gate_failures(result)
        for f in failures:
            print(f"GATE FAILED: {f}", file=sys.stderr)
        return 1 if failures else 0
    return 0


def cmd_demo(a: argparse.Namespace) -> int:
    from kit.pipeline.demo import run_demo

    run_demo(Path(a.out))
    return 0


def cmd_make_checkpoint(a: argparse.Namespace) -> int:
    from kit.backends.sglang.checkpoint import make_checkpoint

    gains = {}
    for item in a.gain:
        name, _, value = item.partition("=")
        try:
            gains[name] = float(value)
        except ValueError:
            raise KitError(f"--gain {item!r}: expected NAME=NUMBER, e.g. --gain attn_out=8") from None
    _print_json(make_checkpoint(Path(a.out), seed=a.seed, gains=gains))
    return 0


def _add_analyze(sub: argparse._SubParsersAction) -> None:
    from kit.probe import ranges as nr
    an = sub.add_parser(
        "analyze", help="count indexer launches per draft round; write rounds.csv + verdict.json"
    )
    an.add_argument("target", help="a run directory, or a .sqlite / .nsys-rep report")
    an.add_argument("--out", help="directory for rounds.csv/verdict.json (default: the run directory)")
    an.add_argument("--arm")
    an.add_argument("--num-steps", type=int)
    an.add_argument("--context-len", type=int)
    an.add_argument("--method", default="auto", choices=["auto", "nvtx", "eager", "graph", "classifier"])
    an.add_argument("--domain", default=nr.DOMAIN)
    an.add_argument("--indexer-range", default=nr.INDEXER)
    an.add_argument("--round-range", default=nr.ROUND)
    an.add_argument("--step-range", default=nr.STEP)
    an.set_defaults(func=cmd_analyze)


def build_parser(only_analyze: bool = False) -> argparse.ArgumentParser:
    """All subcommands; `only_analyze` builds just `analyze`, so that its process imports none of the
    engine/sglang/batch modules the others need (~0.1 s of a 0.4 s analysis)."""
    p = argparse.ArgumentParser(prog="kit", description="Reproduction kit for sglang PR #29654")
    sub = p.add_subparsers(dest="cmd", required=True)
    if only_analyze:
        _add_analyze(sub)
        return p
    from kit.backends.sglang import run as sglang_run
    from kit.compare import noise
    from kit.sglang_src import probe_check
    b = sub.add_parser("build", help="download sglang from PyPI (sha256-pinned), apply the fix, repack")
    b.add_argument("--version", default="0.5.14")
    b.add_argument("--out", default="build/sglang-0.5.14+pr29654")
    b.set_defaults(func=cmd_build)

    v = sub.add_parser(
        "verify", help="classify an sglang wheel/tree/install as absent|bug|fix (AST, no import)"
    )
    v.add_argument("path")
    v.set_defaults(func=cmd_verify)

    r = sub.add_parser("run", help="run one arm under Nsight Systems into a new run directory")
    r.add_argument("--backend", default="mini", choices=["mini", "sglang"])
    r.add_argument("--arm", required=True, help="off | bug | fix | upstream")
    r.add_argument("--context-len", type=int)
    r.add_argument("--num-steps", type=int)
    r.add_argument("--num-requests", type=int)
    r.add_argument("--max-new-tokens", type=int)
    r.add_argument("--eagle-topk", type=int)
    r.add_argument("--device", choices=["cpu", "cuda"])
    r.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None)
    r.add_argument("--preset")
    r.add_argument("--seed", type=int)
    r.add_argument(
        "--indexer-impl",
        choices=["auto", "torch", "sglang"],
        help="mini: the lightning indexer: sglang's kernels (deep_gemm + sgl_kernel), the torch one, or auto",
    )
    r.add_argument(
        "--indexer-path",
        choices=["paged", "ragged"],
        help="mini, sglang indexer: decode's paged logits kernel (default) or extend's ragged one",
    )
    r.add_argument("--out", default="runs", help="runs root (default: runs)")
    r.add_argument("--batch", default="default")
    r.add_argument("--run-id")
    sglang_run.add_sglang_args(r)
    r.set_defaults(func=cmd_run)
    sglang_run.add_plan_command(sub)
    sglang_run.add_patch_checkout_command(sub)
    probe_check.add_command(sub)
    noise.add_command(sub)

    _add_analyze(sub)

    c = sub.add_parser(
        "compare", help="compare two analysed runs (launches, latency, accept length, outputs)"
    )
    c.add_argument("run_a")
    c.add_argument("run_b")
    c.add_argument(
        "--gate", action="store_true", help="exit 1 unless the fix shows 1 launch/round and outputs match"
    )
    c.set_defaults(func=cmd_compare)

    d = sub.add_parser(
        "demo", help="the embedded default: papermill notebooks, mini backend, arms bug and fix"
    )
    d.add_argument("--out", default="runs")
    d.set_defaults(func=cmd_demo)

    mc = sub.add_parser(
        "make-checkpoint",
        help="write the small DeepSeek-V3.2-shaped DSA+MTP checkpoint (random bf16) for real sglang",
    )
    mc.add_argument("out", help="a new (or empty) directory")
    mc.add_argument("--seed", type=int, default=0, help="weights seed (default 0); same seed, same bytes")
    mc.add_argument(
        "--gain",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="change one weight-structure gain (checkpoint.GAINS), e.g. attn_out=5.5; repeatable",
    )
    mc.set_defaults(func=cmd_make_checkpoint)

    from kit.pipeline.batch import add_batch_parser

    add_batch_parser(sub)
    from kit.sglang_src.stage import add_stage_parser

    add_stage_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(only_analyze=argv[:1] == ["analyze"]).parse_args(argv)
    try:
        return args.func(args)
    except KitError as exc:
        print(f"kit {args.cmd}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"kit {args.cmd}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
