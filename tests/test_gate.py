"""kit compare's gate on small synthetic run directories (params.json + verdict.json + rounds.csv +
outputs.jsonl): each way it must fail, the real fix passing, the control run's noise floor, parameters
that differ, and comparison.json written where kit batch writes its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kit.cli import main as kit_main
from kit.compare import noise
from kit.compare.runs import compare_runs, comparison, gate_failures, gate_notes, write_comparison
from kit.errors import KitError, UsageError

EXPECTED = {"off": 4, "bug": 4, "fix": 1, "upstream": 1}
ANSWER = [7, 8, 9, 10]


def row(pid: int, out: list[int], verify: int, workload: str = "same-target", **kw: Any) -> dict:
    """One outputs.jsonl row as the sglang backend writes it for a task workload."""
    r = {
        "prompt_id": pid,
        "workload": workload,
        "prompt_sha256": f"p{pid}",
        "output_ids": out,
        "completion_tokens": len(out),
        "spec_verify_ct": verify,
        "accept_length": len(out) / verify,
        "expected_ids": ANSWER,
    }
    r["correct"] = out[: len(ANSWER)] == ANSWER
    return {**r, **kw}


def rows(verify: list[int], workload: str = "same-target", outs: list[list[int]] | None = None) -> list[dict]:
    outs = outs or [ANSWER + [i] * 8 for i in range(len(verify))]
    return [row(i, o, v, workload) for i, (o, v) in enumerate(zip(outs, verify, strict=True))]


def make_run(
    root: Path, name: str, arm: str, outputs: list[dict], analysed: bool = True, **params: Any
) -> Path:
    d = root / name
    d.mkdir(parents=True)
    p = {
        "backend": "sglang",
        "arm": arm,
        "model_path": "/models/task",
        "workload": outputs[0]["workload"] if outputs else "same-target",
        "context_len": 8192,
        "num_steps": 5,
        "num_requests": len(outputs),
        "max_new_tokens": 12,
        **params,
    }
    (d / "params.json").write_text(json.dumps(p))
    (d / "outputs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in outputs))
    if analysed:
        n = EXPECTED[arm]
        verdict = {
            "arm": arm,
            "status": "pass",
            "passed": True,
            "expected_per_round": n,
            "launches_per_round": [n] * 3,
            "num_rounds": 3,
            "source": "nsys",
            "method": "graph",
        }
        (d / "verdict.json").write_text(json.dumps(verdict))
        step = 2_000_000 if n > 1 else 1_000_000
        csv = "round,pid,step_ns,indexer_launches\n" + "".join(f"{i},1,{step},{n}\n" for i in range(3))
        (d / "rounds.csv").write_text(csv)
    return d


@pytest.fixture
def fix_pair(tmp_path: Path) -> dict[str, Path]:
    """The real fix on a same-target workload: same tokens and answers, the same acceptance as the bug
    arm, and an off-arm control whose acceptance wobbles by one verify round on request 1."""
    return {
        "bug": make_run(tmp_path, "bug", "bug", rows([4, 5, 4])),
        "fix": make_run(tmp_path, "fix", "fix", rows([4, 5, 4])),
        "off": make_run(tmp_path, "off", "off", rows([4, 6, 4])),
    }


def test_the_real_fix_passes_with_a_control(fix_pair: dict[str, Path]) -> None:
    result = comparison(fix_pair["bug"], fix_pair["fix"], fix_pair["off"])
    assert result["gate_failures"] == []
    same = result["acceptance"]["by_workload"]["same-target"]
    assert same["gated"] and same["status"] == "within_noise" and same["mean_b_minus_a"] == 0
    assert same["noise_floor"] == pytest.approx(12 / 5 - 12 / 6, abs=1e-6)  # off vs bug, request 1
    assert result["control"]["repeat_of"] == "a" and result["control"]["arm"] == "off"
    assert result["accuracy"]["by_workload"]["same-target"] == {"a": 1.0, "b": 1.0, "same": True}
    assert result["a"]["accuracy"]["same-target"]["correct"] == 3
    assert result["noise"]["verdict"] == "identical"
    assert "accuracy not checked" not in " ".join(result["gate_notes"])


def test_tokens_differ(tmp_path: Path, fix_pair: dict[str, Path]) -> None:
    outs = [ANSWER + [0] * 8, ANSWER + [1] * 7 + [5], ANSWER + [2] * 8]
    fix = make_run(tmp_path, "fix2", "fix", rows([4, 5, 4], outs=outs))
    failures = gate_failures(compare_runs(fix_pair["bug"], fix, fix_pair["off"]))
    assert failures == ["greedy outputs differ: 2/3 requests identical, first divergence at token 11"]


def test_accuracy_differs(tmp_path: Path, fix_pair: dict[str, Path]) -> None:
    outs = [ANSWER + [0] * 8, [7, 8, 0, 10] + [1] * 8, ANSWER + [2] * 8]
    fix = make_run(tmp_path, "fix2", "fix", rows([4, 5, 4], outs=outs))
    result = compare_runs(fix_pair["bug"], fix, fix_pair["off"])
    assert result["accuracy"]["by_workload"]["same-target"]["same"] is False
    assert any(
        f.startswith("answer accuracy differs on same-target: a 1.0 vs b 0.6667")
        for f in gate_failures(result)
    )


def test_accuracy_from_expected_ids_where_rows_carry_no_verdict(tmp_path: Path) -> None:
    """Rows with expected_ids but no `correct` are judged the way the rows that carry it were."""
    bare = [{k: v for k, v in r.items() if k != "correct"} for r in rows([4, 4])]
    bare[1]["output_ids"] = [7, 8, 9, 0] + [1] * 8
    bug = make_run(tmp_path, "bug", "bug", rows([4, 4]))
    fix = make_run(tmp_path, "fix", "fix", bare)
    result = compare_runs(bug, fix)
    assert result["b"]["accuracy"]["same-target"] == {
        "requests": 2,
        "correct": 1,
        "correct_ids": [0],
        "rate": 0.5,
    }


def test_same_target_acceptance_beyond_the_noise_floor(tmp_path: Path, fix_pair: dict[str, Path]) -> None:
    """Same tokens, but the fix needs 2 more verify rounds on every request (acceptance drops by ~0.7-1.0)
    while the control moved by at most 0.4 on one request: the gate fails."""
    fix = make_run(tmp_path, "fix2", "fix", rows([6, 7, 6]))
    result = compare_runs(fix_pair["bug"], fix, fix_pair["off"])
    same = result["acceptance"]["by_workload"]["same-target"]
    assert same["status"] == "beyond_noise" and same["mean_b_minus_a"] < -0.7
    [failure] = gate_failures(result)
    assert failure.startswith("same-target acceptance moved beyond the noise floor: mean change per request")
    assert "floor 0.4000" in failure and "over 3 requests" in failure


def test_acceptance_within_a_wider_floor_passes(tmp_path: Path, fix_pair: dict[str, Path]) -> None:
    """A noisier control (a GPU repeat whose acceptance moves by more than the fix's) absorbs the move."""
    fix = make_run(tmp_path, "fix2", "fix", rows([4, 6, 4]))
    noisy = make_run(tmp_path, "off2", "off", rows([6, 5, 4]))
    result = compare_runs(fix_pair["bug"], fix, noisy)
    assert result["acceptance"]["by_workload"]["same-target"]["status"] == "within_noise"
    assert gate_failures(result) == []


def test_no_control_the_acceptance_check_fails_loudly(fix_pair: dict[str, Path]) -> None:
    result = compare_runs(fix_pair["bug"], fix_pair["fix"])
    assert result["acceptance"]["by_workload"]["same-target"]["status"] == "not_run"
    assert gate_failures(result) == [
        "same-target acceptance could not be checked: no control run: no noise floor to judge acceptance "
        "against (--control)"
    ]
    assert result["noise"] is None and result["control"] is None


def test_moving_target_acceptance_is_reported_with_its_interval_not_gated(tmp_path: Path) -> None:
    bug = make_run(tmp_path, "bug", "bug", rows([4, 4, 4], "moving-target"))
    fix = make_run(tmp_path, "fix", "fix", rows([5, 6, 7], "moving-target"))
    result = compare_runs(bug, fix)
    moving = result["acceptance"]["by_workload"]["moving-target"]
    assert not moving["gated"] and moving["status"] == "reported"
    diffs = [12 / 5 - 3, 12 / 6 - 3, 12 / 7 - 3]
    low, high = noise.t_interval(diffs)
    assert moving["interval95_b_minus_a"] == [pytest.approx(low, abs=1e-6), pytest.approx(high, abs=1e-6)]
    assert gate_failures(result) == []
    notes = " | ".join(gate_notes(result))
    assert "acceptance not gated: no same-target requests" in notes
    assert "moving-target acceptance reported, not gated" in notes and "95% t interval" in notes
    assert "no noise floor (no control run)" in notes


def test_t_interval() -> None:
    low, high = noise.t_interval([1.0, 2.0, 3.0])  # mean 2, sd 1, t(2 df) 4.303
    assert (low, high) == (pytest.approx(2 - 4.303 / 3**0.5), pytest.approx(2 + 4.303 / 3**0.5))
    assert noise.t_interval([1.0]) is None
    wide = noise.t_interval([float(i % 2) for i in range(100)])  # 99 df: close to the normal 1.96
    assert wide[1] - 0.5 == pytest.approx(1.984 * (100 / 99 * 0.25) ** 0.5 / 10, rel=1e-3)


@pytest.mark.parametrize(
    "params,named",
    [
        ({"context_len": 4096}, "context_len (a 8192, b 4096)"),
        ({"num_steps": 3}, "num_steps (a 5, b 3)"),
        ({"backend": "mini", "preset": "tiny", "device": "cpu"}, "backend (a 'sglang', b 'mini')"),
        ({"workload": "records"}, "workload (a 'same-target', b 'records')"),
        ({"model_path": "/models/other"}, "model_path"),
    ],
)
def test_mismatched_parameters_are_refused(tmp_path: Path, fix_pair: dict, params: dict, named: str) -> None:
    other = make_run(tmp_path, "other", "fix", rows([4, 5, 4]), **params)
    with pytest.raises(UsageError, match="--allow-mismatch") as err:
        compare_runs(fix_pair["bug"], other)
    assert named in str(err.value)


def test_mismatched_parameters_allowed_fail_the_gate(tmp_path: Path, fix_pair: dict) -> None:
    """4k bug vs 8k fix, 3 vs 2 requests: with --allow-mismatch the comparison runs, warns, and fails the
    gate on the parameters and on the request that only one run holds (not a 'divergence at None')."""
    short = make_run(tmp_path, "short", "fix", rows([4, 5]), context_len=4096)
    result = compare_runs(fix_pair["bug"], short, fix_pair["off"], allow_mismatch=True)
    failures = gate_failures(result)
    assert failures[0].startswith("the runs' parameters differ: context_len (a 8192, b 4096), num_requests")
    assert "the runs hold different requests: prompt_id [2] only in a" in failures
    assert not any("first divergence at token None" in f for f in failures)
    assert result["warnings"][0].startswith("PARAMETERS DIFFER: context_len")


def test_cli_exit_codes_and_comparison_json(fix_pair: dict[str, Path], tmp_path: Path, capsys) -> None:
    bug, fix, off = (str(fix_pair[k]) for k in ("bug", "fix", "off"))
    assert kit_main(["compare", bug, fix, "--control", off, "--gate"]) == 0
    written = fix_pair["fix"].parent / "compare-bug-vs-fix" / "comparison.json"
    result = json.loads(written.read_text())
    assert result["gate_failures"] == [] and result["control"]["run_dir"] == off
    assert json.loads(capsys.readouterr().out)["acceptance"] == result["acceptance"]
    first = written.read_text()
    # again: the earlier comparison is set aside, never overwritten
    assert kit_main(["compare", bug, fix, "--gate"]) == 1  # no control: the acceptance check fails
    err = capsys.readouterr().err
    assert "GATE FAILED: same-target acceptance could not be checked" in err
    assert (
        written.parent.with_name("compare-bug-vs-fix.superseded-1") / "comparison.json"
    ).read_text() == first
    assert json.loads(written.read_text())["control"] is None
    other = make_run(tmp_path, "ctx4k", "fix", rows([4, 5, 4]), context_len=4096)
    assert kit_main(["compare", bug, str(other), "--gate"]) == 2  # refused: one line, nothing written
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "context_len" in err
    assert not (tmp_path / "compare-bug-vs-ctx4k").exists()
    assert kit_main(["compare", bug, str(other), "--allow-mismatch", "--out", str(tmp_path / "x")]) == 0
    assert "WARNING: PARAMETERS DIFFER: context_len" in capsys.readouterr().err
    assert (tmp_path / "x" / "comparison.json").is_file()


def test_control_must_repeat_one_computation(tmp_path: Path, fix_pair: dict[str, Path]) -> None:
    up = make_run(tmp_path, "up", "upstream", rows([4, 5, 4]))
    with pytest.raises(UsageError, match=r"control \(arm upstream\) runs neither a's computation"):
        compare_runs(fix_pair["bug"], fix_pair["fix"], up)
    # a same-build repeat of the fix, run without the profiler (no verdict): the floor is fix vs its repeat
    repeat = make_run(tmp_path, "fix-repeat", "fix", rows([4, 5, 5]), analysed=False)
    result = compare_runs(fix_pair["bug"], fix_pair["fix"], repeat)
    assert result["control"]["repeat_of"] == "b"
    assert result["acceptance"]["by_workload"]["same-target"]["noise_floor"] == pytest.approx(0.6)
    other = make_run(tmp_path, "off-8k", "off", rows([4, 5, 4]), num_steps=3)
    with pytest.raises(UsageError, match=r"a and control differ in num_steps"):
        compare_runs(fix_pair["bug"], fix_pair["fix"], other)


def test_kit_noise_and_compare_judge_tokens_alike(tmp_path: Path, fix_pair: dict[str, Path]) -> None:
    """One implementation: kit noise's verdict is the one kit compare --control reports."""
    outs = [ANSWER + [0] * 8, ANSWER + [1] * 7 + [5], ANSWER + [2] * 8]
    fix = make_run(tmp_path, "fix2", "fix", rows([4, 5, 4], outs=outs))
    res = noise.compare_with_noise(fix_pair["bug"], fix, fix_pair["off"])
    assert res["verdict"] == "beyond_noise"  # the control repeats the tokens exactly
    assert compare_runs(fix_pair["bug"], fix, fix_pair["off"])["noise"]["verdict"] == res["verdict"]
    assert res["acceptance"]["by_workload"]["same-target"]["noise_floor"] == pytest.approx(0.4)
    assert kit_main(["noise", str(fix_pair["bug"]), str(fix), str(fix_pair["off"])]) == 1
    assert kit_main(["noise", str(fix_pair["bug"]), str(fix_pair["fix"]), str(fix_pair["off"])]) == 0


def test_batch_compare_stage_writes_the_same_comparison(tmp_path: Path, fix_pair: dict[str, Path]) -> None:
    """kit batch's plain compare stage and kit compare are one function: the same comparison.json."""
    from kit.pipeline import stages

    stages.compare_plain(fix_pair["bug"], fix_pair["fix"], tmp_path / "stage", fix_pair["off"])
    direct = write_comparison(fix_pair["bug"], fix_pair["fix"], tmp_path / "cli", fix_pair["off"])
    assert json.loads((tmp_path / "stage" / "comparison.json").read_text()) == json.loads(json.dumps(direct))
    with pytest.raises(KitError, match="is a file, not a folder"):
        (tmp_path / "file").write_text("")
        write_comparison(fix_pair["bug"], fix_pair["fix"], tmp_path / "file")


def test_model_fields_one_kit_did_not_record_are_not_a_difference() -> None:
    """A run made before the kit read num_attention_heads vs one after: the same checkpoint; a field both
    recorded and that differs is still refused."""
    from kit.compare.params import differences

    old = {"model": {"index_topk": 2048, "index_n_heads": 64}}
    new = {"model": {"index_topk": 2048, "index_n_heads": 64, "num_attention_heads": 16}}
    assert differences(old, new) == {}
    other = {"model": {"index_topk": 1024, "index_n_heads": 64, "num_attention_heads": 16}}
    assert list(differences(old, other)) == ["model"]


def test_kit_noise_refuses_runs_that_differ_as_kit_compare_does(
    tmp_path: Path, fix_pair: dict[str, Path], capsys
) -> None:
    """kit noise B <8k fix> REP and kit noise B F <a num_steps 3 repeat>: refused in one line naming the
    field (they judged 'beyond_noise' and 'identical'); --allow-mismatch judges them, warns, and exits 1."""
    bug, fix, off = (str(fix_pair[k]) for k in ("bug", "fix", "off"))
    fix4k = str(make_run(tmp_path, "fix4k", "fix", rows([4, 5, 4]), context_len=4096))
    steps3 = str(make_run(tmp_path, "bug-s3", "bug", rows([4, 5, 4]), num_steps=3, analysed=False))
    for argv, named in (
        ([bug, fix4k, off], "A and B differ in context_len (A 8192, B 4096)"),
        ([bug, fix, steps3], "A and repeat differ in num_steps (A 5, repeat 3)"),
    ):
        assert kit_main(["noise", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and named in err and "--allow-mismatch" in err
        assert kit_main(["noise", *argv, "--allow-mismatch"]) == 1
        out, err = capsys.readouterr()
        assert json.loads(out)["verdict"] == "identical"
        assert f"kit noise: WARNING: PARAMETERS DIFFER: {named.split(' differ in ')[1]}" in err
    with pytest.raises(
        UsageError, match=r"repeat \(arm fix\) is not a second run of A's computation \(arm bug\)"
    ):
        noise.compare_with_noise(fix_pair["bug"], fix_pair["fix"], fix_pair["fix"])
    assert noise.compare_with_noise(fix_pair["bug"], fix_pair["fix"], fix_pair["off"])["params_differ"] == {}


def test_compare_and_noise_share_one_parameter_check(
    fix_pair: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kit.compare import params

    calls: list[tuple] = []
    real = params.check_runs

    def spy(*args: Any, **kw: Any) -> Any:
        calls.append(args[3:])  # (repeat_of, allow, labels...)
        return real(*args, **kw)

    monkeypatch.setattr(params, "check_runs", spy)
    compare_runs(fix_pair["bug"], fix_pair["fix"], fix_pair["off"])
    noise.compare_with_noise(fix_pair["bug"], fix_pair["fix"], fix_pair["off"])
    assert [c[:2] for c in calls] == [("a", False), ("a", False)]


def test_timing_across_two_instruments_is_refused_launches_and_tokens_kept(
    tmp_path: Path, fix_pair: dict[str, Path]
) -> None:
    """An nsys run against a torch-profiler (Kineto) run: no draft-step ratio, a named reason in
    comparison.json and the warnings; the gate still judges launches and tokens."""
    torch_fix = make_run(tmp_path, "fix-torch", "fix", rows([4, 5, 4]))
    verdict = json.loads((torch_fix / "verdict.json").read_text())
    (torch_fix / "verdict.json").write_text(json.dumps({**verdict, "source": "kineto"}))
    result = comparison(fix_pair["bug"], torch_fix, fix_pair["off"])
    assert result["draft_step_ratio_a_over_b"] is None
    why = result["draft_step_ratio_why"]
    assert "two instruments" in why and "Nsight Systems" in why and "PyTorch profiler" in why
    assert f"TIMING NOT COMPARED: {why}" in result["warnings"] and result["gate_failures"] == []
    same = comparison(fix_pair["bug"], fix_pair["fix"], fix_pair["off"])
    assert same["draft_step_ratio_a_over_b"] == 2.0 and same["draft_step_ratio_why"] is None
    assert not any(w.startswith("TIMING") for w in same["warnings"])


def test_save_makes_a_missing_folder_and_never_overwrites(tmp_path: Path, fix_pair: dict[str, Path]) -> None:
    """What 03_compare writes out_dir with: a folder that does not exist yet is made (as kit compare --out),
    an existing comparison.json is refused, a file in the way is one line."""
    from kit.compare.runs import save
    from kit.errors import ExistsError, InputError

    result = comparison(fix_pair["bug"], fix_pair["fix"])
    path = save(result, tmp_path / "new" / "deeper")
    assert json.loads(path.read_text())["gate_failures"] == result["gate_failures"]
    with pytest.raises(ExistsError, match="refusing to overwrite"):
        save(result, tmp_path / "new" / "deeper")
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="out_dir must name a folder"):
        save(result, tmp_path / "file" / "x")
