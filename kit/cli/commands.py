"""What each `kit` subcommand does: import its module when it runs, print, return an exit code."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from kit.errors import EXIT, UsageError


def _print_json(obj: object) -> None:
    print(json.dumps(obj, indent=2, default=str))


def cmd_build(a: argparse.Namespace) -> int:
    from kit.sglang_src.build import build_patched_wheel

    out = Path(a.out) if a.out else None
    _print_json(build_patched_wheel(a.version, out, patch=Path(a.patch) if a.patch else None))
    return 0


def cmd_verify(a: argparse.Namespace) -> int:
    from kit.sglang_src.verify import detect_state

    _print_json(detect_state(Path(a.path)))
    return 0


def cmd_probe_check(a: argparse.Namespace) -> int:
    """The flat report of the set the registry names (or --target-set); a release no set applies to gets
    every set's report, what each misses and where it moved, and exit 1."""
    from kit.probe.check import choose, missing, probe_check
    from kit.probe.targets import TARGET_SETS
    from kit.sglang_src.source import installed_sglang_dir

    path = Path(a.path) if a.path else installed_sglang_dir()
    if a.target_set is not None:
        if a.target_set not in TARGET_SETS:
            raise UsageError(
                f"--target-set {a.target_set!r}: use one of {', '.join(TARGET_SETS)}", param="target_set"
            )
        report = probe_check(path, TARGET_SETS[a.target_set])
    else:
        choice = choose(path)
        print(f"kit probe-check: {choice.describe()}", file=sys.stderr)
        if choice.target_set is None:
            _print_json(choice.as_json())
            return 1
        report = choice.report
    _print_json(report)
    return 1 if missing(report) else 0


def cmd_run(a: argparse.Namespace) -> int:
    if a.backend == "sglang":
        from kit.backends.sglang.launch import run_server

        res = run_server(run_params(a, "sglang"), Path(a.out), a.batch, a.run_id)
        for d in res.cell_dirs:  # one line per cell: what `kit analyze` takes
            print(d)
        for d, why in res.failed.items():
            print(f"kit run: cell {d.name} failed: {why}", file=sys.stderr)
        return EXIT["error"] if res.failed else 0
    params = run_params(a, a.backend)
    if isinstance(params.get("context_len"), list):
        raise UsageError("several --context-len values (one server, many cells) need --backend sglang")
    if isinstance(params.get("workload"), list):
        raise UsageError("several --workload values (one server, many cells) need --backend sglang")
    from kit.backends.profile import run_profile

    print(run_profile(params, Path(a.out), a.batch, a.run_id))
    return 0


def cmd_plan(a: argparse.Namespace) -> int:
    from kit.backends.sglang.plan import plan

    params = run_params(a, "sglang")
    params["arms"] = [x.strip() for x in a.arms.split(",") if x.strip()]
    _print_json(plan(params, Path(a.out), a.batch))
    return 0


def cmd_patch_checkout(a: argparse.Namespace) -> int:
    from kit.sglang_src.checkout import patch_git_checkout

    _print_json(patch_git_checkout(Path(a.checkout)))
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
        force=a.force,
    )
    _print_json(verdict)
    if verdict["status"] != "pass":
        print(f"kit analyze: {verdict['meaning']}", file=sys.stderr)
    else:  # a pass with caveats (a profile that ended inside a round, ...) says them where it is read
        for warning in verdict["warnings"]:
            print(f"kit analyze: warning: {warning}", file=sys.stderr)
    return EXIT[verdict["status"]]


