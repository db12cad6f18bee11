"""Which lightning indexer a mini run uses (auto | torch | sglang), what it records, the one-line errors."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from kit.backends.mini import dsa_kernels, presets
from kit.backends.mini.dsa_kernels import ReferenceKernels, load_kernels, resolve_indexer_impl
from kit.backends.mini.engine import Engine
from kit.backends.mini.params import validate, warnings_for
from kit.cli import build_parser
from kit.compare.equivalence import compare_runs
from kit.errors import KitError
from kit.paths import REPO
from kit.probe import ranges as nr


@pytest.fixture(autouse=True)
def _sink_off():
    nr.configure("off")
    yield


@pytest.fixture
def tiny128(monkeypatch):
    """`tiny` with sglang's index_head_dim 128 (the cache format's), small enough for CPU."""
    p = dataclasses.replace(presets.get("tiny"), name="tiny128", index_head_dim=128)
    monkeypatch.setitem(presets.PRESETS, "tiny128", p)
    return "tiny128"


def test_defaults_and_choices():
    p = validate({})
    assert p.indexer_impl == "auto" and p.indexer_path == "paged"
    assert validate({"indexer_impl": "torch"}).indexer_impl == "torch"
    for bad in ({"indexer_impl": "deepgemm"}, {"indexer_path": "dense"}):
        with pytest.raises(KitError, match="allowed"):
            validate(bad)


def test_ragged_needs_sglang():
    with pytest.raises(KitError) as info:
        validate({"indexer_path": "ragged"})
    assert "indexer_path='ragged'" in str(info.value) and "indexer_impl is sglang" in str(info.value)


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_sglang_on_cpu_is_one_line_naming_cause_and_fix():
    with pytest.raises(KitError) as info:
        validate({"indexer_impl": "sglang"})
    msg = _one_line(info)
    assert "indexer_impl='sglang'" in msg and "device cpu" in msg and "sm90" in msg


def test_sglang_with_a_preset_the_kernels_cannot_run(monkeypatch):
    monkeypatch.setattr(dsa_kernels, "device_problem", lambda device: None)
    with pytest.raises(KitError) as info:
        validate({"indexer_impl": "sglang", "preset": "tiny"})
    msg = _one_line(info)
    assert "index_head_dim 32" in msg and "dsv32 | glm5" in msg


def test_sglang_without_the_kernels_names_the_packages(monkeypatch):
    monkeypatch.setattr(dsa_kernels, "device_problem", lambda device: None)
    monkeypatch.setattr(dsa_kernels, "missing_modules", lambda: ["deep_gemm", "sgl_kernel"])
    with pytest.raises(KitError) as info:
        validate({"indexer_impl": "sglang", "preset": "dsv32", "context_len": 4096})
    msg = _one_line(info)
    assert "deep_gemm and sgl_kernel not importable" in msg
    assert "sgl-deep-gemm 0.1.3" in msg and "sglang-kernel 0.4.4" in msg and "PYTHONPATH" in msg


def test_a_broken_kernel_import_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "deep_gemm", None)  # import deep_gemm -> ImportError
    with pytest.raises(KitError) as info:
        load_kernels()
    msg = _one_line(info)
    assert "failed to load (ModuleNotFoundError: import of deep_gemm" in msg and "PYTHONPATH" in msg


def test_resolution(monkeypatch):
    impl, why, kernels = resolve_indexer_impl("auto", "cpu", 64, 128, 2048)
    assert (impl, kernels) == ("torch", None) and "device cpu" in why
    assert resolve_indexer_impl("torch", "cuda", 64, 128, 2048)[0] == "torch"
    with pytest.raises(KitError, match="indexer_impl='sglang'.*device cpu"):
        resolve_indexer_impl("sglang", "cpu", 64, 128, 2048)
    # kernels importable but failing to load: auto falls back (and says why), sglang refuses
    monkeypatch.setattr(dsa_kernels, "device_problem", lambda device: None)
    monkeypatch.setattr(dsa_kernels, "missing_modules", lambda: [])
    monkeypatch.setitem(sys.modules, "deep_gemm", None)
    impl, why, _ = resolve_indexer_impl("auto", "cuda", 64, 128, 2048)
    assert impl == "torch" and "failed to load" in why
    with pytest.raises(KitError, match="failed to load"):
        resolve_indexer_impl("sglang", "cuda", 64, 128, 2048)
    assert "index_topk 1024" in resolve_indexer_impl("auto", "cuda", 64, 128, 1024)[1]
    assert "index_n_heads 48" in resolve_indexer_impl("auto", "cuda", 48, 128, 2048)[1]


def test_kit_run_passes_the_indexer_options():
    a = build_parser().parse_args(
        ["run", "--arm", "fix", "--indexer-impl", "sglang", "--indexer-path", "ragged"]
    )
    assert (a.indexer_impl, a.indexer_path) == ("sglang", "ragged")
    a = build_parser().parse_args(["run", "--arm", "fix"])
    assert a.indexer_impl is None and a.indexer_path is None  # -> the mini's defaults
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--arm", "fix", "--indexer-impl", "cutlass"])


def test_python_m_kit_mini_refuses_sglang_on_cpu_in_one_line(tmp_path):
    (tmp_path / "params.json").write_text(json.dumps({"indexer_impl": "sglang", "nvtx_sink": "off"}))
    proc = subprocess.run(
        [sys.executable, "-m", "kit.backends.mini", str(tmp_path)], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "indexer_impl='sglang'" in lines[0], proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.json"]


def test_ragged_warning():
    assert warnings_for(validate({})) == []
    p = validate({}).replace(indexer_impl="sglang", indexer_path="ragged")
    (w,) = warnings_for(p)
    assert "counterfactual" in w and "fp8_mqa_logits" in w


def _run(preset: str, arm: str, impl: str, context: int, path: str = "paged", max_new: int = 12):
    p = validate(
        {
            "arm": arm,
            "context_len": context,
            "num_requests": 2,
            "max_new_tokens": max_new,
            "preset": preset,
            "nvtx_sink": "off",
        }
    )
    p.indexer_impl, p.indexer_path = impl, path  # sglang on CPU: only with injected kernels
    return Engine(p, kernels=ReferenceKernels() if impl == "sglang" else None).run()


def test_engine_records_the_torch_indexer():
    _, info = _run("tiny", "fix", "auto", 512)
    assert info["indexer_impl"] == "torch" and info["indexer_impl_requested"] == "auto"
    assert "device cpu" in info["indexer_impl_reason"]
    assert info["indexer_path"] is None and info["indexer_kernels"] is None
    assert info["index_k_cache"].startswith("float32")


def test_engine_on_the_kernel_indexer_keeps_the_mechanism(tiny128):
    """Through the stand-in kernels: bug 4 indexer calls per round, fix 1; outputs identical across arms and,
    while every token fits in the top-k, identical to the torch indexer's (the plumbing is exact)."""
    runs = {
        (arm, impl, path): _run(tiny128, arm, impl, 1024, path)
        for arm, impl, path in [
            ("bug", "torch", "paged"),
            ("bug", "sglang", "paged"),
            ("fix", "sglang", "paged"),
            ("fix", "sglang", "ragged"),
        ]
    }
    info = runs[("bug", "sglang", "paged")][1]
    assert info["indexer_impl"] == "sglang" and info["indexer_path"] == "paged"
    assert info["indexer_kernels"]["name"].startswith("reference")
    assert info["index_k_cache"].startswith("sglang's fp8 paged layout")
    assert set(info["draft_indexer_calls_per_round"]) == {4}
    assert set(runs[("fix", "sglang", "paged")][1]["draft_indexer_calls_per_round"]) == {1}
    assert runs[("fix", "sglang", "ragged")][1]["indexer_path"] == "ragged"
    base = runs[("bug", "torch", "paged")][0]
    for key, (rows, _) in runs.items():
        assert compare_runs(base, rows)["all_identical"], key


