"""The mutation suite in kit batch (kit.pipeline.mutant_cells) and its H200 call, `kit host mutants`
(scripts/h200_mutants.sh), on the fake GPU stack: wrong fixes killed by the gate, by the kit's refusal and
by a start-up death, a survivor failing the batch, and the layout scripts/mutants.py reads."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fake_gpu_helpers import driver_checkout, fake_build, fake_nsys, host_env
from task_helpers import task_checkpoint

from kit.errors import EXIT, InputError, UsageError
from kit.paths import REPO
from kit.pipeline import host_mutants as hm
from kit.pipeline import matrix, mutant_section
from kit.sglang_src.mutants import MUTANTS, h200_plan

CRASH_LINE = "AssertionError: topk_indices rows (2) > num_tokens (1)"


def test_the_matrix_runs_the_registrys_plan_beside_each_fix_cell() -> None:
    """One table drives everything: the mutants and their modes are the registry's H200 plan; each runs as
    the fix arm in its own build, named after it in its run id; --set picks some, none, or narrows arms."""
    works = {"workload": ["same-target", "moving-target"]}
    for mode in ("graph", "eager"):
        m = matrix.load("h200_mutants", mode, works)
        plan = [n for n, k in h200_plan() if k == mode or (k == "preflight" and mode == "graph")]
        cells = [c for c in m.cells if c.mutant]
        assert list(dict.fromkeys(c.mutant for c in cells)) == plan
        assert len(cells) == 2 * len(plan) and len(m.cells) == 6 + len(cells)
        for c in cells:
            assert c.params["arm"] == "fix" and c.run_id.startswith(f"sglang-{c.mutant}-")
            assert c.build.pythonpath[0] == f"/tmp/kit-sgl/sglang-{mutant_section.version(c.mutant)}"
            assert c.group in {x.group for x in m.cells if x.params["arm"] == "bug"}
    assert mutant_section.version("no-clear") == "0.5.14+no.clear"
    none = matrix.load("h200_mutants", "graph", {**works, "mutants": []})
    assert [c.params["arm"] for c in none.cells] == ["bug", "bug", "fix", "fix", "off", "off"]
    some = matrix.load("h200_mutants", "eager", {**works, "arm": ["bug", "off"], "mutants": "verify-leak"})
    assert [c.name for c in some.cells] == ["bug", "bug", "off", "off", "verify-leak", "verify-leak"]
    with pytest.raises(UsageError, match="unknown mutant 'nope'"):
        matrix.load("h200_mutants", "graph", {"mutants": ["nope"]})
    with pytest.raises(UsageError, match="no mutants: section"):
        matrix.load("h200_pr29654", None, {"mutants": []})


def test_the_matrix_serves_as_the_committed_suite_did() -> None:
    """The committed suite's server flags (the task runs' with the KV pool capped for a shared GPU: it ran 4
    to 6 servers at once) and its workload settings, as its runs' params.json recorded them."""
    m = matrix.load("h200_mutants", "graph")
    run = (
        REPO / "data" / "results" / "mutants" / "h200" / "runs" / "mutants" / "fix-graph-ctx65536-same-target"
    )
    ran = json.loads((run / "params.json").read_text())
    assert m.params["extra_args"] == ran["extra_args"]
    for key in ("num_requests", "concurrency", "max_new_tokens", "num_draft_tokens", "profile_skip"):
        assert m.params[key] == ran[key], key
    assert ran["context_len"] == 65536 and ran["num_steps"] == 5
    from kit.sglang_src.releases import BASELINE, PATCHED  # the builds the registry names

    folders = {arm: b.pythonpath[0] for arm, b in m.builds.items()}
    assert folders == {
        "bug": f"/tmp/kit-sgl/sglang-{BASELINE}",
        "fix": f"/tmp/kit-sgl/sglang-{PATCHED}",
        "off": f"/tmp/kit-sgl/sglang-{PATCHED}",
    }


