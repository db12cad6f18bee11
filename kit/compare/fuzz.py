"""The corruption fuzzer: wrong fixes that hand the later draft steps only PART of the right shared top-k
(kit.backends.mini.corrupt), drawn at random per class, each run as the fix arm of the mini task model and
judged by the gate exactly as `kit compare BUG X --control OFF --gate` judges a candidate
(kit.compare.runs.comparison). Killed: the gate fails; survived: it passes, with why (kit.compare.fuzz_why).

A corruption that changes no row in its run (every corrupted view equal to the clean top-k) is a NO-OP: it
is counted apart, never as killed or survived, and another is drawn in its place on the main workload.
The negative control runs the same corruptions on the CPU suite's two workloads (same-target and
moving-target at context 4096), where the facts the draft needs sit in the first slots: it must report
survivors, or the fuzzer could not tell a workload that sees every slot from one that does not.

All cells of one workload run in engine processes of many cells under Nsight Systems
(kit.backends.mini.cells), `kit analyze` gives each its launches, and the comparison its gate.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kit import provenance
from kit.analysis.analyze import analyze
from kit.backends.mini.corrupt import AXES, HOWS, REQUESTS, SLOTS, Corruption
from kit.compare import fuzz_why, mutation
from kit.compare.gate import gate_checks
from kit.compare.runs import comparison
from kit.compare.share_model import task_spec
from kit.errors import ExistsError
from kit.rundir import RunDir, new_folder, read_json, read_outputs, write_json
from kit.trace import nsys as capture

MAIN = "any-slot"
NEGATIVE = ("same-target", "moving-target")
# The main workload's cells: any-slot needs context >= 8192; requests: enough that the deciding slots of all
# requests cover the top-k (kit.task.slots.spread over prompts 0..2 of the 14-key chains: 35 distinct
# deciding slots, 11 to 13 per request, a random quarter of the slots misses them all with P = 3.8e-5, the
# largest empty run 181 < 512 slots; tests/test_task_slots.py).
SETTINGS: dict[str, Any] = {**mutation.CPU, "context_len": 8192, "num_requests": 3, "workload": MAIN}
NEGATIVE_SETTINGS: dict[str, Any] = dict(mutation.CPU)  # the CPU suite's: context 4096, 3 requests
WIDTH = 2048  # the top-k's slots (index_topk)
# What the draws are: each corrupts 25% to 75% of a row's slots, like the wrong fixes (a quarter
# and a half of the row), on a random subset of the later steps and of the requests.
DRAWS = {
    "steps": "a nonempty subset of the later draft steps 1..num_steps-2, uniform over the subsets "
    "('all': every one)",
    "requests": "uniform over all | one (a random row) | fraction (U[0.25, 0.75] of the rows, at least "
    "one) | indices (2..batch-1 random rows); rows taken modulo the batch",
    "slots": "uniform over fraction (each slot with p ~ U[0.25, 0.75]) | block ([a, a+L), L ~ "
    "U{512..1024}) | scattered (every n-th, n ~ U{2,3,4}, from s ~ U{0..63})",
    "how": "uniform over dropped | shifted (+1 or -1) | other-request (row r + U{1..batch-1}) | "
    "other-round (the most recent earlier round whose row differs in the corrupted slots) | rejected-branch "
    "(the most recent round the verify cut short whose row differs there)",
}
TARGETS = {"overall": 0.95, "class": 0.90, "corruptions": 200}
CHUNK = 40  # corrupted cells per engine process
FUZZ = "fuzz.json"


def _rng(seed: int, index: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, index, 32])))


def draw(seed: int, index: int, num_steps: int, batch: int) -> Corruption:
    """The `index`-th corruption of the fuzzer's `seed` (DRAWS), the same on every machine."""
    rng = _rng(seed, index)
    later = list(range(1, num_steps - 1))
    subsets = [s for n in range(1, len(later) + 1) for s in itertools.combinations(later, n)]
    steps = subsets[int(rng.integers(len(subsets)))]
    kw: dict[str, Any] = {"steps": None if len(steps) == len(later) else tuple(steps)}
    kw["requests"] = REQUESTS[int(rng.integers(len(REQUESTS)))]
    if kw["requests"] == "one":
        kw["request_ids"] = (int(rng.integers(batch)),)
    elif kw["requests"] == "indices":
        k = int(rng.integers(2, max(2, batch - 1) + 1))
        kw["request_ids"] = tuple(sorted(int(r) for r in rng.choice(max(batch, k), size=k, replace=False)))
    elif kw["requests"] == "fraction":
        kw["request_fraction"] = round(float(rng.uniform(0.25, 0.75)), 3)
    kw["slots"] = SLOTS[int(rng.integers(len(SLOTS)))]
    if kw["slots"] == "fraction":
        kw["slot_fraction"] = round(float(rng.uniform(0.25, 0.75)), 3)
    elif kw["slots"] == "block":
        length = int(rng.integers(512, 1025))
        a = int(rng.integers(0, WIDTH - length + 1))
        kw["block"] = (a, a + length)
    else:
        kw["every"], kw["first"] = int(rng.integers(2, 5)), int(rng.integers(0, 64))
    kw["how"] = HOWS[int(rng.integers(len(HOWS)))]
    kw["shift"] = 1 if rng.random() < 0.5 else -1
    kw["other"] = int(rng.integers(1, max(2, batch)))
    kw["seed"] = int(rng.integers(2**31 - 1))
    return Corruption(**kw)


