"""The profiles a reviewer opens (issue 33, item 6), gathered on the GPU host after a grid.

For each named arm's cell (the 4k graph cells of bug, fix and 0.5.16 by default): the cell's small files, its
SQLite export trimmed to its first rounds (scripts/trim_fixture.py: what the tests analyse, since CI's nsys
2022.4 cannot read the host's 2025.3 reports), and its server's `.nsys-rep` (what a reviewer opens in Nsight
Systems) when the arms' reports fit `limit` together: every call to the host carries the repository, so each
committed MB costs every later transfer. Every report's size is listed first (OUT/sizes-BATCH.txt), so a
report that does not fit is measured, not guessed. What comes back: OUT/profiles.tgz, or pieces of it under
16 MiB.
"""

from __future__ import annotations

import json
import shutil
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path

from kit.errors import InputError
from kit.proc import run_logged
from kit.rundir import RunDir

ARMS = ("bug", "fix", "upstream")
CELL = "ctx4096-s5-graph-cuda"  # the grid's 4k cell with CUDA graphs (kit.pipeline.matrix's run ids)
LIMIT = 6_000_000  # the three reports together, bytes (issue 33: within 6 MB)
ROUNDS = 8  # draft rounds the trimmed export keeps after the profile window opens
PIECE = 15 << 20  # a returned file holds 16 MiB
TRIM = Path(__file__).resolve().parents[2] / "scripts" / "trim_fixture.py"
CELL_FILES = ("params.json", "verdict.json", "rounds.csv", "provenance.json", "outputs.jsonl")


def sizes(batch_dir: Path) -> list[tuple[int, Path]]:
    """Every Nsight report and SQLite export under a batch (each file once: the cells link their server's),
    largest first."""
    found = {p.resolve() for pat in ("*.nsys-rep", "*.sqlite") for p in batch_dir.rglob(pat) if p.exists()}
    return sorted(((p.stat().st_size, p) for p in found), key=lambda x: (-x[0], str(x[1])))


def cells_of(batch_dir: Path, arms: Sequence[str] = ARMS, cell: str = CELL) -> dict[str, Path]:
    """Each arm's run dir of `cell` under a batch (kit.pipeline.matrix's run ids)."""
    return {arm: batch_dir / f"sglang-{arm}-{cell}" for arm in arms}


def unanalysed(batch_dir: Path, arms: Sequence[str] = ARMS, cell: str = CELL) -> list[str]:
    """The arms' cells under a batch that have no verdict (not run, or not analysed)."""
    return [str(c) for c in cells_of(batch_dir, arms, cell).values() if not (c / "verdict.json").is_file()]


def gather(
    out: Path,
    batch_dir: Path,
    arms: Sequence[str] = ARMS,
    cell: str = CELL,
    limit: int = LIMIT,
    rounds: int = ROUNDS,
) -> dict:
    """OUT/profiles/ (one folder per arm's cell) and OUT/profiles.tgz (in pieces if over 15 MiB); returns
    what profiles/profiles.json says: each arm's report and its size, whether the reports are included and
    why not, the trimmed exports."""
    cells = cells_of(batch_dir, arms, cell)
    missing = unanalysed(batch_dir, arms, cell)
    if missing:
        raise InputError(f"no analysed cell at {', '.join(missing)}: not finished", path=batch_dir)
    staging = out / "profiles"
    if staging.exists():
        shutil.rmtree(staging)  # OUT is this call's: a repeat gathers again
    staging.mkdir(parents=True)
    listed = out / f"sizes-{batch_dir.name}.txt"  # beside, not inside: a second batch's gather keeps it
    listed.write_text("".join(f"{n} {p}\n" for n, p in sizes(batch_dir)))
    reports = {arm: RunDir(c).server().nsys_rep for arm, c in cells.items()}
    have = {arm: r.stat().st_size for arm, r in reports.items() if r.is_file()}
    total = sum(have.values())
    included = len(have) == len(arms) and total <= limit
    why = (
        ""
        if included
        else (
            f"the {len(arms)} reports are {total:,} bytes, over {limit:,}"
            if len(have) == len(arms)
            else f"no report for {', '.join(a for a in arms if a not in have)}"
        )
    )
    summary: dict = {"cell": cell, "limit": limit, "total_bytes": total, "included": included, "why": why}
    for arm, c in cells.items():
        dst = staging / c.name
        log = staging / f"trim-{arm}.txt"
        rc = run_logged([sys.executable, str(TRIM), str(c), str(dst), "--rounds", str(rounds)], log, None)
        dst.mkdir(exist_ok=True)
        for name in CELL_FILES:
            if (c / name).is_file() and not (dst / name).exists():
                shutil.copyfile(c / name, dst / name)
        if included:
            shutil.copyfile(reports[arm], dst / "profile.nsys-rep")
        summary[arm] = {
            "report": str(reports[arm]),
            "report_bytes": have.get(arm),
            "trimmed_export": RunDir(dst).nsys_sqlite_packed.is_file() and rc == 0,
            "trim_rounds": rounds,
        }
    (staging / "profiles.json").write_text(json.dumps(summary, indent=1) + "\n")
    _pack(staging, out / "profiles.tgz")
    return summary


def _pack(folder: Path, tgz: Path) -> list[Path]:
    """`folder` as one gzip tar, cut into PIECE-sized files (tgz.00, .01 ...) when larger."""
    for old in tgz.parent.glob(tgz.name + "*"):
        old.unlink()
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    if tgz.stat().st_size <= PIECE:
        return [tgz]
    pieces = []
    with open(tgz, "rb") as f:
        for i, chunk in enumerate(iter(lambda: f.read(PIECE), b"")):
            piece = tgz.with_name(f"{tgz.name}.{i:02d}")
            piece.write_bytes(chunk)
            pieces.append(piece)
    tgz.unlink()
    return pieces
