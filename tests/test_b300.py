"""B300 (sm100) on paper: the indexer kernel names per architecture, read from the wheels' binaries and
matched by the NVTX-free classifier; the sm100 stage lock against the H200 one; the PR's setup on 4x B300
as `kit plan` prints it (tests/golden/plan_glm52_b300_tp4_80k_500k_graph.json)."""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import pytest
from sglang_run_helpers import GLM52_CONFIG, make_model
from synthetic_schema import draft_loop_graph
from test_plan import GOLDEN, PY, _normalise

from kit.analysis.attribution import attribute
from kit.cli import build_parser
from kit.errors import UsageError
from kit.paths import REPO
from kit.sglang_src import releases
from kit.sglang_src.releases import (
    INDEXER_ANCHORS,
    INDEXER_KERNEL_NAMES,
    INDEXER_KERNELS,
    gpu_arch,
    indexer_kernel_names,
)
from kit.trace.registry import open_trace
from kit.trace.source import matches_kernel
from kit.trace.sqlite import connect_ro

STAGE = REPO / "data" / "stage"
FIXTURES = REPO / "tests" / "fixtures" / "h200_sglang"


def _lock(name: str) -> dict:
    return json.loads((STAGE / name).read_text())


# ---- the kernel table --------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", sorted(INDEXER_KERNEL_NAMES))
def test_the_classifier_patterns_match_every_arch(arch: str) -> None:
    """One pattern table serves every arch: each name matches it, and exactly the logits kernels are
    anchors (one per indexer call)."""
    names = indexer_kernel_names(arch)
    assert all(matches_kernel(n, INDEXER_KERNELS) for n in names)
    anchors = [n for n in names if matches_kernel(n, INDEXER_ANCHORS)]
    assert anchors == [f"{arch}_fp8_paged_mqa_logits", f"{arch}_fp8_mqa_logits"]
    assert not matches_kernel("deepseek_v3_topk_kernel", INDEXER_KERNELS)  # the MoE router's, every layer


def test_the_arch_follows_sgl_kernels_rule() -> None:
    assert gpu_arch(9, 0) == "sm90"
    assert gpu_arch(10, 0) == gpu_arch(10, 3) == gpu_arch(12, 0) == "sm100"  # B200, B300, RTX Blackwell
    with pytest.raises(UsageError, match="no indexer kernel table for 'sm80'"):
        indexer_kernel_names("sm80")


def test_sm90_names_are_the_h200_reports_names() -> None:
    """Every indexer kernel the H200 reports hold is in the sm90 table (real nsys exports, sglang 0.5.14)."""
    seen: set[str] = set()
    for db in sorted(FIXTURES.glob("*/profile.sqlite.xz")):
        con = connect_ro(db)
        q = "SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName"
        seen |= {r[0] for r in con.execute(q)}
        con.close()
    indexer = {n for n in seen if matches_kernel(n, INDEXER_KERNELS)}
    assert indexer >= {"sm90_fp8_paged_mqa_logits", "smxx_paged_mqa_logits_metadata"}
    assert indexer <= set(indexer_kernel_names("sm90"))


@pytest.mark.parametrize(("pattern", "per_round"), [("bug", 3), ("fix", 1)])
def test_the_classifier_counts_sm100_kernels_synthetic_schema(
    tmp_path: Path, pattern: str, per_round: int
) -> None:
    """A B300 report (sm100 names) without NVTX: the same counts as an H200 one."""
    names = INDEXER_KERNEL_NAMES["sm100"]
    call = (names["deep_gemm"][2], "gemm_weights_proj", names["deep_gemm"][0], names["sgl_kernel"][1])
    db = draft_loop_graph(tmp_path / "b300.sqlite", pattern, 4, 3, nvtx=False, indexer_kernels=call)
    with open_trace(db) as t:
        att = attribute(t, "classifier", graph_kernels=3 * 10 + per_round * len(call))
    assert att.inconclusive is None
    assert att.rows.column("indexer_launches") == [per_round] * 3


def _stage_wheel(name: str) -> Path:
    """A wheel of the 0.5.14 closure, pinned by the H200 lock's sha256 (fetched once into the cache)."""
    from kit.paths import REPO as KIT_REPO
    from kit.sglang_src.wheels import fetch_file

    (row,) = [w for w in _lock("sglang-0.5.14-h200.json")["wheels"] if w["file"].startswith(name + "-")]
    return fetch_file(row["file"], row["sha256"], KIT_REPO / ".cache" / "stage-wheels")


@pytest.mark.network
def test_sgl_kernel_names_are_in_each_arch_build() -> None:
    """sglang_kernel 0.4.4: both per-arch builds define the four top-k kernels (mangled, anonymous
    namespace of topk.cu), and the loader picks the build by compute capability as gpu_arch says."""
    with zipfile.ZipFile(_stage_wheel("sglang_kernel")) as zf:
        for arch in INDEXER_KERNEL_NAMES:
            blob = zf.read(f"sgl_kernel/{arch}/common_ops.abi3.so")
            found = set(re.findall(rb"_topk_cu_[0-9a-f]+\d+(\w+?kernel)ENS_14FastTopKParams", blob))
            assert {n.decode() for n in found} == set(INDEXER_KERNEL_NAMES[arch]["sgl_kernel"]), arch
        loader = zf.read("sgl_kernel/load_utils.py").decode()
    assert 'compute_capability == 90:\n        ops_subdir = "sm90"' in loader
    assert 'ops_subdir = "sm100"' in loader