def cmd_compare(a: argparse.Namespace) -> int:
    from kit.compare import per_request
    from kit.compare.runs import default_out, write_comparison

    out = Path(a.out) if a.out else default_out(Path(a.run_a), Path(a.run_b))
    control = Path(a.control) if a.control else None
    result = write_comparison(Path(a.run_a), Path(a.run_b), out, control, allow_mismatch=a.allow_mismatch)
    _print_json(result)
    for w in result["warnings"]:
        print(f"kit compare: WARNING: {w}", file=sys.stderr)
    print(f"kit compare: wrote {out / 'comparison.json'}", file=sys.stderr)
    if a.gate:
        for f in result["gate_failures"]:
            print(f"GATE FAILED: {f}", file=sys.stderr)
        for n in result["gate_notes"]:
            print(f"GATE NOTE: {n}", file=sys.stderr)
    if (
        a.gate or a.per_request
    ):  # why, request by request: a table where a check failed (or asked), else a line
        for line in per_request.lines(result["per_request"], every=a.per_request):
            print(line, file=sys.stderr)
    if a.gate:
        return EXIT["fail"] if result["gate_failures"] else EXIT["pass"]
    return 0


def cmd_noise(a: argparse.Namespace) -> int:
    from kit.compare.noise import compare_with_noise

    res = compare_with_noise(
        Path(a.run_a), Path(a.run_b), Path(a.repeat_a), a.tolerance, allow_mismatch=a.allow_mismatch
    )
    _print_json(res)
    for w in res["warnings"]:
        print(f"kit noise: WARNING: {w}", file=sys.stderr)
    # runs that differ were compared anyway (--allow-mismatch): as kit compare's gate, that fails
    return EXIT["fail"] if res["verdict"] == "beyond_noise" or res["params_differ"] else EXIT["pass"]


def cmd_demo(a: argparse.Namespace) -> int:
    from kit.pipeline.demo import run_demo

    return run_demo(Path(a.out))[1]


def cmd_batch(a: argparse.Namespace) -> int:
    from kit.pipeline import batch
    from kit.pipeline import matrix as matrix_mod
    from kit.pipeline.executors import SlurmOptions
    from kit.pipeline.summary import summary

    m = matrix_mod.load(a.matrix, a.mode, matrix_mod.parse_overrides(a.set))
    how = {
        "batch": a.batch,
        "jobs": a.jobs,
        "resume": a.resume,
        "executor": a.executor,
        "slurm": SlurmOptions(a.slurm_partition, a.slurm_gpus_per_node, a.slurm_time),
        "runner": a.runner,
        "deadline_s": a.deadline,
        "share_server": not a.server_per_cell,
    }
    if a.dry_run:
        from kit.pipeline.groups import describe, form

        # what the matrix holds first (also where this host cannot run it), then every check of the run
        groups = form(m.cells, Path(a.out) / (a.batch or m.batch), not a.server_per_cell)
        servers = sum(len(g.cells) for g in groups if g.server is not None)
        print(f"matrix {m.path}: batch {a.batch or m.batch}, {len(m.cells)} cells")
        for c in m.cells:
            print(f"  {c.run_id}")
        if servers:
            print(f"{servers} cells on {sum(g.server is not None for g in groups)} shared servers:")
            print("\n".join(describe(groups)))
        plan = batch.dry_run(m, Path(a.out), **how)  # a check that fails: its one line, exit 2, as the run
        done = f", {len(plan.complete)} already complete (skipped)" if plan.complete else ""
        print(f"every check passed: {len(plan.to_run)} cells to run{done} in {plan.batch_dir}")
        return 0
    res = batch.run_batch(m, Path(a.out), progress=not a.no_progress, **how)
    print(summary(res))
    return res.exit_code


def cmd_stage(a: argparse.Namespace) -> int:
    from kit.sglang_src import stage

    if a.stage_cmd == "pack":
        beside = Path(a.beside) if a.beside else None
        res = stage.pack(
            Path(a.lock), Path(a.cache), Path(a.out), [Path(x) for x in a.extra], a.part_mib << 20, beside
        )
    elif a.stage_cmd == "pack-tree":
        res = stage.pack_tree(Path(a.root), a.dirs, Path(a.out), a.part_mib << 20)
    elif a.stage_cmd == "carry":
        part = None if a.part_mib is None else a.part_mib << 20
        res = {"folders": [str(d) for d in stage.carry(Path(a.stage), a.prefix, part)]}
    elif a.stage_cmd == "fit":
        from kit.paths import REPO

        res = stage.fit(REPO, [Path(c) for c in a.carried], a.limit_mb)
    elif a.stage_cmd == "receive":
        res = {}
        for src in a.src:
            res = stage.receive(Path(src), Path(a.store))
    elif a.stage_cmd == "install":
        res = stage.install(Path(a.store), Path(a.target), beside=Path(a.beside) if a.beside else None)
    else:
        res = stage.status(Path(a.store))
    print(json.dumps(res, indent=1))
    return 0


