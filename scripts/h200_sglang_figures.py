"""Print the output-agreement figures that data/results/h200-sglang/README.md quotes, from the files.

    python scripts/h200_sglang_figures.py [RESULTS_DIR]   # default data/results/h200-sglang

Every number in that README's *Outputs* section comes from here: the logprob agreement of each compared pair
(where their tokens agree), the same for runs that differ only in context or prompt (the scale a change in
what the target attends to moves them by), the smallest top-2 margin of every run, and which GPU (UUID in
each trimmed fixture's report) each fixture was measured on.
"""

from __future__ import annotations

import itertools
import sqlite3
import statistics
import sys
from pathlib import Path

import _checkout  # noqa: F401  (this checkout's kit first on sys.path)

from kit.compare.equivalence import logprob_diffs, read_outputs
from kit.paths import REPO
from kit.trace.sqlite import connect_ro

# (label, run A, run B): the pairs the README's table compares, by path under runs/
PAIRS = (
    ("bug vs fix, 5 steps, 4k", "graph/repeat-bug-ctx4096", "graph/graph-fix-ctx4096"),
    ("bug vs fix, 3 steps, 16k", "steps3/steps3-bug-ctx16384", "steps3/steps3-fix-ctx16384"),
    ("same build (bug), 5 vs 3 steps, 16k", "graph/graph-bug-ctx16384", "steps3/steps3-bug-ctx16384"),
    ("bug 5 steps vs fix 3 steps, 16k", "graph/graph-bug-ctx16384", "steps3/steps3-fix-ctx16384"),
)


def _stats(diffs: list[float]) -> tuple[float, float, float]:
    s = sorted(diffs)
    return statistics.median(s), s[min(len(s) - 1, int(0.99 * len(s)))], s[-1]


def _pooled(rows_a: list[dict], rows_b: list[dict], same_prompt: bool = True) -> list[float]:
    by_b = {r["prompt_id"]: r for r in rows_b}
    out: list[float] = []
    for a in rows_a:
        if same_prompt and a["prompt_id"] in by_b:
            out += logprob_diffs(a, by_b[a["prompt_id"]])
    return out


def _line(label: str, diffs: list[float]) -> str:
    med, p99, mx = _stats(diffs)
    return f"  {label:<48} median {med:.3f}  p99 {p99:.2f}  max {mx:.2f}  ({len(diffs)} tokens)"


def gpu_uuids(fixtures: Path) -> dict[str, str]:
    out = {}
    for rep in sorted(fixtures.glob("*/profile.sqlite.xz")):
        con = connect_ro(rep)
        try:
            row = con.execute("SELECT uuid FROM TARGET_INFO_GPU LIMIT 1").fetchone()
        except sqlite3.Error:
            row = None
        finally:
            con.close()
        out[rep.parent.name] = str(row[0]) if row else "?"
    return out


def main(argv: list[str]) -> int:
    results = Path(argv[0]) if argv else REPO / "data" / "results" / "h200-sglang"
    runs = {
        p.parent.relative_to(results / "runs").as_posix(): read_outputs(p)
        for p in sorted((results / "runs").glob("*/*/outputs.jsonl"))
    }
    if not runs:
        print(f"no runs/*/*/outputs.jsonl under {results}", file=sys.stderr)
        return 2
    print(f"Logprob |diff| where the tokens agree ({results.relative_to(REPO)}):")
    pair_medians = []
    for label, a, b in PAIRS:
        diffs = _pooled(runs[a], runs[b])
        pair_medians.append(_stats(diffs)[0])
        print(_line(label, diffs))
    print("Other prompt, same run (prompt i vs prompt j, tokens where they agree):")
    scale = []
    for name, rows in runs.items():
        diffs = [d for x, y in itertools.combinations(rows, 2) for d in logprob_diffs(x, y)]
        if diffs:
            scale.append(_stats(diffs)[0])
            print(_line(name, diffs))
    print("Other context, same prompt (5 steps, every pair of contexts):")
    five = {n: r for n, r in runs.items() if n.startswith("graph/")}
    for (na, ra), (nb, rb) in itertools.combinations(five.items(), 2):
        if ra[0]["input_len"] != rb[0]["input_len"]:
            diffs = _pooled(ra, rb)
            scale.append(_stats(diffs)[0])
            print(_line(f"{na} vs {nb}", diffs))
    lo, hi = min(scale) / max(pair_medians), max(scale) / min(pair_medians)
    print(
        f"Context/prompt medians {min(scale):.3f}-{max(scale):.3f} nats vs bug/fix medians "
        f"{min(pair_medians):.3f}-{max(pair_medians):.3f}: {lo:.0f}x to {hi:.0f}x"
    )
    print("Smallest top-2 margin per run (nats; prompt, token):")
    for name, rows in runs.items():
        m, pid, tok = min(
            (min(r["output_margins"]), r["prompt_id"], r["output_margins"].index(min(r["output_margins"])))
            for r in rows
            if r.get("output_margins")
        )
        print(f"  {name:<32} {m:.3f}  (prompt {pid}, token {tok})")
    fixtures = REPO / "tests" / "fixtures" / "h200_sglang"
    print(f"GPU of each trimmed fixture ({fixtures.relative_to(REPO)}, TARGET_INFO_GPU.uuid):")
    for name, uuid in gpu_uuids(fixtures).items():
        print(f"  {name:<24} {uuid}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
