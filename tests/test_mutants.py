"""The mutation suite without running it: the registry, its patches and the mini's mistakes agree; the
share model the gate learned predicts every committed real-sglang request and keeps those gates passing;
the committed CPU results re-judge to what suite.json says; `kit build --patch` builds a mutant and names
the hunk of one that does not apply."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from wheels_fixtures import release_wheel

from kit.backends.mini.mistakes import FIX, MISTAKES, Mistakes
from kit.compare import mutation
from kit.compare.gate import gate_checks
from kit.compare.mutation import CPU_WORKLOADS as WORKLOADS  # what the committed results ran
from kit.compare.runs import comparison
from kit.compare.share_model import PER_STEP, SHARED, verify_rounds
from kit.errors import InputError, PatchError
from kit.paths import REPO, RESULTS
from kit.sglang_src.build import build_patched_wheel, local_label
from kit.sglang_src.mutant_edits import FILES as EDITED_FILES
from kit.sglang_src.mutants import KINDS, MUTANT_PATCHES, MUTANTS, h200_plan
from kit.sglang_src.patch import apply_patch
from kit.sglang_src.releases import BASELINE
from kit.sglang_src.verify import detect_state
from kit.task.spec import TaskSpec

TASK = RESULTS / "h200-sglang-task"
CPU = RESULTS / "mutants" / "cpu"


# ---------------------------------------------------------------------------------------------------
# registry, patches, mini


def test_one_row_per_mutant_keys_its_patch_and_its_mini_mistake() -> None:
    """The registry's row is the mutant's one home: the patch's mistake line and edits, the mini's mistake."""
    assert len(MUTANTS) >= 8
    assert sorted(p.stem for p in MUTANT_PATCHES.glob("*.patch")) == sorted(MUTANTS) == sorted(MISTAKES)
    for name, m in MUTANTS.items():
        first = m.patch.read_text().split("\n", 1)[0]
        assert first == f"# {name}: {m.mistake}" and len(m.mistake) > 40, name
        assert m.patch.read_text().count("\n# ") == 0  # one header line, then the diff
        assert m.edits and {rel for rel, _, _ in m.edits} <= set(EDITED_FILES), name
        assert MISTAKES[name] == Mistakes(**m.mini) != FIX, name  # the mini makes a mistake, this one
    assert {m.kind for m in MUTANTS.values()} == set(KINDS)  # every kind the issue asks for


def test_the_h200_plan_runs_graphs_for_all_and_eager_where_the_mode_matters() -> None:
    plan = h200_plan()
    assert ("spec-info-replaced", "preflight") in plan
    graph = {n for n, mode in plan if mode == "graph"}
    assert graph == {n for n, m in MUTANTS.items() if m.verify_state == "fix"}
    eager = {n for n, mode in plan if mode == "eager"}
    assert {"indexer-called-eager", "no-clear", "verify-leak"} <= eager
    assert eager == {n for n in graph if MUTANTS[n].eager_differs}


def test_local_labels_are_pep440() -> None:
    assert local_label("no-clear.patch") == "no.clear"
    assert local_label("Pool_Slot-Mixup.patch") == "pool.slot.mixup"


# ---------------------------------------------------------------------------------------------------
# the share model against committed real-sglang runs


def _task_spec() -> TaskSpec:
    return TaskSpec.from_json(json.loads((TASK / "install" / "checkpoint.json").read_text())["task"])


def test_share_model_predicts_every_committed_h200_request() -> None:
    spec, n = _task_spec(), 0
    for cell in sorted((TASK / "runs" / "task").glob("*-ctx*")):
        params = json.loads((cell / "params.json").read_text())
        if params["arm"] not in ("bug", "fix", "off") or params.get("target_topk"):
            continue
        how = SHARED if params["arm"] == "fix" else PER_STEP
        for line in (cell / "outputs.jsonl").read_text().splitlines():
            row = json.loads(line)
            predicted = verify_rounds(spec, row["expected_ids"], 5, params["max_new_tokens"], how)
            assert predicted == row["spec_verify_ct"], (cell.name, row["prompt_id"])
            n += 1
    assert n == 144


def test_the_strengthened_gate_passes_the_committed_h200_comparisons() -> None:
    """Judged against each run's own task.json (no task given, nothing read from the host's checkpoint)."""
    runs = TASK / "runs" / "task"
    for ctx in (4096, 65536, 500000):
        for w in WORKLOADS:
            res = comparison(
                runs / f"bug-ctx{ctx}-{w}", runs / f"fix-ctx{ctx}-{w}", runs / f"off-ctx{ctx}-{w}"
            )
            assert res["gate_failures"] == []
            assert res["share_model"]["task"] == str(runs / f"fix-ctx{ctx}-{w}" / "task.json")
            judged = res["share_model"]["by_workload"][w]
            assert judged["floor"] == 0 and set(judged["status"].values()) == {"matches"}


def test_every_committed_task_run_carries_the_task_its_checkpoint_was_made_with() -> None:
    """The copies are the default task checkpoint's task.json (the sha256 its manifest records)."""
    import hashlib

    from kit.task.make import REFERENCE_SHA256

    copies = sorted(RESULTS.rglob("task.json"))
    assert len(copies) >= 70
    for f in copies:
        assert hashlib.sha256(f.read_bytes()).hexdigest() == REFERENCE_SHA256["task.json"], f
    for params in RESULTS.rglob("params.json"):
        p = json.loads(params.read_text())
        if p.get("backend") == "sglang" and "server_dir" in p and p.get("model_path") == "/tmp/kit-task":
            assert (params.parent / "task.json").is_file(), params.parent


