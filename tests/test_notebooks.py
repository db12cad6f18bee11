"""Every notebook runs top to bottom under papermill (the demo), and the report renders in a real browser."""

from __future__ import annotations

import html as html_lib
import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import numpy as np
import pytest

from kit.paths import REPO
from kit.pipeline import notebooks
from kit.pipeline.demo import run_demo
from kit.pipeline.stages import run_group
from kit.report.rung import Batch
from kit.report.this_batch import batch_runs, outputs_identical, summary_table

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


def test_papermill_parses_every_parameters_cell() -> None:
    """papermill infers parameters line by line; a line it cannot parse (e.g. quotes in a comment) makes
    it warn "Passed unknown parameter" on every run. Its view of the shipped .ipynb (what it runs) must
    equal the cell's assignments."""
    import papermill

    for name in notebooks.NAMES:
        path = notebooks.ipynb(name)
        assert set(papermill.inspect_notebook(str(path))) == notebooks.parameters(name), name


def test_shipped_ipynb_is_its_py_without_outputs() -> None:
    """Each notebooks/NAME.ipynb (what papermill runs) holds exactly the cells of NAME.py (what reviewers
    diff), the `parameters` tag, the python3 kernel, and no outputs."""
    import nbformat

    for name in notebooks.NAMES:
        assert notebooks.stale(name) == [], f"{name}: run `python -m kit.pipeline.notebooks` and commit"
        nb = nbformat.read(notebooks.ipynb(name), as_version=4)
        nbformat.validate(nb)
        assert nb.metadata["kernelspec"]["name"] == "python3"
        assert [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])], name


