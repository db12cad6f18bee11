"""One sglang server per arm in `kit batch` (kit.pipeline.groups), without a GPU.

The cells of one arm and server settings share one server: one start, each cell into its own run directory
at its batch run id, each analysed alone, compared, reported. A server that dies between cells fails the
rest of its group only; a deadline between cells leaves them not started; --resume starts a new server for
what is left. The whole path runs for real: fake sglang builds whose launch_server is the stand-in HTTP
server, and a fake nsys whose report holds one window per cell (fake_gpu_helpers).
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import sglang_standin_helpers as standin
from fake_gpu_helpers import fake_build, fake_nsys, tokenizer_model
from sglang_run_helpers import GLM52_CONFIG, FakeTokenizer, make_model, run_params

from kit.backends.sglang import launch
from kit.paths import REPO
from kit.pipeline import batch as kb
from kit.pipeline import groups, matrix
from kit.pipeline.executors import SlurmOptions
from kit.pipeline.summary import summary
from kit.rundir import RunDir


def _load(tmp_path: Path, doc: dict[str, Any], name: str = "m") -> matrix.Matrix:
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(doc))  # JSON is YAML
    return matrix.load(path)


def _sglang_doc(model: Path, builds: dict[str, Any], arms: list[str], contexts: list[int]) -> dict[str, Any]:
    return {
        "batch": "g",
        "axes": {
            "backend": ["sglang"],
            "arm": arms,
            "context_len": contexts,
            "cuda_graph": [False],
            "device": ["cuda"],
        },
        "params": {
            "model_path": str(model),
            "num_requests": 2,
            "max_new_tokens": 32,
            "profile_skip": 1,
            "profile_steps": 3,
        },
        "builds": builds,
    }


# ---------------------------------------------------------------------------------------------------
# Which cells share a server


def test_cells_of_one_arm_and_server_settings_share_a_server(tmp_path: Path) -> None:
    doc = {
        "axes": {
            "backend": ["sglang"],
            "arm": ["bug", "fix"],
            "context_len": [4096, 81920],
            "cuda_graph": [True],
            "device": ["cuda"],
        },
        "params": {"model_path": "/m", "num_requests": 2},
        "include": [{"arm": ["bug"], "context_len": [4096], "cuda_graph": [False]}],
        "builds": {"bug": {"pythonpath": ["/b"]}, "fix": {"pythonpath": ["/f"]}},
    }
    m = _load(tmp_path, doc)
    assert [c.run_id for c in m.cells][-1] == "sglang-bug-ctx4096-s5-eager-cuda"  # the include: entry
    gs = groups.form(m.cells, tmp_path / "runs" / "b")
    assert [(g.server, g.cell_ids()) for g in gs] == [
        (
            "sglang-bug-s5-graph-cuda-server",
            ["sglang-bug-ctx4096-s5-graph-cuda", "sglang-bug-ctx81920-s5-graph-cuda"],
        ),
        (
            "sglang-fix-s5-graph-cuda-server",
            ["sglang-fix-ctx4096-s5-graph-cuda", "sglang-fix-ctx81920-s5-graph-cuda"],
        ),
        (None, ["sglang-bug-ctx4096-s5-eager-cuda"]),  # CUDA graphs off: another server, alone on it
    ]
    assert gs[0].params()["context_len"] == [4096, 81920] and "workload" not in gs[0].params()
    assert gs[0].build == matrix.Build(("/b",))
    # a server already there (an earlier attempt): the new one gets a name of its own
    (tmp_path / "runs" / "b" / "sglang-bug-s5-graph-cuda-server").mkdir(parents=True)
    assert groups.form(m.cells, tmp_path / "runs" / "b")[0].server == "sglang-bug-s5-graph-cuda-server-1"
    # --server-per-cell, and the mini backend: every cell alone
    assert all(g.server is None for g in groups.form(m.cells, tmp_path, share=False))
    mini = _load(tmp_path, {"axes": {"arm": ["bug"], "context_len": [2048, 4096]}}, "mini")
    assert [g.server for g in groups.form(mini.cells, tmp_path)] == [None, None]


def test_a_server_runs_a_product_of_contexts_and_workloads(tmp_path: Path) -> None:
    """Cells left from an earlier attempt that are no product are split by workload."""
    doc = {
        "axes": {
            "backend": ["sglang"],
            "arm": ["bug"],
            "workload": ["same-target", "moving-target"],
            "context_len": [4096, 65536],
            "cuda_graph": [False],
            "device": ["cuda"],
        },
        "params": {"model_path": "/m"},
    }
    cells = _load(tmp_path, doc).cells
    [whole] = groups.form(cells, tmp_path)
    assert whole.server == "sglang-bug-s5-eager-cuda-server"
    assert whole.params()["context_len"] == [4096, 65536]
    assert whole.params()["workload"] == ["same-target", "moving-target"]
    assert whole.cell_ids() == [  # contexts outer, workloads inner: the order run_server runs them
        "sglang-bug-same-target-ctx4096-s5-eager-cuda",
        "sglang-bug-moving-target-ctx4096-s5-eager-cuda",
        "sglang-bug-same-target-ctx65536-s5-eager-cuda",
        "sglang-bug-moving-target-ctx65536-s5-eager-cuda",
    ]
    left = [c for c in cells if c.run_id != "sglang-bug-same-target-ctx4096-s5-eager-cuda"]
    parts = groups.form(left, tmp_path)
    assert [(g.server, g.cell_ids()) for g in parts] == [
        (
            "sglang-bug-moving-target-s5-eager-cuda-server",
            [
                "sglang-bug-moving-target-ctx4096-s5-eager-cuda",
                "sglang-bug-moving-target-ctx65536-s5-eager-cuda",
            ],
        ),
        (None, ["sglang-bug-same-target-ctx65536-s5-eager-cuda"]),
    ]


def test_include_and_profile_axis_are_checked(tmp_path: Path) -> None:
    base = {"axes": {"arm": ["bug"], "context_len": [4096]}}
    for extra, needle in (
        ({"include": [{"arm": ["bug"]}]}, "include[0] repeats cell mini-bug-ctx4096-s5-eager-cpu"),
        ({"include": {"arm": ["bug"]}}, "include: expected a list of axis mappings"),
        ({"include": [{"num_requests": [1]}]}, "include[0].num_requests"),
        ({"include": [{"context_len": ["x"]}]}, "include[0].context_len: expected an integer"),
        ({"include": [{"profile": [False]}]}, "include[0].profile"),
    ):
        with pytest.raises(Exception, match=__import__("re").escape(needle)):
            _load(tmp_path, {**base, **extra})
    doc = {
        "axes": {
            "backend": ["sglang"],
            "arm": ["bug"],
            "context_len": [4096],
            "device": ["cuda"],
            "profile": [True, False],
        },
        "params": {"model_path": "/m"},
    }
    ids = [c.run_id for c in _load(tmp_path, doc).cells]  # cuda_graph left out: sglang's default, graphs
    assert ids == ["sglang-bug-ctx4096-s5-graph-cuda", "sglang-bug-ctx4096-s5-graph-cuda-noprofile"]


def test_dry_run_lists_each_server_and_its_cells(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from kit.cli import main as kit_main

    path = REPO / "data" / "matrices" / "h200_pr29654.yaml"
    # listed on any host; exit 2 here, where the H200's checkpoint and builds are not (as the run would)
    assert kit_main(["batch", str(path), "--dry-run", "--out", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert "matrix " in out and "19 cells" in out and "16 cells on 4 shared servers:" in out, out
    assert "server sglang-upstream-s5-graph-cuda-server: 4 cells, one start" in out
    assert "/tmp/kit-sgl16/sglang-0.5.16" in out
    assert kit_main(["batch", str(path), "--dry-run", "--server-per-cell", "--out", str(tmp_path)]) == 2
    assert "shared servers" not in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------
# run_server: the batch's names for the cells, and a deadline between cells


def test_run_server_names_cells_as_told_and_starts_none_after_the_deadline(tmp_path: Path) -> None:
    model = make_model(tmp_path, GLM52_CONFIG)

    def run(run_id: str, start_before: float | None) -> launch.ServerRun:
        return launch.run_server(
            run_params(model, context_len=[4096, 8192]),
            tmp_path / "runs",
            "b",
            run_id=run_id,
            tokenizer=FakeTokenizer(),
            server_cmd_factory=standin.command,
            cell_ids=[f"{run_id}-a", f"{run_id}-b"],
            start_before=start_before,
        )

    res = run("named", None)
    assert [d.name for d in res.cell_dirs] == ["named-a", "named-b"] and res.server_dir.name == "named"
    assert RunDir(res.cell_dirs[1]).read_params()["server_dir"] == "../named" and not res.not_started

    late = run("late", time.time() - 1)
    assert late.cell_dirs == [] and [d.name for d in late.not_started] == ["late-a", "late-b"]
    assert not any(d.exists() for d in late.not_started)  # no directory: a later run makes it
    cells = json.loads((late.server_dir / "provenance.json").read_text())["cells"]
    assert [c["status"] for c in cells] == ["not started (deadline)"] * 2
    with pytest.raises(Exception, match="3 cell ids for 2 cells"):
        launch.run_server(
            run_params(model, context_len=[4096, 8192]),
            tmp_path / "runs",
            "b",
            run_id="x",
            tokenizer=FakeTokenizer(),
            server_cmd_factory=standin.command,
            cell_ids=["a", "b", "c"],
        )


# ---------------------------------------------------------------------------------------------------
# The whole batch on the fake GPU stack


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Fake builds (bug, fix), a model with a tokenizer, and the fake nsys on KIT_NSYS."""
    monkeypatch.setenv("KIT_NSYS", str(fake_nsys(tmp_path / "nsys")))
    monkeypatch.chdir(REPO)  # the stages' processes import this checkout's kit
    return {
        "model": tokenizer_model(tmp_path),
        "bug": fake_build(tmp_path / "sgl" / "sglang-0.5.14", "bug"),
        "fix": fake_build(tmp_path / "sgl" / "sglang-0.5.14+pr29654", "fix"),
    }


