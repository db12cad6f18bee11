"""One sglang server, many cells, without a GPU: several (context, workload) cells run in order on one
stand-in server, each into its own run directory beside the server folder; a server dying between cells;
requests in flight at once, written in prompt order; pluggable workloads and their rows; the control
override (target_topk) in every artifact; and the analysis finding a cell's own profile window."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import sglang_standin_helpers as standin
from fake_gpu_helpers import draft_round as _round  # one eager draft round of 4 draft steps
from sglang_run_helpers import GLM52_CONFIG, FakeTokenizer, group_gone, make_model, run_params
from synthetic_schema import SynthReport, gtid

from kit.analysis.analyze import analyze
from kit.backends.sglang import launch, workload
from kit.backends.sglang import params as sp
from kit.backends.sglang import requests as sglang_requests
from kit.backends.sglang.cells import run_cell
from kit.backends.sglang.http import SglangClient
from kit.backends.sglang.plan import plan
from kit.backends.sglang.workload import Prompt, get_workload, prompt_ids
from kit.cli import main as kit_main
from kit.errors import KitError, TraceError, UsageError
from kit.probe import ENV_TARGET_TOPK
from kit.probe.targets import WINDOW_END, WINDOW_START
from kit.rundir import RunDir


@dataclass(frozen=True)
class Answered:
    """A task-like workload: prompt ids with a marker, and the expected output (the stand-in's answer for
    even prompts, a wrong one for odd prompts)."""

    name: str = "answered"
    version: str = "tests/answered-v1"

    def prompt(
        self, tok: object, context_len: int, prompt_id: int, seed: int, model: dict, max_new_tokens: int
    ) -> Prompt:
        assert Path(model["path"], "config.json").is_file() and model["index_topk"] == 2048
        ids = [1, 1000 + prompt_id] + [7 + (seed % 5)] * (context_len - 2)
        expected = standin.fake_output(ids, min(8, max_new_tokens))
        if prompt_id % 2:
            expected = [t + 1 for t in expected]
        return Prompt(ids, expected)


@pytest.fixture
def answered(monkeypatch: pytest.MonkeyPatch) -> Answered:
    w = Answered()
    monkeypatch.setitem(workload._REGISTRY, w.name, w)
    return w


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "outputs.jsonl").read_text().splitlines()]


def _no_probe_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("KIT_PROBE")}


# ---------------------------------------------------------------------------------------------------
# Parameters


def test_cells_are_contexts_times_workloads(tmp_path: Path, answered: Answered) -> None:
    model = make_model(tmp_path, GLM52_CONFIG)
    p = sp.validate(run_params(model, context_len=[4096, 65536], workload=["records", "answered"]))
    assert [c.tag for c in p.cells] == [
        "ctx4096-records",
        "ctx4096-answered",
        "ctx65536-records",
        "ctx65536-answered",
    ]
    one = sp.validate(run_params(model, context_len=[4096], workload=["records"]))
    assert one.context_len == 4096 and one.workload == "records"  # one cell: plain values


@pytest.mark.parametrize(
    "kw,param,match",
    [
        ({"context_len": [4096, 4096]}, "context_len", "twice"),
        ({"context_len": [4096, 2_000_000]}, "context_len", "out of range"),
        ({"workload": "no-such"}, "workload", "unknown workload 'no-such'"),
        ({"concurrency": 3}, "concurrency", "out of range"),  # more than num_requests
        ({"concurrency": 2, "extra_args": ["--cuda-graph-max-bs", "1"]}, "extra_args", "below concurrency"),
        ({"concurrency": 2, "extra_args": ["--cuda-graph-bs", "1"]}, "extra_args", "below concurrency"),
        ({"concurrency": 2, "extra_args": ["--max-running-requests=1"]}, "extra_args", "below concurrency"),
        ({"context_len": [4096, 65536], "extra_args": ["--context-length=8192"]}, "extra_args", "65600"),
        ({"extra_args": ["--cuda-graph-max-bs", "two"]}, "extra_args", "integer"),
        ({"target_topk": "first"}, "target_topk", "use one of"),
    ],
)
def test_refuses_cells_that_cannot_run(tmp_path: Path, kw: dict, param: str, match: str) -> None:
    with pytest.raises(UsageError, match=match) as info:
        sp.validate(run_params(make_model(tmp_path, GLM52_CONFIG), **kw))
    assert info.value.param == param


def test_capacity_flags_that_fit_pass(tmp_path: Path) -> None:
    model = make_model(tmp_path, GLM52_CONFIG)
    extra = ["--cuda-graph-max-bs=2", "--max-running-requests=2", "--context-length=131072"]
    sp.validate(run_params(model, concurrency=2, extra_args=extra))
    # without CUDA graphs the graph batch sizes do not matter
    sp.validate(run_params(model, concurrency=2, cuda_graph=False, extra_args=["--cuda-graph-max-bs", "1"]))


# ---------------------------------------------------------------------------------------------------
# Workloads


def test_workload_registry_and_rows(tmp_path: Path, answered: Answered) -> None:
    assert get_workload("records").name == "records" and "answered" in workload.workload_names()
    with pytest.raises(ValueError, match="already registered"):
        workload.register(Answered(version="other"))
    model = make_model(tmp_path, GLM52_CONFIG)
    p = sp.validate(
        run_params(model, workload="answered", max_new_tokens=8, num_requests=3, warmup_requests=0)
    ).for_cell(sp.Cell(4096, "answered"))
    with standin.StandIn() as s:
        facts = run_cell(SglangClient(s.port, timeout_s=10), p, FakeTokenizer(), tmp_path / "o.jsonl", {})
    rows = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [r["prompt_id"] for r in rows] == [0, 1, 2]
    assert all(r["workload"] == "answered" and r["input_len"] == 4096 for r in rows)
    assert [r["correct"] for r in rows] == [True, False, True]
    assert rows[0]["expected_ids"] == rows[0]["output_ids"]
    assert facts["correct"] == 2 and facts["judged"] == 3


def test_records_rows_carry_the_workload_and_no_expectation(tmp_path: Path) -> None:
    model = make_model(tmp_path, GLM52_CONFIG)
    p = sp.validate(run_params(model, num_requests=1)).for_cell(sp.Cell(4096, "records"))
    with standin.StandIn() as s:
        facts = run_cell(SglangClient(s.port, timeout_s=10), p, FakeTokenizer(), tmp_path / "o.jsonl", {})
    (row,) = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert row["workload"] == "records" and "expected_ids" not in row and "correct" not in row
    assert "correct" not in facts


def test_a_prompt_of_the_wrong_length_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    short = Answered(name="short")
    monkeypatch.setattr(Answered, "prompt", lambda self, tok, n, i, seed, model, new: Prompt([1, 2, 3]))
    monkeypatch.setitem(workload._REGISTRY, "short", short)
    p = sp.validate(run_params(make_model(tmp_path, GLM52_CONFIG), workload="short")).for_cell(
        sp.Cell(4096, "short")
    )
    with pytest.raises(KitError, match="returned 3 input ids for prompt 0, not context_len 4096"):
        sglang_requests.make_prompt(FakeTokenizer(), p, 0)


def test_matches_expected_over_the_generated_length() -> None:
    assert workload.matches_expected([1, 2, 3], [1, 2, 3, 4])  # judged on what was generated
    assert workload.matches_expected([1, 2, 3, 9], [1, 2, 3])  # tokens past a shorter answer are free
    assert not workload.matches_expected([1, 2, 4], [1, 2, 3])
    assert not workload.matches_expected([], [1])


# ---------------------------------------------------------------------------------------------------
# Requests in flight at once


def test_concurrency_writes_rows_in_prompt_order(tmp_path: Path, answered: Answered) -> None:
    """Prompt 0 answers last (0.5 s), prompts 1-3 at once on the second thread: the rows still come out
    0, 1, 2, 3, and two requests were in flight together."""
    model = make_model(tmp_path, GLM52_CONFIG)
    p = sp.validate(
        run_params(model, workload="answered", num_requests=4, concurrency=2, warmup_requests=0)
    ).for_cell(sp.Cell(4096, "answered"))
    with standin.StandIn(delay=lambda ids: 0.5 if ids[1] == 1000 else 0.0) as s:
        run_cell(SglangClient(s.port, timeout_s=10), p, FakeTokenizer(), tmp_path / "o.jsonl", {})
        calls = s.calls
    rows = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [r["prompt_id"] for r in rows] == [0, 1, 2, 3]
    assert max(c["in_flight"] for c in calls) == 2
    assert not any(c["stream"] for c in calls)  # nothing profiled: nothing streamed


def test_concurrency_window_waits_for_the_request_beside_it(tmp_path: Path) -> None:
    """The profiled prompt and the one in flight beside it are streamed; the window opens only once both
    decode (so its rounds run at batch 2), and the rest go plain."""
    model = make_model(tmp_path, GLM52_CONFIG)
    p = sp.validate(
        run_params(model, num_requests=3, concurrency=2, profile=True, cuda_graph=False)
    ).for_cell(sp.Cell(4096, "records"))
    window: dict = {}
    with standin.StandIn() as s:
        facts = run_cell(SglangClient(s.port, timeout_s=10), p, FakeTokenizer(), tmp_path / "o.jsonl", window)
        calls = s.calls
    gens = [c for c in calls if c["endpoint"] == "/generate" and c["input_len"] == 4096]
    assert [c["stream"] for c in gens] == [True, True, False]
    start = next(i for i, c in enumerate(calls) if c["endpoint"] == "/start_profile")
    assert sum(c["endpoint"] == "/generate" and c["input_len"] == 4096 for c in calls[:start]) == 2
    assert window is facts["profile_window"] and window["opened"] and window["at_chunk"] >= 2
    assert window["companion_chunks"]["1"] >= 1
    assert [
        r["prompt_id"] for r in [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    ] == [
        0,
        1,
        2,
    ]


# ---------------------------------------------------------------------------------------------------
# One server, several cells


def test_several_cells_share_one_server_standin(tmp_path: Path, answered: Answered) -> None:
    model = make_model(tmp_path, GLM52_CONFIG)
    record = tmp_path / "calls.jsonl"
    res = launch.run_server(
        run_params(model, context_len=[4096, 8192], workload=["records", "answered"]),
        tmp_path / "runs",
        "b",
        run_id="x",
        tokenizer=FakeTokenizer(),
        server_cmd_factory=lambda port: standin.command(port, record=record),
    )
    runs = tmp_path / "runs" / "b"
    assert res.server_dir == runs / "x-server" and res.failed == {}
    assert [d.name for d in res.cell_dirs] == [
        "x-ctx4096-records",
        "x-ctx4096-answered",
        "x-ctx8192-records",
        "x-ctx8192-answered",
    ]
    server = RunDir(res.server_dir)
    for f in (server.server_log, server.plan, server.preflight, server.provenance):
        assert f.is_file() and not f.is_symlink(), f
    assert not server.params.exists()  # a server folder is not a run: stages never pick it up
    log = server.server_log.read_text()
    assert log.count("[stand-in] pid ") == 1  # one server for all four cells
    calls = [json.loads(x) for x in record.read_text().splitlines()]
    assert [c["input_len"] for c in calls] == [256, 4096, 4096] * 2 + [256, 8192, 8192] * 2
    for k, d in enumerate(res.cell_dirs):
        rd = RunDir(d)
        params = rd.read_params()
        ctx, wl = (4096, 8192)[k // 2], ("records", "answered")[k % 2]
        assert (params["context_len"], params["workload"], params["cell_index"]) == (ctx, wl, k)
        assert params["server_dir"] == "../x-server" and rd.server().path == server.path
        assert params["profile_window_ordinal"] is None  # not profiled
        assert rd.server_log.is_symlink() and rd.server_log.read_text() == log
        assert os.readlink(rd.server_log) == "../x-server/server.log"
        plan = json.loads(rd.plan.read_text())
        assert plan["run_dir"] == str(d) and plan["server_dir"] == str(server.path)
        assert {r["body"]["input_ids"].split()[0] for r in plan["requests"]} == {"<256", f"<{ctx}"}
        rows = _rows(d)
        assert [r["workload"] for r in rows] == [wl, wl] and all(r["input_len"] == ctx for r in rows)
        assert ("correct" in rows[0]) == (wl == "answered")
        prov = json.loads(rd.provenance.read_text())
        assert prov["run"]["cell_index"] == k and prov["run"]["cell_s"] > 0
        assert prov["run"]["left_running"] == [] and not rd.failed()
    summary = json.loads(server.provenance.read_text())
    assert [c["status"] for c in summary["cells"]] == ["done"] * 4
    assert summary["run"]["startup_s"] > 0


def test_a_server_dying_between_cells_fails_the_rest_standin(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The stand-in exits after the first cell's three requests: the second cell fails on its first
    request (or, when the exit is seen first, never starts), the third never runs; each says why, the
    first stays complete, nothing is overwritten."""
    model = make_model(tmp_path, GLM52_CONFIG)
    with pytest.raises(KitError, match="2 of 3 cells failed"):
        launch.run_arm(
            run_params(model, context_len=[4096, 8192, 16384]),
            tmp_path / "runs",
            "b",
            run_id="d",
            tokenizer=FakeTokenizer(),
            server_cmd_factory=lambda port: standin.command(port, die_after=3),
        )
    runs = tmp_path / "runs" / "b"
    first, second, third, server = (
        runs / n for n in ("d-ctx4096-records", "d-ctx8192-records", "d-ctx16384-records", "d-server")
    )
    assert RunDir(first).provenance.is_file() and not RunDir(first).failed() and len(_rows(first)) == 2
    err2 = json.loads((second / "error.json").read_text())
    assert err2["stage"] == "sglang_run" and "dying after 3 /generate calls" in err2["log_tail"]
    err3 = json.loads((third / "error.json").read_text())
    assert "d-ctx16384-records did not run: the server" in err3["message"]
    assert "d-ctx8192-records" in err3["message"]  # the cell during which it went
    assert not (third / "outputs.jsonl").exists() and (third / "params.json").is_file()
    assert json.loads((server / "error.json").read_text())["stage"] == "sglang_run"
    for d in (first, second, third, server):
        assert len(list(d.glob("error*.json"))) == (0 if d == first else 1), d
    summary = json.loads((server / "provenance.json").read_text())
    statuses = [c["status"] for c in summary["cells"]]
    assert statuses[0] == "done" and statuses[1] in ("failed", "not run") and statuses[2] == "not run"
    assert summary["run"]["left_running"] == []


