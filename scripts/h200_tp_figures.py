"""Print the figures data/results/h200-tp4/README.md quotes, from the committed runs: the TP 1 dry run of the
TP 4 step (`TP=1 JOBS=2 bash scripts/h200_task.sh OUT tp4`), per cell: how it ended, its answers and accept
lengths, the launches per draft round per rank (where a verdict exists), and whether its tokens equal the
bug arm's and those of the same cell in ../h200-sglang-task (TP 1 run alone, an earlier lease).

    python scripts/h200_tp_figures.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kit.paths import RESULTS  # noqa: E402
from kit.pipeline import task_evidence as te  # noqa: E402
from kit.rundir import read_outputs  # noqa: E402

DRY = RESULTS / "h200-tp4" / "tp1-dry-run"


def agree(mine: dict, other: Path) -> bool:
    """The tokens of every prompt `mine` answered equal `other`'s cell's for that prompt (a cut-short cell
    answered fewer)."""
    rows = read_outputs(other / "outputs.jsonl") if (other / "outputs.jsonl").is_file() else []
    theirs = {r["prompt_id"]: r["output_ids"] for r in rows}
    return bool(mine) and all(theirs.get(k) == v for k, v in mine.items())


def ended(cell: Path) -> str:
    """done, cut short (error.json: the deadline's Ctrl-C during it) or not started (after it)."""
    err = cell / "error.json"
    if not err.is_file():
        return "done"
    return "not started" if "did not run" in json.loads(err.read_text())["message"] else "cut short"


def main() -> int:
    task = DRY / "task"
    cells = sorted(p for p in task.glob("tp1-*-ctx*") if p.is_dir())
    if not cells:
        print(f"no cells under {task}", file=sys.stderr)
        return 2
    p = json.loads((cells[0] / "params.json").read_text())
    prov = json.loads((task / "tp1-bug-server" / "provenance.json").read_text())
    print(
        f"TP {p['tp_size']} dry run of the TP 4 step on an H200 ({prov['gpu']['uuid'][:12]}, kit "
        f"{prov['git_sha'][:7]}, {prov['start'][:10]}): sglang 0.5.14 (bug) and 0.5.14+pr29654 (fix) at "
        f"once on the one GPU, the task checkpoint, {p['num_requests']} requests {p['concurrency']} in "
        f"flight, EAGLE {p['num_steps']}/{p['eagle_topk']}/{p['num_draft_tokens']}, CUDA graphs"
    )
    print(
        f"{'cell':<33} {'ended':<12} {'answers':<9} {'accept':<11} {'ranks (launches x rounds)':<26} "
        "tokens = bug  = TP 1 alone"
    )
    for cell in cells:
        arm, rest = cell.name.split("-", 2)[1:]
        alone = te.TASK_RESULTS / "runs" / "task" / f"{arm}-{rest}"
        if (cell / "outputs.jsonl").is_file():
            s = te.arm_summary(cell)
            answers = f"{round(s['accuracy'] * s['n'])}/{s['n']}" + (
                f" of {p['num_requests']}" if s["n"] < p["num_requests"] else ""
            )
            accept = f"{s['accept_min']:.2f}-{s['accept_max']:.2f}"
            mine = s["outputs"]  # prompt id -> output token ids
            same = "-" if arm == "bug" else str(agree(mine, task / cell.name.replace("-fix-", "-bug-", 1)))
            earlier = str(agree(mine, alone))
        else:
            answers, accept, same, earlier = "-", "-", "-", "-"
        verdict = cell / "verdict.json"
        ranks = "no verdict"
        if verdict.is_file():
            v = json.loads(verdict.read_text())
            ranks = "; ".join(f"{sorted(r['observed_counts'])} x {r['rounds']}" for r in v.get("ranks") or [])
        row = f"{cell.name:<33} {ended(cell):<12} {answers:<9} {accept:<11} {ranks:<26}"
        print(f"{row} {same:<13} {earlier}")
    log = json.loads((DRY / "device_calls.json").read_text())
    calls = log["calls"]
    held = calls[-1]["held_s"] - log["held_before_s"]
    tp = next(c["wall_s"] for c in calls if c["step"].startswith("tp:"))
    print(
        f"H200 time: {held:,.0f} s held on {calls[0]['machine']} ({len(calls) - 1} calls, machine start "
        f"included), of which the tp call {tp:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
