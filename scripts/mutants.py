"""The mutation suite's tables: run it on CPU, or print what a results folder holds.

    python scripts/mutants.py                  # print data/results/mutants/cpu, the fuzz block (fuzz.json)
                                               # and h200/
    python scripts/mutants.py cpu OUT          # run the CPU suite into OUT (a new folder) and print its table
    python scripts/mutants.py h200 DIR         # judge the real-sglang comparisons in DIR (h200_mutants.sh
                                               # `compare`), write DIR/suite.json, print the table

Each table: mutant -> the gate's checks that kill it (launches | acceptance beyond the noise floor | answer
accuracy | tokens | share model) or `survived`; the fix and the off control must pass.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import _checkout  # noqa: F401  (this checkout's kit first on sys.path)

from kit.compare import fuzz, mutation
from kit.paths import RESULTS

MUTANT_RESULTS = RESULTS / "mutants"
OLD_WORKLOADS = ("same-target", "moving-target")
FUZZ = "fuzz.json"  # scripts/fuzz.py's full run


def _workloads(suite: dict) -> list[str]:
    """The workloads a suite's off control ran ("<workload> (<mode>)" keys), in a stable order."""
    ws = {k.split(" (")[0] for k in suite.get("off") or {}}
    return sorted(ws, key=lambda w: (w != "same-target", w != "moving-target", w)) or list(OLD_WORKLOADS)


def _print(title: str, suite: dict) -> None:
    s = suite["settings"]
    engine = " ".join(str(s[k]) for k in ("backend", "model") if s.get(k))
    flight = f" ({s['concurrency']} in flight)" if s.get("concurrency") else ""
    print(
        f"{title}: {engine}, context {s['context_len']}, {s['num_requests']} requests{flight} x "
        f"{s['max_new_tokens']} tokens, num_steps {s['num_steps']}, {' and '.join(_workloads(suite))}"
    )
    print(mutation.table(suite))
    if suite.get("seconds"):
        print(f"({suite['seconds']['total']} s: cells {suite['seconds']['cells']} s under nsys)")
    if any(r.get("mode") for r in suite["rows"]):
        lost = mutation.survivors(suite)
        print(f"mutants no mode kills: {', '.join(lost) or 'none'}")
        for name, modes in mutation.inert_where(suite).items():
            print(f"  {name}: lives only in {'/'.join(modes)} mode")


def _device(folder: Path) -> None:
    """The H200 time the suite took, from the device tool's own figures (logs/steps/device_calls.json),
    per lease: held_s restarts with each machine."""
    calls = json.loads((folder / "logs" / "steps" / "device_calls.json").read_text())["calls"]
    for lease in sorted({c.get("lease", 1) for c in calls}):
        mine = [c for c in calls if c.get("lease", 1) == lease]
        runs = [c for c in mine if not c["step"].startswith("receive")]
        print(
            f"H200 lease {lease}: {mine[-1]['held_s']:.0f} s held in {len(mine)} calls; the machine's start "
            f"and transfers {mine[len(mine) - len(runs) - 1]['held_s']:.0f} s; the commands:"
        )
        for c in runs:
            print(f"  {c['wall_s']:6.1f} s  {c['step']}")


def _launches(folder: Path) -> None:
    """Indexer launches per draft round in each profiled cell of a real-sglang folder (runs/mutants/)."""
    print("indexer launches per draft round (profiled rounds; cell: distinct values)")
    for v in sorted((folder / "runs" / "mutants").glob("*-ctx*/verdict.json")):
        counts = json.loads(v.read_text()).get("launches_per_round") or []
        print(f"  {v.parent.name:<50} {sorted(set(counts))} over {len(counts)} rounds")


