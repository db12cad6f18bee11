"""sglang's own indexer kernels (deep_gemm + sgl_kernel) inside the mini engine, on an sm90/sm100 GPU.

GPU-only (`make test-gpu`). Needs deep_gemm (sgl-deep-gemm 0.1.3), sgl_kernel (sglang-kernel 0.4.4) and
tvm_ffi on PYTHONPATH; without them the module is skipped, unless KIT_REQUIRE_SGLANG_KERNELS=1 (then it
fails). The reference is kit/mini/dsa_kernels.ReferenceKernels on the same fp8 inputs (the dequantized
cache, fp32 math): the kernels may only move near-ties, so each row's top-2048 set must overlap it >= 95%.
"""

from __future__ import annotations

import os

import pytest
import torch

from kit.backends.mini.dsa_kernels import ReferenceKernels, device_problem, load_kernels, resolve_indexer_impl
from kit.backends.mini.engine import Engine
from kit.backends.mini.kernel_check import MIN_OVERLAP, Case, graph_check, topk_overlap
from kit.backends.mini.params import validate
from kit.compare.equivalence import compare_runs
from kit.errors import KitError
from kit.probe import ranges as nr

if not torch.cuda.is_available():
    pytest.fail("tests/gpu needs a CUDA GPU: run `make test-gpu` on a GPU host", pytrace=False)

try:
    if device_problem("cuda"):
        raise KitError(device_problem("cuda"))
    KERNELS = load_kernels()
except KitError as exc:
    if os.environ.get("KIT_REQUIRE_SGLANG_KERNELS") == "1":
        pytest.fail(f"sglang's kernels are required here: {exc}", pytrace=False)
    pytest.skip(f"sglang's indexer kernels unavailable: {exc}", allow_module_level=True)


@pytest.fixture(autouse=True)
def _sink_off():
    nr.configure("off")
    yield


def test_auto_picks_the_kernels_here():
    impl, why, kernels = resolve_indexer_impl("auto", "cuda", 64, 128, 2048)
    assert impl == "sglang" and kernels is not None, why


@pytest.mark.parametrize("path", ["paged", "ragged"])
@pytest.mark.parametrize("heads,batch,tokens", [(64, 1, 1), (64, 4, 1), (64, 2, 6), (32, 1, 1), (32, 2, 6)])
def test_topk_matches_the_reference_on_the_dequantized_cache(heads, batch, tokens, path):
    case = Case(heads, batch, tokens, 32768, "cuda", seed=heads + batch + tokens)
    got = case.run(case.indexer(KERNELS, path))
    want = case.run(case.indexer(ReferenceKernels(num_sms=KERNELS.num_sms), path))
    assert got.shape == want.shape == (batch, tokens, 2048)
    assert (got >= 0).all() and (got < case.limit[..., None]).all()
    assert topk_overlap(got, want) >= MIN_OVERLAP


def test_short_context_keeps_every_token():
    case = Case(64, 2, 1, 1500, "cuda", seed=1)
    out = case.run(case.indexer(KERNELS, "paged"))
    for b in range(2):
        n = int(case.limit[b, 0])
        assert out[b, 0, -n:].tolist() == list(range(n)) and (out[b, 0, :-n] == -1).all()


def test_cuda_graph_replay_matches_eager_calls():
    for row in graph_check(KERNELS, "cuda"):
        assert row["overlap"] >= MIN_OVERLAP, row


def _run(arm: str, graph: bool, preset: str = "dsv32", context: int = 16384, path: str = "paged"):
    params = validate(
        {
            "arm": arm,
            "context_len": context,
            "num_requests": 2,
            "max_new_tokens": 16,
            "device": "cuda",
            "cuda_graph": graph,
            "preset": preset,
            "nvtx_sink": "off",
            "indexer_impl": "sglang",
            "indexer_path": path,
        }
    )
    return Engine(params).run()


@pytest.fixture(scope="module")
def runs():
    return {(arm, graph): _run(arm, graph) for arm in ("bug", "fix") for graph in (False, True)}


def test_engine_runs_the_kernels_and_records_it(runs):
    info = runs[("bug", True)][1]
    assert info["indexer_impl"] == "sglang" and info["indexer_path"] == "paged"
    assert info["indexer_kernels"]["name"] == "sglang"
    assert info["accept_length_mean"] > 1.5


def test_eager_counts_indexer_calls_per_round(runs):
    assert set(runs[("bug", False)][1]["draft_indexer_calls_per_round"]) == {4}
    assert set(runs[("fix", False)][1]["draft_indexer_calls_per_round"]) == {1}


def test_outputs_identical_across_arms_and_graph_replay(runs):
    base = runs[("bug", False)][0]
    for key, (rows, _) in runs.items():
        assert compare_runs(base, rows)["all_identical"], key


@pytest.mark.parametrize("preset,path", [("glm5", "paged"), ("dsv32", "ragged")])
def test_other_shapes_and_the_ragged_path_run_in_graphs(preset, path):
    rows_bug, info = _run("bug", True, preset, 8192, path)
    rows_fix, _ = _run("fix", True, preset, 8192, path)
    assert info["indexer_impl"] == "sglang" and info["indexer_path"] == path
    assert compare_runs(rows_bug, rows_fix)["all_identical"]
