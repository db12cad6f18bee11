"""Every `kit` subcommand's parser, in one place: options, their help and defaults."""

from __future__ import annotations

import argparse
from typing import Any

from kit.backends.profile import BACKENDS, param_specs
from kit.cli import commands as do
from kit.params import RunParams, Spec
from kit.sglang_src import releases

_NO = Spec("", flag=None)


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, but not the `None` of options whose default the backend chooses."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _defaults_note(name: str) -> str:
    """Each backend's default, from its model: what an option left out means."""
    from kit.backends.profile import models

    shown = {b: m.defaults()[name] for b, m in models().items() if m.specs().get(name, _NO).option(name)}
    if any(v in (None, [], {}) for v in shown.values()):
        return ""
    if len(set(map(repr, shown.values()))) == 1:
        return f" (default {next(iter(shown.values()))})"
    return " (" + ", ".join(f"{b} {v}" for b, v in shown.items()) + ")"


def _add_params(parser: argparse.ArgumentParser | argparse._ArgumentGroup, group: str) -> None:
    """The options of the parameters in `group` (kit.params.GROUPS), as the models declare them; each
    defaults to None, the backend's own default."""
    for name, spec in param_specs().items():
        flag = spec.option(name)
        if spec.group != group or flag is None:
            continue
        kw = {k: v for k, v in spec.cli.items() if k != "convert"}
        if kw.get("action") == "bool":
            kw["action"] = argparse.BooleanOptionalAction
        if spec.flag and "metavar" not in kw and "action" not in kw:
            kw["metavar"] = spec.flag.lstrip("-").replace("-", "_").upper()
        plain = "default" in spec.help or kw.get("action") == "store_true"
        help = spec.help if plain else spec.help + _defaults_note(name)
        parser.add_argument(flag, dest=name, default=None, help=help, **kw)


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    """What both backends run: arm-independent workload shape (unset: the backend's default)."""
    _add_params(p, "shared")
    p.add_argument("--out", default="runs", help="runs root")
    p.add_argument("--batch", default="default", help="batch folder under the runs root")


def _add_sglang_args(parser: argparse.ArgumentParser) -> None:
    """Arguments of the sglang backend for `kit run` and `kit plan` (names the mini backend does not use)."""
    _add_params(parser.add_argument_group("sglang backend (--backend sglang)"), "sglang")


def _add_analyze(sub: argparse._SubParsersAction) -> None:
    from kit.probe import ranges as nr

    an = sub.add_parser(
        "analyze",
        help="count indexer launches per draft round; write rounds.csv + verdict.json",
        description="Count indexer launches per draft round; write rounds.csv + verdict.json. Exit status: "
        "0 pass, 1 fail, 3 inconclusive (an unfinished run, a report without the ranges), 2 error.",
        formatter_class=_Formatter,
    )
    an.add_argument(
        "target",
        help="a run directory, or a .sqlite / .nsys-rep report or a PyTorch-profiler .json[.gz] trace",
    )
    an.add_argument("--out", help="directory for rounds.csv/verdict.json (default: the run directory)")
    an.add_argument(
        "--force",
        action="store_true",
        help="re-analyze: move the earlier rounds.csv/verdict.json/timeline.png aside (never deleted)",
    )
    an.add_argument("--arm", help="for a bare report: off | bug | fix | upstream (a run dir knows its own)")
    an.add_argument("--num-steps", type=int, help="for a bare report: speculative_num_steps")
    an.add_argument("--context-len", type=int, help="for a bare report: input tokens (for the warnings)")
    an.add_argument(
        "--method",
        default="auto",
        choices=["auto", "nvtx", "eager", "graph", "replay", "classifier"],
        help="attribution: auto picks graph, eager or nvtx from what the report holds",
    )
    an.add_argument("--domain", default=nr.DOMAIN, help="NVTX domain of the ranges")
    an.add_argument("--indexer-range", default=nr.INDEXER, help="NVTX range of one indexer call")
    an.add_argument("--round-range", default=nr.ROUND, help="NVTX range of one draft round")
    an.add_argument("--step-range", default=nr.STEP, help="NVTX range of one draft step")
    an.set_defaults(func=do.cmd_analyze)


