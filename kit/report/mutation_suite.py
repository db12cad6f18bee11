"""The mutation suite's rung: the wrong fixes of PR #29654 (kit.sglang_src.mutants) run beside bug, fix and
off, and which gate check kills each, from the committed suites (data/results/mutants/<cpu|h200>/suite.json,
judged by kit.compare.mutation)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from kit.backends.mini.corrupt import Corruption
from kit.compare import mutation
from kit.compare.runs import request_table
from kit.paths import RESULTS
from kit.report.about import describe_runs
from kit.report.rung import CONFIRMED, NOT_CONFIRMED, Batch, Rung, Table, per_request_table, rung
from kit.sglang_src.mutants import MUTANTS


@rung(40)
def mutation_suite(batch: Batch) -> Rung | None:
    """Wrong fixes of PR #29654 (kit.sglang_src.mutants) run beside bug, fix and off: which gate check kills
    each. Evidence about the gate rather than the fix (the gate rejects wrong fixes, so its passes above
    mean something), shown after the evidence about the fix."""
    folder = RESULTS / "mutants"
    loaded = {
        n: json.loads((folder / n / "suite.json").read_text())
        for n in ("cpu", "h200", "h200-part")
        if (folder / n / "suite.json").is_file()
    }
    if "cpu" not in loaded:
        return None
    cpu = loaded["cpu"]
    about = describe_runs(p for c in cpu["cells"].values() if (p := folder / "cpu" / c).is_dir())
    about["model"] = "the task checkpoint made in memory (seed 0), 4k context, both task workloads"
    about["files"] = "data/results/mutants/ (README.md, cpu/suite.json, cpu/runs/, cpu/comparisons/)"
    rows = [r for r in cpu["rows"] if r["candidate"] != "fix"]
    names = list(dict.fromkeys(r["candidate"] for r in rows))
    lost = mutation.survivors(cpu)
    late = [
        n
        for n in names
        if not any(r["killed_by_old_gate"] for r in rows if r["candidate"] == n and r["verdict"] == "killed")
        and n not in lost
    ]
    claim = f"the gate kills {len(names) - len(lost)} of {len(names)} wrong fixes on CPU"
    part = [n for n in lost if MUTANTS[n].kind == "part"] if set(lost) <= set(MUTANTS) else []
    if lost and part == lost:
        claim += (
            f" ({', '.join(lost)} drop slots of the shared top-k that no draft reads on the CPU suite's 4k "
            "workloads: they are killed on any-slot, below)"
        )
    elif lost:
        claim += f" ({', '.join(lost)} survived)"
    inert = mutation.inert_where(cpu)
    if inert:
        claim += " (" + "; ".join(f"{n} lives only in {'/'.join(m)} mode" for n, m in inert.items())
        claim += (
            ": there each round's spec_info is fresh, so it is the fix; the CUDA-graph runner's static "
            "batch kills it)"
        )
    if late:
        claim += f"; {', '.join(late)} only since the gate checks the task's share model"
    claim += "; the fix and the off control pass"
    h200 = loaded.get("h200")
    if h200 is None:
        claim += "; not yet run on real sglang (recipe: data/results/mutants/README.md)"
    else:
        names = {r["candidate"] for r in h200["rows"]} - {"fix"}
        lost = mutation.survivors(h200)
        inert = "; ".join(f"{n} in {'/'.join(m)}" for n, m in mutation.inert_where(h200).items())
        claim += (
            f". On one H200 with real sglang 0.5.14: {len(names) - len(lost)} of {len(names)} killed"
            + (f" ({', '.join(lost)} survived)" if lost else "")
            + (f"; each lives only where its mistake is inert ({inert})" if inert else "")
            + "; the fix and off pass with CUDA graphs and in eager mode"
        )
        about["files"] += ", h200/suite.json, h200/runs/, h200/comparisons/"
        cells = sorted(v.parent for v in (folder / "h200" / "runs" / "mutants").glob("*-ctx*/verdict.json"))
        gpu = describe_runs(cells)
        about["model"] += f"; on the H200 the task checkpoint at {h200['settings']['context_len']} tokens"
        about["engine"] += "; on the GPU, sglang's own server: 0.5.14, the kit's fix and each mutant's build"
        about["device"] = f"{about['device']} (mini engine); {gpu['device']} (sglang)"
        about["Nsight"] = f"{about['Nsight']} (CPU); {gpu['Nsight']} (H200)"
        about["short"] = f"{about['short']} + real sglang 0.5.14 and the mutants' builds on {gpu['device']}"
    part = loaded.get("h200-part")
    if part is not None:
        names = {r["candidate"] for r in part["rows"]} - {"fix"}
        lost = mutation.survivors(part)
        claim += (
            f". Wrong fixes that damage only part of the shared top-k, on the H200 with the any-slot "
            f"workload "
            f"(issue 32): {len(names) - len(lost)} of {len(names)} killed, by the share model"
            + (f" ({', '.join(lost)} survived)" if lost else "")
            + "; the fix and off pass on any-slot, same-target and moving-target"
        )
        about["files"] += ", h200-part/ (suite.json, runs/, comparisons/, topk_slots.json)"

    stops = [
        k for k in mutation.STOPS if any(k in r["killed_by"] for v in loaded.values() for r in v["rows"])
    ]

    def frame(suite: dict) -> pd.DataFrame:
        cols = [*mutation.KILLERS, *stops]
        out = []
        for r in suite["rows"]:
            row = {"candidate": r["candidate"], "kind": r["kind"] or "-", "mode": r.get("mode") or "eager"}
            row.update({k.replace("_", " "): "x" if k in r["killed_by"] else "" for k in cols})
            out.append({**row, "verdict": r["verdict"]})
        return pd.DataFrame(out)

    tables = [Table("CPU (mini engine, eager, under Nsight Systems): mutant -> killed by", frame(cpu))]
    if "h200" in loaded:
        tables.append(
            Table(
                "Real sglang 0.5.14 on one H200 (CUDA graphs and eager, under Nsight Systems 2025.3.1): "
                "mutant -> killed by ('crash': sglang died starting the build)",
                frame(loaded["h200"]),
            )
        )
    if "h200-part" in loaded:
        tables.append(
            Table(
                "Real sglang 0.5.14 on one H200, part of the shared top-k damaged (CUDA graphs; any-slot, "
                "same-target, moving-target): mutant -> killed by",
                frame(loaded["h200-part"]),
            )
        )
    for name in loaded:
        why = failing_tables(folder / name)
        if why:
            tables.append(
                per_request_table(
                    f"{TITLES[name]}: why the gate kills the mutants a per-request check kills, request by "
                    "request (bug, the mutant, off)",
                    why,
                    "Only the comparisons where a per-request check (share model, acceptance, accuracy, "
                    "tokens) fails; every other one (the fix's, those killed by their launches alone) fails "
                    "none.",
                )
            )
    found = fuzz_tables(folder / FUZZ)
    if found is not None:
        line, more = found
        claim += f". {line}"
        tables += more
        about["files"] += f", {FUZZ}"
    return Rung(
        key="mutation-suite",
        title="Wrong fixes must fail: the mutation suite",
        scope=f"{len(MUTANTS)} wrong fixes of PR #29654 on the task workloads (committed results)",
        status=CONFIRMED if all(mutation.as_expected(v, k) for k, v in loaded.items()) else NOT_CONFIRMED,
        claim=claim,
        about=about,
        note=(
            "Each mutant is a patch against sglang 0.5.14 (kit/sglang_src/patches/mutants/) and the same "
            "mistake in the mini engine, compared with 0.5.14 (the bug) with the off control, through the "
            "gate. 'share model': the verify rounds each request must take when the later draft steps share "
            "the round's first top-k, derived from the task (kit/compare/share_model.py); it catches a stale "
            "top-k that keeps one launch per round and the same-target acceptance. The corruption fuzzer "
            "(kit/compare/fuzz.py, scripts/fuzz.py) draws wrong fixes that corrupt only part of the shared "
            "top-k and judges each with the same gate. Printed by scripts/mutants.py."
        ),
        tables=tables,
    )


TITLES = {
    "cpu": "CPU",
    "h200": "Real sglang on one H200",
    "h200-part": "Real sglang on one H200, part of the top-k damaged",
}


def failing_tables(suite: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(labels, per-request table) of each of a suite's comparisons (comparisons*/[mode/]workload/candidate:
    the current ones, not those set aside) where a per-request check of the gate fails."""
    out = []
    for f in sorted(suite.glob("comparisons*/**/comparison.json")):
        rel = f.parent.relative_to(suite).parts
        candidate, workload = rel[-1], rel[-2]
        if candidate not in ("fix", *MUTANTS):
            continue
        table = request_table(f)
        if any(t["failed"] for t in table["by_workload"].values()):
            mode = rel[1] if len(rel) == 4 else ("static" if rel[0].endswith("static") else "eager")
            out.append(({"candidate": candidate, "mode": mode, "workload": workload}, table))
    return out


