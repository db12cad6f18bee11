"""kit.analysis.verdict: expectations per arm, pass/fail/inconclusive, every warning the report must carry."""

from __future__ import annotations

import pytest

from kit.analysis.verdict import make_verdict
from kit.arms import expected_per_round
from kit.errors import KitError


def rows(*launches: int, pid: int = 1) -> list[dict]:
    return [{"round": i + 1, "pid": pid, "indexer_launches": n} for i, n in enumerate(launches)]


@pytest.mark.parametrize(("arm", "expected"), [("off", 4), ("bug", 4), ("fix", 1), ("upstream", 1)])
def test_expected_per_round(arm: str, expected: int) -> None:
    assert expected_per_round(arm, 5) == expected


@pytest.mark.parametrize("bad", [1, 0, "5", 2.0, True, None])
def test_num_steps_is_validated(bad) -> None:
    with pytest.raises(KitError, match="num_steps must be an integer >= 2"):
        expected_per_round("bug", bad)


def test_unknown_arm_and_source() -> None:
    with pytest.raises(KitError, match="unknown arm 'patched'"):
        make_verdict(rows(1), "patched", 5)
    with pytest.raises(KitError, match="unknown source 'ncu'"):
        make_verdict(rows(1), "fix", 5, source="ncu")


def test_fix_pass_and_fail() -> None:
    v = make_verdict(rows(1, 1, 1), "fix", 5, context_len=8192, method="graph")
    assert v["status"] == "pass" and v["passed"] is True
    assert v["expected_per_round"] == 1 and v["launches_per_round"] == [1, 1, 1] and v["num_rounds"] == 3
    assert v["method"] == "graph" and v["source"] == "nsys" and v["warnings"] == []
    assert v["meaning"].startswith("fix confirmed")
    v = make_verdict(rows(1, 4, 1), "fix", 5, context_len=8192)
    assert v["status"] == "fail" and v["passed"] is False
    assert v["observed_counts"] == {"1": 2, "4": 1}


def test_bug_passed_means_reproduced() -> None:
    v = make_verdict(rows(4, 4), "bug", 5, context_len=8192)
    assert v["passed"] and v["meaning"].startswith("bug reproduced")
    v = make_verdict(rows(1, 1), "bug", 5, context_len=8192)
    assert not v["passed"] and v["status"] == "fail" and "NOT reproduced" in v["meaning"]


def test_no_rounds_is_inconclusive_never_zero_passed() -> None:
    for arm in ("off", "bug", "fix", "upstream"):
        v = make_verdict([], arm, 3)
        assert v["status"] == "inconclusive" and v["passed"] is False and v["num_rounds"] == 0
        assert "no draft rounds" in v["warnings"][0]


def test_inconclusive_reason_wins_over_matching_rows() -> None:
    v = make_verdict(rows(1), "fix", 3, inconclusive_reason="NVTX dropped: domain created, no ranges")
    assert v["status"] == "inconclusive" and not v["passed"]
    assert v["warnings"][0].startswith("NVTX dropped") and v["meaning"].startswith("inconclusive")


def test_warnings() -> None:
    v = make_verdict(rows(1) + rows(1, pid=2), "fix", 2, context_len=2048, index_topk=2048, source="recorder")
    text = " | ".join(v["warnings"])
    assert "context_len 2048 <= index_topk 2048" in text
    assert "num_steps 2: bug and fix both expect 1" in text
    assert "multiple ranks: 2 processes" in text and v["num_processes"] == 2
    assert "NOT measured under Nsight Systems" in text
    v = make_verdict(rows(1), "fix", 3, context_len=2049, extra_warnings=["from the analyzer"])
    assert v["warnings"] == ["from the analyzer"]
