"""What `kit batch` prints at the end: one line per cell and stage, then what failed or never started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kit import rundir
from kit.errors import InputError
from kit.pipeline.batch import BatchResult
from kit.pipeline.cell import CELL_LOG, CellResult

STATUSES = ("done", "skipped", "failed", "not_started")


def verdict_text(v: dict[str, Any] | None) -> str:
    if not v:
        return "-"
    per_round = v.get("launches_per_round") or []
    launches = ",".join(map(str, sorted(set(per_round)))) or "?"
    return (
        f"{v.get('status', '?')}  launches/round {launches} over {len(per_round)} rounds "
        f"(expected {v.get('expected_per_round')})"
    )


def _start_retries(res: BatchResult) -> list[tuple[str, dict[str, Any]]] | None:
    """Each sglang start-up the batch's cells retried (provenance.json `start_retries`, written by
    kit.backends.sglang.launch); None when no cell records any (no sglang cell ran)."""
    found, seen = [], False
    for c in res.cells:
        prov = Path(c.run_dir) / "provenance.json"
        try:
            got = rundir.read_json(prov).get("start_retries") if prov.is_file() else None
        except InputError:  # a damaged provenance: the cell's own failure says more
            got = None
        if got is not None:
            seen = True
            found += [(c.run_id, r) for r in got]
    return found if seen else None


def summary(res: BatchResult) -> str:
    counts = {s: sum(c.status == s and c.run_id not in res.killed for c in res.cells) for s in STATUSES}
    later = f", {counts['not_started']} not started" if counts["not_started"] else ""
    later += f", {len(res.killed)} mutants killed" if res.killed else ""
    lines = [
        f"Batch {res.batch_dir}: {len(res.cells)} cells: {counts['done']} run, "
        f"{counts['skipped']} already complete, {counts['failed']} failed{later} ({res.wall_s:.0f} s)"
    ]
    width = max((len(c.run_id) for c in res.cells), default=10)
    for c in res.cells:
        status = {"failed": "FAILED", "not_started": "not run"}.get(c.status, c.status)
        status = "killed" if c.run_id in res.killed else status  # a mutant's failed run: its kill
        lines.append(f"  {c.run_id:<{width}}  {status:<7}  {verdict_text(c.verdict)}")
    retries = _start_retries(res)
    if retries is not None:
        lines.append(f"  sglang start-up retries (a port taken, new ports): {len(retries)}")
        lines += [f"    {rid}: port {r.get('port')}: {r.get('why')}" for rid, r in retries]
    for s in res.compares:
        gate = "" if s.gate is None else "  gate " + ("PASS" if not s.gate else f"FAIL: {'; '.join(s.gate)}")
        why = f" ({s.message})" if s.status == "skipped" and s.message else ""
        lines.append(f"  {s.name}: {s.status}{why}{gate}  {s.path}")
    for s in res.mutants:
        lines.append(f"  {s.name}: {s.message if s.status != 'failed' else 'FAILED'}  {s.path}")
    if res.mutants:
        n = {v: sum(s.verdict == v for s in res.mutants) for v in ("killed", "survived")}
        lines.append(f"  mutants: {n['killed']} killed, {n['survived']} survived, of {len(res.mutants)}")
    for s in res.overheads:
        lines.append(f"  {s.name}: {s.status}" + (f" ({s.message})" if s.message else "") + f"  {s.path}")
    if res.report:
        lines.append(
            f"  report: {res.report.status}  {res.report.path}"
            + (f"  ({res.report.message})" if res.report.message else "")
        )
    for p in res.set_aside:
        lines.append(f"  set aside (earlier failure, kept): {p}")
    record = "executed-*.ipynb" if res.runner == "notebooks" else CELL_LOG
    if res.failures:
        lines.append(f"FAILED ({len(res.failures)}):")
        for f in res.failures:
            if isinstance(f, CellResult):
                lines.append(f"  {f.run_id}: {f.stage}: {f.message}")
                if rundir.failed(Path(f.run_dir)):  # none where the dir is another process's, left as is
                    lines.append(f"    see {f.run_dir}/error.json and its {record}")
            else:
                lines.append(f"  {f.name}: {f.message}  ({f.path})")
    if res.not_started:
        lines.append(
            f"NOT STARTED ({len(res.not_started)}): the deadline passed before they could start; "
            f"run the batch again with --resume: {', '.join(c.run_id for c in res.not_started)}"
        )
    return "\n".join(lines)
