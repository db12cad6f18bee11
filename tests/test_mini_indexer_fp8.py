"""sglang's fp8 index-K cache in plain torch: quantization, byte layout, round trip, and the kernel indexer's
plumbing through the torch stand-in for deep_gemm + sgl_kernel (all on CPU)."""

from __future__ import annotations

import re
import struct

import pytest
import torch

from kit.backends.mini.dsa_indexer import Indexer, Rope
from kit.backends.mini.dsa_indexer_sglang import SglangIndexer
from kit.backends.mini.dsa_kernels import ReferenceKernels
from kit.backends.mini.index_buf_accessor import (
    FP8,
    PAGE_SIZE,
    IndexKWithScaleBuffer,
    act_quant,
    hadamard_matrix,
    quant_index_k,
    rotate_activation,
)
from kit.backends.mini.kernel_check import HIDDEN, Q_LORA, Case, indexer_weights, shuffled_cache, topk_overlap
from kit.probe import ranges as nr


@pytest.fixture(autouse=True)
def _sink_off():
    nr.configure("off")
    yield


def test_key_quantization_is_fused_store_index_k_cache():
    """Per-token fp32 scale = max(amax, 1e-4) / 448 (no power-of-two rounding); amax lands on +-448."""
    g = torch.Generator().manual_seed(0)
    k = torch.randn(5, 128, generator=g) * torch.tensor([1.0, 3.0, 0.01, 100.0, 0.0])[:, None]
    k_fp8, scale = quant_index_k(k)
    assert k_fp8.dtype == FP8 and k_fp8.shape == (5, 128) and scale.shape == (5,)
    amax = k.abs().amax(-1)
    assert torch.allclose(scale[:4], amax[:4] / 448.0)
    assert scale[4] == pytest.approx(1e-4 / 448.0)  # an all-zero key keeps a finite scale
    top = k.abs().argmax(-1)
    assert torch.equal(k_fp8.float()[torch.arange(4), top[:4]].abs(), torch.full((4,), 448.0))
    rel = (k_fp8.float() * scale[:, None] - k).abs() / amax.clamp_min(1e-9)[:, None]
    assert rel[:4].max() <= 2**-4  # e4m3: 3 mantissa bits, error at most 1/16 of the largest value