def test_without_the_task_the_share_model_is_a_note_not_a_failure(tmp_path: Path) -> None:
    """Runs that carry no task.json: the check is named as not run and the gate still passes; the checkpoint
    path the run recorded is never read, even where it holds a task (here: another one)."""
    from kit.task.spec import TASK_FILE

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / TASK_FILE).write_text(json.dumps(TaskSpec(seed=7).to_json()))
    runs = {}
    for arm in ("bug", "fix", "off"):
        runs[arm] = tmp_path / arm
        shutil.copytree(TASK / "runs" / "task" / f"{arm}-ctx4096-same-target", runs[arm], symlinks=True)
        (runs[arm] / TASK_FILE).unlink()
        params = json.loads((runs[arm] / "params.json").read_text())
        (runs[arm] / "params.json").write_text(json.dumps({**params, "model_path": str(elsewhere)}))
    res = comparison(runs["bug"], runs["fix"], runs["off"])
    assert res["gate_failures"] == []
    assert any(n.startswith("share model not checked: no task.json") for n in res["gate_notes"])


def test_runs_of_different_tasks_are_not_judged_against_either(tmp_path: Path) -> None:
    from kit.task.spec import TASK_FILE

    runs = {}
    for arm in ("bug", "fix", "off"):
        runs[arm] = tmp_path / arm
        shutil.copytree(TASK / "runs" / "task" / f"{arm}-ctx4096-same-target", runs[arm], symlinks=True)
    (runs["bug"] / TASK_FILE).unlink()
    (runs["bug"] / TASK_FILE).write_text(json.dumps(TaskSpec(seed=7).to_json()))
    res = comparison(runs["bug"], runs["fix"], runs["off"])
    assert res["share_model"] == {
        "checked": False,
        "why": "a ran another task than b (their task.json differ)",
    }


# ---------------------------------------------------------------------------------------------------
# the committed CPU results


def _committed() -> dict:
    return json.loads((CPU / "suite.json").read_text())


def test_committed_cpu_results_rejudge_to_what_suite_json_says() -> None:
    """Every comparison recomputed from the committed run directories (their verdicts, outputs and
    params: no Nsight needed) gives the committed rows; and they are what the registry demands."""
    suite = _committed()
    cells = {k: CPU / v for k, v in suite["cells"].items()}
    rows, off = [], {}
    for mode, comparisons in mutation.compare_cells(cells).items():
        rows += mutation.judge(comparisons, mode)
        off.update(mutation.off_checks(comparisons, mutation.cpu_controls(cells, mode)))
    assert [(r["candidate"], r["mode"], r["killed_by"]) for r in rows] == [
        (r["candidate"], r["mode"], r["killed_by"]) for r in suite["rows"]
    ]
    assert mutation.as_expected(suite, "cpu")
    assert off and all(v["passes"] for v in off.values())


