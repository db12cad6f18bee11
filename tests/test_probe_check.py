"""Every probe target resolves by AST in the releases the kit supports; 0.5.23 says what moved."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from fake_sglang_helpers import make_fake_sglang
from sglang_run_helpers import patched_wheel_once

from kit.cli import main as kit_main
from kit.errors import InputError
from kit.probe.check import missing, probe_check, refusal, warnings
from kit.probe.targets import OVERRIDE_TARGETS, TARGETS

INDEXER = "sglang.srt.layers.attention.dsa.dsa_indexer:Indexer"


@pytest.fixture(scope="session")
def patched_0514(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return patched_wheel_once(tmp_path_factory)


def _all_found(report: dict) -> None:
    assert set(report) == {t.key for t in TARGETS}
    assert missing(report) == [], {k: v.get("reason") for k, v in report.items() if v["status"] != "found"}
    for t in TARGETS:
        r = report[t.key]
        assert r["file"] == t.relpath and isinstance(r["line"], int) and r["line"] > 0


@pytest.mark.network
@pytest.mark.parametrize("version", ["0.5.14", "0.5.15"])
def test_all_targets_found_in_release_wheels(version: str) -> None:
    from kit.sglang_src.wheels import fetch_wheel

    report = probe_check(fetch_wheel(version))
    _all_found(report)
    assert warnings(report) == []  # every look-alike is a known off-path class (NPU, multi-layer EAGLE, ...)
    if version == "0.5.14":  # the lines the docs and kit/probe/targets.py cite
        assert report[f"{INDEXER}.forward_cuda"]["line"] == 1352
        assert report["sglang.srt.speculative.eagle_worker_v2:EagleDraftWorker.draft_forward"]["line"] == 575
        assert (
            report[
                "sglang.srt.speculative.eagle_draft_cuda_graph_runner:EAGLEDraftCudaGraphRunner._replay_graph"
            ]["line"]
            == 255
        )


@pytest.mark.network
def test_all_targets_found_in_patched_wheel_and_tree(patched_0514: Path, tmp_path: Path) -> None:
    _all_found(probe_check(patched_0514))
    with zipfile.ZipFile(patched_0514) as zf:  # just the target modules: enough for the layout check
        zf.extractall(tmp_path / "unpacked", sorted({t.relpath for t in TARGETS}))
    _all_found(probe_check(tmp_path / "unpacked", scan_tree=False))  # an unpacked wheel
    _all_found(probe_check(tmp_path / "unpacked" / "sglang", scan_tree=False))  # an installed package dir


@pytest.mark.network
def test_0523_reports_what_moved() -> None:
    from kit.sglang_src.wheels import fetch_wheel

    report = probe_check(fetch_wheel("0.5.23"))
    assert missing(report) == [f"{INDEXER}.forward_indexer"]
    gone = report[f"{INDEXER}.forward_indexer"]
    assert gone["status"] == "missing" and gone["line"] is None
    assert "not defined in the body of class Indexer" in gone["reason"]
    assert all(
        c["match"].startswith("similar method name") for c in gone["moved_to"]
    )  # nothing of that exact name
    looks = [c["qualname"] for c in report[f"{INDEXER}.forward_cuda"]["unprobed_lookalikes"]]
    assert "IndexerKPool.forward_cuda" in looks  # a second DSA indexer the probe would miss
    msg = refusal(report, "0.5.23")
    assert "Indexer.forward_indexer" in msg and "refusing to run" in msg


def test_fake_tree_all_found_and_missing_named(tmp_path: Path) -> None:
    _all_found(probe_check(make_fake_sglang(tmp_path / "ok")))
    bad = make_fake_sglang(tmp_path / "bad", drop=("EagleDraftWorker.draft_forward",))
    report = probe_check(bad)
    key = "sglang.srt.speculative.eagle_worker_v2:EagleDraftWorker.draft_forward"
    assert missing(report) == [key]
    assert report[key]["moved_to"][0]["qualname"] == "EagleDraftWorker.draft_forward_renamed"


def test_moved_class_is_found_elsewhere(tmp_path: Path) -> None:
    root = make_fake_sglang(tmp_path / "moved")
    src = root / "sglang/srt/speculative/eagle_draft_cuda_graph_runner.py"
    (root / "sglang/srt/speculative/graph_runners.py").write_text(src.read_text())
    src.write_text("# moved to graph_runners.py\n")
    report = probe_check(root)
    key = "sglang.srt.speculative.eagle_draft_cuda_graph_runner:EAGLEDraftCudaGraphRunner._replay_graph"
    assert report[key]["status"] == "missing"
    assert report[key]["moved_to"][0] == {
        "file": "sglang/srt/speculative/graph_runners.py",
        "line": 14,
        "qualname": "EAGLEDraftCudaGraphRunner._replay_graph",
        "match": "same class and method",
    }


def test_cli_prints_json_and_exits_nonzero_on_missing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert kit_main(["probe-check", str(make_fake_sglang(tmp_path / "ok"))]) == 0
    assert len(json.loads(capsys.readouterr().out)) == len(TARGETS)
    assert (
        kit_main(["probe-check", str(make_fake_sglang(tmp_path / "bad", drop=("ModelRunner.forward",)))]) == 1
    )


def test_not_sglang_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no sglang package"):
        probe_check(tmp_path)
    (tmp_path / "x.whl").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="not a readable wheel"):
        probe_check(tmp_path / "x.whl")


@pytest.mark.network
@pytest.mark.parametrize("version", ["0.5.14", "0.5.15", "0.5.16", "0.5.21", "0.5.23"])
def test_override_targets_found_in_release_wheels(version: str) -> None:
    """The control override (target_topk) is checked only for a control run, but wherever the kit runs."""
    from kit.sglang_src.wheels import fetch_wheel

    report = probe_check(fetch_wheel(version), OVERRIDE_TARGETS, scan_tree=False)
    assert missing(report) == []
    if version == "0.5.14":  # the lines kit/probe/targets.py cites
        lines = [report[t.key]["line"] for t in OVERRIDE_TARGETS]
        assert lines == [334, 590, 794]


def test_override_targets_found_in_the_fake_tree(tmp_path: Path) -> None:
    assert missing(probe_check(make_fake_sglang(tmp_path / "ok"), OVERRIDE_TARGETS, scan_tree=False)) == []
    bad = make_fake_sglang(tmp_path / "bad", drop=("Indexer._get_topk_ragged",))
    assert missing(probe_check(bad, OVERRIDE_TARGETS, scan_tree=False)) == [f"{INDEXER}._get_topk_ragged"]