def _builds(stack: dict[str, Any], **other: Path) -> dict[str, Any]:
    paths = {"bug": stack["bug"], "fix": stack["fix"], "off": stack["fix"], **other}
    return {arm: {"pythonpath": [str(p)]} for arm, p in paths.items()}


def _starts(server: Path) -> int:
    return (server / "server.log").read_text().count("[stand-in] pid ")


def test_one_server_per_arm_each_cell_its_own_run_and_verdict(tmp_path: Path, stack: dict[str, Any]) -> None:
    m = _load(tmp_path, _sglang_doc(stack["model"], _builds(stack), ["off", "bug", "fix"], [4096, 8192]))
    res = kb.run_batch(m, tmp_path / "runs", progress=False, runner="plain")
    assert res.exit_code == 0, summary(res)
    batch = tmp_path / "runs" / "g"
    for arm, launches in (("off", 4), ("bug", 4), ("fix", 1)):
        server = batch / f"sglang-{arm}-s5-eager-cuda-server"
        assert _starts(server) == 1  # one start for both cells
        prov = json.loads((server / "provenance.json").read_text())
        assert [c["status"] for c in prov["cells"]] == ["done", "done"]
        for k, ctx in enumerate((4096, 8192)):
            run = RunDir(batch / f"sglang-{arm}-ctx{ctx}-s5-eager-cuda")
            params = run.read_params()
            assert (params["context_len"], params["cell_index"], params["profile_window_ordinal"]) == (
                ctx,
                k,
                k + 1,
            )
            assert run.server().path == server and run.nsys_sqlite.is_symlink()
            verdict = json.loads(run.verdict.read_text())
            assert verdict["passed"] and set(verdict["launches_per_round"]) == {launches}
            assert verdict["num_rounds"] == 3  # its own window's rounds: not the other cell's, not warm-up
            assert (run.path / "cell.log").is_file()
    assert [s.status for s in res.compares] == ["done", "done"] and all(s.gate == [] for s in res.compares)


