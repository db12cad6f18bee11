"""What a set of runs ran on, as every rung's `about` says it (engine, device, model, Nsight Systems), read
from the runs' own params.json and provenance.json; and the words and colours every rung names things by:
a context length, a path as a reader finds it, an arm's colour."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from kit.paths import REPO
from kit.rundir import RunDir, read_json

ARM_COLORS = {"off": "#8172b2", "bug": "#c44e52", "fix": "#55a868", "upstream": "#4c72b0"}


def context_label(n: Any) -> str:
    """4096 -> "4k", 524288 -> "512k"; other lengths as digits."""
    if n is None or pd.isna(n):
        return "-"
    n = int(n)
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else f"{n:,}"


def shown(path: Path) -> str:
    """A path as a reader finds it: relative to the repository when inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


# ------------------------------------------------------------------------------ what a set of runs ran on


def _version(nsys: str | None) -> str:
    return (nsys or "").split("-")[0]


def describe_runs(run_dirs: Iterable[Path]) -> dict[str, str]:
    """engine, device, model and Nsight Systems of a set of run directories, from their params.json and
    provenance.json (what the runs recorded, not what anyone remembers), plus `short`: e.g. "mini engine
    on CPU"."""
    params, provs = [], []
    for path in run_dirs:
        run = RunDir(Path(path))
        params.append(run.read_params() if run.params.is_file() else {})
        provs.append(read_json(run.provenance) if run.provenance.is_file() else {})
    backends = sorted(
        {p.get("backend") or q.get("backend") or "?" for p, q in zip(params, provs, strict=True)}
    )
    gpus = sorted({f"{q['gpu'].get('count', 1)}x {q['gpu']['name']}" for q in provs if q.get("gpu")})
    device = ", ".join(gpus) if gpus else "CPU"
    graphs = {bool(p.get("cuda_graph")) for p in params}
    modes = " and ".join(m for m, on in (("eager", False), ("CUDA graphs", True)) if on in graphs)
    engines, models, names = [], [], {"mini": "mini engine"}
    if "mini" in backends:
        engines.append("the kit's mini engine (a model of sglang 0.5.14's EAGLE-MTP draft loop, not sglang)")
        mini = [(p, q) for p, q in zip(params, provs, strict=True) if p.get("backend") == "mini"]
        presets = sorted({p.get("preset") or "default" for p, _ in mini if p.get("model") != "task"})
        if presets:
            models.append(f"mini preset {', '.join(presets)} (random weights)")
        tasks = sorted({_task_checkpoint(q) for p, q in mini if p.get("model") == "task"})
        if tasks:
            models.append(
                f"the task checkpoint ({'; '.join(tasks)}): it answers a lookup through its sparse "
                "attention, so its answers depend on the indexer's selection"
            )
    if "sglang" in backends:
        by_arm: dict[str, set[str]] = {}
        for q in provs:
            version = ((q.get("sglang") or {}).get("state") or {}).get("version")
            if version:
                by_arm.setdefault(q.get("arm", "?"), set()).add(version)
        builds = " vs ".join(f"{', '.join(sorted(v))} ({arm})" for arm, v in sorted(by_arm.items()))
        engines.append(f"sglang's own server: {builds or 'version not recorded'}")
        distinct = dict.fromkeys(", ".join(sorted(v)) for _, v in sorted(by_arm.items()))  # off shares fix's
        names["sglang"] = "sglang " + " vs ".join(distinct)
        archs = sorted({a for q in provs for a in (q.get("model") or {}).get("architectures", [])})
        models.append(", ".join(archs) or "model not recorded")
    measured = [q.get("measured_under_nsight") for q in provs]
    versions = sorted({_version(q.get("nsys_version")) for q in provs if q.get("measured_under_nsight")})
    if measured and all(measured):
        nsight = "Nsight Systems " + ", ".join(versions)
    elif any(measured):
        nsight = f"Nsight Systems {', '.join(versions)} for some runs; the others NOT measured under Nsight"
    else:
        nsight = "NOT measured under Nsight Systems (the kit's in-process NVTX recorder)"
    short = " + ".join(names.get(b, b) for b in backends) + f" on {device}"
    return {
        "engine": "; ".join(engines) or ", ".join(backends),
        "device": f"{device}, {modes}" if modes else device,
        "model": "; ".join(models) or "-",
        "Nsight": nsight,
        "short": short,
    }


def _task_checkpoint(prov: dict[str, Any]) -> str:
    """A mini task run's checkpoint as its provenance recorded it: keys, seed, and where it came from."""
    task = (prov.get("engine") or {}).get("task") or {}
    if not task:
        return "not recorded"
    source = str(task.get("source") or "?")
    where = "made in memory" if source.startswith("made in memory") else source
    return f"{task.get('n_keys', '?')} keys, seed {task.get('seed', '?')}, {where}"