class Workload:
    """One workload's cells: bug, off and the fix once, then corrupted fix cells in sessions of CHUNK."""

    def __init__(self, out: Path, settings: dict[str, Any]) -> None:
        self.out, self.settings, self.sessions = out, settings, 0
        self.name = settings["workload"]
        self.base: dict[str, Path] = {}
        self.fix: dict[str, Any] | None = None  # the uncorrupted fix's gate

    def judge(self, ids: list[str]) -> list[dict[str, Any]]:
        """The results of cells already run (out/<workload>/<id>), judged again by this kit."""
        self.base = {a: self.out / self.name / a for a in ("bug", "off", "fix")}
        self.fix = self._judge(self.base["fix"])
        return [self._judge(self.out / self.name / cid) for cid in ids]

    def run(self, corruptions: list[Corruption], start: int) -> list[dict[str, Any]]:
        """Each corruption's result (cell c<start + i>): no_op, or killed / survived with the checks."""
        from kit.backends.mini.cells import run_cells

        results = []
        for lo in range(0, len(corruptions), CHUNK):
            part = corruptions[lo : lo + CHUNK]
            cells = [] if self.base else [(a, {**self.settings, "arm": a}) for a in ("bug", "off", "fix")]
            ids = [f"c{start + lo + i:04d}" for i in range(len(part))]
            cells += [
                (cid, {**self.settings, "arm": "fix", "corrupt": c.to_json()})
                for cid, c in zip(ids, part, strict=True)
            ]
            self.sessions += 1
            dirs = run_cells(cells, self.out, self.name, f"s{self.sessions}", timeout_s=None)
            by = dict(zip((c[0] for c in cells), dirs, strict=True))
            for d in dirs:
                analyze(d)
            if not self.base:
                self.base = {a: by[a] for a in ("bug", "off", "fix")}
                self.fix = self._judge(self.base["fix"])
            results += [self._judge(by[cid]) for cid in ids]
            print(f"fuzz {self.name}: {start + lo + len(part)} cells judged", file=sys.stderr)
        return results

    def _judge(self, cell: Path) -> dict[str, Any]:
        """The gate on bug vs the cell with off as the control, as `kit compare --gate` runs it (the fix
        cell: whether it passes)."""
        summary = read_json(RunDir(cell).engine).get("corruption")
        out: dict[str, Any] = {"cell": str(cell.relative_to(self.out))}
        if summary is not None and summary["no_op"]:
            return {**out, "verdict": "no_op"}
        res = comparison(self.base["bug"], cell, self.base["off"])
        failing = [check for check, lines in gate_checks(res).items() if lines]
        spec, _ = task_spec(cell, RunDir(cell).read_params())
        rows = read_outputs(RunDir(cell).outputs)
        shape = (self.settings["num_steps"], self.settings["max_new_tokens"])
        if summary is None:
            verdict = "fails" if failing else "passes"
            # the fix's own rounds against the share model's walk, round by round (none may depart)
            departing = {str(k): v for k, v in fuzz_why.departures(rows, spec, *shape).items()}
            return {
                **out,
                "verdict": verdict,
                "gate_failures": res["gate_failures"],
                "rounds_departing": departing,
            }
        out.update(verdict="killed" if failing else "survived", killed_by=failing)
        if failing:
            return out
        share = ((res.get("share_model") or {}).get("by_workload") or {}).get(self.name)
        fix_rows = read_outputs(RunDir(self.base["fix"]).outputs)
        return {**out, **fuzz_why.why(summary, rows, spec, fix_rows, shape, share)}


