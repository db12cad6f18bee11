"""The mini engine on CUDA, eager and with the draft loop as one CUDA graph.

GPU-only: not collected by `make test` (norecursedirs), run on a GPU host with `make test-gpu`.
"""

from __future__ import annotations

import pytest
import torch

from kit.backends.mini.engine import Engine
from kit.backends.mini.params import validate
from kit.compare.equivalence import compare_runs
from kit.probe import ranges as nr

if not torch.cuda.is_available():
    pytest.fail("tests/gpu needs a CUDA GPU: run `make test-gpu` on a GPU host", pytrace=False)


def _run(arm: str, graph: bool, context: int = 8192, preset: str = "tiny") -> tuple[list[dict], dict]:
    nr.configure("off")
    params = validate(
        {
            "arm": arm,
            "context_len": context,
            "num_requests": 2,
            "max_new_tokens": 24,
            "device": "cuda",
            "cuda_graph": graph,
            "preset": preset,
            "nvtx_sink": "off",
        }
    )
    return Engine(params).run()


@pytest.fixture(scope="module")
def runs():
    return {(arm, graph): _run(arm, graph) for arm in ("off", "bug", "fix") for graph in (False, True)}


@pytest.mark.parametrize("arm", ["off", "bug", "fix"])
def test_graph_replay_reproduces_eager(runs, arm: str):
    eager, graph = runs[(arm, False)][0], runs[(arm, True)][0]
    summary = compare_runs(eager, graph)
    assert summary["all_identical"] and summary["draft_identical"]


@pytest.mark.parametrize("graph", [False, True])
def test_outputs_identical_across_arms_on_cuda(runs, graph: bool):
    for arm in ("bug", "fix"):
        assert compare_runs(runs[("off", graph)][0], runs[(arm, graph)][0])["all_identical"]


def test_eager_cuda_counts_indexer_calls_per_round(runs):
    assert set(runs[("bug", False)][1]["draft_indexer_calls_per_round"]) == {4}
    assert set(runs[("fix", False)][1]["draft_indexer_calls_per_round"]) == {1}
    assert runs[("fix", True)][1]["draft_indexer_calls_per_round"] is None  # replays bypass Python


def test_accept_length_on_cuda(runs):
    for (arm, graph), (_, info) in runs.items():
        assert info["accept_length_mean"] > 1.5, (arm, graph)
