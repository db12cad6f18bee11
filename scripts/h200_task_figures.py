"""Print the figures data/results/h200-sglang-task/README.md quotes, from the committed runs and comparisons.

    python scripts/h200_task_figures.py [RESULTS_DIR]      # default data/results/h200-sglang-task

Per context and workload: each arm's answer accuracy, accept length (pooled over the requests, and the
per-request range), launches per draft round and median draft-step GPU time from its own profile window;
whether the fix's and the off control's tokens equal the bug's; the kit's comparison (bug vs fix with off as
the same-computation control): the gate, and for acceptance the per-request mean change with its 95% t
interval and the noise floor. Then the wrong-top-k control's accuracy. (kit.report.sglang_task reads it.)
A converted set that lacks an arm or a comparison (cut by a deadline, a lost machine) gets no table: each
server and its cells as they ended, one line naming what is missing, exit 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

import _checkout  # noqa: F401  (this checkout's kit first on sys.path)

from kit.errors import KitError
from kit.report import sglang_task as te


def main(argv: list[str]) -> int:
    results = Path(argv[0]) if argv else te.TASK_RESULTS
    if not te.has_runs(results):
        print(f"no runs/task or runs/{te.BATCH} under {results}", file=sys.stderr)
        return 2
    try:
        return figures(results)
    except KitError as exc:  # a set whose arms or comparisons have not all run: no table, what ran
        if te.converted(results):
            ran(results)
        print(
            f"{results}: {exc}; this prints a set where bug, fix, off and their compares all ran",
            file=sys.stderr,
        )
        return 2


def gate_verdict(g: dict) -> str:
    return "PASS" if not g["gate_failures"] else "FAIL " + "; ".join(g["gate_failures"])


def ran(results: Path) -> None:
    """A partial set: each server and its cells as they ended, and any comparisons made off the host."""
    print("a partial set (no table, no host comparison): each server and its cells as they ended")
    for s in te.servers(results):
        done = sum(c["status"] == "done" for c in s["cells"])
        print(
            f"{s['server']} ({s['arm']}, {s['gpu']}): up after {s['startup_s']} s, waited "
            f"{s['gpu_wait_s']} s for the GPU, {done} of {len(s['cells'])} cells done"
        )
        for c in s["cells"]:
            if "launches" not in c:
                print(f"  {c['run']}: {c['status']}")
                continue
            launches = "/".join(map(str, c["launches"]))
            print(
                f"  {c['run']}: {c['status']} in {c['cell_s']} s, {round(c['accuracy'] * c['n'])} of "
                f"{c['n']} right, accept {c['accept_min']:.2f}-{c['accept_max']:.2f}, {launches} launches "
                f"per round over {c['rounds']} rounds"
            )
    for g in te.compared_here(results):
        print(
            f"compared here (kit compare bug fix --control off --gate on the runs above), ctx "
            f"{g['context_len']} {g['workload']}: gate {gate_verdict(g)}; acceptance fix - bug "
            f"{g['mean']:+.3f}, draft step bug/fix {g['draft_step_ratio']}"
        )


def figures(results: Path) -> int:
    # every file read before a line is printed: a set that lacks one prints nothing but the error
    ck, cells, gates, controls = (
        te.checkpoint(results),
        te.cells(results),
        te.gates(results),
        te.controls(results),
    )
    print(
        f"checkpoint: {ck['format']}, task_checkpoint {ck['task_checkpoint']}, reference_match "
        f"{ck['reference_match']}, self-check {ck['self_check']['passed']} "
        f"(generated in {ck['generation_seconds']} s, self-check {ck['self_check_seconds']} s on the host)"
    )
    print(
        "ctx     workload       arm  n  accuracy  accept (range)       launches/round  step GPU ms  ", end=""
    )
    print("tokens = bug")
    for c in cells:
        same = "-" if c["tokens_equal_bug"] is None else str(c["tokens_equal_bug"])
        step = f"{c['step_ms']:.3f}" if c["step_ms"] is not None else "-"
        accept = f"{c['accept']:.3f} ({c['accept_min']:.2f}-{c['accept_max']:.2f})"
        print(
            f"{c['context_len']:<7} {c['workload']:<14} {c['arm']:<4} {c['n']}  {c['accuracy']:.2f}      "
            f"{accept}   {c['launches']} x {c['rounds']}       {step:<11}  {same}"
        )
    print("kit compare bug fix --control off --gate (acceptance: fix - bug per request):")
    for g in gates:
        ci = g["interval"]
        ci_text = f" 95% t interval [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else ""
        where = f"  ctx {g['context_len']:<7} {g['workload']:<14}"
        print(
            f"{where} gate {gate_verdict(g)}; mean {g['mean']:+.3f}{ci_text}, "
            f"noise floor {g['noise_floor']:.3f} ({g['status']})"
        )
    for c in controls:
        print(
            f"wrong target top-k (last 2048 tokens), 65536 {c['workload']}: accuracy {c['accuracy']:.2f} "
            f"over {c['n']} requests (chance 1/{ck['task']['n_keys']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