def rates(corruptions: list[Corruption], results: list[dict[str, Any]]) -> dict[str, Any]:
    """Kill rate overall and per class value (AXES), each with its count; no-ops counted apart."""
    judged = [(c, r) for c, r in zip(corruptions, results, strict=True) if r["verdict"] != "no_op"]
    by: dict[str, dict[str, dict[str, Any]]] = {a: {} for a in AXES}
    for c, r in judged:
        for axis, value in c.labels().items():
            v = by[axis].setdefault(value, {"corruptions": 0, "killed": 0, "equivalent": 0, "departing": 0})
            v["corruptions"] += 1
            v["killed"] += r["verdict"] == "killed"
            v["equivalent"] += bool(r.get("equivalent"))  # survivors shown equivalent
            v["departing"] += bool(r.get("rounds_departing"))  # survivors a per-round check would kill
    for values in by.values():
        for v in values.values():
            v["rate"] = round(v["killed"] / v["corruptions"], 4)
    killed = sum(r["verdict"] == "killed" for _, r in judged)
    survived = [r for _, r in judged if r["verdict"] == "survived"]
    shown = len(judged) - sum(bool(r.get("equivalent")) for r in survived)
    return {
        "corruptions": len(judged),
        "killed": killed,
        "rate": round(killed / len(judged), 4) if judged else None,
        "no_ops": len(results) - len(judged),
        # survivors shown equivalent (the draft reads nothing they changed), and the kill rate without them
        "equivalent": len(judged) - shown,
        "rate_not_equivalent": round(killed / shown, 4) if shown else None,
        # survivors whose acceptance departs in some round from the share model's per-round prediction (the
        # gate judges rounds too: only a departure within the control's own floor survives)
        "survivors_departing_per_round": sum(bool(r.get("rounds_departing")) for r in survived),
        "by_class": {a: dict(sorted(by[a].items())) for a in AXES},
        "survivors": [
            {
                "corruption": c.to_json(),
                "why": r.get("why"),
                "equivalent": r.get("equivalent"),
                "rounds_departing": r.get("rounds_departing"),
                "cell": r["cell"],
            }
            for c, r in judged
            if r["verdict"] == "survived"
        ],
    }


def short_of_targets(summary: dict[str, Any]) -> list[str]:
    """What misses the targets (TARGETS), one line each; [] when met."""
    lines = []
    if summary["corruptions"] < TARGETS["corruptions"]:
        lines.append(f"{summary['corruptions']} corruptions, fewer than {TARGETS['corruptions']}")
    if summary["rate"] is None or summary["rate"] < TARGETS["overall"]:
        lines.append(f"overall kill rate {summary['rate']} below {TARGETS['overall']}")
    for axis, values in summary["by_class"].items():
        for value, v in values.items():
            if v["rate"] < TARGETS["class"]:
                lines.append(f"{axis}={value}: kill rate {v['rate']} ({v['killed']}/{v['corruptions']})")
    return lines


