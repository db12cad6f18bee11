"""The corruption fuzzer (issue 32): corruptions of the shared top-k (kit.backends.mini.corrupt) and their
judgement by the gate (kit.compare.fuzz). Unit tests of what a corruption does to a row, then a sample of
the fuzzer for real: the mini task model under Nsight Systems, every cell analysed and compared with bug
(off as the control) through the gate. The sample is small (any-slot at 8192, 2 requests x 16 tokens) so
that `make test` runs it in about a minute; the committed figures come from scripts/fuzz.py's full run
(data/results/mutants/fuzz.json)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from kit.backends.mini.corrupt import NAMED, Context, Corrupter, Corruption, apply
from kit.backends.mini.eagle_info import EagleDraftInput
from kit.backends.mini.forward_batch_info import ForwardBatch, ForwardMode
from kit.backends.mini.index_topk_share import CARRIERS
from kit.backends.mini.mistakes import Mistakes, mistakes
from kit.backends.mini.params import validate
from kit.compare import fuzz
from kit.errors import ExistsError, UsageError
from kit.paths import RESULTS

ROW = torch.arange(8).view(1, 1, 8)  # one request, one query, 8 slots holding positions 0..7


def test_a_corruption_round_trips_through_json_and_refuses_what_it_cannot_be() -> None:
    c = Corruption(how="shifted", slots="block", block=(4, 9), steps=(1, 3), requests="one", request_ids=(2,))
    assert Corruption.from_json(json.loads(json.dumps(c.to_json()))) == c
    for bad in (
        {"how": "scrambled", "slots": "block", "block": [0, 1]},
        {"how": "dropped", "slots": "block"},  # no block
        {"how": "dropped", "slots": "fraction", "slot_fraction": 0},
        {"how": "dropped", "slots": "block", "block": [0, 1], "steps": [0]},  # step 0 computes its own
        {"how": "dropped", "slots": "block", "block": [0, 1], "requests": "one"},
        {"how": "dropped", "slots": "block", "block": [0, 1], "colour": "red"},
    ):
        with pytest.raises(UsageError) as err:
            Corruption.from_json(bad)
        assert err.value.param == "corrupt"


def test_the_named_corruptions_are_the_h200_patches_ones() -> None:
    width = 2048
    masks = {name: c.slot_mask(width) for name, c in NAMED.items()}
    assert masks["topk-tail-dropped"].nonzero().flatten().tolist() == list(range(1024, 2048))
    assert masks["topk-quarter-dropped"].nonzero().flatten().tolist() == list(range(512, 1024))
    assert masks["topk-scattered-dropped"].nonzero().flatten().tolist() == list(range(16, 2048, 4))
    assert NAMED["topk-tail-shifted"].shift == 1 and NAMED["topk-tail-other-request"].other == 1
    for c in NAMED.values():  # every later step, every request
        assert c.steps is None and c.requests == "all"
    # the registry's mini field names them: {"corrupt": NAME}
    assert Mistakes(corrupt="topk-tail-dropped") == Mistakes(corrupt=NAMED["topk-tail-dropped"])
    with pytest.raises(UsageError):
        Mistakes(corrupt="topk-everything-dropped")


def test_each_how_takes_its_values_from_where_it_says() -> None:
    block = {"slots": "block", "block": (2, 5)}
    assert apply(Corruption(how="dropped", **block), ROW, Context(1))[0, 0].tolist() == [
        0,
        1,
        -1,
        -1,
        -1,
        5,
        6,
        7,
    ]
    shifted = apply(Corruption(how="shifted", shift=-1, slots="block", block=(0, 3)), ROW, Context(1))
    assert shifted[0, 0].tolist() == [-1, 0, 1, 3, 4, 5, 6, 7]  # position 0 - 1: dropped
    two = torch.stack([ROW[0], ROW[0] + 100])
    other = apply(Corruption(how="other-request", **block), two, Context(1))
    assert other[0, 0].tolist() == [0, 1, 102, 103, 104, 5, 6, 7] and other[1, 0].tolist()[2:5] == [2, 3, 4]
    old, same = ROW + 50, ROW.clone()
    ctx = Context(2, history=[old, same], cut_short=[[True], [False]])
    # other-round: the most recent earlier round whose row differs there; rejected-branch: the most recent
    # round the verify cut short whose row differs there (a cut-short round holding the clean row is skipped)
    assert apply(Corruption(how="other-round", **block), ROW, ctx)[0, 0].tolist()[2:5] == [52, 53, 54]
    assert apply(Corruption(how="rejected-branch", **block), ROW, ctx)[0, 0].tolist()[2:5] == [52, 53, 54]
    cut_same = Context(2, history=[old, same], cut_short=[[True], [True]])
    rejected = apply(Corruption(how="rejected-branch", **block), ROW, cut_same)
    assert rejected[0, 0].tolist()[2:5] == [52, 53, 54]
    never_cut = Context(2, history=[old, same], cut_short=[[False], [False]])
    assert torch.equal(apply(Corruption(how="rejected-branch", **block), ROW, never_cut), ROW)
    assert apply(Corruption(how="other-round", **block), ROW, Context(2, [same], [[True]])) is not ROW
    assert torch.equal(apply(Corruption(how="other-round", **block), ROW, Context(2, [same], [[True]])), ROW)
    assert apply(Corruption(how="dropped", steps=(2,), **block), ROW, Context(1)) is ROW  # not its step


def test_requests_and_slots_pick_their_rows_and_columns() -> None:
    assert Corruption(how="dropped", slots="block", block=(0, 1), requests="one", request_ids=(5,)).rows(
        3
    ) == [2]
    frac = Corruption(how="dropped", slots="fraction", slot_fraction=0.25, seed=7)
    assert torch.equal(frac.slot_mask(2048), frac.slot_mask(2048))  # seeded: every application the same
    assert 400 < int(frac.slot_mask(2048).sum()) < 630
    some = Corruption(how="dropped", slots="block", block=(0, 1), requests="fraction", request_fraction=0.5)
    assert len(some.rows(6)) == 3 and some.rows(1) == [0]


def _step_batch(clean: torch.Tensor, seq: int) -> ForwardBatch:
    info = EagleDraftInput(torch.zeros(1, 1, 4), torch.zeros(1, 1, dtype=torch.long), torch.zeros(1))
    ids = torch.tensor([[11]])
    return ForwardBatch(ForwardMode.DECODE, 1, ids, ids, torch.tensor([seq]), spec_info=info)


def test_the_carrier_keeps_the_clean_top_k_and_each_later_step_reads_the_corrupted_view() -> None:
    carrier = CARRIERS["fix"]
    c = Corrupter(Corruption(how="dropped", slots="block", block=(0, 4)), num_steps=5)
    c.needs = lambda row, token: 2  # the lookup needs position 2
    fb = _step_batch(ROW, 100)
    c.before_step(fb, 0, carrier)
    carrier.put(fb, ROW)  # step 0 computes its own top-k and writes it back
    c.after_step(fb, 0, carrier)
    for i in (1, 2):
        c.before_step(fb, i, carrier)
        seen = carrier.get(fb)
        assert seen[0, 0].tolist() == [-1, -1, -1, -1, 4, 5, 6, 7]
        carrier.put(fb, seen)  # the NextN writes back what it used
        c.after_step(fb, i, carrier)
        assert carrier.get(fb) is ROW
    c.end_of_round()
    s = c.summary()
    assert (s["applications"], s["changed"], s["no_op"]) == (2, 2, False)
    assert s["lookups"][0] == {
        "round": 0,
        "step": 1,
        "request": 0,
        "token": 11,
        "slots_changed": 4,
        "need": 2,
        "removed": True,
        "added": False,
    }


def test_params_take_a_corruption_only_on_the_fix_arm_of_the_task_model() -> None:
    base = {"backend": "mini", "model": "task", "context_len": 8192, "workload": "any-slot", "num_steps": 5}
    tail = NAMED["topk-tail-dropped"].to_json()
    assert validate({**base, "arm": "fix", "corrupt": tail}).corrupt == tail
    assert mistakes(None, tail).corrupt == NAMED["topk-tail-dropped"] and mistakes(None) == Mistakes()
    for bad, param in (
        ({**base, "arm": "bug", "corrupt": tail}, "arm"),
        ({**base, "arm": "fix", "corrupt": {**tail, "steps": [4]}}, "corrupt"),  # 5 steps: later steps 1..3
        ({"backend": "mini", "arm": "fix", "corrupt": tail}, "corrupt"),  # the random-weight model
    ):
        with pytest.raises(UsageError) as err:
            validate(bad)
        assert err.value.param == param


def test_the_draws_are_seeded_and_each_corrupts_a_quarter_to_three_quarters_of_a_row() -> None:
    drawn = [fuzz.draw(0, i, 5, 3) for i in range(300)]
    assert drawn == [fuzz.draw(0, i, 5, 3) for i in range(300)]
    for c in drawn:
        share = float(c.slot_mask(fuzz.WIDTH).float().mean())
        assert 0.2 <= share <= 0.8, c
        assert c.steps is None or set(c.steps) <= {1, 2, 3}
    for axis, values in (("how", 5), ("slots", 3), ("requests", 4), ("steps", 7)):
        assert len({c.labels()[axis] for c in drawn}) == values, axis


# ---- the sample, for real

SAMPLE = {"num_requests": 2, "max_new_tokens": 16}
NO_OP = Corruption(how="other-request", other=2, slots="block", block=(0, 2048))  # row (r + 2) % 2 = r
KILLER = Corruption(how="dropped", slots="block", block=(0, 2048))  # every deciding fact gone


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory, require_nsys: str) -> tuple[dict, Path]:
    """20 counted corruptions on any-slot: a no-op first (drawn again), the killer, then seeded draws."""
    out = tmp_path_factory.mktemp("fuzz") / "sample"

    def pick(i: int) -> Corruption:
        return {0: NO_OP, 1: KILLER}.get(i) or fuzz.draw(0, i, 5, SAMPLE["num_requests"])

    return fuzz.run(out, 20, settings=SAMPLE, negative=(), draws=pick), out


@pytest.mark.nsys
def test_the_sample_counts_twenty_corruptions_and_sets_the_no_op_apart(sample: tuple[dict, Path]) -> None:
    result, out = sample
    assert result["corruptions"] == 20 and result["no_ops"] == 1
    assert result["fix"]["verdict"] == "passes" and result["fix"]["gate_failures"] == []
    assert result["fix"]["rounds_departing"] == {}  # the share model's walk is exact round by round
    engine = json.loads((out / "any-slot" / "c0000" / "engine.json").read_text())["corruption"]
    assert engine["no_op"] and engine["applications"] > 0 and engine["changed"] == 0
    assert sum(v["corruptions"] for v in result["by_class"]["how"].values()) == 20
    assert fuzz.table(result).startswith("Corruption fuzzer: mini task, any-slot, context 8192")


@pytest.mark.nsys
def test_a_corruption_that_drops_every_deciding_fact_is_killed_by_the_share_model(
    sample: tuple[dict, Path],
) -> None:
    """The kill is real: the killer's cell takes other verify rounds than the fix, as the gate says."""
    result, out = sample
    written = json.loads((out / "fuzz.json").read_text())
    assert (
        written["results"][1]["verdict"] == "killed" and "share_model" in written["results"][1]["killed_by"]
    )
    cell = out / "any-slot" / "c0001"
    params = json.loads((cell / "params.json").read_text())
    assert Corruption.from_json(params["corrupt"]) == KILLER
    rounds = [
        json.loads(line)["spec_verify_ct"] for line in (cell / "outputs.jsonl").read_text().splitlines()
    ]
    fix = out / "any-slot" / "fix" / "outputs.jsonl"
    assert rounds != [json.loads(line)["spec_verify_ct"] for line in fix.read_text().splitlines()]
    assert KILLER.to_json() not in [s["corruption"] for s in result["survivors"]]


