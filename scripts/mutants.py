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
FUZZ = "fuzz.json"  # scripts/fuzz.py's full run


def _print(title: str, suite: dict) -> None:
    s = suite["settings"]
    engine = " ".join(str(s[k]) for k in ("backend", "model") if s.get(k))
    flight = f" ({s['concurrency']} in flight)" if s.get("concurrency") else ""
    print(
        f"{title}: {engine}, context {s['context_len']}, {s['num_requests']} requests{flight} x "
        f"{s['max_new_tokens']} tokens, num_steps {s['num_steps']}, same-target and moving-target"
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
    for name in ("cpu", "h200"):
        f = MUTANT_RESULTS / name / "suite.json"
        if f.is_file():
            _print(name.upper(), json.loads(f.read_text()))
            if name == "cpu" and (MUTANT_RESULTS / FUZZ).is_file():  # the corruption fuzzer (issue 32)
                print(fuzz.table(json.loads((MUTANT_RESULTS / FUZZ).read_text())))
            if name == "h200":
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
