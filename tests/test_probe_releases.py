"""Probe targets per release: each release gets the target set the registry names, every target of it
resolves in that release's wheel (the lines pinned below are what changed between releases), the runtime
probe picks the set from the installed version, and a release the registry does not know is refused with
every set's report (what is missing, where it moved) unless the run asks for the classifier only."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest
from fake_sglang_helpers import inside, make_fake_sglang, read_ranges, run_driver
from sglang_run_helpers import GLM52_CONFIG, make_model, patched_wheel_once, run_params

from kit.backends.sglang import params as sp
from kit.backends.sglang.plan import plan, server_env
from kit.cli import main as kit_main
from kit.errors import ProbeTargetError, UsageError
from kit.paths import REPO
from kit.probe import ENV_ENABLE
from kit.probe import ranges as nr
from kit.probe.check import choose, missing, unknown_release, warnings
from kit.probe.targets import TARGET_SETS, TARGETS
from kit.sglang_src import releases

INDEXER = "sglang.srt.layers.attention.dsa.dsa_indexer:Indexer"
KPOOL = "sglang.srt.layers.attention.dsa.dsa_indexer_kpool:IndexerKPool.forward_cuda"

# Where each target is defined, per release (python/sglang/srt/...; None: not in that release's set). The
# rows are what changed between releases; each release's set is the registry's.
Q = (
    "Indexer.forward_cuda",
    "Indexer.forward_indexer",
    "IndexerKPool.forward_cuda",
    "EagleDraftWorker.draft_forward",
    "EAGLEDraftCudaGraphRunner._replay_graph",
    "ModelRunner.forward",
    "EagleDraftWorker._draft_extend_for_decode",
    "EAGLEWorkerV2.verify",
    "EAGLEDraftCudaGraphRunner.capture_one_shape",
    "EAGLEDraftExtendCudaGraphRunner.capture_one_shape",
    "DecodeCudaGraphRunner.capture_one_shape",
    "SchedulerProfilerManager._start_profile",
    "SchedulerProfilerManager._stop_profile",
)
LINES: dict[str, tuple[int | None, ...]] = {
    "0.5.14": (1352, 1173, None, 575, 255, 2896, 809, 1431, 296, 285, 743, 154, 286),
    "0.5.15": (1634, 1454, None, 611, 274, 3001, 885, 1538, 315, 309, 754, 154, 286),
    "0.5.16": (1727, 1545, None, 563, 278, 1232, 869, 1498, 326, 320, 913, 155, 296),
    "0.5.17": (1477, None, None, 548, 278, 1382, 854, 1495, 326, 314, 917, 155, 298),
    "0.5.21": (1598, None, 1624, 689, 301, 1706, 1039, 1883, 353, 342, 1143, 166, 314),
    "0.5.23": (1910, None, 1664, 742, 310, 1813, 1110, 1979, 380, 350, 1368, 170, 318),
}
SET_OF = {
    "0.5.14": "0.5.14",
    "0.5.15": "0.5.14",
    "0.5.16": "0.5.14",
    "0.5.17": "0.5.17",
    "0.5.21": "0.5.21",
    "0.5.23": "0.5.21",
}


def _wheel(version: str) -> Path:
    from kit.sglang_src.wheels import fetch_wheel

    return fetch_wheel(version)


def _lines(report: dict) -> dict[str, int]:
    return {k.split(":", 1)[1]: v["line"] for k, v in report.items()}


def _with_version(root: Path, version: str) -> Path:
    """Give a tree a dist-info, as pip leaves next to an installed package."""
    di = root / f"sglang-{version}.dist-info"
    di.mkdir(parents=True, exist_ok=True)
    (di / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n\n")
    return root


def test_registry_names_a_set_for_every_probed_release() -> None:
    assert {releases.probe_set(v) for v in releases.probed_releases()} <= set(TARGET_SETS)
    assert {v: releases.probe_set(v) for v in SET_OF} == SET_OF
    assert releases.probe_set(releases.PATCHED) == "0.5.14"
    assert releases.probe_set("0.5.16+mine") == "0.5.14"  # a local build probes like its release
    assert releases.probe_set("0.5.24") is None and releases.probe_set("0.5.13.post1") is None
    assert TARGETS == TARGET_SETS["0.5.14"]
    new = {t.key for t in TARGET_SETS["0.5.21"]} - {t.key for t in TARGETS}
    gone = {t.key for t in TARGETS} - {t.key for t in TARGET_SETS["0.5.21"]}
    assert (new, gone) == ({KPOOL}, {f"{INDEXER}.forward_indexer"})
    for ts in TARGET_SETS.values():  # each set marks every part of the draft loop, once
        assert sum(t.starts_profiler for t in ts) == 1 and len({t.key for t in ts}) == len(ts)
        assert {t.range for t in ts} >= {nr.ROUND, nr.STEP, nr.INDEXER, nr.GRAPH_CAPTURE}


@pytest.mark.network
@pytest.mark.parametrize("version", sorted(LINES))
def test_each_release_gets_its_set_and_every_target_resolves(version: str) -> None:
    choice = choose(_wheel(version))
    assert (choice.version, choice.target_set, choice.chosen_by) == (version, SET_OF[version], "registry")
    report = choice.report
    assert missing(report) == [] and warnings(report) == []  # every look-alike is known to be off-path
    assert _lines(report) == {q: n for q, n in zip(Q, LINES[version], strict=True) if n is not None}


@pytest.mark.network
def test_patched_build_gets_the_baseline_set(tmp_path_factory: pytest.TempPathFactory) -> None:
    choice = choose(patched_wheel_once(tmp_path_factory))
    assert (choice.version, choice.target_set) == (releases.PATCHED, "0.5.14")
    assert missing(choice.report) == []


@pytest.mark.network
@pytest.mark.parametrize("version", ["0.5.14", "0.5.16", "0.5.17", "0.5.21", "0.5.23"])
def test_cli_probe_check_passes_on_the_release_wheels(
    version: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert kit_main(["probe-check", str(_wheel(version))]) == 0
    out = capsys.readouterr()
    assert set(json.loads(out.out)) == {t.key for t in TARGET_SETS[SET_OF[version]]}
    assert f"sglang {version}: probe-target set {SET_OF[version]}" in out.err


@pytest.mark.network
def test_an_unknown_release_says_what_is_missing_and_where_it_went(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """0.5.23's code under a version the registry does not know: refused; the closest set fits whole, the
    older one misses forward_indexer, which is gone from the tree (not moved)."""
    tree = tmp_path / "next"
    with zipfile.ZipFile(_wheel("0.5.23")) as zf:
        zf.extractall(tree, [n for n in zf.namelist() if n.startswith("sglang/srt/")])
    _with_version(tree, "0.5.24")
    choice = choose(tree)
    assert (choice.version, choice.target_set) == ("0.5.24", None)
    assert choice.chosen_by.startswith("unknown release")
    assert {k: missing(r) for k, r in choice.reports.items()} == {
        "0.5.14": [f"{INDEXER}.forward_indexer"],
        "0.5.17": [],  # 0.5.17's set is 0.5.21's less IndexerKPool: it fits too, and finds less
        "0.5.21": [],
    }
    gone = choice.reports["0.5.14"][f"{INDEXER}.forward_indexer"]
    assert "nothing named forward_indexer in any class of the tree: removed, not moved" in gone["reason"]
    msg = unknown_release(choice, str(tree))
    assert "sglang 0.5.24" in msg and "not in the kit's release registry" in msg and "refusing to run" in msg
    assert "set 0.5.21 (closest): 0 missing: all found" in msg and "Indexer.forward_indexer" in msg
    assert kit_main(["probe-check", str(tree)]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["target_set"] is None and out["closest_set"] == "0.5.21"
    assert out["missing"]["0.5.14"] == [f"{INDEXER}.forward_indexer"]
    assert kit_main(["probe-check", "--target-set", "0.5.21", str(tree)]) == 0  # what a new row would say


def test_an_unknown_release_that_moved_a_class_names_where(tmp_path: Path) -> None:
    root = _with_version(make_fake_sglang(tmp_path / "moved"), "0.6.0")
    src = root / "sglang/srt/speculative/eagle_draft_cuda_graph_runner.py"
    (root / "sglang/srt/speculative/graph_runners.py").write_text(src.read_text())
    src.write_text("# moved to graph_runners.py\n")
    choice = choose(root)
    assert choice.target_set is None and choice.chosen_by.startswith("unknown release")
    key = "sglang.srt.speculative.eagle_draft_cuda_graph_runner:EAGLEDraftCudaGraphRunner._replay_graph"
    assert choice.reports["0.5.14"][key]["moved_to"][0]["file"] == "sglang/srt/speculative/graph_runners.py"
    msg = unknown_release(choice, "x")
    assert "set 0.5.14 (closest)" in msg and "moved? candidates" in msg and "graph_runners.py:14" in msg


def test_a_version_less_tree_gets_the_set_it_fits(tmp_path: Path) -> None:
    fake = make_fake_sglang(tmp_path / "fake")  # shaped like 0.5.14, no dist-info (a git checkout)
    choice = choose(fake)
    assert (choice.version, choice.target_set, choice.chosen_by) == ("unknown", "0.5.14", "fit")
    assert choose(_with_version(make_fake_sglang(tmp_path / "v"), "0.5.14+local")).chosen_by == "registry"
    bad = make_fake_sglang(tmp_path / "bad", drop=("ModelRunner.forward",))
    refused = choose(bad)
    assert refused.target_set is None and refused.chosen_by == "version unknown and no set fits"


def _fake_0521(root: Path) -> Path:
    """The fake tree as 0.5.21 has it: no forward_indexer, and a model whose indexers are IndexerKPool."""
    fake = make_fake_sglang(root, drop=("Indexer.forward_indexer",))
    dsa = fake / "sglang/srt/layers/attention/dsa"
    (dsa / "dsa_indexer_kpool.py").write_text(
        "from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer\n\n\n"
        "class IndexerKPool(Indexer):\n"
        "    def forward_cuda(self, x, paged=True):\n"
        "        return ('kpool-topk', x)\n"
    )
    mr = fake / "sglang/srt/model_executor/model_runner.py"
    text = mr.read_text().replace(
        "from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer",
        "from sglang.srt.layers.attention.dsa.dsa_indexer_kpool import IndexerKPool as Indexer",
    )
    mr.write_text(text)
    return _with_version(fake, "0.5.21")


def test_runtime_probe_picks_the_set_from_the_installed_version_fake_sglang(tmp_path: Path) -> None:
    """A 0.5.21-shaped tree runs with the 0.5.21 set (IndexerKPool probed); as 0.5.14 it is refused."""
    fake = _fake_0521(tmp_path / "fake")
    report = tmp_path / "report.json"
    args = {"mode": "bug", "steps": 5, "graph": False, "rounds": 2, "report": str(report)}
    res = run_driver(tmp_path, fake, args)
    assert res.returncode == 0, res.stderr
    ranges: dict[str, list[tuple]] = {}
    for r in read_ranges(tmp_path / "rec.sqlite"):
        ranges.setdefault(r[3], []).append(r)
    rounds = ranges[nr.ROUND]
    assert len(rounds) == 3  # the warm-up round and two in the window
    for rnd in rounds:  # 4 draft steps, each with its IndexerKPool call
        assert len([i for i in ranges[nr.INDEXER] if inside(rnd, i)]) == 4
    shutil.rmtree(fake / "sglang-0.5.21.dist-info")
    _with_version(fake, "0.5.14")
    res = run_driver(tmp_path, fake, {**args, "report": str(tmp_path / "r2.json")})
    assert res.returncode == 3 and "Indexer.forward_indexer" in res.stderr and "refusing to run" in res.stderr


def test_runtime_probe_refuses_an_unknown_release_fake_sglang(tmp_path: Path) -> None:
    fake = _with_version(make_fake_sglang(tmp_path / "fake"), "0.6.0")
    report = tmp_path / "r.json"
    res = run_driver(
        tmp_path, fake, {"mode": "bug", "steps": 3, "graph": False, "rounds": 1, "report": str(report)}
    )
    assert res.returncode == 3, res.stderr
    assert "sglang 0.6.0" in res.stderr and "not in the kit's release registry" in res.stderr
    assert "refusing to run" in res.stderr and "set 0.5.14 (closest): 0 missing" in res.stderr
    assert not report.exists()


# ---- kit run on an unknown release: refused, or classifier only ---------------------------------


def _unknown_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pkg = _with_version(make_fake_sglang(tmp_path / "site"), "0.6.0") / "sglang"
    monkeypatch.setattr("kit.sglang_src.source.installed_sglang_dir", lambda py=None: pkg)
    monkeypatch.setattr("kit.sglang_src.verify.detect_state", lambda p: {"state": "fix", "carrier": "X"})
    monkeypatch.setattr("kit.sglang_src.source.module_locations", lambda mod, py=None: [f"/site/{mod}"])
    monkeypatch.setattr("kit.trace.nsys.find_nsys", lambda: "/usr/bin/nsys")
    monkeypatch.setattr("kit.trace.nsys.nsys_version", lambda n: "2025.3.1")
    return pkg


def test_kit_run_refuses_an_unknown_release_with_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kit.backends.sglang.preflight import preflight

    _unknown_installed(tmp_path, monkeypatch)
    model = make_model(tmp_path, GLM52_CONFIG)
    p = sp.validate(run_params(model, arm="off", profile=True, cuda_graph=True))
    with pytest.raises(ProbeTargetError) as info:
        preflight(p, "off")
    msg = str(info.value)
    assert "sglang 0.6.0" in msg and "refusing to run" in msg and "set 0.5.14 (closest): 0 missing" in msg
    assert "kit run --classifier-only" in msg
    plain = preflight(sp.validate(run_params(model, arm="off")), "off")  # unprofiled: nothing to probe
    assert plain["target_set"] is None and plain["probe_check_missing"]["0.5.21"] == [KPOOL]


def test_classifier_only_runs_it_and_says_so_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kit.backends.sglang.preflight import preflight

    _unknown_installed(tmp_path, monkeypatch)
    model = make_model(tmp_path, GLM52_CONFIG)
    p = sp.validate(run_params(model, arm="off", profile=True, cuda_graph=True, classifier_only=True))
    assert p.classifier_only and p.profile_from == "window"  # sglang's own window, not the probe's
    pre = preflight(p, "off")
    assert pre["target_set"] is None and pre["nsys"] == "/usr/bin/nsys"
    assert pre["warnings"] == [
        "classifier_only: sglang 0.6.0 (unknown release (not in the kit's release registry)), not probed"
    ]
    env = server_env(p, tmp_path / "run")
    assert ENV_ENABLE not in env and "PYTHONPATH" not in env  # no probe in sglang's processes
    the_plan = plan(run_params(model, arm="off", profile=True, cuda_graph=True, classifier_only=True))
    arm = the_plan["arms"]["off"]
    assert arm["profile_from"] == "window" and "--capture-range=cudaProfilerApi" in arm["nsys_cmd"]
    assert any(w.startswith("CLASSIFIER ONLY") for w in arm["warnings"])


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"cuda_graph": False}, "classifier_only needs cuda_graph"),
        ({"profile": False}, "classifier_only needs profile"),
        ({"target_topk": "last"}, "override is part of the probe"),
        ({"profile_from": "capture"}, "profile_from=capture is the probe's"),
        ({"classifier_only": "yes"}, "classifier_only must be true or false"),
    ],
)
def test_classifier_only_refuses_what_it_cannot_do(tmp_path: Path, kw: dict, match: str) -> None:
    model = make_model(tmp_path, GLM52_CONFIG)
    base = {"profile": True, "cuda_graph": True, "classifier_only": True}
    with pytest.raises(UsageError, match=match):
        sp.validate(run_params(model, **{**base, **kw}))


def test_a_classifier_only_run_is_analysed_by_the_classifier_and_says_so(tmp_path: Path) -> None:
    """The verdict of a classifier-only run: the classifier's count (auto picks it), and the warning."""
    from kit.analysis.analyze import analyze

    fixture = REPO / "tests" / "fixtures" / "h200_sglang" / "graph-bug-ctx4096"
    run = shutil.copytree(fixture, tmp_path / "run")
    params = json.loads((run / "params.json").read_text())
    (run / "params.json").write_text(json.dumps({**params, "classifier_only": True}))
    verdict = analyze(run)
    assert verdict["method"] == "classifier" and verdict["method_requested"] == "auto"
    assert verdict["status"] == "pass"
    assert any(w.startswith("CLASSIFIER ONLY") for w in verdict["warnings"])


def test_cli_flag_reaches_the_params(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = make_model(tmp_path, GLM52_CONFIG)
    assert kit_main(["plan", "--model-path", str(model), "--arms", "off", "--classifier-only"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["arms"]["off"]["profile_from"] == "window"
    assert kit_main(["run", "--arm", "bug", "--classifier-only"]) == 2  # the mini backend has no probe
    assert "--classifier-only is an sglang-backend option" in capsys.readouterr().err