def test_ctrl_c_in_a_cell_keeps_the_finished_ones_standin(tmp_path: Path) -> None:
    model = make_model(tmp_path, GLM52_CONFIG)
    count = FakeTokenizer()  # the tokenizer calls one cell makes: its warm-up and two prompts
    for n, i in ((256, -1), (4096, 0), (4096, 1)):
        prompt_ids(count, n, i)
    with pytest.raises(KeyboardInterrupt):
        launch.run_server(
            run_params(model, context_len=[4096, 8192, 16384]),
            tmp_path / "runs",
            "b",
            run_id="i",
            tokenizer=FakeTokenizer(interrupt_after=count.calls + 2),  # Ctrl-C in the second cell
            server_cmd_factory=lambda port: standin.command(port),
        )
    runs = tmp_path / "runs" / "b"
    assert not RunDir(runs / "i-ctx4096-records").failed()
    assert RunDir(runs / "i-ctx4096-records").provenance.is_file()
    assert json.loads((runs / "i-ctx8192-records/error.json").read_text())["error"] == "KeyboardInterrupt"
    assert "did not run" in json.loads((runs / "i-ctx16384-records/error.json").read_text())["message"]
    assert json.loads((runs / "i-server/error.json").read_text())["error"] == "KeyboardInterrupt"
    log = (runs / "i-server/server.log").read_text()
    assert group_gone(int(log.split("[stand-in] pid ")[1].split()[0]))


