"""kit.report.evidence (the tables under data/results/<machine>/) and the report's H200 section.

Bug/fix pairs are only meaningful between runs that differ in the arm alone: same indexer implementation,
indexer path and num_steps. The committed H200 set mixes the torch stand-in with sglang's own kernels and
3- with 5-step draft loops, so the grouping keys are what these tests pin down.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from matplotlib.figure import Figure

from kit.errors import InputError
from kit.paths import REPO
from kit.report import evidence, mini_h200, sglang_h200

H200 = REPO / "data" / "results" / "h200"


def write_run(
    results: Path,
    mode: str,
    name: str,
    *,
    arm: str,
    ctx: int = 131072,
    num_steps: int = 5,
    step_ms: float = 1.2,
    call_ms: float = 0.4,
    impl: str | None = None,
    path: str | None = None,
    engine_step_ms: float | None = None,
    tokens: tuple[int, ...] = (1, 2, 3),
) -> Path:
    """A minimal analysed run directory, as `kit run` + `kit analyze` leave it.

    impl=None writes params/engine without indexer keys: a mini run from before the sglang-kernel indexer.
    """
    run = results / "runs" / mode / name
    run.mkdir(parents=True)
    launches = num_steps - 1 if arm in ("bug", "off") else 1
    params: dict[str, Any] = {
        "backend": "mini",
        "arm": arm,
        "context_len": ctx,
        "num_steps": num_steps,
        "num_requests": 1,
        "cuda_graph": True,
        "preset": "dsv32",
    }
    engine: dict[str, Any] = {"backend": "mini", "preset": {"index_n_heads": 64}, "num_steps": num_steps}
    if impl is not None:
        params.update(indexer_impl=impl, indexer_path=path or "paged")
        engine.update(indexer_impl=impl, indexer_path=path if impl == "sglang" else None)
    if engine_step_ms is not None:
        engine["draft_step_ms_median"] = engine_step_ms
    (run / "params.json").write_text(json.dumps(params))
    (run / "engine.json").write_text(json.dumps(engine))
    (run / "verdict.json").write_text(
        json.dumps(
            {
                "arm": arm,
                "status": "pass",
                "expected_per_round": launches,
                "launches_per_round": [launches] * 3,
                "num_rounds": 3,
                "source": "nsys",
                "method": "graph",
            }
        )
    )
    pd.DataFrame(
        {
            "round": [1, 2, 3],
            "indexer_gpu_ns": [call_ms * launches * 1e6] * 3,
            "step_gpu_ns": [step_ms * 1e6] * 3,
            "step_ns": [step_ms * 1e6] * 3,
        }
    ).to_csv(run / "rounds.csv", index=False)
    (run / "outputs.jsonl").write_text(
        json.dumps({"prompt_id": 0, "output_ids": list(tokens), "accept_length": 3.0}) + "\n"
    )
    return run


def test_collect_carries_indexer_and_steps_and_defaults_old_mini_runs(tmp_path: Path) -> None:
    write_run(tmp_path, "graph", "old-bug", arm="bug")
    write_run(
        tmp_path, "kernels-ragged", "new-bug", arm="bug", impl="sglang", path="ragged", engine_step_ms=1.3
    )
    write_run(tmp_path, "kernels-s3", "s3-fix", arm="fix", impl="sglang", num_steps=3)
    write_run(tmp_path, "kernels-control", "torch-fix", arm="fix", impl="torch")
    df = evidence.collect(tmp_path).set_index("run")
    assert df.loc["old-bug", ["indexer_impl", "indexer_path", "num_steps"]].tolist() == ["torch", "dense", 5]
    assert df.loc["new-bug", ["indexer_impl", "indexer_path"]].tolist() == ["sglang", "ragged"]
    assert df.loc["new-bug", "engine_step_ms"] == 1.3 and pd.isna(df.loc["old-bug", "engine_step_ms"])
    assert df.loc["s3-fix", ["indexer_path", "num_steps"]].tolist() == ["paged", 3]
    # the torch indexer has one path, whatever params say (engine.json records null for it)
    assert df.loc["torch-fix", ["indexer_impl", "indexer_path"]].tolist() == ["torch", "dense"]


def test_indexer_impl_prefers_what_the_engine_resolved() -> None:
    assert evidence.indexer_impl({"indexer_impl": "torch"}, {"indexer_impl": "auto"}) == "torch"
    assert evidence.indexer_impl({}, {"indexer_impl": "sglang"}) == "sglang"
    assert evidence.indexer_impl({}, {"backend": "mini", "indexer_impl": "auto"}) == "torch"
    assert evidence.indexer_impl({}, {"backend": "sglang"}) == "native"
    assert evidence.indexer_path("native", {}, {}) == "native"


def test_ratios_pair_only_runs_that_differ_in_the_arm(tmp_path: Path) -> None:
    # same folder, same context: sglang bug + torch fix, 5-step bug + 3-step fix -> no pair at all
    write_run(tmp_path, "mixed", "bug-sglang", arm="bug", impl="sglang")
    write_run(tmp_path, "mixed", "fix-torch", arm="fix", impl="torch")
    write_run(tmp_path, "steps", "bug-5", arm="bug", impl="sglang", num_steps=5)
    write_run(tmp_path, "steps", "fix-3", arm="fix", impl="sglang", num_steps=3)
    # and one proper pair per path, side by side in one folder
    for path in ("paged", "ragged"):
        write_run(tmp_path, "paths", f"bug-{path}", arm="bug", impl="sglang", path=path)
        write_run(tmp_path, "paths", f"fix-{path}", arm="fix", impl="sglang", path=path)
    table = evidence.ratios(evidence.collect(tmp_path))
    assert table["mode"].tolist() == ["paths", "paths"]
    assert table["indexer_path"].tolist() == ["paged", "ragged"]


def test_ratios_cost_model_per_step_count(tmp_path: Path) -> None:
    """call = indexer GPU time / launches; floor = fix - call / (draft forwards); forwards = num_steps - 1."""
    for steps, bug_ms, fix_ms in ((5, 1.6, 1.3), (3, 1.5, 1.3)):
        mode = f"s{steps}"
        write_run(
            tmp_path,
            mode,
            "bug",
            arm="bug",
            num_steps=steps,
            step_ms=bug_ms,
            call_ms=0.4,
            impl="sglang",
            engine_step_ms=bug_ms + 0.1,
        )
        write_run(
            tmp_path,
            mode,
            "fix",
            arm="fix",
            num_steps=steps,
            step_ms=fix_ms,
            call_ms=0.4,
            impl="sglang",
            engine_step_ms=fix_ms + 0.1,
        )
    table = evidence.ratios(evidence.collect(tmp_path)).set_index("mode")
    assert table.loc["s5", ["launches_bug", "launches_fix", "num_steps"]].tolist() == [4, 1, 5]
    assert table.loc["s3", ["launches_bug", "launches_fix", "num_steps"]].tolist() == [2, 1, 3]
    assert table.loc["s5", "indexer_call_ms"] == pytest.approx(0.4)
    assert table.loc["s5", "floor_step_ms"] == pytest.approx(1.3 - 0.4 / 4)
    assert table.loc["s3", "floor_step_ms"] == pytest.approx(1.3 - 0.4 / 2)
    assert table.loc["s5", "ratio_bug_over_fix"] == pytest.approx(1.6 / 1.3, abs=1e-3)
    assert table.loc["s5", "ratio_engine_wall"] == pytest.approx(1.7 / 1.4, abs=1e-3)
    assert bool(table.loc["s5", "outputs_identical"])


def test_committed_h200_ratios_are_consistent() -> None:
    """data/results/h200/ratios.csv: every pair is one bug and one fix arm of the same configuration."""
    table = pd.read_csv(H200 / "ratios.csv")
    assert set(evidence.KEYS) <= set(table.columns)
    assert not table.duplicated(evidence.KEYS).any()
    assert (table["launches_bug"] == table["num_steps"] - 1).all() and (table["launches_fix"] == 1).all()
    assert table["outputs_identical"].all()
    ratio = (table["step_ms_bug"] / table["step_ms_fix"]).round(3)
    assert (ratio - table["ratio_bug_over_fix"]).abs().max() <= 0.001
    impls = set(zip(table["indexer_impl"], table["indexer_path"], strict=True))
    assert impls == {("torch", "dense"), ("sglang", "paged"), ("sglang", "ragged")}
    # the sglang-kernel modes never fall back silently to the torch indexer (only the control does)
    kernels = table[table["mode"].str.startswith("kernels-") & (table["mode"] != "kernels-control")]
    assert set(kernels["indexer_impl"]) == {"sglang"} and len(kernels) == 9


def test_committed_h200_tables_regenerate() -> None:
    """ratios.csv follows from summary.csv by evidence.ratios; where the run directories are present
    (data/results/h200/runs/), both follow from them. No skip when they are absent (CI refuses skips):
    then the first check alone runs."""
    summary = pd.read_csv(H200 / "summary.csv")
    # outputs_identical and the logprob agreement are checked elsewhere
    summary["output_ids"] = summary["outputs"] = [[] for _ in range(len(summary))]
    committed = pd.read_csv(H200 / "ratios.csv")
    again = evidence.ratios(summary)
    cols = [c for c in committed.columns if c != "outputs_identical" and not c.startswith("logprob_")]
    pd.testing.assert_frame_equal(again[cols], committed[cols], check_dtype=False, atol=1e-9)
    if (H200 / "runs").is_dir():
        df = evidence.collect(H200)
        summary_again = df.drop(columns=["output_ids", "outputs"])
        for name, table in (("summary", summary_again), ("ratios", evidence.ratios(df))):
            pd.testing.assert_frame_equal(
                table.reset_index(drop=True), pd.read_csv(H200 / f"{name}.csv"), check_dtype=False, atol=1e-9
            )


def test_report_h200_section_labels_the_indexer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ratios = mini_h200.h200_ratios()
    assert ratios is not None
    table = mini_h200.h200_table(ratios)
    assert "indexer" in table.columns and "latency_basis" not in table.columns
    assert {"torch stand-in", "sglang kernels, paged", "sglang kernels, ragged"} <= set(table["indexer"])
    assert set(table["mode"]) >= {"graph", "batch4", "glm5", "kernels-base", "kernels-ragged", "kernels-s3"}
    ax = Figure().subplots()  # no pyplot: no global backend state
    mini_h200.plot_h200(ratios, ax)
    labels = ax.get_legend_handles_labels()[1]
    gpu = ratios[ratios["latency_basis"] == "gpu"]
    assert len(labels) == gpu.groupby(mini_h200.H200_LINE_KEYS).ngroups + 1  # + the PR's published star
    assert any("kernels-ragged" in lb and "sglang kernels, ragged" in lb for lb in labels)
    # a ratios.csv from before the indexer columns: read as the torch stand-in, 5 steps
    old = tmp_path / "ratios.csv"
    ratios[ratios["mode"] == "graph"].drop(columns=["indexer_impl", "indexer_path", "num_steps"]).to_csv(
        old, index=False
    )
    monkeypatch.setattr(mini_h200, "H200_RATIOS", old)
    legacy = mini_h200.h200_ratios()
    assert legacy is not None and set(mini_h200.h200_table(legacy)["indexer"]) == {"torch stand-in"}
    assert set(legacy["num_steps"]) == {5}


def test_real_sglang_rung_table() -> None:
    """The report's real-sglang rung reads the committed H200 results: num_steps - 1 launches per round
    unpatched, 1 patched, in every mode, context and step count measured; with the current checkpoint the
    greedy outputs are identical (the first runs' checkpoint decided tokens at near-ties)."""
    table = sglang_h200.sglang_h200_table()
    assert table is not None and set(table["mode"]) == {"eager", "graph", "steps3"}
    assert (table["launches/round 0.5.14"] == table["steps"] - 1).all()
    assert set(table["launches/round patched"]) == {1} and (table["bug/fix"] > 1).all()
    current = table[table["checkpoint"] == "attn_out 3.5"]
    assert set(current["steps"]) == {3, 5} and current["outputs identical"].all()
    assert (current["median |logprob diff|"] < 0.05).all() and (current["max |logprob diff|"] < 0.5).all()
    assert not table[table["checkpoint"] != "attn_out 3.5"]["outputs identical"].any()


# ---------------------------------------------------------------------------------------------------
# What is not a result set: one line that says what it is instead (never pandas' KeyError: 'mode')


def _batch(root: Path) -> Path:
    """A batch folder as `kit batch` leaves it: its runs analysed directly inside it."""
    for arm in ("bug", "fix"):
        write_run(root, "b", arm, arm=arm)  # root/runs/b/<arm>/
    return root / "runs" / "b"


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda root: root / "nosuch", ["does not exist", "RESULTS/runs/<mode>/<run>/"]),
        (lambda root: (root / "empty").mkdir() or root / "empty", ["not a result set", "no analysed run"]),
        (_batch, ["not a result set", "a batch folder", "report.html"]),
        (lambda root: _batch(root).parent, ["a runs root", "pass the folder above it"]),
    ],
    ids=["missing", "empty", "batch", "runs-root"],
)
def test_write_tables_refuses_what_is_not_a_result_set(tmp_path: Path, make: Any, words: list[str]) -> None:
    target = make(tmp_path)
    with pytest.raises(InputError) as e:
        evidence.write_tables(target)
    assert all(w in str(e.value) for w in words), str(e.value)
    assert "\n" not in str(e.value)
    assert not list(tmp_path.rglob("summary.csv")) and not list(tmp_path.rglob("ratios.csv"))


def test_runs_without_a_pair_write_no_table(tmp_path: Path) -> None:
    """Analysed runs, but no bug and fix of one configuration: said in one line, nothing written; ratios()
    itself gives an empty table with its keys (not a KeyError from sorting nothing)."""
    write_run(tmp_path, "m", "bug-only", arm="bug")
    assert list(evidence.ratios(evidence.collect(tmp_path)).columns) == evidence.KEYS
    with pytest.raises(InputError, match="1 analysed runs but no bug and fix run that share mode"):
        evidence.write_tables(tmp_path)
    assert not (tmp_path / "summary.csv").exists() and not (tmp_path / "ratios.csv").exists()
