"""The PR's own figures (data/pr29654_published.yaml): measured by its author on another machine and model,
never by this kit. Read here for the section that closes the page (not a rung: no rank, no verdict) and for
the points the GPU rungs' figures mark as the PR's."""

from __future__ import annotations

from typing import Any

import pandas as pd
import yaml

from kit.paths import PUBLISHED
from kit.report.about import shown
from kit.report.rung import Rung, Table


def published() -> dict[str, Any]:
    """The PR's own figures (data/pr29654_published.yaml): another machine and model, never measured here."""
    return yaml.safe_load(PUBLISHED.read_text())


def published_figures() -> Rung:
    """The PR's own figures: not a rung (nothing here was measured by the kit), shown last and apart."""
    pub = published()
    setup = pub["setup"]
    spec = setup["speculative"]
    rows = [
        {
            "input tokens": f"~{p['input_tokens'] // 1000}k" if p.get("approx") else p["input_tokens"],
            "draft step ms, bug": p.get("bug"),
            "draft step ms, fix": p.get("fix"),
            "bug / fix": p.get("speedup"),
            "note": p.get("note", ""),
        }
        for p in pub["per_draft_step_ms"]
    ]
    acc = pub["accept_length"]
    return Rung(
        key="published",
        title="The PR's own figures: another machine and model",
        scope="the PR's figures, another machine and model (not measured by this kit)",
        status="",
        claim=f"{setup['model']} on {setup['hardware']}; accept length {acc['bug']} -> {acc['fix']}",
        about={
            "engine": "sglang with PR #29654, as its author ran it",
            "device": setup["hardware"],
            "model": setup["model"],
            "speculative": f"EAGLE {spec['num_steps']}/{spec['eagle_topk']}/{spec['num_draft_tokens']}",
            "files": f"{shown(PUBLISHED)} ({pub['source']})",
        },
        note=(
            "Measured by the PR's author on another machine and model, so listed here and never drawn beside "
            "this kit's CPU times; the H200 ratio plot above marks the one published ratio as such."
        ),
        tables=[Table("Per draft step, as published", pd.DataFrame(rows))],
    )