def test_notebooks_profile_a_server_once_and_analyse_each_cell(tmp_path: Path, stack: dict[str, Any]) -> None:
    m = _load(tmp_path, _sglang_doc(stack["model"], _builds(stack), ["bug", "fix"], [4096, 8192]))
    res = kb.run_batch(m, tmp_path / "runs", progress=False)
    assert not res.failures and [c.status for c in res.cells] == ["done"] * 4, summary(res)
    batch = tmp_path / "runs" / "g"
    server = batch / "sglang-bug-s5-eager-cuda-server"
    nb = json.loads((server / "executed-01_profile.ipynb").read_text())
    injected = next(c for c in nb["cells"] if "injected-parameters" in c["metadata"].get("tags", []))
    source = "".join(injected["source"])
    assert "cell_ids = " in source and "context_len = [4096, 8192]" in source, source
    assert "sglang-bug-ctx4096-s5-eager-cuda" in source and "sglang-bug-ctx8192-s5-eager-cuda" in source
    cell = batch / "sglang-bug-ctx8192-s5-eager-cuda"
    assert (
        os.readlink(cell / "executed-01_profile.ipynb")
        == "../sglang-bug-s5-eager-cuda-server/executed-01_profile.ipynb"
    )
    assert (cell / "executed-02_analyze.ipynb").is_file() and (cell / "verdict.json").is_file()
    assert res.report is not None and res.report.status == "done"