def test_existing_cell_dir_refuses_the_whole_run(tmp_path: Path) -> None:
    model = make_model(tmp_path, GLM52_CONFIG)
    (tmp_path / "runs/b/e-ctx8192-records").mkdir(parents=True)
    with pytest.raises(KitError, match="already exists"):
        launch.run_server(
            run_params(model, context_len=[4096, 8192]),
            tmp_path / "runs",
            "b",
            run_id="e",
            tokenizer=FakeTokenizer(),
            server_cmd_factory=lambda port: standin.command(port),
        )
    assert sorted(p.name for p in (tmp_path / "runs/b").iterdir()) == ["e-ctx8192-records"]


def test_cli_runs_cells_and_prints_each_run_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = make_model(tmp_path, GLM52_CONFIG)
    real = launch.run_server

    def with_standin(params: dict, *a: object, **k: object) -> launch.ServerRun:
        return real(params, *a, tokenizer=FakeTokenizer(), server_cmd_factory=standin.command)

    monkeypatch.setattr(launch, "run_server", with_standin)
    argv = ["run", "--backend", "sglang", "--arm", "bug", "--model-path", str(model), "--no-profile"]
    argv += ["--context-len", "4096,8192", "--num-requests", "1", "--max-new-tokens", "16"]
    argv += ["--out", str(tmp_path / "runs"), "--batch", "c", "--run-id", "cli"]
    assert kit_main(argv) == 0
    out = capsys.readouterr().out.split()
    assert out == [str(tmp_path / "runs/c/cli-ctx4096-records"), str(tmp_path / "runs/c/cli-ctx8192-records")]
    assert kit_main(["run", "--arm", "bug", "--context-len", "4096,8192"]) == 2  # mini: one context
    assert "need --backend sglang" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------