def test_a_stale_pair_is_caught_and_sync_repairs_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in notebooks.NAMES:
        for suffix in (".py", ".ipynb"):
            shutil.copy(notebooks.NOTEBOOK_DIR / f"{name}{suffix}", tmp_path)
    monkeypatch.setattr(notebooks, "NOTEBOOK_DIR", tmp_path)
    py = tmp_path / "02_analyze.py"
    py.write_text(py.read_text().replace('method = "auto"', 'method = "nvtx"'))
    assert notebooks.stale("02_analyze") == ["cells differ from the .py"]
    ran = tmp_path / "03_compare.ipynb"
    nb = json.loads(ran.read_text())
    code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    code["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["x\n"]}]
    ran.write_text(json.dumps(nb))
    assert notebooks.stale("03_compare") == ["it carries outputs"]
    (tmp_path / "01_profile.ipynb").unlink()
    assert notebooks.stale("01_profile") == [f"{tmp_path / '01_profile.ipynb'} is missing"]
    assert sorted(p.name for p in notebooks.sync()) == [
        "01_profile.ipynb",
        "02_analyze.ipynb",
        "03_compare.ipynb",
    ]
    assert all(notebooks.stale(name) == [] for name in notebooks.NAMES)
    assert notebooks.defaults("02_analyze")["method"] == "nvtx"  # parameters come from the .ipynb
    assert notebooks.sync() == []  # unchanged notebooks are not rewritten


def test_readme_lists_each_notebooks_papermill_parameters() -> None:
    """The README's papermill table names exactly what each notebook's `parameters` cell assigns."""
    readme = (REPO / "README.md").read_text()
    for name in notebooks.NAMES:
        [row] = [line for line in readme.splitlines() if line.startswith(f"| `{name}` |")]
        listed = re.findall(r"`([a-z_]+)`", row.split("|")[2])
        assert listed == list(notebooks.defaults(name)), name
    assert "papermill notebooks/01_profile.ipynb" in readme


def test_git_tracks_the_shipped_notebooks_and_ignores_executed_ones() -> None:
    def ignored(path: str) -> bool:
        res = subprocess.run(["git", "-C", str(REPO), "check-ignore", "--no-index", "-q", path], check=False)
        assert res.returncode in (0, 1), res
        return res.returncode == 0

    for name in notebooks.NAMES:
        assert not ignored(f"notebooks/{name}.ipynb"), name
    for executed in (
        "out.ipynb",
        "notebooks/out.ipynb",
        "notebooks/executed-01_profile.ipynb",
        "runs/b/r/executed-01_profile.ipynb",
        "notebooks/.ipynb_checkpoints/01_profile-checkpoint.ipynb",
    ):
        assert ignored(executed), executed


def test_unknown_notebook_is_a_clear_error() -> None:
    from kit.errors import KitError

    with pytest.raises(KitError, match="known notebooks"):
        notebooks.source("99_nope")


def test_every_notebook_checks_papermills_names_first() -> None:
    """The first code cell after each parameters cell refuses what papermill injected and the notebook
    does not declare, before anything runs (papermill only warns, and the run went on with defaults)."""
    import jupytext

    for name in notebooks.NAMES:
        cells = jupytext.read(notebooks.source(name)).cells
        i = next(i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", []))
        after = next(c for c in cells[i + 1 :] if c.cell_type == "code")
        assert f'check_parameters("{name}", In)' in after.source, name


def _history(name: str, injected: str) -> list[str]:
    """IPython's `In` in the first code cell after the parameters cell, under papermill."""
    cell = notebooks.parameters_cell(json.loads(notebooks.ipynb(name).read_text()))
    return ["", cell, injected, f'check_parameters("{name}", In)']


def test_injected_names_are_read_from_papermills_cell_only() -> None:
    assert notebooks.injected(_history("01_profile", "# Parameters\narm = 'bug'\ncontxt_len = 8192\n")) == [
        "arm",
        "contxt_len",
    ]
    # no -p: the parameters cell ran just before; in JupyterLab, whatever cell the user ran
    assert notebooks.injected(["", "arm = 'fix'", "check"]) == []
    assert notebooks.injected(["", "# a comment\nx = 1", "check"]) == []
    assert notebooks.injected(["check"]) == []


@pytest.mark.parametrize("name", notebooks.NAMES)
def test_an_undeclared_papermill_parameter_is_refused_in_one_line(name: str) -> None:
    from kit.errors import UsageError

    declared = list(notebooks.defaults(name))
    good = "".join(f"{k} = None\n" for k in declared)
    notebooks.check_parameters(name, _history(name, f"# Parameters\n{good}PAPERMILL_INPUT_PATH = 'x'\n"))
    typo = declared[-1] + "s"  # e.g. runs_root -> runs_roots
    with pytest.raises(UsageError) as err:
        notebooks.check_parameters(name, _history(name, f"# Parameters\n{typo} = 1\n"))
    msg = str(err.value)
    assert "\n" not in msg and f"unknown key {typo!r}" in msg and f"did you mean {declared[-1]!r}" in msg
    assert msg.endswith("allowed: " + ", ".join(declared)) and err.value.param == typo


@pytest.mark.parametrize("name", notebooks.NAMES)
def test_papermill_stops_every_notebook_at_an_undeclared_parameter(name: str, tmp_path: Path) -> None:
    """Real papermill, each shipped notebook: a typo'd name fails in the check cell (the third executed),
    so nothing after it ran (no build, no run, no comparison)."""
    import papermill

    out = tmp_path / f"{name}.ipynb"
    with pytest.raises(papermill.PapermillExecutionError) as err:
        notebooks.execute(name, out, {"contxt_len": 8192}, cwd=tmp_path)
    assert err.value.ename == "UsageError" and "unknown key 'contxt_len'" in err.value.evalue
    assert err.value.exec_count == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{name}.ipynb", f"{name}.kernel.log"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory, require_nsys: str) -> Path:
    batch_dir, code = run_demo(tmp_path_factory.mktemp("demo"))
    assert code == 0
    return batch_dir


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
    assert outputs_identical(Batch(demo, run_group)) == {"mini-ctx4096-s5-eager-cpu": True}  # per group
    html = (demo / "report.html").read_text()
    assert "CONFIRMED (under Nsight Systems)" in html and "NOT CONFIRMED" not in html
    # the report's accept length is the engine's: total tokens / total verify rounds over the requests
    table = summary_table(Batch(demo, run_group))
    for run_dir, accept in zip(batch_runs(demo), table["accept length"], strict=True):
        assert accept == json.loads((run_dir / "engine.json").read_text())["accept_length_mean"], run_dir.name


# Injected into a copy of the page only (the report itself has no script): where each block ends, in px.
LAYOUT_PROBE = """<script>
const vw = window.innerWidth;
const wide = [...document.querySelectorAll("main *")]
  .filter(e => e.getBoundingClientRect().right > vw + 1 || e.scrollWidth > e.clientWidth + 1)
  .map(e => e.tagName + ": " + (e.textContent || "").slice(0, 60));
document.body.setAttribute("data-kit-layout",
  JSON.stringify({vw: vw, page: document.documentElement.scrollWidth, wide: wide}));
</script>"""
RUNG_TITLES = (
    "1 · Real sglang on a task whose answers depend on the indexer",
    "2 · The PR's grid on real sglang",
    "3 · Real sglang on one GPU",
    "4 · Tensor parallel: the TP 4 step, run so far only at TP 1 on one H200",
    "5 · The mini engine on one GPU",
    "6 · Without Nsight: PyTorch-profiler (Kineto) traces on one H200",
    "7 · This batch's own runs",
    "The PR's own figures: another machine and model",
)


class _PageText(HTMLParser):
    """The text a reader sees (no style or script), and the body's attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.body: dict[str, str | None] = {}
        self._skip = 0

    BLOCKS = frozenset("p div td th tr li dt dd h1 h2 h3 br pre table section".split())

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._skip += tag in ("style", "script", "title")
        if tag == "body":
            self.body = dict(attrs)
        if tag in self.BLOCKS:
            self.parts.append(" ")

    def handle_endtag(self, tag: str) -> None:
        self._skip -= tag in ("style", "script", "title")
        if tag in self.BLOCKS:
            self.parts.append(" ")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)

    @property
    def text(self) -> str:
        return re.sub(r"\s+", " ", "".join(self.parts))


def _chromium(chromium: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.nsys
def test_report_renders_in_headless_chromium(demo: Path, tmp_path: Path) -> None:
    """A real browser opens the self-contained report and a reviewer reads it top-down at 1400 px: what ran
    and each rung's headline first, the rungs strongest first, no code, prompts, NaN or Python reprs, no
    script or network, nothing wider than the window; table, plots and verdict are on the page."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("chromium not installed in CI: scripts/ensure-chromium.sh must install it")
        pytest.skip("chromium not installed (make browser)")
    html = demo / "report.html"
    text = html.read_text()
    assert "launches/round" in text and text.count("data:image/png;base64") >= 3  # plots inlined
    # self-contained: no script at all (so none from a CDN), every image inlined
    assert "<script" not in text and '<script src="http' not in text
    assert re.findall(r"<img[^>]*\ssrc=\"(?!data:image/png;base64,)", text) == []
    title = re.search(r"<title>(.*?)</title>", text, re.S)
    assert title and title.group(1) == f"PR #29654 evidence report: batch {demo.name}", title
    without_images = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", text)
    assert "NaN" not in without_images and "Out[" not in without_images and "In [" not in without_images

    dom_page = tmp_path / "probe.html"
    dom_page.write_text(text.replace("</body>", LAYOUT_PROBE + "</body>"))
    res = _chromium(chromium, tmp_path, "--window-size=1400,2400", "--dump-dom", dom_page.as_uri())
    page = _PageText()
    page.feed(res.stdout)
    assert page.body.get("data-kit-layout"), res.stderr[-2000:]
    layout = json.loads(html_lib.unescape(page.body["data-kit-layout"] or "{}"))
    assert layout["vw"] == 1400 and layout["page"] <= 1400 and layout["wide"] == [], layout
    seen = page.text
    for bad in ("NaN", "None", "Out[", "{'", "import ", "batch_dir ="):
        assert bad not in seen, bad
    at = [seen.find(t) for t in RUNG_TITLES]
    assert -1 not in at and at == sorted(at), dict(zip(RUNG_TITLES, at, strict=True))
    top = "this run: mini engine on CPU: CONFIRMED (under Nsight Systems): fix = 1 indexer launch per"
    assert 0 <= seen.find(top) < at[0], "the overview names what this batch ran before any rung's detail"
    assert seen.find("real sglang 0.5.14 on one NVIDIA H200 (committed results): CONFIRMED") < seen.find(top)
    assert "Nsight Systems 2022.4" in seen[: at[0]] and "Nsight Systems 2025.3.1" in seen[: at[0]]
    assert seen.count("Source: ") >= text.count("<img"), "every figure names its source"
    # the PR's B300 figures are never in this batch's (CPU) section
    assert "B300" not in seen[at[2] : at[3]]

    shot = tmp_path / "report.png"
    res = _chromium(chromium, tmp_path, "--window-size=1400,2400", f"--screenshot={shot}", html.as_uri())
    assert shot.is_file(), res.stderr[-2000:]
    import matplotlib.image as mpimg

    pixels = mpimg.imread(shot)[..., :3]
    # A rendered page, not a blank one: many distinct colours (plots) and plenty of dark text pixels.
    assert len(np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 200
    assert (pixels.mean(axis=2) < 0.3).mean() > 0.005


@pytest.mark.nsys
def test_papermill_runs_a_shipped_notebook_as_it_is(tmp_path: Path, require_nsys: str) -> None:
    """The README's command: papermill on notebooks/01_profile.ipynb, no conversion, parameters by name."""
    out = tmp_path / "out.ipynb"
    cmd = [
        sys.executable,
        "-m",
        "papermill",
        str(notebooks.ipynb("01_profile")),
        str(out),
        "-p",
        "arm",
        "bug",
        "-p",
        "max_new_tokens",
        "8",
        "-p",
        "num_requests",
        "1",
        "--cwd",
        str(tmp_path),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    [run] = (tmp_path / "runs" / "interactive").iterdir()
    assert json.loads((run / "params.json").read_text())["arm"] == "bug"
    assert json.loads((run / "provenance.json").read_text())["measured_under_nsight"] is True


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