def test_query_quantization_is_act_quant_ue8m0():
    """act_quant(q, 128, 'ue8m0'): a power-of-two scale per 128-group, >= amax / 448, values within +-448."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(3, 4, 256, generator=g) * 7
    q_fp8, s = act_quant(q, 128, "ue8m0")
    assert q_fp8.shape == q.shape and s.shape == (3, 4, 2)
    assert torch.equal(torch.exp2(torch.log2(s).round()), s)  # powers of two
    amax = q.view(3, 4, 2, 128).abs().amax(-1)
    assert (s >= amax / 448).all() and (s < 2 * amax / 448).all()
    back = q_fp8.float().view(3, 4, 2, 128) * s[..., None]
    assert (back - q.view(3, 4, 2, 128)).abs().max() <= (amax / 8).max()
    _, plain = act_quant(q, 128, None)
    assert torch.allclose(plain, amax / 448)
    with pytest.raises(ValueError, match="multiple of block_size"):
        act_quant(torch.zeros(2, 100))


def test_hadamard_is_orthonormal_and_keeps_dot_products():
    h = hadamard_matrix(128, "cpu", torch.float64)
    assert torch.allclose(h @ h, torch.eye(128, dtype=torch.float64))
    assert set(h.mul(128**0.5).round().unique().tolist()) == {-1.0, 1.0}
    g = torch.Generator().manual_seed(2)
    a, b = (torch.randn(4, 128, generator=g, dtype=torch.float64) for _ in range(2))
    assert torch.allclose((rotate_activation(a) * rotate_activation(b)).sum(-1), (a * b).sum(-1))
    assert not torch.allclose(rotate_activation(a), a)
    with pytest.raises(ValueError, match="power of 2"):
        hadamard_matrix(96, "cpu", torch.float32)


def _stored(batch: int = 2, max_len: int = 256, seed: int = 3):
    cache = shuffled_cache(batch, max_len, "cpu", seed)
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(batch, max_len, 128, generator=g).to(torch.bfloat16)
    pos = torch.arange(max_len).expand(batch, -1)
    cache.store(keys, pos)
    return cache, keys


def test_cache_bytes_are_laid_out_as_sglang_and_deepgemm_read_them():
    """Page = 64 tokens' 128 fp8 bytes, then their 64 fp32 scales; the page comes from page_table_64."""
    cache, keys = _stored()
    assert cache.buf.shape == (2 * 256 // PAGE_SIZE, PAGE_SIZE * 132) and cache.buf.dtype == torch.uint8
    assert not torch.equal(cache.page_table_64.flatten().sort().values, cache.page_table_64.flatten())
    raw = cache.buf.numpy().tobytes()
    page_bytes = PAGE_SIZE * 132
    for b, pos in ((0, 0), (0, 63), (0, 64), (1, 130), (1, 255)):
        k_fp8, scale = quant_index_k(keys[b, pos][None])
        page = int(cache.page_table_64[b, pos // 64])
        off = pos % 64
        base = page * page_bytes
        assert raw[base + off * 128 : base + off * 128 + 128] == k_fp8.view(torch.uint8).numpy().tobytes()
        (stored_scale,) = struct.unpack("<f", raw[base + 64 * 128 + off * 4 : base + 64 * 128 + off * 4 + 4])
        assert stored_scale == pytest.approx(float(scale[0]), rel=0, abs=0)
    view = cache.kv_cache_fp8()
    assert view.shape == (cache.num_pages, 64, 1, 132) and view.stride() == (page_bytes, 132, 132, 1)
    assert view.data_ptr() == cache.buf.data_ptr()


def test_round_trip_and_gather_agree():
    cache, keys = _stored()
    deq = cache.dequantize()
    assert deq.shape == (2, 256, 128)
    amax = keys.float().abs().amax(-1, keepdim=True)
    assert ((deq - keys.float()).abs() <= amax / 16).all()
    k, s = cache.get_index_k_scale_buffer()
    assert k.dtype == FP8 and k.shape == (512, 128) and s.shape == (512,)
    assert k.is_contiguous() and s.is_contiguous()
    assert torch.equal((k.float() * s[:, None]).view(2, 256, 128), deq)


def test_cache_refuses_other_shapes():
    with pytest.raises(ValueError, match="index_head_dim 128"):
        IndexKWithScaleBuffer.allocate(1, 128, "cpu", head_dim=64)
    with pytest.raises(ValueError, match="multiple of the page size"):
        IndexKWithScaleBuffer.allocate(1, 100, "cpu")


def test_reference_paged_logits_follow_the_block_table():
    """The stand-in reads DeepGEMM's layout: its logits equal a computation on the dequantized keys."""
    ref = ReferenceKernels()
    cache, _ = _stored(batch=2, max_len=512)
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 1, 64, 128, generator=g).to(FP8)
    w = torch.rand(2, 64, generator=g)
    ctx = torch.tensor([[300], [511]], dtype=torch.int32)
    meta = ref.get_paged_mqa_logits_metadata(ctx, 64, ref.num_sms)
    logits = ref.fp8_paged_mqa_logits(q, cache.kv_cache_fp8(), w, ctx, cache.page_table_64, meta, 512)
    deq = cache.dequantize()
    for b, n in ((0, 300), (1, 511)):
        want = ((deq[b, :n] @ q[b, 0].float().T).relu() * w[b]).sum(-1)
        assert torch.allclose(logits[b, :n], want, rtol=1e-5, atol=1e-4)
        assert (logits[b, n:] == ReferenceKernels.UNWRITTEN).all()


@pytest.mark.parametrize(
    "break_it,what",
    [
        (lambda a: {**a, "block_table": a["block_table"].long()}, "block_table int32"),
        (lambda a: {**a, "context_lens": a["context_lens"].view(-1)}, "context_lens [B, next_n]"),
        (lambda a: {**a, "weights": a["weights"].t().contiguous().t()}, "weights f32 contiguous"),
        (lambda a: {**a, "q": a["q"].float()}, "fp8 contiguous"),
    ],
)
def test_reference_kernels_enforce_the_real_host_checks(break_it, what):
    ref = ReferenceKernels()
    cache, _ = _stored(batch=2, max_len=128)
    args = {
        "q": torch.zeros(2, 1, 64, 128).to(FP8),
        "kv_cache": cache.kv_cache_fp8(),
        "weights": torch.zeros(2, 64),
        "context_lens": torch.full((2, 1), 100, dtype=torch.int32),
        "block_table": cache.page_table_64,
        "schedule_meta": torch.zeros(ref.num_sms + 1, 2, dtype=torch.int32),
        "max_context_len": 128,
    }
    ref.fp8_paged_mqa_logits(**args)
    with pytest.raises(RuntimeError, match="host check failed: .*" + re.escape(what)):
        ref.fp8_paged_mqa_logits(**break_it(args))
    with pytest.raises(RuntimeError, match="topk == 2048"):
        ref.fast_topk_transform_fused(
            torch.zeros(2, 128),
            torch.full((2,), 100, dtype=torch.int32),
            cache.page_table_1,
            torch.arange(3, dtype=torch.int32),
            1024,
        )


def test_reference_topk_transform_maps_through_page_table_1():
    ref = ReferenceKernels()
    score = torch.arange(3000, dtype=torch.float32).repeat(2, 1)
    score[1] = -score[1]
    positions = torch.arange(3000, dtype=torch.int32)
    table = torch.stack([positions, positions + 10000])
    lengths = torch.tensor([2500, 3000], dtype=torch.int32)
    out = ref.fast_topk_transform_fused(score, lengths, table, torch.arange(3, dtype=torch.int32), 2048)
    assert sorted(out[0].tolist()) == list(range(2500 - 2048, 2500))  # the largest within the length
    assert sorted(out[1].tolist()) == list(range(10000, 10000 + 2048))  # request 1's table
    short = ref.fast_topk_transform_fused(
        score[:1], torch.tensor([10], dtype=torch.int32), table[:1], torch.arange(2, dtype=torch.int32), 2048
    )
    assert short[0, :10].tolist() == list(range(10)) and (short[0, 10:] == -1).all()
    starts = torch.tensor([100], dtype=torch.int32)  # ragged: indices relative to the row start
    rel = ref.fast_topk_transform_fused(
        score[:1],
        torch.tensor([2500], dtype=torch.int32),
        table[:1],
        torch.arange(2, dtype=torch.int32),
        2048,
        row_starts=starts,
    )
    assert sorted(rel[0].tolist()) == list(range(2500 - 2048, 2500))


@pytest.mark.parametrize("heads,batch,tokens", [(64, 1, 1), (32, 2, 1), (64, 2, 6)])
def test_kernel_indexer_paged_and_ragged_select_the_same_tokens(heads, batch, tokens):
    case = Case(heads, batch, tokens, 4096, "cpu", seed=heads + tokens)
    ref = ReferenceKernels()
    paged = case.run(case.indexer(ref, "paged"))
    ragged = case.run(case.indexer(ref, "ragged"))
    assert paged.shape == (batch, tokens, 2048) and paged.dtype == torch.int64
    assert torch.equal(paged, ragged)
    assert torch.equal(paged, paged.sort(-1).values)  # the mini's canonical order
    assert (paged >= 0).all() and (paged < case.limit[..., None]).all()  # only slots below each limit


def test_kernel_indexer_counts_calls_and_short_contexts_keep_everything():
    case = Case(64, 2, 1, 1500, "cpu", seed=5)
    ix = case.indexer(ReferenceKernels(), "paged")
    out = case.run(ix)
    assert ix.calls == 1
    for b in range(2):
        n = int(case.limit[b, 0])
        assert out[b, 0, -n:].tolist() == list(range(n)) and (out[b, 0, :-n] == -1).all()


def test_kernel_indexer_agrees_with_the_torch_indexer_up_to_fp8():
    """Same weights and keys: fp8 + Hadamard moves only near-ties of the top-2048 out of 8k."""
    n = 8192
    weights, rope = indexer_weights(64, 6, "cpu"), Rope(64, n + 64, torch.device("cpu"))
    ix = SglangIndexer(weights, 64, 128, 2048, rope, ReferenceKernels(), "paged")
    tix = Indexer(weights, 64, 128, 2048, rope)
    cache = shuffled_cache(2, n + 64, "cpu", 6)
    dense = torch.zeros(2, n + 64, 128)
    g = torch.Generator().manual_seed(6)
    xs = torch.randn(2, n, HIDDEN, generator=g).to(torch.bfloat16)
    pos = torch.arange(n).expand(2, -1)
    for s in range(0, n, 2048):
        ix.store_k(xs[:, s : s + 2048], pos[:, s : s + 2048], cache)
        tix.store_k(xs[:, s : s + 2048], pos[:, s : s + 2048], dense)
    x = torch.randn(2, 1, HIDDEN, generator=g).to(torch.bfloat16)
    q_lora = torch.randn(2, 1, Q_LORA, generator=g).to(torch.bfloat16)
    qpos = torch.full((2, 1), n)
    got = ix.forward(x, q_lora, qpos, cache, qpos + 1)
    want = tix.forward(x, q_lora, qpos, dense, qpos + 1)
    assert topk_overlap(got, want) >= 0.9
    assert not torch.equal(got, want)  # fp8 does change something: the comparison is not vacuous


def _dequantized_reference(case: Case) -> torch.Tensor:
    """Top-k of sum_h gate_h * relu((q_fp8 * q_scale)_h . k_s) on the dequantized cache, written out here."""
    w, B, T, H = case.weights, case.batch, case.tokens, case.heads
    q = (case.q_lora @ w.wq_b.T).float().view(B, T, H, 128)
    q = rotate_activation(case.rope.apply(q, case.positions).to(torch.bfloat16))
    q_fp8, q_scale = act_quant(q, 128, "ue8m0")
    q = q_fp8.float() * q_scale  # [B, T, H, 128]
    gate = (case.x @ w.weights_proj.T).float() * H**-0.5 * 128**-0.5  # [B, T, H]
    keys = case.cache.dequantize()  # [B, N, 128]
    logits = torch.einsum("bnd,bthd->bthn", keys, q).relu().mul(gate[..., None]).sum(2)  # [B, T, N]
    slots = torch.arange(keys.shape[1])
    logits = logits.masked_fill(slots >= case.limit[..., None], float("-inf"))
    return torch.topk(logits, 2048, dim=-1).indices.sort(-1).values


@pytest.mark.parametrize("path", ["paged", "ragged"])
def test_kernel_indexer_is_the_dequantized_computation(path):
    """The weights the kernels get carry q's fp8 scales and the softmax scale (the kernels see raw fp8 q)."""
    case = Case(64, 2, 2, 6000, "cpu", seed=8)
    got = case.run(case.indexer(ReferenceKernels(), path))
    assert topk_overlap(got, _dequantized_reference(case)) >= 0.995