# Profiled cells: one report, one window per cell, the analysis finds the cell's own


def _three_window_report(path: Path, rounds: tuple[int, ...] = (3, 4, 5)) -> Path:
    """An eager report like a several-cell server's: per cell a warm-up round outside any window (1
    indexer launch), then a window (start mark, its rounds with 4 launches each, end marks)."""
    r = SynthReport(path)
    g = gtid(7000)
    for n in rounds:
        _round(r, g, 1)
        r.pop(r.push(g, WINDOW_START))
        for _ in range(n):
            _round(r, g, 4)
        r.pop(r.push(g, WINDOW_END))
        r.pop(r.push(g, WINDOW_END))  # /stop_profile's no-op call after sglang stopped by itself
    return r.write()


def test_profiled_cells_share_one_report_and_each_analyses_its_window_standin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = make_model(tmp_path, GLM52_CONFIG)
    runs = tmp_path / "runs"
    report = _three_window_report(tmp_path / "report.sqlite")

    def fake_export(nsys: object, rep: Path, out: Path) -> Path:
        assert rep.read_text().startswith("report written after the app exited")
        shutil.copy(report, out)
        return out

    monkeypatch.setattr(launch.capture, "export_sqlite", fake_export)
    monkeypatch.setattr(launch, "server_env", lambda *a, **k: {})  # the stand-in is no sglang to probe
    record = tmp_path / "calls.jsonl"

    def factory(port: int) -> list[str]:
        app = standin.command(port, record=record) + ["-m", "sglang.launch_server"]
        return standin.fake_nsys_command(runs / "w" / "p-server" / "profile.nsys-rep", app)

    res = launch.run_server(
        run_params(
            model, context_len=[4096, 8192, 16384], profile=True, cuda_graph=False, target_topk="last"
        ),
        runs,
        "w",
        run_id="p",
        tokenizer=FakeTokenizer(),
        server_cmd_factory=factory,
    )
    assert res.failed == {}
    calls = [json.loads(x) for x in record.read_text().splitlines()]
    assert [c["endpoint"] for c in calls].count("/start_profile") == 3
    server_plan = json.loads((res.server_dir / "plan.json").read_text())
    assert [c["profile_window"] for c in server_plan["cells"]] == [1, 2, 3]
    assert server_plan["target_topk"] == "last" and "CONTROL RUN" in server_plan["warnings"][0]
    # the stand-in runs no probe: the log never shows the override applied, and the cells say so
    assert json.loads((res.server_dir / "provenance.json").read_text())["run"]["target_topk_applied"] == 0
    for k, d in enumerate(res.cell_dirs):
        rd = RunDir(d)
        params = rd.read_params()
        assert params["profile_window_ordinal"] == k + 1 and params["target_topk"] == "last"
        assert rd.nsys_sqlite.is_symlink() and rd.nsys_rep.is_symlink()
        plan = json.loads(rd.plan.read_text())
        assert plan["profile_window"] == k + 1 and plan["target_topk"] == "last"
        assert any("CONTROL RUN" in w for w in plan["warnings"])
        cell_warnings = json.loads(rd.provenance.read_text())["warnings"]
        assert any("CONTROL RUN" in w for w in cell_warnings)
        assert any("never shows the override applied" in w for w in cell_warnings)
        verdict = analyze(d)  # through the links: the server's one report, only this cell's window
        assert verdict["num_rounds"] == (3, 4, 5)[k] and set(verdict["launches_per_round"]) == {4}
        assert any(f"window {k + 1} of its server's report" in w for w in verdict["warnings"])
        assert any("CONTROL RUN, target_topk=last" in w for w in verdict["warnings"])
        assert (d / "verdict.json").is_file() and not (res.server_dir / "verdict.json").exists()