def test_a_deadline_passing_while_a_server_starts_leaves_its_cells_not_started(
    tmp_path: Path, stack: dict[str, Any]
) -> None:
    """The group started before the deadline, its server came up after it: no cell runs. Through the
    notebooks every cell must read 'not started' (run again), not failed: on the H200 the profile
    notebook's outputs table raised KeyError on no rows and both cells of 0.5.16's unprofiled server were
    recorded as failures."""
    m = _load(tmp_path, _sglang_doc(stack["model"], _builds(stack), ["fix"], [4096, 8192]))
    [group] = groups.form(list(m.cells), tmp_path / "runs" / "g")
    results = groups.run_group(group, tmp_path / "runs", "g", "notebooks", start_before=time.time() - 1)
    assert [(r.status, r.message) for r in results] == [("not_started", "deadline reached")] * 2, results
    server = tmp_path / "runs" / "g" / group.server
    assert not (server / "error.json").exists() and (server / "executed-01_profile.ipynb").is_file()
    assert not any((tmp_path / "runs" / "g" / c.run_id).exists() for c in group.cells)


@pytest.mark.parametrize("seen", ["before the server starts", "by the server (a race)"])
def test_a_cell_dir_another_process_made_is_left_as_it_is(
    tmp_path: Path, stack: dict[str, Any], monkeypatch: pytest.MonkeyPatch, seen: str
) -> None:
    """D84: a run directory made under a shared server's cell name by another process (a finished run) is
    never written into or analysed: every cell of that server fails saying so."""
    m = _load(tmp_path, _sglang_doc(stack["model"], _builds(stack), ["fix"], [4096, 8192]))
    [group] = groups.form(list(m.cells), tmp_path / "runs" / "g")
    other = tmp_path / "runs" / "g" / group.cells[1].run_id
    other.mkdir(parents=True)
    (other / "verdict.json").write_text("{}")
    if seen != "before the server starts":  # the dir appears after the batch looked: run_server meets it
        monkeypatch.setattr(groups.cell_mod, "refuse_existing", lambda run_dir: None)
    results = groups.run_group(group, tmp_path / "runs", "g", "plain")
    assert [r.status for r in results] == ["failed", "failed"], results
    assert all(f"run directory {other} already exists" in r.message for r in results)
    assert [p.name for p in other.iterdir()] == ["verdict.json"]