def run(
    out: Path,
    n: int = TARGETS["corruptions"],
    *,
    seed: int = 0,
    settings: dict[str, Any] | None = None,
    negative: tuple[str, ...] = NEGATIVE,
    negative_settings: dict[str, Any] | None = None,
    max_redraws: int = 5,
    draws: Callable[[int], Corruption] | None = None,
) -> dict[str, Any]:
    """The fuzzer into `out` (a new folder): n counted corruptions on the main workload (no-ops redrawn, at
    most `max_redraws` times), the same ones on each `negative` workload; returns fuzz.json's content,
    also written to out/fuzz.json. `draws`: index -> corruption (default: `draw` with `seed`)."""
    out = new_folder(Path(out), "the fuzzer's runs")
    nsys = capture.find_nsys()
    # the code and machine that run the cells, taken before anything else is done
    t0, sha = time.perf_counter(), provenance.git_sha()
    prov = provenance.collect("mini", "fuzz", capture.nsys_version(nsys) if nsys else None)
    s = {**SETTINGS, **(settings or {})}
    main = Workload(out, s)
    pick = draws or (lambda i: draw(seed, i, s["num_steps"], s["num_requests"]))
    corruptions: list[Corruption] = []
    results: list[dict[str, Any]] = []
    counted = 0
    for _ in range(max_redraws + 1):
        want = n - counted
        if want <= 0:
            break
        more = [pick(len(corruptions) + i) for i in range(want)]
        got = main.run(more, len(corruptions))
        corruptions += more
        results += got
        counted += sum(r["verdict"] != "no_op" for r in got)
    t_main = time.perf_counter() - t0
    kept = [c for c, r in zip(corruptions, results, strict=True) if r["verdict"] != "no_op"]
    ns = {**NEGATIVE_SETTINGS, **(negative_settings or {})}
    control: dict[str, Any] = {}
    for w in negative:
        wl = Workload(out, {**ns, "workload": w})
        control[w] = {**rates(kept, wl.run(kept, 0)), "fix": wl.fix}
    fuzz = summarise(main, corruptions, results, ns, control)
    fuzz["settings"]["seed"] = seed
    fuzz.update(
        seconds={"main": round(t_main, 1), "total": round(time.perf_counter() - t0, 1)},
        kit_git_sha=sha,
        provenance=prov,
    )
    write_json(out / FUZZ, fuzz)
    return fuzz


def summarise(
    main: Workload,
    corruptions: list[Corruption],
    results: list[dict[str, Any]],
    negative_settings: dict[str, Any],
    control: dict[str, Any],
) -> dict[str, Any]:
    """fuzz.json's judgement part: rates, every result, the targets, the fix, the negative control."""
    summary = rates(corruptions, results)
    return {
        **summary,
        # every corruption run on the main workload, no-ops included, in the order drawn
        "results": [
            {"cell": r["cell"], "verdict": r["verdict"], "killed_by": r.get("killed_by"), **c.labels()}
            for c, r in zip(corruptions, results, strict=True)
        ],
        "short_of_targets": short_of_targets(summary),
        "fix": main.fix,
        "negative_control": {
            "settings": negative_settings,
            "by_workload": control,
            "reports_survivors": all(v["corruptions"] > v["killed"] for v in control.values())
            if control
            else None,
        },
        "settings": {**main.settings, "draws": DRAWS, "targets": TARGETS},
    }