def test_a_window_the_report_lacks_is_an_error(tmp_path: Path) -> None:
    server = tmp_path / "srv"
    server.mkdir()
    _three_window_report(server / "profile.sqlite", rounds=(2, 2))
    cell = tmp_path / "cell"
    cell.mkdir()
    (cell / "params.json").write_text(
        json.dumps(
            {
                "arm": "bug",
                "num_steps": 5,
                "context_len": 4096,
                "backend": "sglang",
                "server_dir": "../srv",
                "profile_window_ordinal": 3,
            }
        )
    )
    RunDir(cell).link_server_files(RunDir(server))
    with pytest.raises(TraceError, match="opened profile window 3, but the report marks 2"):
        analyze(cell)


def test_a_one_cell_report_keeps_everything_from_the_first_start(tmp_path: Path) -> None:
    """No window ordinal (a run alone on its server): as before, rounds from the first start mark on."""
    run = tmp_path / "run"
    run.mkdir()
    _three_window_report(run / "profile.sqlite", rounds=(2, 3))
    (run / "params.json").write_text(json.dumps({"arm": "bug", "num_steps": 5, "context_len": 4096}))
    verdict = analyze(run)
    assert verdict["num_rounds"] == 2 + 1 + 3  # the second warm-up round sits between the windows
    assert verdict["observed_counts"] == {"1": 1, "4": 5}