FUZZ = "fuzz.json"  # scripts/fuzz.py's full run, beside the suites


def fuzz_tables(path: Path) -> tuple[str, list[Table]] | None:
    """The corruption fuzzer's part of the rung (issue 32): one line for the claim, then its kill rate per
    class value with counts, and every survivor with why; None when fuzz.json is not there."""
    if not path.is_file():
        return None
    f = json.loads(path.read_text())
    s, short = f["settings"], f["short_of_targets"]
    line = (
        f"The corruption fuzzer ({s['workload']}, context {s['context_len']}, {s['num_requests']} requests): "
        f"the gate kills {f['killed']} of {f['corruptions']} corruptions of part of the shared top-k "
        f"({f['rate']:.1%}; {f['no_ops']} no-ops set apart); of its survivors {f['equivalent']} are shown "
        f"equivalent and {f['survivors_departing_per_round']} change some round's acceptance while each "
        "request's total verify rounds, what the gate checks, stay right; targets "
        + ("met" if not short else f"NOT met ({len(short)} shortfalls, listed below the table)")
    )
    classes = pd.DataFrame(
        [
            {
                "class": axis,
                "value": value,
                "killed": v["killed"],
                "corruptions": v["corruptions"],
                "rate": v["rate"],
                "survivors shown equivalent": v.get("equivalent", 0),
                "survivors departing per round": v.get("departing", 0),
            }
            for axis, values in f["by_class"].items()
            for value, v in values.items()
        ]
    )
    survivors = pd.DataFrame(
        [
            {
                "cell": v["cell"],
                "corruption": Corruption.from_json(v["corruption"]).describe(),
                "equivalent": "yes" if v.get("equivalent") else "no",
                "why": v["why"],
            }
            for v in f["survivors"]
        ],
        columns=["cell", "corruption", "equivalent", "why"],
    )
    control = pd.DataFrame(
        [
            {
                "workload": w,
                "killed": v["killed"],
                "corruptions": v["corruptions"],
                "rate": v["rate"],
                "survivors": len(v["survivors"]),
                "no-ops": v["no_ops"],
            }
            for w, v in f["negative_control"]["by_workload"].items()
        ]
    )
    note = "the same corruptions; it must report survivors (the facts sit in the first slots there)"
    control_context = f["negative_control"]["settings"]["context_len"]
    return line, [
        Table(
            "Corruption fuzzer: kill rate per class value",
            classes,
            "'departing per round': a survivor whose acceptance departs in some round from what sharing the "
            "round's first top-k must give, while each request's total verify rounds (what the gate "
            "judges) match. "
            + ("Targets met." if not short else "Short of the targets: " + "; ".join(short) + "."),
        ),
        Table("Corruption fuzzer: survivors, with why", survivors),
        Table(
            f"Corruption fuzzer, negative control (context {control_context})",
            control,
            note,
        ),
    ]