def test_a_stale_top_k_passes_the_old_gate_and_fails_the_share_model() -> None:
    """first-topk-kept keeps one launch per round, every token and the same-target acceptance: only the
    share model, on moving-target, tells its top-k is not the round's."""
    suite = _committed()
    cells = {k: CPU / v for k, v in suite["cells"].items()}
    w = "moving-target"
    res = comparison(cells[f"bug-{w}"], cells[f"first-topk-kept-{w}"], cells[f"off-{w}"])
    checks = gate_checks(res)
    assert [k for k, v in checks.items() if v] == ["share_model"]
    same = comparison(
        cells["bug-same-target"], cells["first-topk-kept-same-target"], cells["off-same-target"]
    )
    assert same["gate_failures"] == []


def test_the_readme_blocks_are_what_the_script_prints() -> None:
    """Every block of data/results/mutants/README.md that scripts/mutants.py prints, from one run of it."""
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "mutants.py")], capture_output=True, text=True, check=True
    ).stdout
    readme = (RESULTS / "mutants" / "README.md").read_text()
    block = readme.split("## CPU results", 1)[1].split("```", 2)[1].strip("\n")
    assert block in out
    block = readme.split("## H200 results", 1)[1].split("```", 2)[1].strip("\n")
    assert block in out and block.startswith("H200: sglang")
    block = readme.split("Device time, measured", 1)[1].split("```", 2)[1].strip("\n")
    assert block in out and block.startswith("H200 lease 1:")
    # the corruption fuzzer's block (fuzz.json) and the part mutants' H200 set: the same script, one run
    block = readme.split("## Corruption fuzzer", 1)[1].split("```", 2)[1].strip("\n")
    assert block.startswith("Corruption fuzzer: mini task, any-slot") and block in out
    section = readme.split("## H200: wrong fixes that damage", 1)[1]
    table, device = section.split("```")[1].strip("\n"), section.split("```")[3].strip("\n")
    assert table.startswith("H200-PART: sglang") and table in out
    assert device.startswith("H200 lease 1:") and device in out


# ---------------------------------------------------------------------------------------------------
# building the patches (the pinned 0.5.14 wheel: downloaded once into the kit's cache)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sglang-0.5.14")
    with zipfile.ZipFile(release_wheel(BASELINE)) as zf:
        zf.extractall(root, [n for n in zf.namelist() if n.startswith("sglang/")])
    return root


@pytest.mark.network
@pytest.mark.parametrize("name", list(MUTANTS))
def test_each_patch_applies_and_kit_verify_reports_it(tree: Path, tmp_path: Path, name: str) -> None:
    copy = tmp_path / "tree"
    shutil.copytree(tree, copy, copy_function=os.link)  # the applier replaces files, never writes through
    changed = apply_patch(copy, MUTANTS[name].patch.read_text())
    for rel in changed:
        compile((copy / rel).read_text(), rel, "exec")
    assert detect_state(copy / "sglang")["state"] == MUTANTS[name].verify_state
    assert detect_state(tree / "sglang")["state"] == "bug"  # the shared tree is untouched


@pytest.mark.network
def test_the_generator_writes_the_committed_patches(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(REPO / "scripts" / "mutant_patches.py"), str(tmp_path)], check=True,
                   capture_output=True)  # fmt: skip
    for name, m in MUTANTS.items():
        assert (tmp_path / f"{name}.patch").read_text() == m.patch.read_text(), name


@pytest.mark.network
def test_kit_build_patch_builds_a_mutant_as_its_own_version(tmp_path: Path, capsys) -> None:
    from kit.cli import main as kit_main

    out = tmp_path / "out"
    assert kit_main(["build", "--patch", str(MUTANTS["no-clear"].patch), "--out", str(out)]) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert manifest["local_version"] == f"{BASELINE}+no.clear"
    assert manifest["patch"] == "no-clear.patch" and manifest["patch_header"].startswith("no-clear: drops")
    assert json.loads((out / "manifest.json").read_text()) == manifest
    wheel = out / manifest["output_wheel"]
    assert wheel.name.startswith(f"sglang-{BASELINE}+no.clear-") and wheel.is_file()
    state = detect_state(wheel)
    assert (state["state"], state["version"]) == ("fix", f"{BASELINE}+no.clear")
    with pytest.raises(Exception, match="already exists"):
        build_patched_wheel(BASELINE, out, patch=MUTANTS["no-clear"].patch)