# ---------------------------------------------------------------------------------------------------
# Plans


def test_plan_of_several_cells(tmp_path: Path) -> None:
    model = make_model(tmp_path, GLM52_CONFIG)
    out = plan(
        run_params(model, context_len=[4096, 65536], profile=True, concurrency=2, num_requests=4),
        tmp_path / "runs",
        "b",
    )["arms"]["bug"]
    assert out["run_dir"].endswith("b/<RUN_ID:bug>-server")
    assert "--capture-range-end=none" in out["nsys_cmd"]
    assert out["nsys_cmd"][out["nsys_cmd"].index("-o") + 1].endswith("<RUN_ID:bug>-server/profile")
    assert [c["run_dir"].rsplit("/", 1)[1] for c in out["cells"]] == [
        "<RUN_ID:bug>-ctx4096-records",
        "<RUN_ID:bug>-ctx65536-records",
    ]
    assert [c["profile_window"] for c in out["cells"]] == [1, 2] and out["cells"][0]["concurrency"] == 2
    streams = [r["body"]["stream"] for r in out["cells"][1]["requests"] if r["endpoint"] == "/generate"]
    assert streams == [False, True, True, False, False]  # warm-up, profiled, in flight beside it, rest
    one = plan(run_params(model, profile=True), tmp_path / "runs", "b")["arms"]["bug"]
    assert "--capture-range-end=stop" in one["nsys_cmd"] and "cells" not in one