def cmd_evidence(a: argparse.Namespace) -> int:
    from kit.report.evidence import write_tables

    print(write_tables(Path(a.results)))
    return 0


def cmd_host(a: argparse.Namespace) -> int:
    from kit.pipeline import host

    if a.host_cmd == "facts":
        print(host.facts(Path(a.file), a.lines))
    elif a.host_cmd == "pack":
        print(host.pack(Path(a.tgz), Path(a.runs)))
    elif a.host_cmd == "sglang":
        from kit.pipeline import host_sglang

        dirs = host_sglang.HostDirs(Path(a.tmp))
        return host_sglang.sglang(Path(a.out), a.mode, a.deadline, dirs, a.jobs, a.gains.split())
    elif a.host_cmd == "task":
        from kit.pipeline import host_builds, host_task

        dirs = host_builds.HostDirs(Path(a.tmp))
        return host_task.task(Path(a.out), a.mode, a.deadline, dirs, a.jobs, a.tp, a.runner)
    elif a.host_cmd == "mutants":
        from kit.pipeline import host_mutants as hm

        works = [w for w in a.workloads.split(",") if w]
        dirs, pip = hm.MutantDirs(Path(a.tmp)), shlex.split(a.pip_args)
        return hm.mutants(Path(a.out), a.step, a.args, a.deadline, dirs, a.jobs, a.min_run, works, pip)
    else:
        return host.evidence(Path(a.out), a.mode, a.deadline, Path(a.runs), a.indexer_impl)
    return 0


def cmd_make_checkpoint(a: argparse.Namespace) -> int:
    if a.task:
        if a.gain:
            raise UsageError("--gain shapes the next-token-cycle checkpoint; the task checkpoint has its own")
        from kit.task import make_task_checkpoint

        manifest = make_task_checkpoint(
            Path(a.out), seed=a.seed, n_keys=a.keys, n_groups=a.groups, draft_miss_per_group=a.draft_miss
        )
        _print_json(manifest)
        return 0 if manifest["task_checkpoint"] else EXIT["fail"]
    from kit.checkpoint import make_checkpoint

    gains = {}
    for item in a.gain:
        name, _, value = item.partition("=")
        try:
            gains[name] = float(value)
        except ValueError:
            raise UsageError(f"--gain {item!r}: expected NAME=NUMBER, e.g. --gain attn_out=8") from None
    _print_json(make_checkpoint(Path(a.out), seed=a.seed, gains=gains))
    return 0


def cmd_task_reference(a: argparse.Namespace) -> int:
    from kit.task.measure import measure

    for row in measure(Path(a.checkpoint), tuple(a.context_len), a.prompts, a.max_new_tokens, a.num_steps):
        print(json.dumps(row), flush=True)
    return 0


def run_params(a: argparse.Namespace, backend: str) -> dict[str, Any]:
    """The run parameters the options gave, by the models' names (one not given is left out: the backend's
    default). An option of another backend is refused: it would be ignored."""
    from kit.backends.profile import param_specs, params_model

    mine = params_model(backend).specs()
    params: dict[str, Any] = {"backend": backend}
    if getattr(a, "arm", None) is not None:
        params["arm"] = a.arm
    for name, spec in param_specs().items():
        value = getattr(a, name, None) if spec.option(name) else None
        if value is None:
            continue
        if name not in mine:
            other = "an sglang" if backend == "mini" else "a mini"
            raise UsageError(
                f"{spec.option(name)} is {other}-backend option (--backend {other.split()[1]})", param=name
            )
        params[name] = spec.cli["convert"](value) if "convert" in spec.cli else value
    return params