@pytest.mark.network
def test_kit_build_patch_names_the_hunk_that_does_not_apply(tmp_path: Path) -> None:
    text = MUTANTS["pool-slot-mixup"].patch.read_text()
    ctx = "                 canary_index_ctx,\n"
    assert text.count(ctx) == 1
    bad = tmp_path / "broken-mutant.patch"
    bad.write_text(text.replace(ctx, "                 canary_ctx,\n"))
    out = tmp_path / "out"
    with pytest.raises(PatchError) as e:
        build_patched_wheel(BASELINE, out, patch=bad)
    assert e.value.file == "sglang/srt/speculative/eagle_worker_v2.py" and e.value.hunk == 3
    assert "hunk #3" in str(e.value) and "canary_ctx" in str(e.value)
    assert not out.exists() or list(out.iterdir()) == []


def _as_h200_folder(dest: Path, names: tuple[str, ...]) -> None:
    """scripts/h200_mutants.sh's layout (comparisons/MODE/WORKLOAD/NAME/, runs/), filled with the committed
    CPU comparisons as if they were a graph-mode run: each comparison records its runs relative to itself,
    so it is written again beside copies of its runs (as `kit compare --out` there would have)."""
    from kit.compare.runs import compared_run, placed

    for w in WORKLOADS:
        for name in names:
            src = CPU / "comparisons" / w / name / "comparison.json"
            res = json.loads(src.read_text())
            for side in ("a", "b", "control"):
                run = dest / "runs" / compared_run(src, side).name
                if not run.exists():
                    shutil.copytree(compared_run(src, side), run)
                res[side] = {**res[side], "run_dir": str(run)}
            out = dest / "comparisons" / "graph" / w / name
            out.mkdir(parents=True)
            (out / "comparison.json").write_text(json.dumps(placed(res, out)))


def test_a_real_sglang_folder_is_judged_per_mode_with_refusals(tmp_path: Path) -> None:
    _as_h200_folder(tmp_path, ("fix", "pool-slot-mixup"))
    (tmp_path / "refused").mkdir()
    (tmp_path / "refused" / "spec-info-replaced.txt").write_text(
        "arm 'fix' cannot run on the installed ...\n"
    )
    (tmp_path / "crashed").mkdir()
    (tmp_path / "crashed" / "worker-kept-graph.txt").write_text("AssertionError: topk_indices rows (2) ...\n")
    suite = mutation.judge_folder(tmp_path)
    assert [(r["candidate"], r["mode"], r["killed_by"]) for r in suite["rows"]] == [
        ("fix", "graph", []),
        ("pool-slot-mixup", "graph", ["acceptance", "share_model"]),
        ("worker-kept", "graph", ["crash"]),
        ("spec-info-replaced", "-", ["preflight"]),
    ]
    assert all(v["passes"] for v in suite["off"].values()) and len(suite["off"]) == 2
    assert json.loads((tmp_path / "suite.json").read_text()) == suite
    text = mutation.table(suite)
    assert "mode" in text.splitlines()[0] and "preflight" in text.splitlines()[0]
    assert "crash" in text.splitlines()[0]
    assert mutation.survivors(suite) == [] and mutation.inert_where(suite) == {}


def test_a_folder_whose_runs_are_missing_is_refused_naming_the_run_it_expected(tmp_path: Path) -> None:
    """The recorded host path (/tmp/cpu-suite/...) is never a fallback, whatever that machine holds."""
    _as_h200_folder(tmp_path, ("fix",))
    shutil.rmtree(tmp_path / "runs" / "off-moving-target")
    with pytest.raises(InputError, match=r"control run is expected at .*runs/off-moving-target.*ran at "):
        mutation.judge_folder(tmp_path)


def test_a_comparison_without_relative_runs_is_refused_not_guessed(tmp_path: Path) -> None:
    """A comparison.json that names its runs only by host path (as before relative paths were recorded)."""
    _as_h200_folder(tmp_path, ("fix",))
    f = tmp_path / "comparisons" / "graph" / "same-target" / "fix" / "comparison.json"
    res = json.loads(f.read_text())
    f.write_text(json.dumps({**res, "control": {k: v for k, v in res["control"].items() if k != "run"}}))
    with pytest.raises(InputError, match="only by the path it had where it ran"):
        mutation.judge_folder(tmp_path)