def test_control_plan_sets_the_probe_even_without_profiling(tmp_path: Path) -> None:
    model = make_model(tmp_path, GLM52_CONFIG)
    out = plan(run_params(model, target_topk="last"), tmp_path / "runs")["arms"]["bug"]
    assert out["env"][ENV_TARGET_TOPK] == "last" and out["env"]["KIT_PROBE_SINK"] == "off"
    assert out["target_topk"] == "last" and any("CONTROL RUN" in w for w in out["warnings"])
    plain = plan(run_params(model), tmp_path / "runs")["arms"]["bug"]
    assert "KIT_PROBE" not in plain["env"] and "target_topk" not in plain


# ---------------------------------------------------------------------------------------------------
# What a second cell costs against a second server start (stand-in; printed with -s)


def test_second_cell_costs_less_than_a_second_server_standin(tmp_path: Path) -> None:
    model = make_model(tmp_path, GLM52_CONFIG)

    def timed(run_id: str, contexts: list[int]) -> tuple[float, launch.ServerRun]:
        t0 = time.monotonic()
        res = launch.run_server(
            run_params(model, context_len=contexts if len(contexts) > 1 else contexts[0]),
            tmp_path / "runs",
            "m",
            run_id=run_id,
            tokenizer=FakeTokenizer(),
            server_cmd_factory=standin.command,
        )
        return time.monotonic() - t0, res

    t_one, one = timed("one", [4096])
    t_three, three = timed("three", [4096, 8192, 16384])
    prov = json.loads((one.cell_dirs[0] / "provenance.json").read_text())["run"]
    cells_s = [json.loads((d / "provenance.json").read_text())["run"]["cell_s"] for d in three.cell_dirs]
    extra = (t_three - t_one) / 2
    print(
        f"\nstand-in: one cell {t_one:.2f} s wall (start-up {prov['startup_s']:.2f} s, "
        f"cell {prov['cell_s']:.2f} s, whole server {prov['wall_s']:.2f} s); "
        f"three cells {t_three:.2f} s wall, cells {cells_s}; "
        f"each extra cell {extra:.2f} s vs a server {t_one:.2f} s"
    )
    assert extra < t_one


def test_preflight_checks_the_override_targets_of_a_control_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Profiled or not, a control run needs the override's targets; a plain run does not."""
    from fake_sglang_helpers import make_fake_sglang

    from kit.backends.sglang.preflight import preflight
    from kit.errors import ProbeTargetError

    model = make_model(tmp_path, GLM52_CONFIG)
    tree = {"ok": make_fake_sglang(tmp_path / "ok") / "sglang"}
    tree["bad"] = make_fake_sglang(tmp_path / "bad", drop=("Indexer._get_topk_paged",)) / "sglang"
    which = {"tree": "ok"}
    monkeypatch.setattr("kit.sglang_src.source.installed_sglang_dir", lambda py=None: tree[which["tree"]])
    monkeypatch.setattr("kit.sglang_src.verify.detect_state", lambda pkg: {"state": "bug", "carrier": None})
    control = sp.validate(run_params(model, target_topk="last"))
    pre = preflight(control, "off")
    assert (
        all(v["status"] == "found" for v in pre["override_check"].values())
        and len(pre["override_check"]) == 3
    )
    which["tree"] = "bad"
    with pytest.raises(ProbeTargetError, match="target_topk=last: .*Indexer._get_topk_paged") as info:
        preflight(control, "off")
    assert info.value.missing == ["sglang.srt.layers.attention.dsa.dsa_indexer:Indexer._get_topk_paged"]
    assert "override_check" not in preflight(sp.validate(run_params(model)), "off")  # not a control run


