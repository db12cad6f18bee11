"""kit.task.topk.kernel_topk: the slot order of sgl-kernel's radix-select top-k, on hand-built rows whose
order is known from the kernel's passes (decided-above first in position order, ties last, earliest
first), and the selected set against torch.topk where the scores are distinct."""

from __future__ import annotations

import torch

from kit.task.topk import _fp16_bins, kernel_topk

K = 2048


def _row(n: int, fill: float, **levels: tuple[list[int], float]) -> torch.Tensor:
    x = torch.full((n,), fill, dtype=torch.float32)
    for positions, value in levels.values():
        x[torch.tensor(positions, dtype=torch.long)] = value
    return x


def _picks(n: int, count: int, seed: int, lo: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return sorted((lo + torch.randperm(n - lo, generator=g)[:count]).tolist())


def test_three_levels_group_in_position_order_then_earliest_fillers() -> None:
    n = 8192
    group = _picks(n, 100, 1)
    rest = [p for p in _picks(n, 3000, 2) if p not in group]
    x = _row(n, 1.0, g=(group, 2.0), r=(rest, 0.0))
    fillers = [p for p in range(n) if p not in set(group) | set(rest)]
    assert kernel_topk(x).tolist() == group + fillers[: K - len(group)]


def test_decided_above_is_position_order_not_score_order() -> None:
    n = 4096
    high, mid = [3000, 3500], [10, 20]  # different coarse bins, both above the fillers' bin
    x = _row(n, 1.0, h=(high, 8.0), m=(mid, 2.0))
    assert kernel_topk(x)[:4].tolist() == [10, 20, 3000, 3500]


def test_more_than_k_in_the_top_coarse_bin_refined_round_by_round() -> None:
    n = 4096
    ties = _picks(n, 2100, 3)
    r1 = [p for p in _picks(n, 5, 4, lo=3000) if p not in ties]  # decided in refine round 1
    r3 = [p for p in _picks(n, 5, 5) if p not in ties + r1]  # decided in round 3, earlier positions
    x = _row(n, 0.0, t=(ties, 1.0), a=(r1, 1.0 + 2**-7), b=(r3, 1.0 + 2**-20))
    assert len(set(_fp16_bins(torch.tensor([1.0, 1.0 + 2**-7, 1.0 + 2**-20])).tolist())) == 1
    got = kernel_topk(x).tolist()
    assert got == r1 + r3 + ties[: K - len(r1) - len(r3)]


def test_exactly_k_above() -> None:
    n = 5000
    top = _picks(n, K, 6)
    x = _row(n, 1.0, t=(top, 2.0))
    assert kernel_topk(x).tolist() == top


def test_short_rows_are_the_prefix_in_order() -> None:
    for n in (0, 1, 100, K):
        assert kernel_topk(torch.randn(n)).tolist() == list(range(n))


def test_negative_scores() -> None:
    n = 6000
    group = _picks(n, 50, 7)
    rest = [p for p in _picks(n, 1000, 8) if p not in group]
    x = _row(n, -1.0, g=(group, -0.5), r=(rest, -2.0))
    fillers = [p for p in range(n) if p not in set(group) | set(rest)]
    assert kernel_topk(x).tolist() == group + fillers[: K - len(group)]


def test_minus_inf_masked_tail() -> None:
    x = torch.full((6000,), float("-inf"))
    x[:3000] = 1.0
    x[[5, 2999]] = 4.0
    assert kernel_topk(x).tolist() == [5, 2999] + [p for p in range(3000) if p not in (5, 2999)][: K - 2]
    y = torch.full((6000,), float("-inf"))
    y[:1500] = torch.rand(1500)
    got = kernel_topk(y)
    assert sorted(got[:1500].tolist()) == list(range(1500))  # every finite score, then the earliest -inf
    assert got[1500:].tolist() == list(range(1500, K))


def test_distinct_scores_select_the_true_top_k() -> None:
    g = torch.Generator().manual_seed(9)
    for n in (2049, 5000, 70000):
        x = torch.randn(n, generator=g) * 3
        got = kernel_topk(x)
        assert len(got) == K and len(set(got.tolist())) == K
        assert set(got.tolist()) == set(torch.topk(x, K).indices.tolist())


def test_the_kernels_torch_stand_in_writes_the_kernel_order_through_the_page_table() -> None:
    """ReferenceKernels.fast_topk_transform_fused: slot order of kernel_topk over each row's live range
    (row_starts), then the page table; short rows keep the naive path's first `length` slots."""
    from kit.backends.mini.dsa_kernels import ReferenceKernels

    n, start = 6000, 100
    group = _picks(n, 40, 11)
    live = _row(n, 1.0, g=(group, 3.0))
    score = torch.full((2, start + n), 9.0)  # outside a row's live range: huge, never picked
    score[0, start:] = live
    score[1, :1000] = torch.rand(1000)
    pages = torch.randperm(start + n).to(torch.int32)[None].repeat(2, 1).contiguous()
    out = ReferenceKernels().fast_topk_transform_fused(
        score=score,
        lengths=torch.tensor([n, 1000], dtype=torch.int32),
        page_table_size_1=pages,
        cu_seqlens_q=torch.tensor([0, 1, 2], dtype=torch.int32),
        topk=K,
        row_starts=torch.tensor([start, 0], dtype=torch.int32),
    )
    assert out[0].tolist() == pages[0][kernel_topk(live)].tolist()
    assert out[0][: len(group)].tolist() == pages[0][group].tolist()
    assert out[1].tolist() == pages[1][:1000].tolist() + [-1] * (K - 1000)
