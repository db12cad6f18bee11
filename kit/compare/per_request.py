"""The gate's reasons, request by request: per workload of a comparison, each request's accept length
(completion_tokens / spec_verify_ct, as sglang reports it), the verify rounds it ran and those the share model
predicts, and whether its answer is right, for a (the bug), b (the candidate) and the control; the cells that
fail the gate marked.

A verdict alone ("share model departs", "acceptance beyond the noise floor") does not say which requests moved
or by how much, and a pass does not show what was compared. The table is built once, in `kit compare`, from
what the comparison already holds (the share model's predictions, the gate's rules: kit.compare.gate
.failing_cells) and the runs' own rows through the helpers that judged them (kit.compare.equivalence); it is
stored in comparison.json as `per_request`, printed by `kit compare` (`lines`) and shown by the report
(`grid`). A comparison.json written before it existed gets it rebuilt from the runs it names
(kit.compare.runs.request_table).
"""

from __future__ import annotations

import statistics
from typing import Any

from kit.compare import equivalence as eq
from kit.compare.gate import CHECKS, failing_cells

SIDES = ("a", "b", "control")
# The table's columns with a cell per side, and the gate check whose failure marks a cell of it; `right`
# (every side's answer, marked by `accuracy`) and `tokens` (b's output identical to a's) are one column each.
COLUMNS = (("accept", "acceptance"), ("rounds", "share_model"))
MARK = "*"  # appended to a failing cell in text
FLOORS = {
    "share_model": "share model {:g} rounds",
    "round_floor": "{:g} rounds off the walk",
    "acceptance": "acceptance {:g}",
}  # the control's floors
GROUPS = {"accept": "accept length", "rounds": "verify rounds (predicted)", "right": "right"}