def test_a_follower_node_only_serves_standin(tmp_path: Path) -> None:
    """node_rank > 0 with several cells: node 0 runs the cells; this node keeps just the server folder."""
    model = make_model(tmp_path, GLM52_CONFIG)
    res = launch.run_server(
        run_params(model, context_len=[4096, 8192], nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:5000"),
        tmp_path / "runs",
        "b",
        run_id="f",
        tokenizer=None,
        server_cmd_factory=lambda port: standin.command(port, mode="die"),  # the server exits at once
    )
    assert res.cell_dirs == [] and res.failed == {}
    assert sorted(p.name for p in (tmp_path / "runs/b").iterdir()) == ["f-server"]
    plan_ = json.loads((res.server_dir / "plan.json").read_text())
    assert [c["requests"] for c in plan_["cells"]] == [[], []]
    assert json.loads((res.server_dir / "provenance.json").read_text())["run"]["exit_code"] == 1


def test_torch_profiler_cells_each_get_their_own_kineto_trace_standin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """profiler torch: no nsys around the server; each cell's window asks sglang's own PyTorch profiler
    (CPU + GPU) to write into the cell's torch_traces/, rank 0's trace becomes the cell's
    profile.trace.json.gz, and `kit analyze` judges the cell from it (the stand-in writes a bug-arm trace
    with CUDA-graph replays: 4 launches per round, by the replay method)."""
    model = make_model(tmp_path, GLM52_CONFIG)
    monkeypatch.setattr(launch, "server_env", lambda *a, **k: {})  # the stand-in is no sglang to probe
    record = tmp_path / "calls.jsonl"
    res = launch.run_server(
        run_params(model, context_len=[4096, 8192], profile=True, profiler="torch"),
        tmp_path / "runs",
        "t",
        run_id="k",
        tokenizer=FakeTokenizer(),
        server_cmd_factory=lambda port: standin.command(port, record=record),
    )
    assert res.failed == {} and len(res.cell_dirs) == 2
    starts = [json.loads(x) for x in record.read_text().splitlines()]
    starts = [c["body"] for c in starts if c["endpoint"] == "/start_profile"]
    assert [b["activities"] for b in starts] == [["CPU", "GPU"]] * 2
    plan = json.loads((res.server_dir / "plan.json").read_text())
    assert plan["nsys_cmd"] is None and "nsys" not in " ".join(plan["server_cmd"])
    for d, body in zip(res.cell_dirs, starts, strict=True):
        rd = RunDir(d)
        assert body["output_dir"] == str(rd.torch_traces)
        assert rd.kineto.is_file() and [f.name.split("-", 1)[1] for f in rd.torch_traces.iterdir()] == [
            "TP-1.trace.json.gz"
        ]
        prov = json.loads(rd.provenance.read_text())
        assert prov["profiler"] == "torch" and prov["measured_under_nsight"] is False
        assert prov["run"]["kineto"]["trace"] == "profile.trace.json.gz"
        assert any("PyTorch profiler" in w for w in prov["warnings"])
        verdict = analyze(d)
        assert verdict["source"] == "kineto" and verdict["method"] == "replay"
        assert verdict["status"] == "pass" and verdict["launches_per_round"] == [4] * 3


def test_torch_profiler_needs_a_profiled_run(tmp_path: Path) -> None:
    from kit.backends.sglang.params import validate

    model = make_model(tmp_path, GLM52_CONFIG)
    with pytest.raises(UsageError, match="profiler=torch needs profile on"):
        validate(run_params(model, profile=False, profiler="torch"))
    with pytest.raises(UsageError, match="profiler='perfetto': use nsys or torch"):
        validate(run_params(model, profile=True, profiler="perfetto"))
    p = validate(run_params(model, profile=True, profiler="torch", cuda_graph=True))
    assert p.profile_from == "window"  # the capture start is an nsys matter
