"""The real-sglang launcher without a GPU: parameters and refusals, the HTTP client, health wait, capture
window and workload against a stand-in server (`standin` tests), process clean-up, the state guard on real
wheels (network), the git-checkout patch helper, and the noise-floor comparison."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest
import sglang_standin_helpers as standin
from sglang_run_helpers import (
    DSV32_CONFIG,
    GLM52_CONFIG,
    FakeTokenizer,
    group_gone,
    make_model,
    patched_wheel_once,
    run_on_standin,
    run_params,
)

from kit.backends.sglang import launch, ports, preflight
from kit.backends.sglang import params as sp
from kit.backends.sglang.cells import stop_window
from kit.backends.sglang.http import SglangClient, wait_healthy
from kit.backends.sglang.plan import server_cmd
from kit.backends.sglang.workload import (
    WARMUP_INPUT_LEN,
    generate_body,
    ids_sha256,
    output_logprobs,
    prompt_ids,
)
from kit.compare.noise import compare_with_noise, token_match
from kit.errors import BuildStateError, HttpError, InputError, KitError, ServerError, UsageError
from kit.sglang_src.checkout import patch_git_checkout
from kit.sglang_src.releases import PR_CARRIER

# ---------------------------------------------------------------------------------------------------
# Parameters and refusals


def test_refuses_a_model_without_dsa(tmp_path: Path) -> None:
    model = make_model(tmp_path, {"architectures": ["LlamaForCausalLM"], "num_nextn_predict_layers": 1})
    with pytest.raises(KitError, match="not a DSA model"):
        sp.validate(run_params(model))


def test_feature_override_follows_config_and_arm(tmp_path: Path) -> None:
    glm = sp.validate(run_params(make_model(tmp_path, GLM52_CONFIG, "glm")))
    dsv = sp.validate(run_params(make_model(tmp_path, DSV32_CONFIG, "dsv")))
    assert sp.feature_override(glm, "fix") == {}  # GLM-5.2 sets it in config.json
    assert sp.feature_override(glm, "off") == {sp.FEATURE: False}
    assert sp.feature_override(dsv, "bug") == {sp.FEATURE: True}
    cmd = server_cmd(dsv, "bug", 1234, "python")
    i = cmd.index("--json-model-override-args")
    assert json.loads(cmd[i + 1]) == {sp.FEATURE: True}
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and "--disable-cuda-graph" not in cmd


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--tp-size", "8"], "set by the kit"),
        (["--port=1"], "set by the kit"),
        (["--enable-multi-layer-eagle"], "MultiLayerEagleWorkerV2"),
        (["--json-model-override-args", "{}"], "set by the kit"),
    ],
)
def test_refuses_owned_or_unprobed_extra_args(tmp_path: Path, extra: list, match: str) -> None:
    with pytest.raises(KitError, match=match):
        sp.validate(run_params(make_model(tmp_path, GLM52_CONFIG), extra_args=extra))


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"eagle_topk": 2}, "topk 1"),
        ({"num_draft_tokens": 4}, "num_steps \\+ 1"),
        ({"profile": True, "profile_skip": 8, "profile_steps": 8}, "outlast the request"),
        ({"nnodes": 2}, "dist_init_addr"),
        ({"context_len": 2_000_000}, "out of range"),
        ({"model_overrides": {sp.FEATURE: True}}, "set by the arm"),
        ({"arm": "maybe"}, "unknown arm"),
        ({"device": "cpu"}, "runs on CUDA"),
        ({"preset": "tiny"}, "unknown sglang-backend parameter"),
        ({"port": 60475}, r"port=60475 is out of range \(1024..55535\)"),  # sglang would add 10000
    ],
)
def test_refuses_bad_parameters(tmp_path: Path, kw: dict, match: str) -> None:
    with pytest.raises(KitError, match=match):
        sp.validate(run_params(make_model(tmp_path, GLM52_CONFIG), **kw))


def test_refusals_are_typed(tmp_path: Path) -> None:
    """Callers branch on the error's kind and fields, never on its text."""
    with pytest.raises(UsageError) as info:
        sp.validate(run_params(make_model(tmp_path, GLM52_CONFIG), eagle_topk=2))
    assert info.value.param == "eagle_topk"
    with pytest.raises(InputError):
        sp.validate(run_params(tmp_path / "no-model"))
    with pytest.raises(ServerError) as dead:
        port = ports.lease(1).ports[0]
        wait_healthy(SglangClient(port), alive=lambda: False, timeout_s=1, log=tmp_path / "server.log")
    assert dead.value.log == tmp_path / "server.log"


