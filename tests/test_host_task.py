"""kit host task's steps without a server (kit.pipeline.host_task, host.batch faked): which matrix modes
each step runs, into which batch, with which --set and deadline; the task checkpoint made once; the
long window's trace split into pieces that join."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kit.errors import EXIT
from kit.pipeline import host, host_task
from kit.pipeline.host_builds import HostDirs


def _call(tmp_path: Path, step: str, jobs: int = 1, tp: int = 4) -> host_task.TaskCall:
    dirs = HostDirs(tmp_path / "host", site=tmp_path / "site")
    ckpt = dirs.task_ckpt
    ckpt.mkdir(parents=True)
    (ckpt / "kit-checkpoint.json").write_text(json.dumps({"task_checkpoint": "task-v1", "self_check": {}}))
    clock = host.Clock.starting_now(540.0)
    return host_task.TaskCall(tmp_path / "out" / step, step, clock, dirs, jobs, "plain", tp=tp)


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[host.BatchCall]:
    calls: list[host.BatchCall] = []

    def fake_batch(call: host.BatchCall, log: Path, refresh: Any, every_s: float = 0) -> int:
        calls.append(call)
        log.write_text(f"batch {call.batch}\n")
        return 3 if call.mode is None else 0  # the compare pass: the other arms not run yet

    monkeypatch.setattr(host, "batch", fake_batch)
    monkeypatch.setattr(host_task.TaskCall, "jit_pack", lambda self: None)
    return calls


@pytest.mark.parametrize(
    ("step", "jobs", "tp", "batches"),
    [
        ("bug", 1, 4, [("bug", "h200_task"), (None, "h200_task")]),
        ("off", 3, 4, [("off", "h200_task"), (None, "h200_task")]),
        ("arms", 3, 4, [("arms", "h200_task"), (None, "h200_task")]),
        ("control", 1, 4, [("control", "h200_task-control")]),
        ("upstream", 1, 4, [("upstream", "h200_task-upstream")]),
        ("kineto", 2, 4, [("kineto", "h200_task-kineto"), ("kineto-long", "h200_task-kineto-long")]),
        ("tp4", 1, 4, [("tp4", "h200_task-tp4")]),
        ("tp4", 2, 1, [("tp4", "h200_task-tp1")]),
    ],
)
def test_each_step_runs_its_modes_into_its_batches(
    tmp_path: Path, seen: list[host.BatchCall], step: str, jobs: int, tp: int, batches: list[tuple]
) -> None:
    call = _call(tmp_path, step, jobs, tp)
    assert call.run(tmp_path) == EXIT["pass"]  # the compare pass's 3 (arms not run yet) is not the step's
    assert [(c.matrix, c.mode, c.batch) for c in seen] == [("h200_task", m, b) for m, b in batches]
    assert all(c.runs == call.dirs.task_runs and c.tmp == call.dirs.tmp and c.jobs == jobs for c in seen)
    margin = host_task.STEPS[step].margin_s
    assert all(c.deadline_s <= 540 - margin for c in seen if c.mode) and seen[-1].deadline_s >= 0
    sets = dict(kv.split("=", 1) for kv in seen[0].overrides)
    assert sets.get("tp_size") == (str(tp) if step == "tp4" else None)
    capped = host_task.STEPS[step].shared_context if jobs > 1 else None
    if capped:
        assert f"--max-total-tokens={4 * capped}" in json.loads(sets["extra_args"])
    else:
        assert "extra_args" not in sets
    if any(c.mode is None for c in seen):
        assert "compare: waits for the arms not run yet" in (call.out / f"log-{step}.txt").read_text()


def test_a_failed_compare_gate_is_the_steps_exit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_batch(call: host.BatchCall, log: Path, refresh: Any) -> int:
        log.write_text("")
        return 0 if call.mode else EXIT["fail"]  # the arm's cells ran; a pair's gate failed

    monkeypatch.setattr(host, "batch", fake_batch)
    monkeypatch.setattr(host_task.TaskCall, "jit_pack", lambda self: None)
    assert _call(tmp_path, "fix").run(tmp_path) == EXIT["fail"]


def test_the_long_trace_comes_back_in_pieces_that_join(tmp_path: Path) -> None:
    whole = tmp_path / "profile.trace.json.gz"
    whole.write_bytes(bytes(range(256)) * 41)
    pieces = host_task.split_file(whole, tmp_path / "out.trace.json.gz", size=4096)
    assert [p.name for p in pieces] == [f"out.trace.json.gz.{i:02d}" for i in range(3)]
    assert b"".join(p.read_bytes() for p in pieces) == whole.read_bytes()
    assert all(p.stat().st_size <= 4096 for p in pieces)


def test_a_cell_line_reads_its_answers_and_acceptance(tmp_path: Path) -> None:
    cell = tmp_path / "sglang-bug-same-target-ctx4096-s5-graph-cuda"
    cell.mkdir()
    rows = [{"correct": True, "accept_length": 4.5}, {"correct": False, "accept_length": 3.0}]
    (cell / "outputs.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n")
    assert host_task.cell_line(cell) == f"{cell.name}: 2 rows, correct 0.50, accept 3.00-4.50"
    assert host_task.cell_line(tmp_path) is None