def _host(tmp: Path) -> hm.MutantDirs:
    """The fake host: bug and fix builds, the wrong fixes (one the gate kills, one it passes, one the kit
    refuses, one that dies starting), the task checkpoint."""
    sgl = tmp / "kit-sgl"
    fake_build(sgl / "sglang-0.5.14", "bug")
    fake_build(sgl / "sglang-0.5.14+pr29654", "fix")
    fake_build(sgl / "sglang-0.5.14+no.clear", "fix", serves="bug")  # verify: fix; launches: the bug's
    fake_build(sgl / "sglang-0.5.14+verify.leak", "fix")  # the fix's every way: the gate passes it
    fake_build(sgl / "sglang-0.5.14+spec.info.replaced", "bug")  # kit verify: not fix, refused
    fake_build(sgl / "sglang-0.5.14+worker.kept", "fix", crash=CRASH_LINE)
    for d in ("deps", "fallback"):
        (sgl / d).mkdir()
    shutil.copytree(task_checkpoint()[0], tmp / "kit-task")
    return hm.MutantDirs(tmp)


def test_a_mutant_suite_judges_each_wrong_fix_and_a_survivor_fails_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """suite graph: bug, fix, off and three wrong fixes, each killed (the gate, the kit's refusal, a
    start-up death): exit 0. mutants graph with a wrong fix the gate passes: exit 1, nothing run again.
    compare: the layout scripts/mutants.py reads, and its judgement of every row."""
    from kit.compare import mutation

    dirs = _host(tmp_path / "host")
    monkeypatch.setenv("KIT_NSYS", str(fake_nsys(tmp_path / "nsys")))
    monkeypatch.setattr(hm.host, "jit_pack", lambda out, log: None)
    out = tmp_path / "out"

    def call(step: str, *args: str) -> int:
        return hm.mutants(out, step, args, 900, dirs, jobs=2, min_run_s=0, workloads=["same-target"])

    killed = ("no-clear", "spec-info-replaced", "worker-kept")
    assert call("suite", "graph", *killed) == 0, (out / "log-suite.txt").read_text()
    log = (out / "log-suite.txt").read_text()
    assert "mutant no-clear (sglang-same-target-ctx65536-s5-graph-cuda): killed by the gate: launches " in log
    assert "mutant spec-info-replaced (" in log and "killed: preflight: arm 'fix' cannot run" in log
    assert f"killed: crash: {CRASH_LINE}" in log and "mutants: 3 killed, 0 survived, of 3" in log
    batch = dirs.runs / hm.BATCH
    assert (batch / "sglang-no-clear-same-target-ctx65536-s5-graph-cuda" / "verdict.json").is_file()
    judged = json.loads(
        (batch / "compare-sglang-worker-kept-same-target-ctx65536-s5-graph-cuda" / "judged.json").read_text()
    )
    assert judged["verdict"] == "killed" and judged["by"] == "crash" and judged["why"] == CRASH_LINE

    assert call("mutants", "graph", "verify-leak") == EXIT["fail"]
    log = (out / "log-mutants.txt").read_text()
    assert "mutant verify-leak (" in log and "SURVIVED: the gate passes this wrong fix" in log
    assert "kit batch h200_mutants --mode graph" in log and "mutants: 0 killed, 1 survived, of 1" in log
    assert log.count(": ok (") == 1  # the one new cell; bug and off are complete
    assert "set aside" not in log  # a killed mutant's failed run is its result, not run again

    call("compare")  # its code is the table's: the fake stack is not the registry's H200 prediction
    res = dirs.results
    for name in ("fix", "no-clear", "verify-leak"):
        assert (res / "comparisons" / "graph" / "same-target" / name / "comparison.json").is_file(), name
    assert (res / "refused" / "spec-info-replaced.txt").read_text().startswith("arm 'fix' cannot run")
    assert (res / "crashed" / "worker-kept-graph.txt").read_text().strip() == CRASH_LINE
    suite = mutation.judge_folder(res)
    rows = {r["candidate"]: r for r in suite["rows"]}
    assert rows["fix"]["verdict"] == "passes" and rows["verify-leak"]["verdict"] == "survived"
    assert rows["no-clear"]["verdict"] == "killed" and "launches" in rows["no-clear"]["killed_by"]
    assert rows["spec-info-replaced"]["killed_by"] == ["preflight"] and rows["worker-kept"]["killed_by"] == [
        "crash"
    ]
    table = (out / "log-compare.txt").read_text()
    assert "no-clear" in table and "survived" in table
    with_runs = {p.name for p in out.iterdir()}
    assert {"results.tgz", "runs.tgz", "host-compare.txt"} <= with_runs