@pytest.mark.parametrize(
    "arm,state,carrier,ok",
    [
        ("bug", "bug", "ForwardBatch.topk_indices", True),
        ("fix", "fix", PR_CARRIER, True),
        ("upstream", "fix", "EagleDraftInput.dsa_topk_indices", True),
        ("off", "absent", None, True),
        ("off", "fix", PR_CARRIER, True),
        ("fix", "bug", "ForwardBatch.topk_indices", False),
        ("fix", "fix", "EagleDraftInput.dsa_topk_indices", False),  # fixed, but upstream's naming
        ("upstream", "fix", PR_CARRIER, False),  # the kit's patch is the `fix` arm
        ("bug", "fix", PR_CARRIER, False),
        ("off", "unknown", None, False),
    ],
)
def test_state_guard_table(arm: str, state: str, carrier: str | None, ok: bool) -> None:
    """The arm/state/carrier rules, without wheels: the network test below checks them on real builds."""
    found = {"state": state, "carrier": carrier, "version": "x", "reasons": ["r"]}
    if ok:
        preflight.check_state(arm, found, "x")
        return
    with pytest.raises(BuildStateError) as info:
        preflight.check_state(arm, found, "x")
    assert (info.value.arm, info.value.state) == (arm, state)


def test_short_context_is_flagged(tmp_path: Path) -> None:
    p = sp.validate(run_params(make_model(tmp_path, GLM52_CONFIG), context_len=2048))
    assert any("cannot show the bug" in w for w in sp.warnings_for(p))
    assert not sp.warnings_for(sp.validate(run_params(make_model(tmp_path, GLM52_CONFIG), context_len=2049)))


def test_prompts_have_exact_length_and_are_deterministic() -> None:
    tok = FakeTokenizer()
    a = prompt_ids(tok, 5000, 0)
    assert len(a) == 5000 and a[0] == tok.bos_token_id
    assert a == prompt_ids(FakeTokenizer(), 5000, 0)
    assert ids_sha256(a) != ids_sha256(prompt_ids(tok, 5000, 1))


# ---------------------------------------------------------------------------------------------------
# HTTP client against the in-thread stand-in


def test_output_logprobs_reads_sglangs_lists_and_refuses_misaligned_ones() -> None:
    meta = {
        "output_token_logprobs": [[-0.1, 7, None], [-0.5, 9, None]],
        "output_top_logprobs": [[[-0.1, 7, None], [-2.6, 3, None]], [[-0.5, 9, None], [-0.75, 8, None]]],
    }
    got = output_logprobs(meta, [7, 9])
    assert got["output_logprobs"] == [-0.1, -0.5] and got["output_margins"] == pytest.approx([2.5, 0.25])
    # other tokens than the output (or a different count): positions cannot be trusted, so none
    assert output_logprobs(meta, [7, 8])["output_logprobs"] is None
    assert output_logprobs(meta, [7, 9, 11]) == {"output_logprobs": None, "output_margins": None}
    assert output_logprobs({}, [7, 9]) == {"output_logprobs": None, "output_margins": None}


def test_client_generate_stream_and_window_standin() -> None:
    with standin.StandIn() as s:
        c = SglangClient(s.port, timeout_s=10)
        body = generate_body(list(range(100)), 32, False)
        out = c.generate(body)
        assert out["output_ids"] == standin.fake_output(list(range(100)), 32)
        assert out["meta_info"]["spec_verify_ct"] == 8
        seen = []
        last = c.generate_stream(body, on_chunk=seen.append)
        assert last["output_ids"] == out["output_ids"] and seen == list(range(1, len(seen) + 1))
        assert (
            c.post("/start_profile", {"activities": ["CUDA_PROFILER"], "start_step": 1, "num_steps": 3})
            == "Start profiling.\n"
        )
        assert [x["endpoint"] for x in s.calls] == ["/generate", "/generate", "/start_profile"]


def test_health_wait_polls_until_ready_standin() -> None:
    with standin.StandIn(ready_after_s=0.6) as s:
        waited = wait_healthy(SglangClient(s.port), alive=lambda: True, timeout_s=10, poll_s=0.1)
        assert waited >= 0.5