def test_the_committed_h200_suite_is_what_its_comparisons_say(tmp_path: Path) -> None:
    """data/results/mutants/h200: judged again from its comparisons, crashes and refusals, the suite is the
    committed one; every mutant is killed in some mode, each as the registry says (predictions that did not
    hold are recorded there, why_h200), and the fix and off pass in both modes."""
    committed = RESULTS / "mutants" / "h200"
    copy = tmp_path / "h200"
    shutil.copytree(committed, copy)
    suite = mutation.judge_folder(copy)
    assert suite == json.loads((committed / "suite.json").read_text())
    assert mutation.as_expected(suite, "h200")
    first = {n for n, m in MUTANTS.items() if m.kind != "part"}  # the part ones: ../h200-part
    assert {r["candidate"] for r in suite["rows"]} == {"fix", *first}
    assert mutation.survivors(suite) == []
    assert {r["mode"] for r in suite["rows"] if r["candidate"] == "fix"} == {"graph", "eager"}
    assert len(suite["off"]) == 4 and all(v["passes"] for v in suite["off"].values())
    crashed = {r["candidate"] for r in suite["rows"] if r["killed_by"] == ["crash"]}
    assert crashed == {n for n, m in MUTANTS.items() if m.h200.get("graph") == "crash"}
    assert all(MUTANTS[n].why_h200 for n in crashed)


def test_the_report_shows_the_mutation_table(tmp_path: Path) -> None:
    from kit.pipeline.stages import run_group
    from kit.report.mutation_suite import mutation_suite
    from kit.report.rung import CONFIRMED, Batch

    rung = mutation_suite(Batch(tmp_path, run_group))
    assert rung is not None and rung.status == CONFIRMED
    assert rung.headline.startswith(f"{len(MUTANTS)} wrong fixes of PR #29654 on the task workloads")
    part = [n for n, m in MUTANTS.items() if m.kind == "part" and not m.cpu]  # at 4k no draft reads them
    n = len(MUTANTS)
    head = f"the gate kills {n - len(part)} of {n} wrong fixes on CPU ({', '.join(part)} drop slots"
    assert head in rung.claim
    assert "(no-clear lives only in eager" in rung.claim
    assert (
        "first-topk-kept, topk-tail-other-request, topk-tail-shifted only since the gate checks the task"
        in rung.claim
    )
    frame = rung.tables[0].frame
    assert list(frame["candidate"]) == ["fix", *MUTANTS, "fix", "no-clear"]
    assert list(frame["mode"]) == ["eager"] * (len(MUTANTS) + 1) + ["static"] * 2
    assert list(frame.columns[-8:]) == [
        "launches",
        "acceptance",
        "accuracy",
        "tokens",
        "share model",
        "crash",
        "preflight",
        "verdict",
    ]
    first = len([m for m in MUTANTS.values() if m.kind != "part"])
    assert f"On one H200 with real sglang 0.5.14: {first} of {first} killed" in rung.claim
    assert "no-clear in eager" in rung.claim and "(issue 32): 6 of 6 killed, by the share model" in rung.claim
    assert rung.tables[1].title.startswith("Real sglang 0.5.14 on one H200")
    assert rung.tables[2].title.startswith("Real sglang 0.5.14 on one H200, part of the shared top-k damaged")
    # then why, request by request (tests/test_per_request.py)
    titles = [t.title.split(":")[0] for t in rung.tables[3:6]]
    assert titles == ["CPU", "Real sglang on one H200", "Real sglang on one H200, part of the top-k damaged"]
    assert set(rung.about) >= {"engine", "device", "model", "files"} and rung.about["Nsight"].startswith(
        "Nsight"
    )


def test_the_share_model_knows_sharing_needs_eagle_topk_one() -> None:
    from kit.compare.share_model import computation

    assert computation("fix", "sglang") == SHARED and computation("bug", "mini") == PER_STEP
    assert computation("fix", "mini", eagle_topk=2) == PER_STEP
    assert computation("upstream", "mini") == SHARED and computation("upstream", "sglang") is None


def test_a_folder_without_the_fix_comparison_is_refused_in_one_line(tmp_path: Path) -> None:
    """An empty or wrong folder must not judge to an empty suite that "holds as expected"."""
    with pytest.raises(InputError, match="holds no comparison of the fix"):
        mutation.judge_folder(tmp_path)
    assert not (tmp_path / "suite.json").exists()
    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "mutants.py"), "h200", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "h200_mutants.sh OUT compare" in r.stderr