@pytest.mark.network
def test_deep_gemm_names_are_its_jit_kernels() -> None:
    """sgl_deep_gemm 0.1.3: the logits kernels are `sm{arch}_fp8_*mqa_logits` templates its C++ code
    instantiates per arch, the metadata kernel one arch-neutral template."""
    with zipfile.ZipFile(_stage_wheel("sgl_deep_gemm")) as zf:
        inc = "deep_gemm/include/deep_gemm/"
        for arch, table in INDEXER_KERNEL_NAMES.items():
            for name in table["deep_gemm"]:
                path = (
                    f"{inc}impls/{name}.cuh"
                    if name.startswith(arch)
                    else f"{inc}scheduler/paged_mqa_logits.cuh"
                )
                assert re.search(rf"\nvoid {name}\(", zf.read(path).decode()), (arch, name)
        lib = zf.read("deep_gemm/_C.so")
    for template in (
        b"&sm{}_fp8_paged_mqa_logits<",
        b"&sm{}_fp8_mqa_logits<",
        b"&sched::smxx_paged_mqa_logits_metadata<",
    ):
        assert template in lib


# ---- the sm100 stage lock ----------------------------------------------------------------------------


def test_the_b300_lock_is_the_h200_lock_with_the_sm100_pieces() -> None:
    h200, b300 = _lock("sglang-0.5.14-h200.json"), _lock("sglang-0.5.14-b300.json")
    assert [(w["file"], w["sha256"], w["size"]) for w in h200["wheels"]] == [
        (w["file"], w["sha256"], w["size"]) for w in b300["wheels"]
    ]
    by_file = {w["file"]: (w, v) for w, v in zip(h200["wheels"], b300["wheels"], strict=True)}
    changed = {
        f
        for f, (h, b) in by_file.items()
        if {k: h.get(k) for k in ("drop", "trim")} != {k: b.get(k) for k in ("drop", "trim")}
    }
    assert {f.split("-")[0] for f in changed} == {
        "sglang_kernel",
        "flashinfer_cubin",
        "nvidia_cutlass_dsl_libs_base",
        "nvidia_cutlass_dsl_libs_cu13",
    }
    for f in changed:
        h, b = by_file[f]
        assert b.get("why") and "drop" not in b
        if f.startswith("sglang_kernel"):
            assert h["trim"] == ["sgl_kernel/sm100/", "sgl_kernel/flash_ops.abi3.so"]
            assert b["trim"] == ["sgl_kernel/sm90/", "sgl_kernel/flash_ops.abi3.so"]
    staged = sum(w["size"] for w in b300["wheels"] if "drop" not in w)
    pack = b300["pack"]
    assert pack["closure"] == {"count": 120, "bytes": sum(w["size"] for w in b300["wheels"])}
    assert pack["dropped"]["count"] == len([w for w in b300["wheels"] if "drop" in w]) == 11
    assert (
        pack["staged"]["bytes"]
        == staged
        - 615071908
        + pack["trimmed"]["sglang_kernel-0.4.4-cp310-abi3-manylinux2014_x86_64.whl"]["wheel_after"]
    )
    assert pack["parts"] == -(-pack["payload_bytes"] // (45 << 20)) == 18


# ---- the PR's setup on 4x B300 -----------------------------------------------------------------------

B300_PLAN = [
    "plan",
    "--arms",
    "bug,fix,off",
    "--tp-size",
    "4",
    "--context-len",
    "81920,500000",
    "--cuda-graph",
    "--batch",
    "pr29654",
]


def test_the_documented_plan_command_prints_the_golden_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command data/stage/README.md gives for 4x B300 prints exactly the golden plan."""
    model = make_model(tmp_path, GLM52_CONFIG, "GLM-5.2-FP8")
    runs = tmp_path / "runs"
    args = build_parser().parse_args(
        [*B300_PLAN, "--model-path", str(model), "--python", PY, "--out", str(runs)]
    )
    assert args.func(args) == 0
    got = _normalise(json.loads(capsys.readouterr().out), model, runs)
    golden = json.loads((GOLDEN / "plan_glm52_b300_tp4_80k_500k_graph.json").read_text())
    assert got == golden
    assert {a: v["expected_per_round"] for a, v in got["arms"].items()} == {"bug": 4, "fix": 1, "off": 4}
    for v in got["arms"].values():
        assert [(c["context_len"], c["profile_window"]) for c in v["cells"]] == [(81920, 1), (500000, 2)]
        assert v["server_cmd"][v["server_cmd"].index("--tp-size") + 1] == "4"
        assert "--capture-range-end=none" in v["nsys_cmd"] and v["env"]["KIT_PROBE_PROFILE_FROM"] == "capture"
    readme = (STAGE / "README.md").read_text()
    assert "kit plan " + " ".join(B300_PLAN[1:]) in readme
    assert releases.BASELINE == "0.5.14"  # the builds the lock stages: bug and the patched fix