def test_health_wait_reports_a_dead_server_at_once_standin() -> None:
    with (
        standin.StandIn(ready_after_s=60) as s,
        pytest.raises(KitError, match="exited during start-up.*: boom"),
    ):
        wait_healthy(SglangClient(s.port), alive=lambda: False, timeout_s=60, on_dead=lambda: "boom")


def test_request_timeout_standin() -> None:
    with standin.StandIn(mode="hang") as s, pytest.raises(KitError, match="request timeout"):
        SglangClient(s.port, timeout_s=0.5).generate(generate_body([1, 2, 3], 4, False))


def test_stop_window_reads_http_500_as_closed_by_sglang_standin() -> None:
    """sglang answers /stop_profile with HTTP 500 once a window given num_steps has closed by itself: the
    launcher tells that apart by the error's status, and any other failure still raises."""
    with standin.StandIn(mode="closed") as s:
        client = SglangClient(s.port, timeout_s=10)
        assert "Profiling is not in progress" in stop_window(client)["closed_by_sglang"]
        with pytest.raises(HttpError) as info:
            client.post("/no_such_endpoint", {})
        assert info.value.status == 404 and info.value.url == f"http://127.0.0.1:{s.port}/no_such_endpoint"
    with pytest.raises(HttpError) as info:  # nothing listens any more: no status at all
        stop_window(client)
    assert info.value.status is None


# ---------------------------------------------------------------------------------------------------
# Whole runs against the stand-in as a server process


def test_run_writes_outputs_and_leaves_no_process_standin(tmp_path: Path) -> None:
    model = make_model(tmp_path, GLM52_CONFIG)
    run_dir = run_on_standin(model, tmp_path)
    for name in (
        "params.json",
        "plan.json",
        "preflight.json",
        "server.log",
        "outputs.jsonl",
        "provenance.json",
    ):
        assert (run_dir / name).is_file(), name
    rows = [json.loads(x) for x in (run_dir / "outputs.jsonl").read_text().splitlines()]
    assert [r["prompt_id"] for r in rows] == [0, 1]
    assert all(
        r["input_len"] == 4096 and r["completion_tokens"] == 64 and r["spec_verify_ct"] == 16 for r in rows
    )
    assert rows[0]["accept_length"] == 4.0 and rows[0]["bug_visible"] and not rows[0]["profiled"]
    # the top-2 logprobs the stand-in returned (as sglang does) became per-token logprobs and margins
    assert [len(r["output_logprobs"]) for r in rows] == [64, 64]
    assert rows[0]["output_margins"] == pytest.approx([1.5] * 64)
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert prov["run"]["left_running"] == [] and group_gone(prov["run"]["server_pid"])
    assert "scheduler child pid" in (run_dir / "server.log").read_text()


def _profiled_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, record: Path | None = None, **params: object
) -> tuple[Path, list[str]]:
    """One profiled cell through the real path (run_arm), the stand-in under a fake nsys: the stand-in is no
    sglang to probe, and what the fake nsys writes is no report to export (the export gets it as it is).
    Returns the run directory and each report's text as the export found it."""
    model = make_model(tmp_path, GLM52_CONFIG)
    runs = tmp_path / "runs"
    exported: list[str] = []

    def fake_export(nsys: object, rep: Path, out: Path) -> Path:
        exported.append(rep.read_text())
        out.write_text("")
        return out

    monkeypatch.setattr(launch.capture, "export_sqlite", fake_export)
    monkeypatch.setattr(launch, "server_env", lambda *a, **k: {})

    def factory(port: int) -> list[str]:
        app = standin.command(port, record=record) + ["-m", "sglang.launch_server"]
        return standin.fake_nsys_command(runs / "b" / "r" / "profile.nsys-rep", app)

    run_dir = launch.run_arm(
        run_params(model, profile=True, cuda_graph=False, **params),
        runs,
        "b",
        run_id="r",
        tokenizer=FakeTokenizer(),
        server_cmd_factory=factory,
    )
    return run_dir, exported