@pytest.mark.nsys
def test_a_same_target_survivor_survives_and_is_shown_equivalent(tmp_path: Path, require_nsys: str) -> None:
    """The negative control's point: on same-target the facts sit in the first 16 slots, so the issue's
    tail-dropping wrong fix passes the gate, and its why says the draft read nothing it changed."""
    w = fuzz.Workload(tmp_path, {**fuzz.NEGATIVE_SETTINGS, **SAMPLE, "workload": "same-target"})
    [res] = w.run([NAMED["topk-tail-dropped"]], 0)
    assert w.fix is not None and w.fix["verdict"] == "passes"
    assert res["verdict"] == "survived" and res["equivalent"] is True, res
    assert res["lookups"]["deciding"] > 0 and res["touched"] == 0
    assert res["why"].startswith("equivalent: ") and "held no deciding fact" in res["why"]


@pytest.mark.nsys
def test_the_mutation_rung_shows_the_fuzzer_kill_rates_and_survivors(sample: tuple[dict, Path]) -> None:
    from kit.report.mutation_suite import fuzz_tables

    result, out = sample
    shutil.copy(out / "fuzz.json", out / "copy.json")  # any name: the rung reads the file it is given
    found = fuzz_tables(out / "copy.json")
    assert found is not None and fuzz_tables(out / "none.json") is None
    line, tables = found
    assert f"kills {result['killed']} of 20 corruptions" in line and "targets NOT met" in line  # 20 < 200
    classes, survivors, control = (t.frame for t in tables)
    assert int(classes[classes["class"] == "how"]["corruptions"].sum()) == 20
    assert list(survivors["cell"]) == [s["cell"] for s in result["survivors"]]
    assert survivors["why"].str.len().min() > 0 and control.empty


