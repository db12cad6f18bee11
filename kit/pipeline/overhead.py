"""Does the instrument perturb what it measures? An unprofiled cell beside its profiled twin.

A cell with `profile: false` runs the same server without nsys and without the probes; with `time_decode`
its prompt 0 is streamed all the same, so in both runs the client notes when each chunk (one per verify
round) arrives and how many verify rounds and tokens it carries. The time per decode round (draft, verify,
draft-extend, as the client sees them) over the same chunks of the same greedy decode, with and without
the instrument, is the overhead: over the profiled run's window (the rounds the analysis measures) and over
the whole decode. The draft step alone cannot be timed without the instrument that times it; a round holds
it. The result goes to `overhead-<profiled run id>/overhead.json`, one per pair.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kit import rundir
from kit.compare.runs import fresh_dir
from kit.errors import InputError

OVERHEAD = "overhead.json"


def chunks(run_dir: Path) -> list[list[Any]]:
    """Prompt 0's streamed chunks: [seconds since sent, completion_tokens, spec_verify_ct] each."""
    rows = rundir.read_outputs(rundir.RunDir(run_dir).outputs)
    first = next((r for r in rows if r.get("prompt_id") == 0), None)
    if first is None or not first.get("stream_chunks"):
        raise InputError(
            f"{run_dir}: prompt 0 was not streamed (no stream_chunks in outputs.jsonl): run it with "
            "time_decode true",
            path=run_dir,
        )
    return first["stream_chunks"]


def per_round_ms(timeline: list[list[Any]], start: int, end: int) -> dict[str, Any] | None:
    """Milliseconds per verify round (and per token) from chunk `start` to chunk `end` (1-based; chunk 1
    already follows the prefill, so any span from it on is decode only). None where the span is empty.
    Rounds are the server's verify count where its chunks carry one (`rounds_from: spec_verify_ct`), else
    the chunks themselves (sglang 0.5.14 streams one chunk per verify round and no count)."""
    end = min(end, len(timeline))
    if start < 1 or end <= start:
        return None
    (t0, tok0, v0), (t1, tok1, v1) = timeline[start - 1], timeline[end - 1]
    out: dict[str, Any] = {"chunks": [start, end], "seconds": round(t1 - t0, 6)}
    counted = isinstance(v0, int) and isinstance(v1, int) and v1 > v0
    rounds = v1 - v0 if counted else end - start
    out.update(
        rounds=rounds,
        rounds_from="spec_verify_ct" if counted else "chunks",
        ms_per_round=round(1000 * (t1 - t0) / rounds, 4),
    )
    if isinstance(tok0, int) and isinstance(tok1, int) and tok1 > tok0:
        out.update(tokens=tok1 - tok0, ms_per_token=round(1000 * (t1 - t0) / (tok1 - tok0), 4))
    return out


def window_chunks(run_dir: Path) -> tuple[int, int] | None:
    """The chunks the profiled run's window covered: from the chunk it opened at, `profile_steps` on."""
    prov = rundir.read_json(rundir.RunDir(run_dir).provenance)
    window = (prov.get("run") or {}).get("profile_window") or {}
    steps = rundir.RunDir(run_dir).read_params().get("profile_steps")
    at = window.get("at_chunk")
    if not window.get("opened") or not isinstance(at, int) or not isinstance(steps, int):
        return None
    return max(at, 1), max(at, 1) + steps


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None, key: str) -> float | None:
    if not a or not b or not a.get(key) or not b.get(key):
        return None
    return round(a[key] / b[key], 4)


def overhead(profiled: Path, unprofiled: Path) -> dict[str, Any]:
    """Both runs' decode-round times over the window's chunks and the whole decode, and their ratios
    (profiled / unprofiled: above 1, the instrument slows the decode)."""
    with_, without = chunks(profiled), chunks(unprofiled)
    spans: dict[str, tuple[int, int] | None] = {
        "window": window_chunks(profiled),
        "decode": (1, min(len(with_), len(without))),
    }
    out: dict[str, Any] = {  # run ids: both runs sit in the batch folder beside this result
        "profiled": profiled.name,
        "unprofiled": unprofiled.name,
        "timed": "prompt 0's decode rounds from the client (draft, verify, draft-extend, streaming)",
    }
    for name, span in spans.items():
        a = per_round_ms(with_, *span) if span else None
        b = per_round_ms(without, *span) if span else None
        out[name] = {
            "profiled": a,
            "unprofiled": b,
            "ratio_per_round": _ratio(a, b, "ms_per_round"),
            "ratio_per_token": _ratio(a, b, "ms_per_token"),
        }
    return out


def write_overhead(profiled: Path, unprofiled: Path, out: Path) -> dict[str, Any]:
    """overhead() into out/overhead.json (a fresh folder: an earlier one is set aside)."""
    result = overhead(profiled, unprofiled)
    rundir.write_json(fresh_dir(out) / OVERHEAD, result)
    return result
