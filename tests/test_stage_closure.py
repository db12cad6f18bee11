"""scripts/stage_closure.py: the image model (which packages the host's image serves for a release), the tar
size `kit stage pack` will cut, and the committed figures (data/stage/README.md, candidates-h200.json and the
0.5.16 lock) agreeing with each other."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
from test_stage import _wheel

from kit.paths import REPO
from kit.sglang_src import stage
from kit.sglang_src.wheels import sha256_file

STAGE = REPO / "data" / "stage"


@pytest.fixture(scope="module")
def sc():  # noqa: ANN201 - the script as a module
    spec = importlib.util.spec_from_file_location("stage_closure", REPO / "scripts" / "stage_closure.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["stage_closure"] = module
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(REPO / "scripts"))  # as `python scripts/stage_closure.py` has it
        spec.loader.exec_module(module)
    return module


def _report(path: Path, pkgs: dict[str, tuple[str, list[str]]]) -> Path:
    """A pip --report with name -> (version, requires_dist)."""
    install = [
        {
            "metadata": {"name": n, "version": v, "requires_dist": reqs},
            "download_info": {
                "url": f"https://files.example/{n}-{v}-py3-none-any.whl",
                "archive_info": {"hashes": {"sha256": "0" * 64}},
            },
        }
        for n, (v, reqs) in pkgs.items()
    ]
    path.write_text(json.dumps({"install": install}))
    return path


def test_the_image_serves_what_still_fits_and_a_new_torch_takes_its_dependents(sc, tmp_path: Path) -> None:
    base = sc.load_report(
        _report(
            tmp_path / "base.json",
            {
                "sglang": ("0.5.14", ["torch==2.11.0", "torchvision", "requests>=2"]),
                "torch": ("2.11.0", []),
                "torchvision": ("0.26.0", ["torch==2.11.0"]),
                "requests": ("2.34.2", []),
                "anthropic": ("2.14.0", []),
            },
        )
    )
    lock = {
        "wheels": [{"file": "sglang-0.5.14-py3-none-any.whl"}, {"file": "anthropic-2.14.0-py3-none-any.whl"}]
    }
    image = sc.image_model(base, lock)
    assert {n: p.version for n, p in image.items()} == {
        "torch": "2.11.0",
        "torchvision": "0.26.0",
        "requests": "2.34.2",
    }
    same_torch = sc.load_report(
        _report(
            tmp_path / "a.json",
            {
                "sglang": ("0.5.16", ["torch==2.11.0", "torchvision", "requests>=2.1", "zstandard"]),
                "torch": ("2.11.0", []),
                "torchvision": ("0.26.0", ["torch==2.11.0"]),
                "requests": ("2.34.2", []),
                "zstandard": ("0.25.0", []),
            },
        )
    )
    assert sc.classify(same_torch, image) == {
        "sglang": "stage: not in the image",
        "torch": "image",
        "torchvision": "image",
        "requests": "image",
        "zstandard": "stage: not in the image",
    }
    new_torch = sc.load_report(
        _report(
            tmp_path / "b.json",
            {
                "sglang": ("0.5.21", ["torch==2.13.0", "torchvision", "requests>=3"]),
                "torch": ("2.13.0", []),
                "torchvision": ("0.28.0", ["torch==2.13.0"]),
                "requests": ("3.0.0", []),
            },
        )
    )
    status = sc.classify(new_torch, image)
    assert status["torch"] == "stage: the image has 2.11.0; sglang wants ==2.13.0; torchvision wants ==2.13.0"
    assert status["torchvision"] == "stage: the image's torchvision 0.26.0 needs torch==2.11.0, staged 2.13.0"
    assert status["requests"] == "stage: the image has 2.34.2; sglang wants >=3"


def test_rules_carry_over_by_name_and_new_drops_say_why(sc) -> None:
    rules = sc.rules(json.loads((STAGE / "sglang-0.5.14-h200.json").read_text()))
    assert rules["sglang-kernel"] == {"trim": ["sgl_kernel/sm100/", "sgl_kernel/flash_ops.abi3.so"]}
    assert rules["flashinfer-cubin"]["drop"].startswith("prebuilt TRT-LLM/Blackwell cubins")
    assert "fallback" in rules["pydantic"] and rules["llvmlite"]["drop"].startswith("numba's")


def test_tar_bytes_is_the_payload_pack_cuts(sc, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    wheels = [
        _wheel(cache, "a", "1.0", {"a/x.bin": b"x" * 1000}),
        _wheel(cache, "b" * 60, "2.0", {"b/y.bin": b"y" * 70000}),  # a name over 100 chars: a PAX record
    ]
    rows = [{"file": w.name, "sha256": sha256_file(w), "size": w.stat().st_size} for w in wheels]
    (tmp_path / "lock.json").write_text(json.dumps({"wheels": rows}))
    manifest = stage.pack(tmp_path / "lock.json", cache, tmp_path / "out", [])
    sizes = [w.stat().st_size for w in wheels]
    assert sc.tar_bytes(sizes, [w.name for w in wheels]) == manifest["payload_size"]


def test_the_committed_figures_agree() -> None:
    table = {r["version"]: r for r in json.loads((STAGE / "candidates-h200.json").read_text())}
    assert [(v, r["torch"], r["parts"]) for v, r in table.items()] == [
        ("0.5.14", "2.11.0", 5),
        ("0.5.16", "2.11.0", 5),
        ("0.5.17", "2.11.0", 8),
        ("0.5.21", "2.13.0", 36),
        ("0.5.23", "2.14.1", 45),
    ]
    readme = (STAGE / "README.md").read_text()
    for v, r in table.items():
        row = (
            f"| {v} | {r['torch']} | {r['closure']['wheels']} | {r['closure']['image_served']} | "
            f"{r['staged']['wheels']} | {r['staged']['bytes']:,} | {r['dropped']['bytes']:,} | {r['parts']} |"
        )
        assert row in readme, row
        assert r["parts"] == -(-r["payload_bytes"] // (r["part_mib"] << 20))
    lock = json.loads((STAGE / "sglang-0.5.16-h200.json").read_text())
    pack, mine = lock["pack"], table["0.5.16"]
    assert (pack["payload_bytes"], pack["staged"]) == (mine["payload_bytes"], mine["staged"])
    assert pack["parts"] == -(-pack["payload_bytes"] // (pack["part_mib"] << 20))
    assert pack["closure"] == {"count": len(lock["wheels"]), "bytes": sum(w["size"] for w in lock["wheels"])}
    assert pack["dropped"]["count"] == sum("drop" in w for w in lock["wheels"]) == mine["dropped"]["wheels"]
    assert all(re.fullmatch(r"[0-9a-f]{64}", w["sha256"]) and w["size"] > 0 for w in lock["wheels"])
    assert [w["file"] for w in lock["wheels"] if w["file"].startswith("sglang-")] == [
        "sglang-0.5.16-cp312-cp312-manylinux_2_34_x86_64.whl"
    ]
    assert f"payload sha256 {pack['payload_sha256'][:12]}" in readme


def test_the_0516_run_uses_the_task_runs_settings() -> None:
    """The upstream step (data/matrices/h200_task.yaml's mode, through scripts/h200_upstream.sh) serves its
    cells as the task runs were, so they sit next to those: no driver defines flags of its own (the matrices
    hold them), and the matrix's server flags are those the committed bug server was served with (its
    plan.json)."""
    import json

    from kit.pipeline.matrix import load

    for script in ("h200_task.sh", "h200_upstream.sh", "h200_mutants.sh", "h200_task_settings.sh"):
        text = (REPO / "scripts" / script).read_text()
        assert not re.search(r"^(SGL|TASK)=\(|--sglang-arg", text, re.M), script
    plan = REPO / "data" / "results" / "h200-sglang-task" / "runs" / "task" / "bug-server" / "plan.json"
    served = json.loads(plan.read_text())["server_cmd"]
    flags = load("h200_task", "upstream").params["extra_args"]
    assert flags and served[served.index("--port") + 2 :] == flags


def test_the_0517_lock_stages_the_registry_wheel_on_the_image_torch() -> None:
    """sglang 0.5.17 pins torch 2.11.0, as the H200 image has: its lock stages no torch, and its sglang
    wheel is the one the release registry pins."""
    from kit.sglang_src import releases

    lock = json.loads((STAGE / "sglang-0.5.17-h200.json").read_text())
    files = [w["file"] for w in lock["wheels"]]
    [mine] = [w for w in lock["wheels"] if w["file"].startswith("sglang-0.5.17-")]
    assert (mine["file"], mine["sha256"]) == releases.pinned("0.5.17")
    assert not [f for f in files if f.startswith(("torch-", "nvidia_cudnn_cu", "triton-"))]  # the image's
    assert releases.release("0.5.17").torch == "2.11.0"
