"""One prompt as a prompt source hands it to a backend: the ids to send and the output it expects.

Here, below both sides that need it: the sglang backend's prompt sources (kit.backends.sglang.workload) and
the retrieval task's (kit.task.workload), which the backend loads by name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Prompt:
    """One prompt of a workload: the ids sent, and the output ids the workload expects (None: no answer
    is known, as for `records`, whose prompts only need to be long and deterministic)."""

    input_ids: list[int]
    expected_ids: list[int] | None = None
