"""A/B of two analysed runs: launches/round, indexer GPU time, draft-step latency, answer accuracy, accept
length per request (against a control run's noise floor), outputs; written as comparison.json.

One code path for `kit compare` and `kit batch`'s compare stage: `write_comparison` into a compare
folder (an earlier one is set aside, never overwritten). The gate's rules: kit.compare.gate.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from kit.compare import equivalence, noise, per_request, share_model
from kit.compare import params as params_mod
from kit.compare.gate import gate_failures, gate_notes
from kit.errors import InputError
from kit.paths import unique_path
from kit.rundir import RunDir, check_folder, read_json, read_outputs, write_json
from kit.task.spec import TaskSpec

COMPARISON = "comparison.json"

__all__ = [  # gate_failures/gate_notes: kit.compare.gate's, imported from here by notebooks and tests
    "COMPARISON",
    "compare_runs",
    "compared_run",
    "comparison",
    "default_out",
    "fresh_dir",
    "gate_failures",
    "gate_notes",
    "load_run",
    "placed",
    "request_table",
    "save",
    "summarize",
    "timing",
    "write_comparison",
]


def _run_dir(path: Path) -> RunDir:
    run = RunDir(Path(path))
    if not run.path.is_dir():
        raise InputError(f"run directory {run.path} not found", path=run.path)
    return run


def load_run(run_dir: Path, analysed: bool = True) -> dict[str, Any]:
    """A run's parameters and outputs, and, when `analysed`, its verdict and per-round table (a control
    run needs only its outputs: it may have run without the profiler)."""
    run = _run_dir(run_dir)
    if analysed and not run.verdict.is_file():
        raise InputError(f"{run.path} has no verdict.json: run `kit analyze {run.path}` first", path=run.path)
    out = {"run_dir": run.path, "params": run.read_params(), "outputs": read_outputs(run.outputs)}
    if analysed:
        out.update(verdict=read_json(run.verdict), rounds=pd.read_csv(run.rounds))
    return out


def _quantiles_ms(series: pd.Series) -> dict[str, float | None]:
    s = pd.to_numeric(series, errors="coerce").dropna() / 1e6
    if s.empty:
        return {"median": None, "p10": None, "p90": None}
    return {k: round(float(s.quantile(q)), 4) for k, q in (("median", 0.5), ("p10", 0.1), ("p90", 0.9))}


def accuracy(outputs: list[dict[str, Any]]) -> dict[str, dict[str, Any]] | None:
    """Per workload: requests with a known answer, how many are right, and the share; None when no row
    carries an answer (`correct` or `expected_ids`)."""
    out: dict[str, dict[str, Any]] = {}
    for row in outputs:
        ok = equivalence.correct(row)
        if ok is None:
            continue
        w = out.setdefault(equivalence.workload(row), {"requests": 0, "correct": 0, "correct_ids": []})
        w["requests"] += 1
        if ok:
            w["correct"] += 1
            w["correct_ids"].append(row["prompt_id"])
    for w in out.values():
        w["rate"] = round(w["correct"] / w["requests"], 4)
    return out or None


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    v, rounds, outputs = run["verdict"], run["rounds"], run["outputs"]
    accept = [o["accept_length"] for o in outputs if o.get("accept_length") is not None]
    gpu = rounds["indexer_gpu_ns"] if "indexer_gpu_ns" in rounds else pd.Series(dtype=float)
    has_gpu = "step_gpu_ns" in rounds and rounds["step_gpu_ns"].notna().any()
    basis = "step_gpu_ns" if has_gpu else "step_ns"
    return {
        "run_dir": str(run["run_dir"]),
        "arm": v["arm"],
        "context_len": run["params"].get("context_len"),
        "status": v["status"],
        "expected_per_round": v["expected_per_round"],
        "launches_per_round": sorted(set(v["launches_per_round"])),
        "num_rounds": v.get("num_rounds", len(v["launches_per_round"])),
        "source": v["source"],
        "method": v["method"],
        "indexer_gpu_ms_per_round": _quantiles_ms(gpu)["median"],
        "draft_step_ms": _quantiles_ms(rounds[basis]),
        # GPU span of the round's kernels when the report has them (CUDA graphs make NVTX wall time
        # measure only the launch); NVTX wall time on CPU-only reports.
        "draft_step_basis": "gpu" if basis == "step_gpu_ns" else "wall",
        "accept_length": round(sum(accept) / len(accept), 4) if accept else None,
        "accept_length_per_request": {
            str(o["prompt_id"]): equivalence.accept_length(o) for o in outputs if "prompt_id" in o
        },
        "accuracy": accuracy(outputs),
    }


def _accuracy_pair(sa: dict[str, Any], sb: dict[str, Any]) -> dict[str, Any]:
    """Per workload: a's and b's accuracy and whether the same requests are right in both."""
    acc_a, acc_b = sa["accuracy"] or {}, sb["accuracy"] or {}
    by = {}
    for w in dict.fromkeys([*acc_a, *acc_b]):
        a, b = acc_a.get(w), acc_b.get(w)
        same = None if a is None or b is None else sorted(a["correct_ids"]) == sorted(b["correct_ids"])
        by[w] = {"a": a and a["rate"], "b": b and b["rate"], "same": same}
    return {"scored": bool(by), "by_workload": by}


def _control(
    path: Path, params: dict[str, Any], side: str, diff: dict[str, list[Any]]
) -> tuple[dict[str, Any], list[str]]:
    """The control run's description (a second run of `side`'s computation) and the warning its
    parameters raise (`diff`: params_mod.check_runs's, allowed)."""
    c = load_run(path, analysed=False)
    info = {"run_dir": str(c["run_dir"]), "arm": params.get("arm"), "repeat_of": side, "params_differ": diff}
    warnings = []
    if diff:
        warnings.append(
            f"PARAMETERS DIFFER: {side} and the control: {params_mod.describe(diff, side, 'control')}"
        )
    return {**info, "outputs": c["outputs"]}, warnings


# What timed each run's draft steps: the verdict's trace source, in words.
INSTRUMENTS = {
    "nsys": "Nsight Systems",
    "kineto": "the PyTorch profiler (Kineto)",
    "recorder": "the kit's in-process NVTX recorder (no Nsight)",
}


def _instrument(s: dict[str, Any]) -> str:
    return f"{INSTRUMENTS.get(s['source'], s['source'])}, {s['draft_step_basis']} time"


def timing(sa: dict[str, Any], sb: dict[str, Any]) -> tuple[float | None, str | None]:
    """The draft-step ratio a/b, or None and why. Two instruments (nsys vs the PyTorch profiler, GPU vs
    wall time) each add their own overhead to a draft step, so their ratio would measure the instruments
    as much as the fix; launch counts and tokens do not depend on the instrument and are compared anyway."""
    if (sa["source"], sa["draft_step_basis"]) != (sb["source"], sb["draft_step_basis"]):
        return None, (
            f"draft steps timed by two instruments (a: {_instrument(sa)}; b: {_instrument(sb)}): their "
            "ratio would measure the instruments as much as the fix; compare runs profiled the same way "
            "for timing (launches and tokens are compared anyway)"
        )
    step_a, step_b = sa["draft_step_ms"]["median"], sb["draft_step_ms"]["median"]
    if not (step_a and step_b):
        return None, "no draft-step time in " + ("a" if not step_a else "b")
    return round(step_a / step_b, 4), None


def compare_runs(
    run_a: Path,
    run_b: Path,
    control: Path | None = None,
    *,
    allow_mismatch: bool = False,
    task_spec: TaskSpec | None = None,
) -> dict[str, Any]:
    """Compare two analysed runs (same parameters, different arms), optionally against a control run
    (a second run of one of their computations): the dict comparison.json holds, without the gate.
    `task_spec`: judge the share model against this task instead of the runs' own task.json copies."""
    pa, pb = _run_dir(run_a).read_params(), _run_dir(run_b).read_params()
    pc = _run_dir(control).read_params() if control is not None else None
    side = noise.repeats(pa.get("arm"), pb.get("arm"), pc.get("arm")) if pc is not None else "a"
    # before any other file is read
    diff, diff_c = params_mod.check_runs(pa, pb, pc, side, allow_mismatch)
    a, b = load_run(run_a), load_run(run_b)
    warnings = [f"PARAMETERS DIFFER: {params_mod.describe(diff)}"] if diff else []
    ctrl = None
    if control is not None and pc is not None:
        ctrl, more = _control(Path(control), pc, side, diff_c)
        warnings += more
    sa, sb = summarize(a), summarize(b)
    ratio, ratio_why = timing(sa, sb)
    if ratio_why is not None:
        warnings.append(f"TIMING NOT COMPARED: {ratio_why}")
    rows_c = ctrl.pop("outputs") if ctrl is not None else None
    outputs = equivalence.compare_runs(a["outputs"], b["outputs"])
    sides = {"a": (sa["arm"], a["outputs"]), "b": (sb["arm"], b["outputs"])}
    if ctrl is not None:
        sides["control"] = (ctrl["arm"], rows_c)
    result = {
        "a": sa,
        "b": sb,
        "control": ctrl,
        "params_differ": diff,
        "warnings": warnings,
        "draft_step_ratio_a_over_b": ratio,
        "draft_step_ratio_why": ratio_why,  # None when there is a ratio
        "accept_length_diff_b_minus_a": round(sb["accept_length"] - sa["accept_length"], 4)
        if sa["accept_length"] is not None and sb["accept_length"] is not None
        else None,
        "outputs": outputs,
        "accuracy": _accuracy_pair(sa, sb),
        "acceptance": noise.acceptance(
            a["outputs"], b["outputs"], rows_c, ctrl["repeat_of"] if ctrl is not None else "a"
        ),
        "noise": _token_noise(outputs["requests"], a if (ctrl or {}).get("repeat_of") == "a" else b, rows_c),
        "share_model": share_model.check(
            sides,
            b["params"],
            task_spec,
            {"a": a["run_dir"], "b": b["run_dir"], **({"control": Path(control)} if control else {})},
        ),
    }
    result["per_request"] = per_request.build(
        result, {"a": a["outputs"], "b": b["outputs"], "control": rows_c}
    )
    return result


def _token_noise(ab: list[dict], x: dict, rows_c: list[dict] | None) -> dict[str, Any] | None:
    """kit noise's token judgement of a vs b (their per-request comparison `ab`) beside the control vs the
    run `x` it repeats (reported; the gate wants identical tokens)."""
    if rows_c is None:
        return None
    xc = equivalence.compare_runs(x["outputs"], rows_c, equivalence.TOKENS_ONLY, ("run", "control"))
    if not ab or not xc["requests"]:
        return None
    s_ab, s_xc = noise.token_summary(ab), noise.token_summary(xc["requests"])
    return {"verdict": noise.token_verdict(s_ab, s_xc), "a_vs_b": s_ab, "control": s_xc}


def comparison(
    run_a: Path,
    run_b: Path,
    control: Path | None = None,
    *,
    allow_mismatch: bool = False,
    task_spec: TaskSpec | None = None,
) -> dict[str, Any]:
    """compare_runs plus the gate's verdict on it: what comparison.json holds."""
    result = compare_runs(run_a, run_b, control, allow_mismatch=allow_mismatch, task_spec=task_spec)
    return {**result, "gate_failures": gate_failures(result), "gate_notes": gate_notes(result)}


def default_out(run_a: Path, run_b: Path) -> Path:
    """Where `kit compare` writes without --out: a compare folder in the second run's batch folder, as
    `kit batch` writes one per bug/fix pair."""
    return Path(run_b).resolve().parent / f"compare-{Path(run_a).name}-vs-{Path(run_b).name}"


def fresh_dir(out: Path) -> Path:
    """An empty compare folder; an earlier one, unless empty, becomes `<out>.superseded-<n>` (never
    overwritten or deleted)."""
    out = check_folder(Path(out), "the comparison")
    if out.exists() and any(out.iterdir()):
        out.rename(unique_path(out, sep=".superseded-"))  # it exists, so this counts from -1
    out.mkdir(parents=True, exist_ok=True)
    return out


def save(result: dict[str, Any], out: Path | str, flag: str = "out_dir") -> Path:
    """comparison() into `out`/comparison.json, `out` made where missing (03_compare writes into the folder
    kit batch gave it, or one a user names); a comparison.json already there is refused, never
    overwritten."""
    out = check_folder(Path(out), "the comparison", flag)
    out.mkdir(parents=True, exist_ok=True)
    return write_json(out / COMPARISON, placed(result, out))


def write_comparison(
    run_a: Path, run_b: Path, out: Path, control: Path | None = None, *, allow_mismatch: bool = False
) -> dict[str, Any]:
    """comparison() into out/comparison.json (a fresh folder); returns what it wrote."""
    result = comparison(run_a, run_b, control, allow_mismatch=allow_mismatch)
    out = fresh_dir(out)
    result = placed(result, out)
    write_json(out / COMPARISON, result)
    return result


def placed(result: dict[str, Any], folder: Path) -> dict[str, Any]:
    """`result` with each run it names also recorded relative to `folder` (where its comparison.json goes):
    a comparison moved with its runs (a committed result set, another machine) still finds them, while
    `run_dir` keeps where they ran as provenance."""
    out = dict(result)
    for side in ("a", "b", "control"):
        if out.get(side):
            rel = os.path.relpath(Path(out[side]["run_dir"]).resolve(), Path(folder).resolve())
            out[side] = {**out[side], "run": Path(rel).as_posix()}
    return out


def compared_run(comparison_json: Path, side: str) -> Path:
    """The run directory a comparison.json names for `side` (a, b, control), found by the path it recorded
    relative to its own folder; never by `run_dir`, the host path it ran at (the folder judged on another
    machine must not read whatever that machine holds there)."""
    f = Path(comparison_json)
    info = read_json(f).get(side) or {}
    if "run" not in info:
        raise InputError(
            f"{f} names its {side} run only by the path it had where it ran ({info.get('run_dir')}): "
            "write it again with `kit compare` (it records its runs relative to itself)",
            path=f,
        )
    run = f.parent / info["run"]
    if not (run / "params.json").is_file():
        raise InputError(
            f"{f}: its {side} run is expected at {run} (recorded as {info['run']}; it ran at "
            f"{info.get('run_dir')}), and that is not a run directory: keep runs beside their comparisons",
            path=run,
        )
    return run


def request_table(comparison_json: Path) -> dict[str, Any]:
    """The per-request table (kit.compare.per_request) a comparison.json holds. One written before it held
    one gets it rebuilt from the runs it names (found beside it, as compared_run finds them), its marks by
    the gate as recorded, and says so; one written before the gate checked the share model gets the
    predicted rounds from the share model run now on those runs (their own task.json), said too. Where the
    runs are not there: an empty table that says it is not recorded."""
    f = Path(comparison_json)
    result = read_json(f)
    if "per_request" in result:
        return result["per_request"]
    try:
        dirs = {s: compared_run(f, s) for s in ("a", "b", "control") if result.get(s)}
        rows = {s: read_outputs(d) for s, d in dirs.items()}
    except InputError as e:
        return {"sides": {}, "share_model_why": None, "by_workload": {}, "note": f"not recorded ({e})"}
    note = f"rebuilt from the runs it names ({f.name} was written before it held the table)"
    model = None
    if "share_model" not in result:
        sides = {s: (result[s]["arm"], rows[s]) for s in dirs}
        model = share_model.check(sides, RunDir(dirs["b"]).read_params(), None, dirs)
        if model.get("checked"):
            note += (
                "; the predicted rounds are the share model's, run now on the runs' own task.json (the gate "
            )
            note += "did not check it when this comparison was written)"
    return {**per_request.build(result, rows, model), "note": note}