def test_profile_window_opens_after_skip_chunks_standin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "calls.jsonl"
    run_dir, _ = _profiled_run(tmp_path, monkeypatch, record, profile_skip=3, profile_steps=5)
    facts = json.loads((run_dir / "provenance.json").read_text())["run"]
    calls = [json.loads(x) for x in record.read_text().splitlines()]
    assert [c["endpoint"] for c in calls] == [
        "/generate",
        "/generate",
        "/start_profile",
        "/stop_profile",
        "/generate",
    ]
    warm, measured, start, stop, other = calls
    assert warm["input_len"] == WARMUP_INPUT_LEN and measured["stream"] and not other["stream"]
    assert start["body"] == {"activities": ["CUDA_PROFILER"], "start_step": 1, "num_steps": 5}
    assert start["streamed"] >= 3 and stop["streamed"] == 16
    assert measured["sampling_params"] == {"temperature": 0.0, "max_new_tokens": 64, "ignore_eos": True}
    assert facts["profile_window"]["opened"] and facts["left_running"] == []
    assert group_gone(facts["server_pid"])
    rows = [json.loads(x) for x in (run_dir / "outputs.jsonl").read_text().splitlines()]
    assert rows[0]["profiled"] and not rows[1]["profiled"]
    assert measured["return_logprob"] and measured["top_logprobs_num"] == 2
    # streamed: the last chunk carries every token's logprobs (sglang's non-incremental streaming)
    assert len(rows[0]["output_logprobs"]) == len(rows[0]["output_ids"]) == 64