def _per_workload(folder: Path, suite: dict) -> None:
    """Each candidate per workload (the gate today), and b3e44e1's gate on the old workloads: a part mutant
    is new only where the old gate passed it on same-target and moving-target."""
    old = json.loads((folder / "logs" / "b3e44e1-gate" / "verdicts.json").read_text())["verdicts"]
    ws = sorted({f.parent.name for f in folder.glob("comparisons/*/*/fix")})
    print("per workload: the gate today (killed: the checks), and b3e44e1's gate on the old workloads")
    print(f"{'candidate':<24} " + " ".join(f"{w:<24}" for w in ws) + " b3e44e1 (same, moving)")
    for r in suite["rows"]:
        cells = [",".join(r["failures"].get(w, {})) or "passes" for w in ws]
        cells = [c if c == "passes" else f"killed: {c}" for c in cells]
        then = ["fails" if old[f"{r['candidate']} {w}"]["rc"] == 1 else "passes" for w in OLD_WORKLOADS]
        print(f"{r['candidate']:<24} " + " ".join(f"{c:<24}" for c in cells) + " " + ", ".join(then))
    new = [
        r["candidate"]
        for r in suite["rows"]
        if r["candidate"] != "fix"
        and all(old[f"{r['candidate']} {w}"]["rc"] == 0 for w in OLD_WORKLOADS)
        and r["verdict"] == "killed"
    ]
    print(f"passed by b3e44e1's gate on the old workloads and killed now: {len(new)} ({', '.join(new)})")


def _topk_order(folder: Path) -> None:
    """sglang's real top-k on any-slot (topk_slots.json) against kit.task.topk's model, and the deciding
    slots' spread."""
    from kit.task.slots import group_entries
    from kit.task.spec import read_task
    from kit.task.topk import order_agreement
    from kit.task.workload import task_prompt

    doc = json.loads((folder / "topk_slots.json").read_text())
    prov = doc["provenance"]
    s = prov["settings"]
    spec = read_task(next((folder / "runs" / "mutants").glob("fix-*-any-slot")))
    rows = []
    for p in doc["prompts"]:
        row = p["full_row"]
        ids = task_prompt(spec, "any-slot", s["context_len"], p["prompt_id"], s["seed"]).ids
        rows.append(order_agreement(row["kernel"], row["emulated_same_logits"],
                                    group_entries(spec, ids, spec.group_of[row["query_key"]])))  # fmt: skip
    sp = doc["summary"]["spread"]
    print(
        f"sglang's top-k on any-slot ({prov['gpu']}, sgl_kernel {prov['kernels']['sgl_kernel']}, "
        f"{s['context_len']} tokens, {len(rows)} prompts, kit {prov['kit_git_sha'][:7]}): the query group's "
        f"entries fill the first slots in {sum(r['above_first'] for r in rows)}/{len(rows)} rows (the model: "
        f"{sum(r['model_above_first'] for r in rows)}/{len(rows)}), in position order up to the warps' "
        f"scheduling: mean |slot - modelled slot| {max(r['mean_displacement'] for r in rows)} at most, "
        f"largest {max(r['max_displacement'] for r in rows)}; the tied fillers after them (the model's "
        f"subset in {sum(r['ties_same_set'] for r in rows)}/{len(rows)} rows)"
    )
    print(
        f"deciding slots on the H200 over {sp['requests']} requests: {sp['n']} lookups at {sp['distinct']} "
        f"distinct slots, per quarter of the top-k {sp['per_quarter']}, largest empty gap "
        f"{sp['largest_gap']}; "
        f"every 512-slot window holds one: {sp['every_window_hit']}; P(a random 25% of slots misses all) "
        f"{sp['p_random_quarter_misses_all']:.1e}"
    )


def main(argv: list[str]) -> int:
    if argv[:1] == ["cpu"] and len(argv) == 2:
        suite = mutation.run_cpu(Path(argv[1]))
        _print("CPU", suite)
        return 0 if mutation.as_expected(suite, "cpu") else 1
    if argv[:1] == ["h200"] and len(argv) == 2:
        suite = mutation.judge_folder(Path(argv[1]))
        _print("H200", suite)
        _launches(Path(argv[1]))
        return 0 if mutation.as_expected(suite, "h200") else 1
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    for name in ("cpu", "h200", "h200-part"):
        f = MUTANT_RESULTS / name / "suite.json"
        if f.is_file():
            _print(name.upper(), json.loads(f.read_text()))
            if name == "cpu" and (MUTANT_RESULTS / FUZZ).is_file():  # the corruption fuzzer (issue 32)
                print(fuzz.table(json.loads((MUTANT_RESULTS / FUZZ).read_text())))
            if name == "h200-part":
                _per_workload(f.parent, json.loads(f.read_text()))
                _topk_order(f.parent)
            if name.startswith("h200"):
                _launches(f.parent)
                _device(f.parent)
    return 0


if __name__ == "__main__":
    from kit.errors import KitError

    try:
        sys.exit(main(sys.argv[1:]))
    except KitError as exc:
        print(f"mutants.py: error: {exc}", file=sys.stderr)
        sys.exit(2)