@pytest.mark.nsys
def test_judging_the_cells_again_gives_the_same_verdicts(sample: tuple[dict, Path]) -> None:
    result, out = sample
    again = fuzz.rejudge(out, out / "again.json")
    assert set(again["judged"]) == {"kit_git_sha", "date"}
    for key in ("corruptions", "killed", "no_ops", "by_class", "survivors", "results", "fix", "settings"):
        assert again[key] == result[key], key
    with pytest.raises(ExistsError):
        fuzz.rejudge(out, out / "again.json")  # never overwritten


# ---- the committed full run (scripts/fuzz.py; data/results/mutants/fuzz.json and README.md)


def test_the_committed_full_run_counts_every_corruption_and_says_why_each_survivor_lived() -> None:
    f = json.loads((RESULTS / "mutants" / "fuzz.json").read_text())
    assert f["settings"]["workload"] == "any-slot" and f["corruptions"] >= fuzz.TARGETS["corruptions"]
    assert f["fix"]["verdict"] == "passes" and f["fix"]["rounds_departing"] == {}
    assert f["killed"] + len(f["survivors"]) == f["corruptions"]
    for values in f["by_class"].values():
        assert sum(v["corruptions"] for v in values.values()) == f["corruptions"]
    assert all(s["why"] and s["equivalent"] is not None for s in f["survivors"])
    control = f["negative_control"]
    assert set(control["by_workload"]) == set(fuzz.NEGATIVE) and control["reports_survivors"]
    assert all(v["fix"]["verdict"] == "passes" for v in control["by_workload"].values())
