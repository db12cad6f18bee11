"""The order sgl-kernel's top-k writes (the one home of it): which position lands in which output slot.

sglang 0.5.14 selects the DSA indexer's top-k with `sgl_kernel.fast_topk_transform_fused`, whose
`fast_topk_cuda_tl` (csrc/elementwise/topk.cu) is a radix select, not a sort. For a row longer than k:
- pass 0: each score's fp16 bits (round to nearest, sign-flipped: negative -> ~bits, else bits | 0x8000),
  top 8 bits = a coarse bin; the threshold bin T is the one with count(bin >= T) > k >= count(bin > T).
  Every element above T is written at the next counter slot; if exactly k are above, that is all;
- else the elements of bin T (the first SMEM_INPUT of them) are refined in up to four rounds of 8 bits of
  the float32 key (negative -> ~bits, else bits | 0x80000000; round r: bits >> (24 - 8r) & 0xFF): each round
  writes its candidates above that round's threshold at the next counter slots and keeps the ties; round 3
  writes the remaining ties into the last slots, the first ones (in atomic order) winning.
- a row of at most k: slot i holds position i.
So slots hold "decided-above first, in position order; ties last, earliest positions first". Which of the
kernel's threads wins an atomicAdd is up to the hardware; threads stride positions (tid, tid + 1024, ...),
so the order is roughly ascending position. This module MODELS the atomic order as ascending position,
the one thing a dump of the real kernel on a GPU must confirm (scripts/topk_slots.py).
"""

from __future__ import annotations

import torch

TOPK = 2048
RADIX_BITS = 8
SMEM_INPUT = 16384  # kSmem / (2 * sizeof(int)) with kSmem = 128 KiB: candidates a refine round keeps
ROUNDS = 4


def _fp16_bins(x: torch.Tensor) -> torch.Tensor:
    """convert_to_uint8: the top 8 bits of the sign-flipped fp16 key (__float2half_rn rounds to nearest)."""
    bits = x.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF
    key = torch.where(bits >= 0x8000, (~bits) & 0xFFFF, bits | 0x8000)
    return key >> 8


def _fp32_keys(x: torch.Tensor) -> torch.Tensor:
    """convert_to_uint32 as a non-negative int64: order-preserving for every float32."""
    bits = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return torch.where(bits >= 0x80000000, (~bits) & 0xFFFFFFFF, bits | 0x80000000)


def _threshold(bins: torch.Tensor, k: int) -> int:
    """The bin T with count(bin >= T) > k and count(bin >= T + 1) <= k (the kernel's suffix cumsum)."""
    at_least = torch.bincount(bins, minlength=1 << RADIX_BITS).flip(0).cumsum(0).flip(0)
    return int((at_least > k).nonzero().max())


def kernel_topk(scores: torch.Tensor, k: int = TOPK) -> torch.Tensor:
    """Positions of `scores` [n] (float32) in the slot order fast_topk_cuda_tl writes them (int64, length
    min(n, k)); atomic order modelled as ascending position (see the module docstring)."""
    x = scores.detach().reshape(-1).to(torch.float32).cpu()
    n = x.numel()
    if n <= k:
        return torch.arange(n)
    bins = _fp16_bins(x)
    t0 = _threshold(bins, k)
    out = [(bins > t0).nonzero().flatten()]
    need = k - len(out[0])
    if need == 0:
        return out[0]
    cand = (bins == t0).nonzero().flatten()[:SMEM_INPUT]
    keys = _fp32_keys(x[cand])
    for rnd in range(ROUNDS):
        if bool((keys == keys[0]).all()):  # every later round ties them all: the earliest fill the rest
            out.append(cand[:need])
            break
        sub = (keys >> (24 - RADIX_BITS * rnd)) & 0xFF
        t = _threshold(sub, need)
        above = sub > t
        out.append(cand[above])
        need -= int(above.sum())
        if need == 0:
            break
        tie = sub == t
        if rnd == ROUNDS - 1:  # the last round's ties fill the last slots, earliest first
            out.append(cand[tie][:need])
            break
        cand, keys = cand[tie][:SMEM_INPUT], keys[tie][:SMEM_INPUT]
    return torch.cat(out)
