"""The real-sglang README quotes figures that scripts/h200_sglang_figures.py prints from the files."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from kit.paths import REPO

RESULTS = REPO / "data" / "results" / "h200-sglang"


def _figures() -> str:
    res = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "h200_sglang_figures.py")], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_readme_quotes_what_the_files_hold() -> None:
    out = _figures()
    readme = (RESULTS / "README.md").read_text()
    margins = [float(m) for m in re.findall(r"^  \S+\s+(\d\.\d{3})  \(prompt", out, re.M)]
    assert len(margins) == 6
    assert f"smallest top-2 margin in any current run is {min(margins):.3f} nats" in " ".join(readme.split())
    lo, hi = re.search(r": (\d+)x to (\d+)x$", out, re.M).groups()
    assert f"{lo}-{hi}x less" in readme
    assert f"{lo}-{hi}x less" in (REPO / "README.md").read_text()


def test_fixture_readme_says_which_gpu() -> None:
    out = _figures()
    uuids = dict(re.findall(r"^  (\S+ctx\d+)\s+([0-9a-f-]{36})$", out, re.M))
    assert len(uuids) == 6
    readme = " ".join((REPO / "tests" / "fixtures" / "h200_sglang" / "README.md").read_text().split())
    if uuids["steps3-bug-ctx16384"] != uuids["graph-bug-ctx4096"]:
        assert "Same H200" not in readme
        assert uuids["steps3-bug-ctx16384"][:8] in readme and uuids["graph-bug-ctx4096"][:8] in readme


def test_task_readme_block_is_what_the_script_prints() -> None:
    """data/results/h200-sglang-task/README.md's results block is the script's output, line for line."""
    res = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "h200_task_figures.py")], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    readme = (REPO / "data" / "results" / "h200-sglang-task" / "README.md").read_text()
    block = readme.split("## Results", 1)[1].split("```", 2)[1].strip("\n")
    assert block == "\n".join(res.stdout.splitlines()[1:])
    assert "task_checkpoint True, reference_match True" in res.stdout


def test_task_results_hold_the_claims() -> None:
    """What the README states in words, checked on the files: every answer right, tokens equal, the gate
    passes each cell, same-target acceptance unchanged, moving-target lower, the wrong top-k at 0."""
    from kit.report import sglang_task as te

    cells = te.cells()
    assert len(cells) == 18 and all(c["accuracy"] == 1.0 and c["n"] == 8 for c in cells)
    assert all(c["tokens_equal_bug"] for c in cells if c["arm"] != "bug")
    assert all(c["launches"] == ([1] if c["arm"] == "fix" else [4]) for c in cells)
    for g in te.gates():
        assert g["gate_failures"] == []
        if g["workload"] == "same-target":
            assert g["mean"] == 0.0 and g["status"] == "within_noise"
        else:
            assert g["interval"][1] < 0
    assert [c["accuracy"] for c in te.controls()] == [0.0, 0.0]


def test_the_task_reader_reads_kit_batchs_layout_as_the_earlier_one(tmp_path) -> None:
    """A converted step's re-run, its folders named as kit batch names them (the matrix's run ids and
    compare groups, the control in its own batch), reads to the same rows as the committed bash-driver
    layout it mirrors."""
    import shutil

    from kit.pipeline.matrix import load
    from kit.report import sglang_task as te

    old, new = te.TASK_RESULTS, tmp_path
    shutil.copytree(old / "install", new / "install")
    for mode, batch in (
        ("bug", te.BATCH),
        ("fix", te.BATCH),
        ("off", te.BATCH),
        ("control", f"{te.BATCH}-control"),
    ):
        for cell in load("h200_task", mode).cells:
            p = cell.params
            arm = "control" if mode == "control" else p["arm"]
            here = new / "runs" / batch / cell.run_id
            shutil.copytree(te.cell_dir(old, arm, p["context_len"], p["workload"]), here)
            if mode == "bug":
                cmp = new / "runs" / batch / f"compare-{cell.group}"
                cmp.mkdir()
                doc = json.loads(te.comparison_file(p["context_len"], p["workload"], old).read_text())
                doc["a"]["run"] = f"../{cell.run_id}"
                (cmp / "comparison.json").write_text(json.dumps(doc))
    assert te.converted(new) and not te.converted(old)
    assert te.cells(new) == te.cells(old)
    assert te.gates(new) == te.gates(old) and te.controls(new) == te.controls(old)
    assert len(te.controls(new)) == 2


def test_a_task_set_without_all_its_arms_lists_what_ran_and_exits_2() -> None:
    """The converted steps' partial re-runs (bug only on an H100; the arms step on an H200 and on an H100,
    cut by their deadlines): the figures script prints no table and no host comparison, but each server and
    its cells as they ended (the numbers their READMEs quote) and the comparisons made here from those runs,
    says in one line what is missing, and exits 2 (it cannot judge the set), not 0; no traceback."""
    sets = REPO / "data" / "results" / "h200-sglang-task"
    out = {}
    for name, missing in (
        ("converted-2026-12-05-h100", "no fix cell at 4096 same-target"),
        ("converted-2026-12-05-h200-arms", "no bug cell at 4096 same-target"),
        ("converted-2026-12-05-h100-arms", "no bug cell at 500000 moving-target"),
    ):
        res = subprocess.run(
            [sys.executable, str(REPO / "scripts" / "h200_task_figures.py"), str(sets / name)],
            capture_output=True,
            text=True,
        )
        assert res.returncode == 2, res.stdout + res.stderr
        assert len(res.stderr.splitlines()) == 1 and missing in res.stderr, res.stderr
        here = [line for line in res.stdout.splitlines() if line.startswith("compared here")]
        assert not any("gate" in line for line in res.stdout.splitlines() if line not in here), res.stdout
        assert "ctx     workload" not in res.stdout, res.stdout
        out[name] = res.stdout.splitlines()
    h100, arms = out["converted-2026-12-05-h100"], out["converted-2026-12-05-h200-arms"]
    assert sum(" done in " in line and "8 of 8 right" in line and "4 launches" in line for line in h100) == 5
    assert any("H100 80GB" in line and "5 of 6 cells done" in line for line in h100)
    servers = {line.split(" (")[0]: line for line in arms if not line.startswith(" ")}
    assert "0 of 6 cells done" in servers["sglang-bug-s5-graph-cuda-server"]
    assert "5 of 6 cells done" in servers["sglang-fix-s5-graph-cuda-server"]
    assert "6 of 6 cells done" in servers["sglang-off-s5-graph-cuda-server"]
    assert sum("not started (deadline)" in line for line in arms) == 7
    assert sum("1 launches per round over 10 rounds" in line for line in arms) == 5
    assert sum("4 launches per round over 10 rounds" in line for line in arms) == 6
    h100_arms = out["converted-2026-12-05-h100-arms"]
    assert sum("measured, not analysed (no verdict.json)" in line for line in h100_arms) == 2
    assert sum("not started (deadline)" in line for line in h100_arms) == 2
    assert sum(" done in " in line and "8 of 8 right" in line for line in h100_arms) == 14
    gated = [line for line in h100_arms if line.startswith("compared here")]
    assert len(gated) == 4 and all("gate PASS" in line for line in gated), gated


def test_a_script_run_by_a_python_without_the_kits_packages_says_so_in_one_line() -> None:
    """`python3 scripts/...` with the system Python (no pandas): one line naming the missing module, the
    Python and the fix, exit 2; not a traceback (scripts/_checkout.py's hook, every script imports it)."""
    script = REPO / "scripts" / "h200_task_figures.py"
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            "import runpy, sys; sys.modules['pandas'] = None; "
            f"sys.argv = [{str(script)!r}]; sys.path.insert(0, {str(script.parent)!r}); "
            f"runpy.run_path({str(script)!r}, run_name='__main__')",
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2 and res.stdout == "", res.stdout + res.stderr
    assert len(res.stderr.splitlines()) == 1, res.stderr
    assert "pandas" in res.stderr and "make setup" in res.stderr and "Traceback" not in res.stderr


def test_a_ctrl_c_in_a_script_is_one_line_and_the_interrupted_code() -> None:
    """A Ctrl-C while a script works (here raised where the figures begin): one line, exit 130 (the kit's
    "interrupted"), not a traceback and never 0 (scripts/_checkout.py's hook)."""
    script = REPO / "scripts" / "h200_task_figures.py"
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import runpy, sys; sys.argv = [{str(script)!r}]; sys.path.insert(0, {str(script.parent)!r}); "
            "import kit.report.sglang_task as te\n"
            "def stop(*a, **k): raise KeyboardInterrupt\n"
            "te.checkpoint = stop\n"
            f"runpy.run_path({str(script)!r}, run_name='__main__')",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert res.returncode == 130, res.stdout + res.stderr
    assert res.stderr == "h200_task_figures.py: interrupted\n", res.stderr