def rejudge(out: Path, dest: Path) -> dict[str, Any]:
    """Judge a fuzzer folder's cells again with this kit (its fuzz.json gives the settings and workloads,
    the cells c0000, c0001, ... the order, each cell's params.json its corruption), into `dest` (a new file):
    what a change of the judging code (not of the cells) needs. Keeps the run's seconds, sha and
    provenance; adds this judge's sha and date."""
    out, dest = Path(out), Path(dest)
    old = read_json(out / FUZZ)
    if dest.exists():
        raise ExistsError(f"{dest} exists: name a new file (nothing is overwritten)", path=dest)
    keys = ("draws", "targets", "seed")
    main = Workload(out, {k: v for k, v in old["settings"].items() if k not in keys})
    ids = sorted(p.name for p in (out / main.name).glob("c[0-9]*") if p.is_dir())
    results = main.judge(ids)
    corruptions = [Corruption.from_json(RunDir(out / main.name / i).read_params()["corrupt"]) for i in ids]
    kept = [c for c, r in zip(corruptions, results, strict=True) if r["verdict"] != "no_op"]
    ns = old["negative_control"]["settings"]
    control: dict[str, Any] = {}
    for w in old["negative_control"]["by_workload"]:
        wl = Workload(out, {**ns, "workload": w})
        control[w] = {**rates(kept, wl.judge([f"c{i:04d}" for i in range(len(kept))])), "fix": wl.fix}
    fuzz = summarise(main, corruptions, results, ns, control)
    fuzz["settings"]["seed"] = old["settings"].get("seed")
    fuzz.update({k: old[k] for k in ("seconds", "kit_git_sha", "provenance")})
    fuzz["judged"] = {"kit_git_sha": provenance.git_sha(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    write_json(dest, fuzz)
    return fuzz


def passes(fuzz: dict[str, Any]) -> bool:
    """The fix passes, the targets are met, and the negative control reports survivors."""
    fix = fuzz.get("fix") or {}
    control = fuzz["negative_control"]["reports_survivors"]
    return fix.get("verdict") == "passes" and not fuzz["short_of_targets"] and control is not False


def _rate(v: dict[str, Any]) -> str:
    return f"{v['rate']:.1%} ({v['killed']}/{v['corruptions']})" if v.get("rate") is not None else "-"


def _by_class(by: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """One line per class value: kill rate (killed/count), survivors shown equivalent, survivors departing
    from the share model in some round."""
    return [
        f"  {axis:<9} {value:<16} {_rate(v):<16} equivalent {v.get('equivalent', 0):>3}   departing per "
        f"round {v.get('departing', 0):>3}"
        for axis, values in by.items()
        for value, v in values.items()
    ]


def table(fuzz: dict[str, Any], survivors: int = 3) -> str:
    """The fuzz block as scripts/fuzz.py and scripts/mutants.py print it (`survivors` of each kind)."""
    s = fuzz["settings"]
    lines = [
        f"Corruption fuzzer: mini task, {s['workload']}, context {s['context_len']}, {s['num_requests']} "
        f"requests x {s['max_new_tokens']} tokens, num_steps {s['num_steps']}, seed {s['seed']}",
        f"killed {_rate(fuzz)}; no-ops {fuzz['no_ops']} (counted apart, drawn again); survivors "
        f"{fuzz['corruptions'] - fuzz['killed']}: {fuzz['equivalent']} shown equivalent, "
        f"{fuzz['survivors_departing_per_round']} departing in some round from the share model's per-round "
        f"prediction within the control's floor; kill rate without the equivalent ones "
        f"{fuzz['rate_not_equivalent']}",
        f"the fix: {(fuzz.get('fix') or {}).get('verdict')}",
        "kill rate per class value (survivors: shown equivalent | departing from the share model per round):",
        *_by_class(fuzz["by_class"]),
    ]
    t = s["targets"]
    short = fuzz["short_of_targets"]
    head = (
        f"targets (>= {t['corruptions']} corruptions, overall >= {t['overall']:.0%}, each class value >= "
        f"{t['class']:.0%})"
    )
    lines.append(f"{head}: {'met' if not short else 'NOT met: ' + '; '.join(short)}")
    kinds = {
        "shown equivalent": [v for v in fuzz["survivors"] if v.get("equivalent")],
        "departing from the share model per round": [
            v for v in fuzz["survivors"] if not v.get("equivalent") and v.get("rounds_departing")
        ],
    }
    kinds["other"] = [v for v in fuzz["survivors"] if not any(v in k for k in kinds.values())]
    for kind, found in kinds.items():
        if not found:
            continue
        lines.append(f"survivors {kind}: {len(found)} ({min(len(found), survivors)} shown; all in fuzz.json)")
        for v in found[:survivors]:
            c = Corruption.from_json(v["corruption"])
            lines.append(f"  {v['cell']}: {c.describe()}: {v['why']}")
    nc = fuzz["negative_control"]
    for w, v in (nc.get("by_workload") or {}).items():
        eq = sum(bool(x.get("equivalent")) for x in v["survivors"])
        ns = nc["settings"]
        lines.append(
            f"negative control {w} (context {ns['context_len']}, {ns['num_requests']} requests): killed "
            f"{_rate(v)}, {len(v['survivors'])} survivors ({eq} shown equivalent), "
            f"no-ops {v['no_ops']}, the fix {(v.get('fix') or {}).get('verdict')}"
        )
    if nc.get("reports_survivors") is not None:
        lines.append(f"negative control reports survivors: {nc['reports_survivors']}")
    lines.append(f"({fuzz['seconds']['total']} s; main workload {fuzz['seconds']['main']} s)")
    return "\n".join(lines)