def build(
    result: dict[str, Any],
    rows: dict[str, list[dict[str, Any]] | None],
    model: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The table of `result` (compare_runs' dict, before or after its gate), given each side's outputs rows
    (`rows`: "a", "b", "control" -> rows; None or absent: that side did not run). The predicted rounds are
    the share model's in `result`, or `model`'s (kit.compare.share_model.check) for a result that holds
    none; the marks are always `result`'s gate."""
    arms = {s: result[s]["arm"] for s in SIDES if result.get(s)}
    sides = {
        s: eq.by_prompt(r, f"the per-request table ({s})", eq.TOKENS_ONLY)
        for s, r in rows.items()
        if r is not None and s in arms
    }
    model = model or result.get("share_model") or {}
    predicted: dict[Any, dict[str, Any]] = {}
    off: dict[Any, dict[str, Any]] = {}
    floors: dict[str, dict[str, Any]] = {}
    for w, judged in (model.get("by_workload") or {}).items():
        floors.setdefault(w, {})["share_model"] = judged.get("floor")
        if judged.get("round_floor") is not None:
            floors[w]["round_floor"] = judged["round_floor"]
        for r in judged["requests"]:
            predicted[r["prompt_id"]] = {s: (r.get(s) or {}).get("predicted") for s in arms}
            off[r["prompt_id"]] = {s: (r.get(s) or {}).get("rounds_off") for s in arms}
    acceptance = (result.get("acceptance") or {}).get("by_workload") or {}
    for w, acc in acceptance.items():
        if acc.get("gated"):
            floors.setdefault(w, {})["acceptance"] = acc.get("noise_floor")
    identical = {r["prompt_id"]: r["identical"] for r in (result.get("outputs") or {}).get("requests") or []}
    marks = failing_cells(result)
    by: dict[str, dict[str, Any]] = {}
    for pid in dict.fromkeys(p for s in ("a", "b") for p in sides.get(s, {})):
        held = {s: rs[pid] for s, rs in sides.items() if pid in rs}
        w = eq.workload(held.get("a") or held["b"])
        by.setdefault(w, {"rows": []})["rows"].append(
            {
                "prompt_id": pid,
                "accept": {s: eq.accept_length(r) for s, r in held.items()},
                "ran": {s: r.get("spec_verify_ct") for s, r in held.items()},
                "predicted": predicted.get(pid, {}),
                "rounds_off": off.get(pid, {}),
                "right": {s: eq.correct(r) for s, r in held.items()},
                "tokens_identical": identical.get(pid),
                "failing": marks.get(pid, {}),
            }
        )
    for w, t in by.items():
        failed = {c for r in t["rows"] for c in r["failing"]}
        if (acceptance.get(w) or {}).get("status") in ("not_run", "beyond_noise"):
            failed.add("acceptance")
        t.update(failed=[c for c in CHECKS if c in failed], floors=floors.get(w, {}))
    why = None if model.get("checked") else (model.get("why") or "not recorded in this comparison")
    return {"sides": arms, "share_model_why": why, "by_workload": by}


def _num(x: Any, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def _right(x: bool | None) -> str:
    return "-" if x is None else ("yes" if x else "NO")


def grid(
    table: dict[str, Any], workload: str
) -> tuple[list[tuple[str, str]], list[list[str]], set[tuple[int, int]]]:
    """One workload's table as text: the header (column group, side), a row of cells per request, and the
    (row, column) cells that fail the gate. Columns: prompt, accept length per side, verify rounds ran and,
    in brackets, the share model's prediction per side, whether each side's answer is right (one column),
    b's tokens identical to a's."""
    arms = table["sides"]
    header = [("", "prompt")]
    header += [(GROUPS[name], arms[s]) for name in ("accept", "rounds") for s in arms]
    header += [(GROUPS["right"], "/".join(arms.values())), ("tokens", f"= {arms.get('a', 'a')}")]
    rows, marked = [], set()
    for i, r in enumerate(table["by_workload"][workload]["rows"]):
        cells = [str(r["prompt_id"])]
        for name, check in COLUMNS:
            for s in arms:
                if s in r["failing"].get(check, ()):
                    marked.add((i, len(cells)))
                cells.append(_cell(name, r, s))
        if r["failing"].get("accuracy"):
            marked.add((i, len(cells)))
        cells.append("/".join(_right(r["right"].get(s)) for s in arms))
        if "tokens" in r["failing"]:
            marked.add((i, len(cells)))
        cells.append(_right(r["tokens_identical"]).lower())
        rows.append(cells)
    return header, rows, marked


def _cell(name: str, row: dict[str, Any], side: str) -> str:
    if name == "accept":
        return _num(row["accept"].get(side))
    ran, pred = row["ran"].get(side), row["predicted"].get(side)
    moved = (row.get("rounds_off") or {}).get(side)
    return _num(ran, "d") + ("" if pred is None else f" ({pred})") + (f", {moved} off" if moved else "")


def summary(table: dict[str, Any], workload: str) -> str:
    """One line for a workload where no per-request check failed: its requests, each side's mean accept
    length, how many requests ran the predicted rounds, and how many are right."""
    arms, t = table["sides"], table["by_workload"][workload]
    n = len(t["rows"])

    def count(s: str, ok: Any) -> str:
        return f"{arms[s]} {sum(1 for r in t['rows'] if ok(r, s))}/{n}"

    accept = ", ".join(
        f"{arms[s]} {statistics.fmean(v):.3f}"
        for s in arms
        if (v := [r["accept"][s] for r in t["rows"] if r["accept"].get(s) is not None])
    )
    line = f"{workload}: {n} request{'s' * (n != 1)}, no per-request check failed; mean accept length "
    line += accept or "-"
    if table["share_model_why"] is None:
        ran = [count(s, lambda r, s: r["predicted"].get(s) == r["ran"].get(s)) for s in arms]
        line += f"; verify rounds as the share model predicts: {', '.join(ran)}"
    else:
        line += f"; share model not checked ({table['share_model_why']})"
    if any(v is not None for r in t["rows"] for v in r["right"].values()):
        line += f"; right: {', '.join(count(s, lambda r, s: r['right'].get(s)) for s in arms)}"
    return line


def lines(table: dict[str, Any], every: bool = False) -> list[str]:
    """`kit compare`'s per-request text: the table of each workload where a check failed (every workload's
    with `every`), one summary line for the others; failing cells end with MARK."""
    out = [f"per request: {table['note']}"] if table.get("note") else []
    for w, t in table["by_workload"].items():
        if not (t["failed"] or every):
            out.append(summary(table, w))
            continue
        floors = ", ".join(FLOORS[k].format(v) for k, v in t["floors"].items() if v is not None)
        failed = f"fails {', '.join(c.replace('_', ' ') for c in t['failed'])}" if t["failed"] else "passes"
        out.append(
            f"{w}: per request {failed}"
            + (f" (the control's floors: {floors})" if floors else "")
            + f"; {MARK}: fails the gate"
        )
        out += _aligned(*grid(table, w))
    return out


def _aligned(header: list[tuple[str, str]], rows: list[list[str]], marked: set[tuple[int, int]]) -> list[str]:
    """Text columns under a two-line header (each group's label over its sides), failing cells + MARK."""
    texts = [[c + (MARK if (i, j) in marked else "") for j, c in enumerate(r)] for i, r in enumerate(rows)]
    widths = [max(len(c) for c in col) for col in zip([sub for _, sub in header], *texts, strict=True)]
    spans: list[tuple[str, list[int]]] = []
    for j, (group, _) in enumerate(header):
        if spans and spans[-1][0] == group:
            spans[-1][1].append(j)
        else:
            spans.append((group, [j]))
    for group, cols in spans:  # a group's label wider than its columns widens its first one
        widths[cols[0]] += max(0, len(group) - sum(widths[j] for j in cols) - 2 * (len(cols) - 1))
    top = "  ".join(g.center(sum(widths[j] for j in cols) + 2 * (len(cols) - 1)) for g, cols in spans)
    body = [[sub for _, sub in header], *texts]
    return ["  " + top.rstrip()] + [
        "  " + "  ".join(c.rjust(wd) for c, wd in zip(r, widths, strict=True)).rstrip() for r in body
    ]
