"""Every notebook runs top to bottom under papermill (the demo), and the report renders in a real browser."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import nbformat
import numpy as np
import pytest

from kit.pipeline import notebooks, report
from kit.pipeline.demo import run_demo

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def test_notebook_sources_have_a_parameters_cell() -> None:
    import jupytext

    for name in notebooks.NAMES:
        nb = jupytext.read(notebooks.source(name))
        tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1, name
        assert nb.cells[0].cell_type == "markdown", f"{name} must open with its narrative"


def test_papermill_parses_every_parameters_cell(tmp_path: Path) -> None:
    """papermill infers parameters line by line; a line it cannot parse (e.g. quotes in a comment) makes
    it warn "Passed unknown parameter" on every run. Its view must equal the cell's assignments."""
    import jupytext
    import papermill


    for name in notebooks.NAMES:
        path = tmp_path / f"{name}.ipynb"
        jupytext.write(jupytext.read(notebooks.source(name)), path)
        assert set(papermill.inspect_notebook(str(path))) == notebooks.parameters(name), name


def test_unknown_notebook_is_a_clear_error() -> None:
    from kit.errors import KitError

    with pytest.raises(KitError, match="known notebooks"):
        notebooks.source("99_nope")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory, require_nsys: str) -> Path:
    return run_demo(tmp_path_factory.mktemp("demo"))


@pytest.mark.nsys
def test_demo_executes_every_notebook_without_errors(demo: Path) -> None:
    for name in notebooks.NAMES:
        executed = list(demo.rglob(f"executed-{name}.ipynb"))
        assert executed, name
        for path in executed:
            nb = nbformat.read(path, as_version=4)
            errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
            assert not errors, f"{path}: {errors[:1]}"


@pytest.mark.nsys
def test_demo_confirms_the_fix_under_nsight(demo: Path) -> None:
    verdicts = [json.loads(p.read_text()) for p in demo.glob("*/verdict.json")]
    by_arm = {v["arm"]: v for v in verdicts}
    assert set(by_arm) == {"bug", "fix"}
    assert set(by_arm["bug"]["launches_per_round"]) == {4} and by_arm["bug"]["expected_per_round"] == 4
    assert set(by_arm["fix"]["launches_per_round"]) == {1}
    assert all(v["passed"] and v["source"] == "nsys" for v in verdicts)
    assert report.outputs_identical(demo) == {"4096": True}
    html = (demo / "report.html").read_text()
    assert "CONFIRMED (under Nsight Systems)" in html and "NOT CONFIRMED" not in html


@pytest.mark.nsys
def test_report_renders_in_headless_chromium(demo: Path, tmp_path: Path) -> None:
    """A real browser opens the self-contained report: table, plots and verdict are on the page."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("chromium not installed in CI: scripts/ensure-chromium.sh must install it")
        pytest.skip("chromium not installed (make browser)")
    html = demo / "report.html"
    text = html.read_text()
    assert "launches/round" in text and text.count("data:image/png;base64") >= 3  # plots inlined
    shot = tmp_path / "report.png"
    res = subprocess.run(
        [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1400,2400",
            f"--screenshot={shot}",
            html.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shot.is_file(), res.stderr[-2000:]
    import matplotlib.image as mpimg

    pixels = mpimg.imread(shot)[..., :3]
    # A rendered page, not a blank one: many distinct colours (plots) and plenty of dark text pixels.
    assert len(np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 200
    assert (pixels.mean(axis=2) < 0.3).mean() > 0.005


@pytest.mark.nsys
def test_notebooks_run_top_to_bottom_on_their_defaults(tmp_path: Path, require_nsys: str) -> None:
    """As in JupyterLab from the repo root: 00, 01 (fix; then arm='bug' for something to compare),
    02 twice (each picks the newest unanalysed run), 03 and 04 (newest analysed runs), all defaults."""
    steps = [
        ("00_build_sglang", {}),
        ("01_profile", {}),
        ("01_profile", {"arm": "bug"}),
        ("02_analyze", {}),
        ("02_analyze", {}),
        ("03_compare", {}),
        ("04_report", {}),
    ]
    for i, (name, params) in enumerate(steps):
        out = notebooks.execute(name, tmp_path / "nb" / f"{i}-{name}.ipynb", params, cwd=tmp_path)
        nb = nbformat.read(out, as_version=4)
        errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, f"{name}: {errors[:1]}"
    verdicts = {
        json.loads(p.read_text())["arm"]: json.loads(p.read_text())
        for p in (tmp_path / "runs").glob("interactive/*/verdict.json")
    }
    assert set(verdicts) == {"bug", "fix"} and all(v["passed"] for v in verdicts.values())
    assert (tmp_path / "build" / "sglang-0.5.14+pr29654" / "manifest.json").is_file()
