"""Every notebook runs top to bottom under papermill on its default parameters (CPU, mini backend)."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from kit import notebooks, report
from kit.demo import run_demo


def test_notebook_sources_have_a_parameters_cell() -> None:
    import jupytext

    for name in notebooks.NAMES:
        nb = jupytext.read(notebooks.source(name))
        tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1, name
        assert nb.cells[0].cell_type == "markdown", f"{name} must open with its narrative"


def test_unknown_notebook_is_a_clear_error() -> None:
    from kit.errors import KitError

    with pytest.raises(KitError, match="known notebooks"):
        notebooks.source("99_nope")


@pytest.mark.nsys
def test_demo_runs_every_notebook_and_confirms_the_fix(tmp_path: Path, require_nsys: str) -> None:
    batch = run_demo(tmp_path)
    for name in notebooks.NAMES:
        executed = list(batch.rglob(f"executed-{name}.ipynb"))
        assert executed, name
        for path in executed:
            nb = nbformat.read(path, as_version=4)
            errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
            assert not errors, f"{path}: {errors[:1]}"
    verdicts = {
        json.loads(p.read_text())["arm"]: json.loads(p.read_text()) for p in batch.glob("*/verdict.json")
    }
    assert set(verdicts) == {"bug", "fix"}
    assert set(verdicts["bug"]["launches_per_round"]) == {verdicts["bug"]["expected_per_round"]} == {4}
    assert set(verdicts["fix"]["launches_per_round"]) == {1}
    assert all(v["passed"] and v["source"] == "nsys" for v in verdicts.values())
    html = (batch / "report.html").read_text()
    assert "CONFIRMED" in html and "NOT CONFIRMED" not in html
    assert report.outputs_identical(batch) == {"4096": True}