def test_the_build_step_builds_installs_and_verifies_each_mutant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """build: kit build --patch from the staged 0.5.14 wheel, pip install --target into the mutant's own
    folder, kit verify (results/verify/NAME.json); an installed one is only verified; a failed build is
    exit 2 and the next one still built; no staged wheel is one line, exit 2."""
    dirs, out = hm.MutantDirs(tmp_path / "host"), tmp_path / "out"
    with pytest.raises(UsageError, match="no staged sglang 0.5.14 wheel"):
        hm.mutants(out, "build", ["no-clear"], 60, dirs)
    (dirs.target / "wheels").mkdir(parents=True)
    (dirs.target / "wheels" / "sglang-0.5.14-cp312-cp312-linux_x86_64.whl").write_text("")
    fake_build(dirs.target / "sglang-0.5.14+no.clear", "fix")
    (dirs.target / "sglang-0.5.14+no.clear" / "sglang-0.5.14+no.clear.dist-info").mkdir()
    builds: list[str] = []

    def build_wheel(patch: Path, to: Path, cache: Path) -> dict:
        builds.append(patch.name)
        if patch.name == "worker-kept.patch":
            raise InputError("no such wheel")
        to.mkdir(parents=True)
        (to / "x.whl").write_text("")
        (to / "manifest.json").write_text("{}")
        return {"cache": str(cache)}

    def install_cmd(wheel: Path, target: Path, pip_args: object = ()) -> list[str]:
        code = "import sys; sys.path.insert(0, 'tests'); import fake_gpu_helpers as f; f.fake_build("
        code += f"__import__('pathlib').Path({str(target)!r}), 'bug')"
        return [sys.executable, "-c", code]

    monkeypatch.setattr(hm, "build_wheel", build_wheel)
    monkeypatch.setattr(hm, "install_cmd", install_cmd)
    rc = hm.mutants(out, "build", ["no-clear", "worker-kept", "pool-slot-mixup"], 60, dirs)
    assert rc == EXIT["error"] and builds == ["worker-kept.patch", "pool-slot-mixup.patch"]
    verify = dirs.results / "verify"
    assert json.loads((verify / "no-clear.json").read_text())["state"] == "fix"  # installed: verified only
    assert json.loads((verify / "pool-slot-mixup.json").read_text())["state"] == "bug"
    built = json.loads((verify / "pool-slot-mixup.build.json").read_text())
    assert built == {"cache": str(dirs.target / "wheels")}
    assert (verify / "worker-kept.build.json").read_text() == "error: no such wheel\n"
    assert not (verify / "worker-kept.json").exists()
    log = (out / "log-build.txt").read_text()
    assert "build worker-kept failed" in log and "no-clear 0.5.14 fix" in log
    assert set(MUTANTS) >= {"no-clear", "worker-kept", "pool-slot-mixup"}


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["nope"], "unknown step 'nope'"),
        (["suite", "fast"], "suite MODE: one of graph, eager, got 'fast'"),
        (["mutants", "graph", "nosuch"], "unknown mutant 'nosuch'"),
        (["base", "graph", "--deadline", "-5"], "the deadline must be >= 0 seconds, got -5"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], line: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "kit.cli", "host", "mutants", str(tmp_path / "out"), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and line in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("section", "error"),
    [
        ({"pythonpath": ["/x/deps"]}, "mutants.pythonpath: no folder names {version}"),
        ({"pythonpath": ["/x/sglang-{version}"], "arm": "nope"}, "mutants.arm: 'nope' is not an arm"),
        ({"pythonpath": ["/x/sglang-{version}"], "names": ["nope"]}, "mutants.names: unknown mutant 'nope'"),
        ({"pythonpath": ["/x/sglang-{version}"], "colour": 1}, "colour"),
    ],
)
def test_a_wrong_mutants_section_is_one_line(section: dict, error: str) -> None:
    doc = {"batch": "t", "axes": {"backend": ["sglang"], "arm": ["bug", "fix", "off"], "context_len": [4096]}}
    with pytest.raises(UsageError, match=re.escape(error)):
        matrix.parse({**doc, "mutants": section})
    some = matrix.parse({**doc, "mutants": {"pythonpath": ["/x/sglang-{version}"], "names": ["no-clear"]}})
    assert [c.run_id for c in some.cells if c.mutant] == ["sglang-no-clear-ctx4096-s5-graph-cuda"]