def test_servers_started_side_by_side_take_turns_to_measure(
    tmp_path: Path, stack: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """-j 2 on one GPU: both arms' servers start at once (each takes 3 s to come up here, a minute on the
    H200), but their requests and profile windows never overlap: one cell measures while the other server
    waits for its turn (kit.proc.gpu_turn), so sharing the GPU saves start-up time without perturbing what
    is timed. Turns go cell by cell, first come first served: an arm measures two cells in a row only if the
    other was not yet waiting, so a call cut by its deadline has both arms' first contexts (pairs to
    compare), not one arm's whole row."""
    builds = _builds(
        stack,
        # each /generate 0.3 s: a cell outlasts the skew between the two servers' readiness under load, so
        # their turns contend (with instant cells one server could finish before the other was ready)
        bug=fake_build(tmp_path / "sgl" / "slow-bug", "bug", ready_after=3.0, generate_delay=0.3),
        fix=fake_build(tmp_path / "sgl" / "slow-fix", "fix", ready_after=3.0, generate_delay=0.3),
    )
    m = _load(tmp_path, _sglang_doc(stack["model"], builds, ["bug", "fix"], [4096, 8192]))
    monkeypatch.setenv(standin.LOG_HEALTH, "1")
    (tmp_path / "runs" / "g").mkdir(parents=True)  # a killed earlier call's queue, its pid taken by now
    (tmp_path / "runs" / "g" / ".gpu-turns.lock.queue").write_text(f"{os.getpid()}:1\n")
    res = kb.run_batch(m, tmp_path / "runs", progress=False, runner="plain", jobs=2, deadline_s=60)
    assert res.exit_code == 0, summary(res)
    batch = tmp_path / "runs" / "g"
    sent, waits, lives = [], [], []
    for arm in ("bug", "fix"):
        server = RunDir(batch / f"sglang-{arm}-s5-eager-cuda-server")
        record = [json.loads(x) for x in json.loads(server.nsys_rep.read_text())["record"]]
        sent += [(e["t"], arm, e["endpoint"]) for e in record if e["endpoint"] in MEASURING]
        prov = json.loads(server.provenance.read_text())
        waits.append(prov["run"].get("gpu_wait_s"))
        lives.append((datetime.fromisoformat(prov["start"]), datetime.fromisoformat(prov["end"])))
    sent.sort()
    ready = {arm: t for t, arm, endpoint in sent if endpoint == "/health"}  # then it waits for a turn
    windows, holder = [], None  # (arm, end) of each profile window; inside one, only that arm's requests
    for t, arm, endpoint in sent:
        if endpoint == "/start_profile":
            assert holder is None, sent
            holder = arm
        elif endpoint == "/stop_profile":
            assert holder == arm, sent
            holder = None
            windows.append((arm, t))
        elif endpoint == "/generate":
            assert holder in (None, arm), sent
    assert len(windows) == 4, windows
    for i, ((arm, end), (after, _)) in enumerate(zip(windows, windows[1:], strict=False)):
        other = "fix" if arm == "bug" else "bug"
        done = not any(a == other for a, _ in windows[i + 1 :])  # the other measured all its cells already
        assert after != arm or ready[other] > end or done, (windows, ready)  # the waiting arm went next
    assert None not in waits and max(waits) > 0.2, waits  # each says how long it waited in all
    together = min(e for _, e in lives) - max(s for s, _ in lives)
    assert together.total_seconds() >= 2, lives  # both were up at once: their 3 s start-ups overlapped
    assert "KIT_GPU_TURNS" not in os.environ  # the batch set it for its servers only


MEASURING = ("/health", "/generate", "/start_profile", "/stop_profile")


def test_a_server_dying_between_cells_fails_only_the_rest_of_its_arm_then_resume(
    tmp_path: Path, stack: dict[str, Any]
) -> None:
    """The bug build's server exits after its first cell (a warm-up and two requests): the bug arm's
    second cell fails on its first request, the third never starts; each says so in error.json. The fix
    arm's server runs all three. --resume starts a new bug server for the two that are left."""
    dying = fake_build(tmp_path / "sgl" / "dying", "bug", die_after=3)
    m = _load(
        tmp_path, _sglang_doc(stack["model"], _builds(stack, bug=dying), ["bug", "fix"], [4096, 8192, 16384])
    )
    res = kb.run_batch(m, tmp_path / "runs", progress=False, runner="plain")
    status = {c.run_id: c.status for c in res.cells}
    assert res.exit_code == 2, summary(res)
    assert status == {
        "sglang-bug-ctx4096-s5-eager-cuda": "done",
        "sglang-bug-ctx8192-s5-eager-cuda": "failed",
        "sglang-bug-ctx16384-s5-eager-cuda": "failed",
        "sglang-fix-ctx4096-s5-eager-cuda": "done",
        "sglang-fix-ctx8192-s5-eager-cuda": "done",
        "sglang-fix-ctx16384-s5-eager-cuda": "done",
    }
    batch = tmp_path / "runs" / "g"
    third = next(c for c in res.cells if c.run_id == "sglang-bug-ctx16384-s5-eager-cuda")
    assert "did not run" in third.message and "server" in third.message, third.message
    assert json.loads((batch / third.run_id / "error.json").read_text())["stage"] == "sglang_run"
    assert _starts(batch / "sglang-fix-s5-eager-cuda-server") == 1

    fake_build(dying, "bug")  # the build repaired in place
    res = kb.run_batch(m, tmp_path / "runs", progress=False, runner="plain", resume=True)
    assert res.exit_code == 0, summary(res)
    assert sorted(p.name for p in res.set_aside) == [
        "sglang-bug-ctx16384-s5-eager-cuda.failed-1",
        "sglang-bug-ctx8192-s5-eager-cuda.failed-1",
    ]
    again = batch / "sglang-bug-s5-eager-cuda-server-1"  # a new server for the two left
    assert _starts(again) == 1 and RunDir(batch / "sglang-bug-ctx16384-s5-eager-cuda").server().path == again
    first = RunDir(
        batch / "sglang-bug-ctx4096-s5-eager-cuda"
    )  # untouched, its links to the first server hold
    assert first.server().path == batch / "sglang-bug-s5-eager-cuda-server" and first.nsys_sqlite.is_file()
    assert [c.status for c in res.cells].count("skipped") == 4


def test_a_deadline_between_cells_leaves_them_not_started(tmp_path: Path, stack: dict[str, Any]) -> None:
    """The server takes 2 s to answer /health, the deadline is 1 s: the first arm's server starts (the
    deadline had not passed), then starts no cell; the second arm's never starts. Nothing half-made."""
    slow = {arm: fake_build(tmp_path / "sgl" / f"slow-{arm}", arm, ready_after=2.0) for arm in ("bug", "fix")}
    m = _load(tmp_path, _sglang_doc(stack["model"], _builds(stack, **slow), ["bug", "fix"], [4096, 8192]))
    res = kb.run_batch(m, tmp_path / "runs", progress=False, runner="plain", deadline_s=1.0)
    assert res.exit_code == kb.EXIT_INCOMPLETE and [c.status for c in res.cells] == ["not_started"] * 4
    batch = tmp_path / "runs" / "g"
    assert not any((batch / c.run_id).exists() for c in res.cells)
    assert (batch / "sglang-bug-s5-eager-cuda-server").is_dir()
    assert not (batch / "sglang-fix-s5-eager-cuda-server").exists()
    res = kb.run_batch(m, tmp_path / "runs", progress=False, runner="plain", resume=True)
    assert res.exit_code == 0 and not res.set_aside, summary(res)


def test_a_refused_build_fails_every_cell_of_its_server(tmp_path: Path, stack: dict[str, Any]) -> None:
    """The pre-flight refuses the fix arm on the bug build before the server makes any directory: both
    fix cells fail with that one line; the bug arm's server runs."""
    m = _load(
        tmp_path, _sglang_doc(stack["model"], _builds(stack, fix=stack["bug"]), ["bug", "fix"], [4096, 8192])
    )
    res = kb.run_batch(m, tmp_path / "runs", progress=False, runner="plain")
    fix = [c for c in res.cells if "-fix-" in c.run_id]
    assert [c.status for c in fix] == ["failed", "failed"], summary(res)
    for c in fix:
        assert "arm 'fix' cannot run on the installed sglang 0.5.14 (state bug" in c.message, c.message
        assert "cannot run" in json.loads((Path(c.run_dir) / "error.json").read_text())["message"]
    assert [c.status for c in res.cells if "-bug-" in c.run_id] == ["done", "done"]


def test_a_server_group_through_submitit(tmp_path: Path, stack: dict[str, Any]) -> None:
    """--executor slurm's path (submitit's LocalExecutor standing in for Slurm): one job per server."""
    pytest.importorskip("submitit")
    m = _load(tmp_path, _sglang_doc(stack["model"], _builds(stack), ["fix"], [4096, 8192]))
    opts = SlurmOptions(time_min=10, cluster="local")
    res = kb.run_batch(m, tmp_path / "runs", progress=False, runner="plain", executor="slurm", slurm=opts)
    assert res.exit_code == 0, summary(res)
    assert _starts(tmp_path / "runs" / "g" / "sglang-fix-s5-eager-cuda-server") == 1
    assert len(list((tmp_path / "runs" / "g" / ".submitit").rglob("*_result.pkl"))) == 1


# ---------------------------------------------------------------------------------------------------
# The instrument's overhead: each cell again without nsys and the probes


def test_decode_round_time_over_a_span_of_chunks() -> None:
    from kit.pipeline.overhead import per_round_ms

    timeline = [[1.0, 1, 0], [1.1, 5, 1], [1.3, 13, 3], [1.6, 25, 6]]  # the first chunk follows prefill
    assert per_round_ms(timeline, 1, 4) == {
        "chunks": [1, 4],
        "seconds": 0.6,
        "rounds": 6,
        "rounds_from": "spec_verify_ct",
        "ms_per_round": 100.0,
        "tokens": 24,
        "ms_per_token": 25.0,
    }
    assert per_round_ms(timeline, 2, 9)["chunks"] == [2, 4]  # clipped to what arrived
    assert per_round_ms(timeline, 4, 4) is None and per_round_ms(timeline, 0, 2) is None
    no_verify = [[0.0, 1, None], [0.5, 11, None]]  # sglang 0.5.14: one chunk per verify round, no count
    assert per_round_ms(no_verify, 1, 2) == {
        "chunks": [1, 2],
        "seconds": 0.5,
        "rounds": 1,
        "rounds_from": "chunks",
        "ms_per_round": 500.0,
        "tokens": 10,
        "ms_per_token": 50.0,
    }


def test_each_unprofiled_cell_beside_its_profiled_twin(tmp_path: Path, stack: dict[str, Any]) -> None:
    doc = _sglang_doc(stack["model"], _builds(stack), ["fix"], [4096, 8192])
    doc["axes"]["profile"] = [True, False]
    doc["params"]["time_decode"] = True
    m = _load(tmp_path, doc)
    res = kb.run_batch(m, tmp_path / "runs", progress=False, runner="plain")
    assert res.exit_code == 0, summary(res)
    batch = tmp_path / "runs" / "g"
    for ctx in (4096, 8192):
        plain = batch / f"sglang-fix-ctx{ctx}-s5-eager-cuda-noprofile"
        assert not (plain / "verdict.json").exists() and not (plain / "profile.nsys-rep").exists()
        rows = [json.loads(x) for x in (plain / "outputs.jsonl").read_text().splitlines()]
        assert rows[0]["stream_chunks"] and "stream_chunks" not in rows[1]  # prompt 0 timed, not profiled
        over = json.loads(
            (batch / f"overhead-sglang-fix-ctx{ctx}-s5-eager-cuda" / "overhead.json").read_text()
        )
        assert over["unprofiled"] == plain.name
        assert over["window"]["profiled"]["chunks"] == [1, 4]  # opened at chunk 1 (skip 1), 3 steps on
        for span in ("window", "decode"):
            assert 0.2 < over[span]["ratio_per_round"] < 5, over  # the stand-in: same pace either way
    assert _starts(batch / "sglang-fix-s5-eager-cuda-noprofile-server") == 1
    assert [s.status for s in res.overheads] == ["done", "done"]
    assert "decode round with/without the instrument: window" in summary(res)
    assert [s.name for s in res.compares] == []  # no bug/fix pair; the unprofiled cells are not compared
    again = kb.run_batch(m, tmp_path / "runs", progress=False, runner="plain", resume=True)
    assert [c.status for c in again.cells] == [
        "skipped"
    ] * 4  # an unprofiled run is complete without a verdict
    assert [s.status for s in again.overheads] == ["skipped", "skipped"]


def test_the_h200_grid_in_two_parts_is_the_grid_and_its_perturbation_check() -> None:
    """part-a and part-b (two leases) run exactly the cells of the grid and of its perturbation mode."""
    ids = {
        mode: {c.run_id for c in matrix.load("h200_pr29654", mode).cells}
        for mode in (None, "perturbation", "part-a", "part-b")
    }
    assert len(ids[None]) == 19 and len(ids["perturbation"]) == 16
    assert ids["part-a"] | ids["part-b"] == ids[None] | ids["perturbation"]
    assert not ids["part-a"] & ids["part-b"]
    assert all("-upstream-" not in r for r in ids["part-a"])


def test_a_servers_cells_are_analysed_side_by_side_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the server has stopped its cells' analyses run at once; the results keep the cells' order."""
    from kit.pipeline import cell as cell_mod
    from kit.pipeline.cell import CellResult, Step

    doc = _sglang_doc(tmp_path / "model", {}, ["fix"], [4096, 8192, 16384, 32768])
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    m = _load(tmp_path, doc)
    group = groups.form(list(m.cells), tmp_path / "runs" / "g", True)[0]
    assert group.server and len(group.cells) == 4

    def profile(*args: Any, **kw: Any) -> Step:
        def run() -> None:
            for c in group.cells:
                (tmp_path / "runs" / "g" / c.run_id).mkdir(parents=True)

        return Step("01_profile", run, None)

    def analyse(cell: Any, run_dir: Path, steps: Any, runner: str, t0: float, fresh: bool) -> CellResult:
        time.sleep(0.5)
        return CellResult(cell.run_id, "done", str(run_dir))

    monkeypatch.setattr(cell_mod, "profile_step", profile)
    monkeypatch.setattr(cell_mod, "run_steps", analyse)
    t0 = time.perf_counter()
    results = groups.run_group(group, tmp_path / "runs", "g", "plain")
    assert time.perf_counter() - t0 < 1.5  # four 0.5 s analyses side by side, not 2 s
    assert [r.run_id for r in results] == [c.run_id for c in group.cells]


def test_a_pair_with_no_decode_round_timed_fails_with_its_cause_and_is_retried(tmp_path: Path) -> None:
    """Prompt 0 streamed one chunk in each run: no ratio. The stage fails saying why (never a blank
    'done'), and a later batch measures the pair again instead of skipping it as measured."""
    from kit.pipeline import stages

    doc = _sglang_doc(tmp_path / "model", {}, ["fix"], [4096])
    doc["axes"]["profile"] = [True, False]
    m = _load(tmp_path, doc)
    batch = tmp_path / "runs" / "g"
    ((with_, without),) = stages.twins(m)
    for cell in (with_, without):
        run = batch / cell.run_id
        run.mkdir(parents=True)
        (run / "params.json").write_text(json.dumps({"profile_steps": 3}))
        (run / "provenance.json").write_text("{}")
        row = {"prompt_id": 0, "stream_chunks": [[0.1, 1, None]]}
        (run / "outputs.jsonl").write_text(json.dumps(row) + "\n")
    (batch / with_.run_id / "verdict.json").write_text("{}")
    for _ in range(2):
        (res,) = stages.run_overheads(m, batch, set())
        assert res.status == "failed" and "no decode round timed in both runs" in res.message