def test_profiled_stop_lets_nsys_write_its_report_standin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under nsys the server (found by its sglang.launch_server command line) gets SIGTERM and nsys is left
    to write the report once the app has exited; nsys itself is never killed first."""
    run_dir, exported = _profiled_run(tmp_path, monkeypatch, num_requests=1)
    assert len(exported) == 1 and exported[0].startswith("report written after the app exited")
    assert (run_dir / "profile.nsys-rep").read_text() == exported[0]
    facts = json.loads((run_dir / "provenance.json").read_text())["run"]
    assert facts["left_running"] == [] and group_gone(facts["server_pid"])


def test_server_dying_at_startup_writes_error_with_log_tail_standin(tmp_path: Path) -> None:
    model = make_model(tmp_path, GLM52_CONFIG)
    with pytest.raises(KitError, match="exited during start-up"):
        run_on_standin(model, tmp_path, mode="die", run_id="dies")
    err = json.loads((tmp_path / "runs/b/dies/error.json").read_text())
    assert "CUDA out of memory (stand-in failure)" in err["log_tail"]
    # a death that is not a taken port is not retried (tests/test_ports.py: one that is)
    assert not (tmp_path / "runs/b/dies/attempt-1-server.log").exists()
    log = (tmp_path / "runs/b/dies/server.log").read_text()
    server = int(log.split("[stand-in] pid ")[1].split()[0])
    child = int(log.split("scheduler child pid ")[1].split()[0])
    assert group_gone(server)
    with pytest.raises(ProcessLookupError):  # the orphaned "scheduler" was found through the session
        os.kill(child, 0)


def test_busy_port_is_refused_before_anything_is_created_standin(tmp_path: Path) -> None:
    model = make_model(tmp_path, GLM52_CONFIG)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports.lease(1).ports[0]))  # port 0 may be above what sglang accepts
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(KitError, match="already in use"):
            launch.run_arm(
                run_params(model, port=port),
                tmp_path / "runs",
                "b",
                tokenizer=FakeTokenizer(),
                server_cmd_factory=lambda p: standin.command(p),
            )
    assert not (tmp_path / "runs").exists()


def test_request_timeout_stops_the_server_standin(tmp_path: Path) -> None:
    model = make_model(tmp_path, GLM52_CONFIG)
    with pytest.raises(KitError, match="request timeout"):
        launch.run_arm(
            run_params(model, request_timeout_s=1.0),
            tmp_path / "runs",
            "b",
            run_id="hang",
            tokenizer=FakeTokenizer(),
            server_cmd_factory=lambda p: standin.command(p, mode="hang"),
        )
    err = json.loads((tmp_path / "runs/b/hang/error.json").read_text())
    assert err["stage"] == "sglang_run"
    plan = json.loads((tmp_path / "runs/b/hang/plan.json").read_text())
    assert plan["arm"] == "bug"
    log = (tmp_path / "runs/b/hang/server.log").read_text()
    pid = int(log.split("[stand-in] pid ")[1].split()[0])
    assert group_gone(pid)


def test_ctrl_c_stops_everything_standin(tmp_path: Path) -> None:
    model = make_model(tmp_path, GLM52_CONFIG)
    with pytest.raises(KeyboardInterrupt):
        launch.run_arm(
            run_params(model),
            tmp_path / "runs",
            "b",
            run_id="int",
            tokenizer=FakeTokenizer(interrupt_after=2),
            server_cmd_factory=lambda p: standin.command(p),
        )
    err = json.loads((tmp_path / "runs/b/int/error.json").read_text())
    assert err["error"] == "KeyboardInterrupt"
    pid = int((tmp_path / "runs/b/int/server.log").read_text().split("[stand-in] pid ")[1].split()[0])
    assert group_gone(pid)


def test_server_ignoring_sigterm_is_killed_standin(tmp_path: Path) -> None:
    model = make_model(tmp_path, GLM52_CONFIG)
    run_dir = launch.run_arm(
        run_params(model, num_requests=1, shutdown_timeout_s=1.0),
        tmp_path / "runs",
        "b",
        tokenizer=FakeTokenizer(),
        server_cmd_factory=lambda p: standin.command(p, mode="stubborn"),
    )
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert prov["run"]["left_running"] == [] and group_gone(prov["run"]["server_pid"])


# ---------------------------------------------------------------------------------------------------
# State guard and the git-checkout helper, on the real wheels


@pytest.fixture(scope="session")
def patched_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return patched_wheel_once(tmp_path_factory)


def _unpack(wheel: Path, dest: Path) -> Path:
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(dest, [n for n in zf.namelist() if n.startswith(("sglang/", "sglang-"))])
    return dest


def _python_with(tmp: Path, site: Path) -> str:
    """An 'sglang env' interpreter: this Python with an unpacked wheel on its path."""
    py = tmp / "python-sglang-env"
    py.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    py.chmod(0o755)
    return str(py)


@pytest.mark.network
def test_state_guard_refuses_the_wrong_build(tmp_path: Path, patched_wheel: Path) -> None:
    from kit.sglang_src.verify import detect_state
    from kit.sglang_src.wheels import fetch_wheel

    bug, fix, up = (
        detect_state(fetch_wheel("0.5.14")),
        detect_state(patched_wheel),
        detect_state(fetch_wheel("0.5.15")),
    )
    preflight.check_state("bug", bug, "x")
    preflight.check_state("fix", fix, "x")
    preflight.check_state("upstream", up, "x")
    with pytest.raises(
        KitError, match=r"arm 'fix' .*pip install --no-deps --force-reinstall .*0\.5\.14\+pr29654"
    ):
        preflight.check_state("fix", bug, "x")
    with pytest.raises(KitError, match=r"arm 'bug' .*sglang==0\.5\.14$"):
        preflight.check_state("bug", fix, "x")
    with pytest.raises(KitError, match=r"arm 'fix' .*"):
        preflight.check_state("fix", up, "x")  # 0.5.15 is fixed too, but with other names: that is 'upstream'


@pytest.mark.network
def test_preflight_reads_the_installed_sglang_without_importing_it(
    tmp_path: Path, patched_wheel: Path
) -> None:
    from kit.sglang_src.wheels import fetch_wheel

    model = make_model(tmp_path, GLM52_CONFIG)
    py = _python_with(tmp_path, _unpack(fetch_wheel("0.5.14"), tmp_path / "site"))
    p = sp.validate(run_params(model, python=py))
    pre = preflight.preflight(p, "bug")
    assert pre["state"]["state"] == "bug" and pre["sglang_dir"] == str(tmp_path / "site" / "sglang")
    assert all(v["status"] == "found" for v in pre["probe_check"].values())
    with pytest.raises(KitError, match="0.5.14\\+pr29654"):
        preflight.preflight(p, "fix")


@pytest.mark.network
def test_preflight_under_the_torch_profiler_needs_no_nsys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sglang's own PyTorch profiler records the window: the probe's targets are still checked, nsys and
    the nvtx package are not needed (the same run under nsys is refused without them)."""
    from kit.sglang_src.wheels import fetch_wheel

    model = make_model(tmp_path, GLM52_CONFIG)
    py = _python_with(tmp_path, _unpack(fetch_wheel("0.5.14"), tmp_path / "site"))
    monkeypatch.setattr(preflight.capture, "find_nsys", lambda: None)
    pre = preflight.preflight(
        sp.validate(run_params(model, python=py, profile=True, profiler="torch")), "bug"
    )
    assert pre["nsys"] is None and all(v["status"] == "found" for v in pre["probe_check"].values())
    with pytest.raises(KitError, match="nvtx package is missing|nsys not found"):
        preflight.preflight(sp.validate(run_params(model, python=py, profile=True)), "bug")