def test_the_batch_exit_code_reads_kills_as_expected_and_a_survivor_as_the_failed_check() -> None:
    """Killed mutants (their failed runs included) leave exit 0; a survivor is 1; a mutant run that failed
    for another reason is 2 (an error, not a kill); a mutant left unjudged (its bug or off not run) is 3."""
    from kit.pipeline.batch import BatchResult
    from kit.pipeline.cell import CellResult
    from kit.pipeline.stages import StageResult

    fail = {"status": "fail"}
    cells = [
        CellResult("bug", "done", "d", verdict={"status": "pass"}),
        CellResult("m1", "done", "d", verdict=fail),  # a wrong fix's verdict: no check of its own
        CellResult("m2", "failed", "d", "profile", "BuildStateError: refused"),
    ]
    killed = [
        StageResult("mutant m1", "done", "p", "killed by the gate", ["x"], "killed", "m1"),
        StageResult("mutant m2", "done", "p", "killed: preflight", None, "killed", "m2"),
    ]
    assert BatchResult(Path("b"), cells, mutants=killed).exit_code == EXIT["pass"]
    survivor = StageResult("mutant m3", "done", "p", "SURVIVED", [], "survived", "m3")
    assert BatchResult(Path("b"), cells, mutants=[*killed, survivor]).exit_code == EXIT["fail"]
    broken = StageResult("mutant m2", "failed", "d", "its run failed, not as a kill", cell="m2")
    assert BatchResult(Path("b"), cells, mutants=[killed[0], broken]).exit_code == EXIT["error"]
    unjudged = StageResult("mutant m4", "skipped", "p", "the bug or off run is not complete", cell="m4")
    assert BatchResult(Path("b"), cells, mutants=[*killed, unjudged]).exit_code == EXIT["inconclusive"]


def test_the_driver_sets_the_host_up_and_hands_the_call_to_the_kit(tmp_path: Path) -> None:
    """scripts/h200_mutants.sh end to end here: a step it does not know, and a build with no staged wheel,
    are one line and exit 2; compare with nothing judged is exit 2 (no comparison of the fix), its log and
    the host's facts come back."""
    hosttmp, out = tmp_path / "host", tmp_path / "out"
    hosttmp.mkdir()
    env, view = host_env(tmp_path, JOBS="2"), driver_checkout(tmp_path)

    def driver(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = ["bash", str(view / "scripts" / "h200_mutants.sh"), str(out), *args]
        return subprocess.run(cmd, cwd=view, env=env, capture_output=True, text=True, timeout=300)

    bad = driver("nope")
    assert bad.returncode == 2 and "unknown step 'nope'" in bad.stderr and "Traceback" not in bad.stderr
    build = driver("build", "no-clear")
    assert build.returncode == 2 and "no staged sglang 0.5.14 wheel in" in build.stderr, build.stderr
    compare = driver("compare")
    assert compare.returncode == 2, compare.stdout + compare.stderr
    assert "holds no comparison of the fix" in (out / "log-compare.txt").read_text()
    assert "jobs: 2" in (out / "host-compare.txt").read_text() and (out / "results.tgz").is_file()