def build_parser(only_analyze: bool = False) -> argparse.ArgumentParser:
    """All subcommands; `only_analyze` builds just `analyze`, so that its process imports none of the
    engine/sglang/batch modules the others need (they would dominate a fresh analysis process)."""
    p = argparse.ArgumentParser(prog="kit", description="Reproduction kit for sglang PR #29654")
    sub = p.add_subparsers(dest="cmd", required=True)
    if only_analyze:
        _add_analyze(sub)
        return p

    def cmd(name: str, func: Any, help: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help, formatter_class=_Formatter)
        sp.set_defaults(func=func)
        return sp

    b = cmd(
        "build",
        do.cmd_build,
        "download sglang from PyPI (sha256-pinned), apply the kit's PR patch (or --patch FILE), repack",
    )
    b.add_argument("--version", default=releases.BASELINE, help="the sglang release to patch")
    b.add_argument(
        "--patch",
        default=None,
        help="a unified diff to apply instead of the kit's PR patch; the build is named <version>+<its "
        "file name> (e.g. kit/sglang_src/patches/mutants/no-clear.patch -> 0.5.14+no.clear)",
    )
    b.add_argument(
        "--out", default=None, help="new directory for wheel + manifest (default: build/sglang-<ver>+<label>)"
    )

    v = cmd(
        "verify",
        do.cmd_verify,
        "classify an sglang wheel/tree/install as absent|bug|fix (AST, no import)",
    )
    v.add_argument("path", help="a wheel, an unpacked tree, a git checkout or a package directory")

    pc = cmd(
        "probe-check",
        do.cmd_probe_check,
        "resolve every probe target in an sglang wheel/tree/install (AST)",
    )
    pc.add_argument(
        "path", nargs="?", help="wheel, unpacked tree, git checkout or package dir (default: installed)"
    )
    pc.add_argument(
        "--target-set",
        help="check this probe-target set (kit.probe.targets.TARGET_SETS) instead of the one the release "
        "registry names for the source's version",
    )

    r = cmd(
        "run",
        do.cmd_run,
        "run one arm under Nsight Systems into a new run directory (sglang: one per cell, on one server)",
    )
    r.add_argument(
        "--backend",
        default=RunParams.defaults()["backend"],
        choices=list(BACKENDS),
        help=RunParams.spec("backend").help,
    )
    r.add_argument("--arm", required=True, help=RunParams.spec("arm").help)
    _add_workload_args(r)
    _add_params(r, "run")
    r.add_argument("--run-id", help="the run directory's name (default: made from the parameters)")
    _add_sglang_args(r)

    pl = cmd("plan", do.cmd_plan, "dry run of the sglang backend: commands, env, requests, run dirs per arm")
    pl.add_argument("--backend", default="sglang", choices=["sglang"], help="only sglang has a plan")
    pl.add_argument("--arms", default="bug,fix", help="comma-separated: bug,fix,upstream,off")
    _add_workload_args(pl)
    _add_sglang_args(pl)

    pc2 = cmd(
        "patch-checkout",
        do.cmd_patch_checkout,
        "apply the PR #29654 patch to an sglang git checkout, verified by AST",
    )
    pc2.add_argument("checkout", help="an sglang git checkout at the parent of 45314a9")

    _add_analyze(sub)

    c = cmd(
        "compare",
        do.cmd_compare,
        "compare two analysed runs (launches, latency, accuracy, accept length, outputs): comparison.json",
    )
    c.add_argument("run_a", help="an analysed run directory (e.g. the bug arm)")
    c.add_argument("run_b", help="an analysed run directory (e.g. the fix arm), same parameters")
    c.add_argument(
        "--control",
        help="a second run of a's or b's computation (a same-build repeat, or the off arm: the bug's "
        "computation on the patched build): the noise floor for accept length and tokens",
    )
    c.add_argument(
        "--gate",
        action="store_true",
        help="exit 1 unless the fix shows its launches per round, the tokens and answers match, "
        "same-target acceptance stays within the control's noise floor, and (on the task) each request's "
        "verify rounds are what correct sharing gives",
    )
    c.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="compare runs whose parameters differ (context, steps, requests, model, ...): warned, and "
        "the gate fails",
    )
    c.add_argument(
        "--per-request",
        action="store_true",
        help="print each workload's per-request table (accept length, verify rounds ran and predicted, "
        "answers; the cells that fail the gate marked); --gate prints it only where a check failed, a line "
        "otherwise",
    )
    c.add_argument(
        "--out",
        help="folder for comparison.json (default: compare-A-vs-B beside run B; an earlier one is set aside)",
    )

    n = cmd("noise", do.cmd_noise, "token match of two arms against the noise floor of a repeat (real GPUs)")
    n.add_argument("run_a", help="a run of build A")
    n.add_argument("run_b", help="a run of build B")
    n.add_argument("repeat_a", help="a second run of A's build: the noise floor")
    n.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="judge runs whose parameters differ (context, steps, requests, model, ...): warned, and exit 1",
    )
    from kit.compare.noise import TOLERANCE

    n.add_argument("--tolerance", type=float, default=TOLERANCE, help="slack on match rates")

    d = cmd("demo", do.cmd_demo, "the embedded default: papermill notebooks, mini backend, arms bug and fix")
    d.add_argument("--out", default="runs", help="runs root")

    bt = cmd("batch", do.cmd_batch, "run a matrix (YAML) of cells through the notebooks, compare, report")
    bt.add_argument(
        "matrix", help="a matrix YAML, or the name of one in data/matrices (demo, cpu_sweep, ...)"
    )
    bt.add_argument("--mode", help="a mode of the matrix: its own grid, in batch NAME-MODE")
    bt.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a params: value of the matrix, or run only some values of an axis (context_len=4096, "
        "arm=[bug,fix]), or pick a mutation suite's mutants (mutants=[no-clear]); repeatable, VALUE is YAML",
    )
    bt.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=1,
        help="cells (or shared servers) run at once; here, sglang servers start side by side and take turns "
        "on the GPU to measure",
    )
    bt.add_argument(
        "--resume", action="store_true", help="continue a batch: skip cells with a verdict, rerun failed ones"
    )
    bt.add_argument(
        "--deadline",
        type=float,
        metavar="SECONDS",
        help="start no cell after this many seconds (running ones finish); exit 3 lists the cells left",
    )
    bt.add_argument(
        "--executor",
        choices=("local", "slurm"),
        default="local",
        help="local: papermill here; slurm: one submitit job per cell",
    )
    bt.add_argument(
        "--runner",
        choices=("notebooks", "plain"),
        default="notebooks",
        help="notebooks: 01_profile/02_analyze per cell, 03/04 per batch (papermill); plain: the same "
        "stages as Python processes, no Jupyter needed (no report)",
    )
    bt.add_argument("--out", default="runs", help="runs root")
    bt.add_argument("--batch", help="batch name (default: the matrix's batch:, NAME-MODE with --mode)")
    bt.add_argument(
        "--dry-run", action="store_true", help="validate and list the cells and servers; run nothing"
    )
    bt.add_argument(
        "--server-per-cell",
        action="store_true",
        help="sglang: start a server for every cell (default: one per arm and server settings)",
    )
    bt.add_argument("--slurm-partition", help="slurm: the partition")
    bt.add_argument("--slurm-gpus-per-node", type=int, help="slurm: GPUs per job")
    bt.add_argument(
        "--slurm-time", type=int, default=120, metavar="MINUTES", help="slurm: per-cell time limit"
    )
    bt.add_argument("--no-progress", action="store_true", help="no progress bar (per-cell lines still print)")

    s = cmd("stage", do.cmd_stage, "move a pinned wheel set to an offline GPU host in small parts")
    ss = s.add_subparsers(dest="stage_cmd", required=True)
    sp = ss.add_parser("pack", help="(here) fetch, drop, trim and cut the locked wheels into parts")
    sp.add_argument("--lock", default="data/stage/sglang-0.5.14-h200.json", help="the stage lock")
    sp.add_argument("--cache", default=".cache/stage-wheels", help="download cache")
    sp.add_argument("--extra", action="append", default=[], help="a local wheel to add (repeatable)")
    from kit.sglang_src.stage import DEFAULT_PART_MIB

    sp.add_argument("--part-mib", type=int, default=DEFAULT_PART_MIB, help="largest part, MiB")
    sp.add_argument(
        "--beside", help="another stage's manifest.json: its wheels stay out (install takes them from it)"
    )
    sp.add_argument("out", help="new folder for the parts and their manifest")
    spt = ss.add_parser(
        "pack-tree", help="(there or here) folders, e.g. sglang's JIT caches, cut into parts like wheels"
    )
    spt.add_argument("out", help="new folder for the parts and their manifest")
    spt.add_argument("dirs", nargs="+", help="folders relative to --root (missing ones skipped)")
    spt.add_argument("--root", default="/", help="what the folders are relative to (default /)")
    spt.add_argument("--part-mib", type=int, default=DEFAULT_PART_MIB, help="largest part, MiB")
    sc = ss.add_parser("carry", help="(here) a folder per part beside STAGE: what one call carries")
    sc.add_argument("stage", help="the folder `kit stage pack` wrote (e.g. .stage16)")
    sc.add_argument("prefix", help="the folders' names without their number (e.g. .stage16_)")
    sc.add_argument(
        "--part-mib", type=int, help="cut the payload again into parts of this size (kit stage fit's)"
    )
    sf = ss.add_parser("fit", help="(here) the largest --part-mib one call carries beside this checkout")
    sf.add_argument("carried", nargs="*", help="what else each call carries (e.g. .whl)")
    from kit.sglang_src.stage import CALL_LIMIT_MB

    sf.add_argument("--limit-mb", type=int, default=CALL_LIMIT_MB, help="one call's limit, MB (decimal)")
    sr = ss.add_parser("receive", help="(there) keep the parts in each SRC whose sha256 matches")
    sr.add_argument("src", nargs="+", help="folders holding manifest.json and some parts")
    sr.add_argument("store", help="where parts accumulate")
    si = ss.add_parser("install", help="(there) join, verify, pip install --no-deps --no-index")
    si.add_argument("store", help="the store with every part")
    si.add_argument("target", help="folder to install each build into (a tree stage: unpacked under it)")
    si.add_argument("--beside", help="the target of the stage this one was packed beside (pack --beside)")
    st = ss.add_parser("status", help="which parts a store holds and which are missing")
    st.add_argument("store", help="the store")

    h = cmd("host", do.cmd_host, "what the H200 drivers (scripts/h200_*.sh) run on the GPU host")
    hs = h.add_subparsers(dest="host_cmd", required=True)
    hf = hs.add_parser("facts", help="GPU, torch, python, the kit's commit and the date into FILE")
    hf.add_argument("file", help="the facts file to write")
    hf.add_argument("lines", nargs="*", help="more lines to record")
    hp = hs.add_parser("pack", help="a runs folder's small files into TGZ (no reports, no traces)")
    hp.add_argument("tgz", help="the tarball to write")
    hp.add_argument("runs", help="the folder to pack")
    from kit.pipeline.host import EVIDENCE_MODES
    from kit.pipeline.host_sglang import MODES
    from kit.pipeline.host_task import ALL_STEPS

    def driver_call(
        name: str, script: str, out: str, modes: tuple[str, ...], deadline: str
    ) -> argparse.ArgumentParser:
        """A driver's call: what comes back (OUT), its mode, the seconds after which no cell starts."""
        p = hs.add_parser(name, help=f"scripts/{script}")
        p.add_argument("out", help=f"what comes back: {out}")
        p.add_argument("mode", help=f"one of {', '.join(modes)}")
        p.add_argument(
            "deadline", type=float, nargs="?", help=f"seconds; no batch cell starts after ({deadline})"
        )
        return p

    he = driver_call(
        "evidence",
        "h200_evidence.sh: one mode of h200_mini, resumed",
        "results-MODE.tgz, logs, the host's facts",
        EVIDENCE_MODES,
        "540; kernels 320",
    )
    he.add_argument("--runs", default="/tmp/kit-runs", help="the runs root on the host")
    he.add_argument("--indexer-impl", help="--set indexer_impl= for every mode but kernels (default: torch)")

    hg = driver_call(
        "sglang",
        "h200_sglang.sh: real sglang's stages, installs and batches",
        "logs, results-MODE.tgz, the checks' JSON, the host's facts",
        MODES,
        "540; the grid's 360",
    )
    hg.add_argument("--tmp", default="/tmp", help="where the host's folders are (the matrices name /tmp's)")
    hg.add_argument("-j", "--jobs", type=int, default=1, help="servers at once (kit batch -j)")
    hg.add_argument(
        "--gains", default="", help="NAME=NUMBER ...: a checkpoint with other gains, its own folder"
    )

    ht = driver_call(
        "task",
        "h200_task.sh, h200_upstream.sh: the task checkpoint's steps (data/matrices/h200_task.yaml)",
        "logs, runs-STEP.tgz, the checks' JSON, Kineto pieces, the host's facts",
        ALL_STEPS,
        "540; cells stop starting 150-300 s before",
    )
    ht.add_argument("--tmp", default="/tmp", help="where the host's folders are (the matrix names /tmp's)")
    ht.add_argument("-j", "--jobs", type=int, default=1, help="servers at once (kit batch -j)")
    ht.add_argument("--tp", type=int, default=4, help="the tp4 step's ranks (1: its dry run on one GPU)")
    ht.add_argument("--runner", default="auto", help="kit batch's runner: auto, plain or notebooks")
    from kit.pipeline.host_mutants import STEPS, WORKLOADS

    hm = hs.add_parser("mutants", help="scripts/h200_mutants.sh: the mutation suite's steps on real sglang")
    hm.add_argument("out", help="what comes back: logs, results.tgz, runs.tgz, the host's facts")
    hm.add_argument("step", help=f"one of {', '.join(STEPS)}")
    hm.add_argument("args", nargs="*", help="build [NAME...], base MODE, suite|mutants MODE [NAME...]")
    hm.add_argument("--deadline", type=float, default=540.0, help="seconds; no cell starts after (540)")
    hm.add_argument("--min-run", type=float, default=150.0, help="a cell starts only while these remain")
    hm.add_argument("-j", "--jobs", type=int, default=1, help="servers at once (kit batch -j)")
    hm.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated task workloads")
    hm.add_argument("--tmp", default="/tmp", help="where the host's folders are (the matrix names /tmp's)")
    hm.add_argument("--pip-args", default="", help="more pip install options for the build step")

    e = cmd("evidence", do.cmd_evidence, "tables over a committed result set: summary.csv and ratios.csv")
    e.add_argument("results", help="a folder under data/results (runs/<mode>/<run> inside)")

    mc = cmd(
        "make-checkpoint",
        do.cmd_make_checkpoint,
        "write the small DeepSeek-V3.2-shaped DSA+MTP checkpoint (random bf16) for real sglang",
    )
    mc.add_argument("out", help="a new (or empty) directory")
    mc.add_argument("--seed", type=int, default=0, help="weights seed; same seed, same bytes")
    mc.add_argument(
        "--gain",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="change one weight-structure gain (checkpoint.GAINS), e.g. attn_out=5.5; repeatable",
    )
    mc.add_argument(
        "--task",
        action="store_true",
        help="the retrieval-task checkpoint: answers depend on what the indexer selects (exit 1 if its "
        "self-check misses the accuracy bar: then it is not labelled a task checkpoint)",
    )
    mc.add_argument("--keys", type=int, default=128, help="--task: keys (answers)")
    mc.add_argument("--groups", type=int, default=8, help="--task: key groups (what the indexer selects)")
    mc.add_argument("--draft-miss", type=int, default=2, help="--task: keys per group the draft gets wrong")

    tr = cmd(
        "task-reference",
        do.cmd_task_reference,
        "float32 reference on a task checkpoint: accuracy, accept length bug vs fix, wrong top-k",
    )
    tr.add_argument("checkpoint", help="a directory written by kit make-checkpoint --task")
    tr.add_argument(
        "--context-len", type=int, nargs="+", default=[4096, 8192, 16384, 65536], help="input tokens"
    )
    tr.add_argument("--prompts", type=int, default=2, help="prompts per workload and context")
    tr.add_argument("--max-new-tokens", type=int, default=96, help="tokens generated per prompt")
    tr.add_argument("--num-steps", type=int, default=5, help="draft steps per round (EAGLE num_steps/1/+1)")
    return p
