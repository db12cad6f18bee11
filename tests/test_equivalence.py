"""kit.compare.equivalence: comparing two runs' outputs.jsonl rows."""

from __future__ import annotations

import json

import pytest

from kit.compare.equivalence import (
    accept_length,
    compare_request,
    compare_runs,
    first_divergence,
    logprob_agreement,
    match_rate,
    read_outputs,
)
from kit.errors import KitError


def row(pid, out, verify, drafts=None):
    r = {
        "prompt_id": pid,
        "input_len": 10,
        "output_ids": out,
        "completion_tokens": len(out),
        "spec_verify_ct": verify,
    }
    if drafts is not None:
        r["draft_ids"] = drafts
    return r


@pytest.mark.parametrize(
    "a,b,expected",
    [
        ([1, 2, 3], [1, 2, 3], None),
        ([1, 2, 3], [1, 9, 3], 1),
        ([1, 2], [1, 2, 3], 2),
        ([], [], None),
        ([5], [], 0),
    ],
)
def test_first_divergence(a, b, expected):
    assert first_divergence(a, b) == expected


def test_match_rate():
    assert match_rate([1, 2, 3, 4], [1, 2, 0, 4]) == 0.75
    assert match_rate([1, 2], [1, 2, 3, 4]) == 0.5  # missing tokens count as mismatches
    assert match_rate([], []) == 1.0


def test_accept_length():
    assert accept_length(row(0, [1] * 10, 4)) == 2.5
    assert accept_length(row(0, [1], 0)) is None


def test_compare_request():
    r = compare_request(row(0, [1, 2, 3, 4], 2, [[1, 2]]), row(0, [1, 2, 3, 5], 1, [[1, 3]]))
    assert r == {
        "prompt_id": 0,
        "identical": False,
        "match_rate": 0.75,
        "first_divergence": 3,
        "accept_length_a": 2.0,
        "accept_length_b": 4.0,
        "accept_length_diff": 2.0,
        "draft_identical": False,
        "logprob_max_abs_diff": None,
        "logprob_median_abs_diff": None,
        "min_margin": None,
        "divergence_margin": None,
    }
    assert (
        compare_request(row(0, [1], 1), row(0, [1], 1))["draft_identical"] is None
    )  # sglang rows: no drafts


def test_compare_runs_identical_outputs_different_drafts():
    a = [row(0, [1, 2, 3], 2, [[1]]), row(1, [4, 5, 6, 7], 2, [[2]])]
    b = [row(1, [4, 5, 6, 7], 1, [[2]]), row(0, [1, 2, 3], 2, [[9]])]  # order does not matter
    s = compare_runs(a, b)
    assert s["all_identical"] and s["n_identical"] == 2 and s["match_rate"] == 1.0
    assert s["first_divergence"] is None
    assert s["accept_length_a"] == 7 / 4 and s["accept_length_b"] == 7 / 3
    assert s["accept_length_diff"] == pytest.approx(7 / 3 - 7 / 4)
    assert s["accept_length_rel_diff"] == pytest.approx((7 / 3 - 7 / 4) / (7 / 4))
    assert s["draft_identical"] is False and s["n_draft_identical"] == 1
    assert [r["prompt_id"] for r in s["requests"]] == [0, 1]


def test_compare_runs_divergence_and_missing():
    a = [row(0, [1, 2, 3, 4], 2), row(1, [1, 1], 1)]
    b = [row(0, [1, 2, 0, 0], 2), row(2, [3], 1)]
    s = compare_runs(a, b)
    assert not s["all_identical"] and s["n_requests"] == 1
    assert s["match_rate"] == 0.5 and s["first_divergence"] == 2
    assert s["missing_in_a"] == [2] and s["missing_in_b"] == [1]
    assert s["draft_identical"] is None


def lp_row(pid, out, logprobs, margins):
    return {**row(pid, out, 1), "output_logprobs": logprobs, "output_margins": margins}


def test_logprob_agreement_over_the_common_prefix_and_at_the_divergence():
    a = lp_row(0, [1, 2, 3, 4], [-0.1, -0.2, -0.3, -0.4], [2.0, 1.0, 0.02, 3.0])
    b = lp_row(0, [1, 2, 7, 4], [-0.1, -0.25, -9.0, -0.4], [2.0, 0.9, 0.01, 3.0])
    got = logprob_agreement(a, b)
    # tokens 0-1 agree: their logprobs differ by at most 0.05; the margin at token 2 says "near-tie"
    assert got["logprob_max_abs_diff"] == pytest.approx(0.05)
    assert got["logprob_median_abs_diff"] == pytest.approx(0.025)
    assert got["min_margin"] == 0.9 and got["divergence_margin"] == 0.01
    same = logprob_agreement(a, {**a, "output_logprobs": [-0.1, -0.2, -0.3, -0.5]})
    assert same["logprob_max_abs_diff"] == pytest.approx(0.1) and same["divergence_margin"] is None
    assert same["min_margin"] == 0.02
    # no logprobs (mini engine rows, older runs): nothing claimed
    assert set(logprob_agreement(row(0, [1], 1), a).values()) == {None}
    # diverging at token 0: there is no common prefix to compare
    first = logprob_agreement(a, lp_row(0, [9, 2, 3, 4], [-5.0] * 4, [0.3] * 4))
    assert first == {
        "logprob_max_abs_diff": None,
        "logprob_median_abs_diff": None,
        "min_margin": None,
        "divergence_margin": 0.3,
    }


def test_compare_runs_pools_logprob_agreement():
    a = [lp_row(0, [1, 2], [-0.1, -0.2], [1.0, 0.5]), lp_row(1, [3, 4], [-0.1, -0.2], [2.0, 0.04])]
    b = [lp_row(0, [1, 2], [-0.1, -0.2], [1.0, 0.5]), lp_row(1, [3, 5], [-0.3, -0.2], [2.0, 0.03])]
    s = compare_runs(a, b)
    assert s["logprob_max_abs_diff"] == pytest.approx(0.2) and s["min_margin"] == 0.5
    assert s["logprob_median_abs_diff"] == pytest.approx(0.0)  # pooled over the 3 common tokens: 0, 0, 0.2
    assert s["divergence_margins"] == [0.03]


def test_compare_runs_rejects_bad_rows():
    with pytest.raises(KitError, match="lacks spec_verify_ct"):
        compare_runs([{"prompt_id": 0, "output_ids": [], "completion_tokens": 0}], [])
    with pytest.raises(KitError, match="appears twice"):
        compare_runs([row(0, [1], 1), row(0, [1], 1)], [])


def test_read_outputs(tmp_path):
    p = tmp_path / "outputs.jsonl"
    p.write_text(json.dumps(row(0, [1], 1)) + "\n\n" + json.dumps(row(1, [2], 1)) + "\n")
    assert [r["prompt_id"] for r in read_outputs(p)] == [0, 1]
    p.write_text("{not json\n")
    with pytest.raises(KitError, match="line 1 is not JSON"):
        read_outputs(p)
    with pytest.raises(KitError, match="not found"):
        read_outputs(tmp_path / "nope.jsonl")