@pytest.mark.network
def test_patch_git_checkout_layout(tmp_path: Path) -> None:
    from kit.sglang_src.wheels import fetch_wheel

    checkout = tmp_path / "sglang-checkout"
    _unpack(fetch_wheel("0.5.14"), checkout / "python")
    res = patch_git_checkout(checkout)
    assert res["before"] == "bug" and res["after"] == "fix" and res["carrier"] == PR_CARRIER
    assert len(res["changed"]) == 4 and all(c.startswith("python/sglang/") for c in res["changed"])
    with pytest.raises(KitError, match="not 'bug'"):
        patch_git_checkout(checkout)


# ---------------------------------------------------------------------------------------------------
# Noise floor


def _rows(outs: list[list[int]]) -> list[dict]:
    return [
        {"prompt_id": i, "output_ids": o, "prompt_sha256": f"p{i}", "accept_length": 4.6}
        for i, o in enumerate(outs)
    ]


def test_token_match() -> None:
    assert token_match([1, 2, 3], [1, 2, 3]) == {"match_rate": 1.0, "first_divergence": None, "length": 3}
    assert token_match([1, 2, 3, 4], [1, 9, 3]) == {"match_rate": 0.5, "first_divergence": 1, "length": 4}
    assert token_match([1, 2], [1, 2, 3])["first_divergence"] == 2


def test_noise_verdicts() -> None:
    a = _rows([[1, 2, 3, 4], [5, 6, 7, 8]])
    assert compare_with_noise(a, a, a)["verdict"] == "identical"
    b = _rows([[1, 2, 3, 4], [5, 6, 0, 0]])
    assert compare_with_noise(a, b, a)["verdict"] == "beyond_noise"  # the repeat is exact
    noisy = _rows([[1, 2, 3, 4], [5, 6, 9, 9]])
    res = compare_with_noise(a, b, noisy)
    assert res["verdict"] == "within_noise"
    assert (
        res["per_request"][1]["first_divergence_ab"] == 2
        and res["per_request"][1]["first_divergence_noise"] == 2
    )
    worse = _rows([[0, 0, 0, 0], [0, 0, 0, 0]])
    assert compare_with_noise(a, worse, noisy)["verdict"] == "beyond_noise"
    assert res["a_vs_b"]["logprob_max_abs_diff"] is None  # rows without logprobs: nothing claimed


def test_noise_reports_logprob_agreement_beside_the_repeat() -> None:
    def with_lp(rows: list[dict], lps: list[list[float]], margins: list[list[float]]) -> list[dict]:
        rows_lps = zip(rows, lps, margins, strict=True)
        return [{**r, "output_logprobs": lp, "output_margins": m} for r, lp, m in rows_lps]

    a = with_lp(_rows([[1, 2, 3], [4, 5, 6]]), [[-0.1] * 3, [-0.2] * 3], [[2.0] * 3, [1.0, 1.0, 0.02]])
    b = with_lp(_rows([[1, 2, 3], [4, 5, 9]]), [[-0.1] * 3, [-0.25, -0.2, -3.0]], [[2.0] * 3, [1.0, 1, 0.01]])
    rep = with_lp(_rows([[1, 2, 3], [4, 5, 6]]), [[-0.1, -0.1, -0.13], [-0.2] * 3], [[2.0] * 3] * 2)
    res = compare_with_noise(a, b, rep)
    assert res["a_vs_b"]["logprob_max_abs_diff"] == pytest.approx(0.05)
    assert res["a_vs_b"]["divergence_margins"] == [0.01]  # the fix and bug split at a near-tie
    assert res["noise_floor"]["logprob_max_abs_diff"] == pytest.approx(0.03)
    assert res["noise_floor"]["divergence_margins"] == []


def test_noise_refuses_different_prompts() -> None:
    a = _rows([[1, 2]])
    b = [{**a[0], "prompt_sha256": "other"}]
    with pytest.raises(KitError, match="different input ids"):
        compare_with_noise(a, b, a)