def test_engine_cache_is_sglang_layout_only_for_the_kernel_indexer(tiny128):
    from kit.backends.mini.index_buf_accessor import IndexKWithScaleBuffer

    p = validate({"preset": tiny128, "context_len": 256, "nvtx_sink": "off"}).replace(indexer_impl="sglang")
    eng = Engine(p, kernels=ReferenceKernels())
    assert isinstance(eng.draft.decoder.cache.index_k, IndexKWithScaleBuffer)
    assert all(isinstance(layer.cache.index_k, IndexKWithScaleBuffer) for layer in eng.target.layers)
    eng = Engine(p.replace(indexer_impl="torch"), kernels=ReferenceKernels())
    assert isinstance(eng.draft.decoder.cache.index_k, torch.Tensor)
    with pytest.raises(KitError, match="indexer_path='ragged': it needs sglang's kernels"):
        Engine(p.replace(indexer_impl="torch", indexer_path="ragged"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_kernel_check_says_torch_when_it_cannot_run_the_kernels(tmp_path):
    out = tmp_path / "check.json"
    proc = subprocess.run(
        [sys.executable, "-m", "kit.backends.mini.kernel_check", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 3, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last == "indexer_impl=torch (sglang unusable: ToolMissing: torch sees no CUDA GPU)"
    report = json.loads(out.read_text())
    assert report["ok"] is False and "no CUDA GPU" in report["error"]
