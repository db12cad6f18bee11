"""The probe reaches spawned sglang processes, emits one draft_round per round in eager and graph mode,
refuses a tree that lacks a target, and costs nothing when disabled. sglang itself needs a GPU, so
these run against a fake tree with sglang's module paths and names (hence `_fake_sglang`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_sglang_helpers import inside, make_fake_sglang, read_ranges, run_driver

from kit.probe import ENV_CENSUS, ENV_TARGET_TOPK, probe_env, site_dir
from kit.probe import ranges as nr
from kit.probe.targets import TARGETS, WINDOW_END, WINDOW_START


def _by_name(rows: list[tuple]) -> dict[str, list[tuple]]:
    out: dict[str, list[tuple]] = {}
    for r in rows:
        out.setdefault(r[3], []).append(r)
    return out


def _after_window(ranges: dict[str, list[tuple]]) -> dict[str, list[tuple]]:
    """What a profile window would hold: ranges that start after sglang's _start_profile marker."""
    (mark,) = ranges[WINDOW_START]
    return {k: [r for r in v if r[0] >= mark[1]] for k, v in ranges.items() if k != WINDOW_START}


def _run(tmp_path: Path, **args) -> tuple[dict, dict[str, list[tuple]], subprocess.CompletedProcess]:
    fake = make_fake_sglang(tmp_path / "fake")
    report = tmp_path / "report.json"
    res = run_driver(tmp_path, fake, {**args, "report": str(report)})
    assert res.returncode == 0, res.stderr
    return json.loads(report.read_text()), _by_name(read_ranges(tmp_path / "rec.sqlite")), res


@pytest.mark.parametrize("mode,per_round", [("bug", 4), ("fix", 1)])
def test_eager_rounds_in_spawned_process_fake_sglang(tmp_path: Path, mode: str, per_round: int) -> None:
    rep, all_ranges, _ = _run(tmp_path, mode=mode, steps=5, graph=False, rounds=3)
    assert rep["wrapped"] and rep["hook"] and rep["pid"] != os.getpid()
    assert len(all_ranges[nr.ROUND]) == 4  # one warm-up round before the window
    ranges = _after_window(all_ranges)
    rounds = ranges[nr.ROUND]
    assert len(rounds) == 3
    for rnd in rounds:
        steps = [s for s in ranges[nr.STEP] if inside(rnd, s)]
        indexers = [i for i in ranges[nr.INDEXER] if inside(rnd, i)]
        assert len(steps) == 4  # num_steps - 1 draft forwards
        assert len(indexers) == per_round
        assert all(any(inside(s, i) for s in steps) for i in indexers)
    # verify (3 target layers) and draft extend (1) indexer calls are outside every round
    assert len(ranges[nr.VERIFY]) == 3 and len(ranges[nr.EXTEND]) == 3
    assert len(ranges[nr.STEP]) == 12  # target forward and draft extend are not draft steps
    assert len(ranges[nr.INDEXER]) == 3 * per_round + 3 * 3 + 3
    assert nr.GRAPH_CAPTURE not in ranges


@pytest.mark.parametrize("mode,per_round", [("bug", 4), ("fix", 1)])
def test_graph_mode_one_round_per_replay_fake_sglang(tmp_path: Path, mode: str, per_round: int) -> None:
    census = tmp_path / "census.jsonl"
    fake = make_fake_sglang(tmp_path / "fake")
    report = tmp_path / "report.json"
    res = run_driver(
        tmp_path,
        fake,
        {"mode": mode, "steps": 5, "graph": True, "rounds": 3, "report": str(report)},
        extra_env={ENV_CENSUS: str(census)},
    )
    assert res.returncode == 0, res.stderr
    ranges = _by_name(read_ranges(tmp_path / "rec.sqlite"))
    captures = ranges[nr.GRAPH_CAPTURE]
    # target decode graph (1 shape) + draft graphs (2 shapes) + draft-extend graph (1 shape)
    assert len(captures) == 4
    assert len(ranges[nr.ROUND]) == 4  # the warm-up round and three in the window
    rounds = _after_window(ranges)[nr.ROUND]
    assert len(rounds) == 3  # exactly one per replay, none from the capture-time draft_forward calls
    assert not any(inside(c, r) for c in captures for r in rounds)
    for rnd in rounds:  # a replay runs no Python draft loop: nothing nested
        assert not any(inside(rnd, x) for x in ranges[nr.STEP] + ranges[nr.INDEXER])
    # capture-time structure, what graph-node attribution joins against: 2 shapes x 2 runs x 4 steps
    steps = ranges[nr.STEP]
    assert len(steps) == 16 and all(any(inside(c, s) for c in captures) for s in steps)
    step_indexers = [i for i in ranges[nr.INDEXER] if any(inside(s, i) for s in steps)]
    assert len(step_indexers) == 4 * per_round
    lines = [json.loads(x) for x in census.read_text().splitlines()]
    draft = [x for x in lines if x["target"].endswith("EAGLEDraftCudaGraphRunner.capture_one_shape")]
    assert sorted(x["shape"] for x in draft) == [1, 2]
    expected = [1, 1, 1, 1] if mode == "bug" else [1, 0, 0, 0]
    assert all(x["draft_forwards"] == [expected, expected] for x in draft)


def test_indexer_entry_points_are_one_range_fake_sglang(tmp_path: Path) -> None:
    """forward_cuda -> forward_indexer (the non-paged path) is one indexer call, not two."""
    fake = make_fake_sglang(tmp_path / "fake")
    mr = fake / "sglang/srt/model_executor/model_runner.py"
    mr.write_text(
        mr.read_text().replace(
            "def __init__(self, layers=1, paged=True)", "def __init__(self, layers=1, paged=False)"
        )
    )
    report = tmp_path / "report.json"
    res = run_driver(
        tmp_path, fake, {"mode": "bug", "steps": 3, "graph": False, "rounds": 2, "report": str(report)}
    )
    assert res.returncode == 0, res.stderr
    ranges = _by_name(read_ranges(tmp_path / "rec.sqlite"))
    idx = ranges[nr.INDEXER]
    assert not any(inside(a, b) for a in idx for b in idx)
    assert len(idx) == 3 * (2 + 3 + 1)  # 3 rounds (warm-up included) x (2 draft steps + 3 target + 1 extend)


def test_refuses_when_a_target_is_missing_fake_sglang(tmp_path: Path) -> None:
    fake = make_fake_sglang(
        tmp_path / "fake", drop=("EAGLEDraftCudaGraphRunner._replay_graph", "Indexer.forward_indexer")
    )
    res = run_driver(
        tmp_path,
        fake,
        {"mode": "bug", "steps": 3, "graph": False, "rounds": 1, "report": str(tmp_path / "r.json")},
    )
    assert res.returncode == 3
    assert "EAGLEDraftCudaGraphRunner._replay_graph" in res.stderr
    assert "Indexer.forward_indexer" in res.stderr
    assert "refusing to run" in res.stderr
    assert "Fatal Python error" not in res.stderr
    assert not (tmp_path / "r.json").exists()


def test_disabled_means_nothing_wrapped_and_no_hook_fake_sglang(tmp_path: Path) -> None:
    fake = make_fake_sglang(tmp_path / "fake")
    report = tmp_path / "report.json"
    res = run_driver(tmp_path, fake, {"plain": True, "report": str(report)}, probe=False)
    assert res.returncode == 0, res.stderr
    rep = json.loads(report.read_text())
    assert rep == {"pid": rep["pid"], "wrapped": False, "finders": rep["finders"], "kit_imported": False}
    assert "ProbeFinder" not in rep["finders"]
    assert not (tmp_path / "rec.sqlite").exists()


def _base_python() -> str:
    return str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}")


def test_refuses_nvtx_sink_without_nvtx_package_fake_sglang(tmp_path: Path) -> None:
    """Ranges silently missing would read as '0 launches': a sink that records nothing must not start.
    Also exercises KIT_PROBE_ROOT: the base interpreter does not have the kit installed. Whether or not
    it has nvtx, a `nvtx` package that fails to import shadows it first on the path."""
    base = _base_python()
    blocker = tmp_path / "no_nvtx" / "nvtx"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('nvtx hidden by the test')\n")
    fake = make_fake_sglang(tmp_path / "fake")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIT_PROBE")}
    env.update(probe_env({"PYTHONPATH": os.pathsep.join([str(blocker.parent), str(fake)])}, sink="nvtx"))
    res = subprocess.run(
        [base, "-c", "print('ran')"], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert res.returncode == 3, res.stderr
    assert "nvtx" in res.stderr and "ran" not in res.stdout


def test_chains_to_the_shadowed_sitecustomize(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins\nbuiltins.KIT_CHAINED = True\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIT_PROBE")}
    env["PYTHONPATH"] = os.pathsep.join([str(site_dir()), str(other)])
    res = subprocess.run(
        [sys.executable, "-c", "import builtins; print(getattr(builtins, 'KIT_CHAINED', False))"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.stdout.strip() == "True", res.stderr


def test_every_target_kind_is_known() -> None:
    assert {t.kind for t in TARGETS} <= {"plain", "round", "step", "capture"}
    assert len({t.key for t in TARGETS}) == len(TARGETS)
    assert sum(t.starts_profiler for t in TARGETS) == 1


def test_probe_env_puts_site_dir_first() -> None:
    env = probe_env(
        {"PYTHONPATH": "/a:/b"}, sink="recorder", recorder=Path("/x.sqlite"), profile_from="capture"
    )
    assert env["PYTHONPATH"].split(os.pathsep) == [str(site_dir()), "/a", "/b"]
    assert env["KIT_PROBE"] == "1" and env["KIT_PROBE_PROFILE_FROM"] == "capture"
    with pytest.raises(ValueError):
        probe_env({}, sink="recorder")


def test_window_edges_are_marked_once_per_window_fake_sglang(tmp_path: Path) -> None:
    """A server that runs several cells opens one window per cell: a zero-length mark after each
    _start_profile and before each _stop_profile, with exactly that window's rounds between them."""
    _, ranges, _ = _run(tmp_path, mode="fix", steps=3, graph=False, rounds=2, windows=3)
    starts, ends = ranges[WINDOW_START], ranges[WINDOW_END]
    assert len(starts) == len(ends) == 3
    assert all(s[0] == s[1] or s[1] - s[0] < 1_000_000 for s in starts + ends)  # marks, not ranges
    rounds = ranges[nr.ROUND]
    assert len(rounds) == 3 * 3  # per window: one warm-up round and two inside
    for n, (s, e) in enumerate(zip(starts, ends, strict=True)):
        inside_window = [r for r in rounds if s[1] <= r[0] and r[1] <= e[0]]
        assert len(inside_window) == 2, n
        if n + 1 < len(starts):
            assert e[1] <= starts[n + 1][0]


def test_target_topk_override_replaces_only_the_target_selection_fake_sglang(tmp_path: Path) -> None:
    """target_topk=last: every target indexer's top-k becomes the last index_topk keys, paged and ragged;
    the NextN draft's indexer (built with layer_id 0, like the target's first) keeps its own."""
    fake = make_fake_sglang(tmp_path / "fake")
    report = tmp_path / "topk.json"
    control = {ENV_TARGET_TOPK: "last"}
    res = run_driver(tmp_path, fake, {"topk": True, "report": str(report)}, extra_env=control)
    assert res.returncode == 0, res.stderr
    got = json.loads(report.read_text())
    last = [[12, 13, 14, 15]] * 2
    assert [ix["prefix"] for ix in got["target"]] == [f"model.layers.{i}.self_attn.indexer" for i in (0, 1)]
    assert all(ix["paged"] == last and ix["ragged"] == last for ix in got["target"])
    ((draft,),) = [got["draft"]]
    assert draft["prefix"] == "model.decoder.self_attn.indexer"
    assert draft["paged"] == draft["ragged"] == got["scores_topk"] != last
    assert "is the target's: its top-k is overridden" in res.stderr
    assert "is the draft's: left alone" in res.stderr
    assert "first target top-k replaced in Indexer._get_topk_paged" in res.stderr
    # without the variable nothing is replaced (and the override's targets are not even wrapped)
    plain = run_driver(tmp_path, fake, {"topk": True, "report": str(report)})
    assert plain.returncode == 0, plain.stderr
    untouched = json.loads(report.read_text())
    assert all(ix["paged"] == untouched["scores_topk"] for ix in untouched["target"] + untouched["draft"])
    assert "top-k" not in plain.stderr


def test_target_topk_override_refuses_a_tree_without_its_targets_fake_sglang(tmp_path: Path) -> None:
    fake = make_fake_sglang(tmp_path / "fake", drop=("Indexer._get_topk_ragged",))
    args = {"mode": "bug", "steps": 3, "graph": False, "rounds": 1, "report": str(tmp_path / "r.json")}
    res = run_driver(tmp_path, fake, args, extra_env={ENV_TARGET_TOPK: "last"})
    assert res.returncode == 3 and "Indexer._get_topk_ragged" in res.stderr
    assert run_driver(tmp_path, fake, args).returncode == 0  # not a control run: not needed


def test_ramp_is_pure_tensor_ops() -> None:
    """Nothing reads a value back to the host, so it can be captured into a CUDA graph: it runs on the
    meta device, where any data-dependent step would fail."""
    import torch

    from kit.probe.override import LastKeysMetadata, ramp_like

    meta = torch.empty(3, 4096, device="meta")
    assert ramp_like(meta) is meta
    logits = torch.rand(2, 6)
    strided = torch.rand(2, 8)[:, :6]  # a padded row stride, as deep_gemm's logits may have
    for t in (logits, strided):
        stride = t.stride()
        out = ramp_like(t)
        assert out.stride() == stride and out.tolist() == [list(map(float, range(6)))] * 2

    class Frozen:
        __slots__ = ()
        page_size = 64

        def topk_transform(self, logits: torch.Tensor, topk: int, ks: object = None) -> list:
            return [logits, topk, ks]

    proxy = LastKeysMetadata(Frozen())
    got = proxy.topk_transform(torch.rand(1, 5), 2, ks="k")
    assert got[0].tolist() == [[0.0, 1.0, 2.0, 3.0, 4.0]] and got[1:] == [2, "k"]
    assert proxy.page_size == 64


@pytest.mark.parametrize(
    "prefix,role",
    [
        ("model.layers.0.self_attn.indexer", "target"),
        ("model.layers.61.self_attn.indexer", "target"),
        ("model.decoder.self_attn.indexer", "draft"),
        ("indexer", None),
        ("", None),
        ("model.decoder.layers.3.self_attn.indexer", None),  # both: never guess
    ],
)
def test_indexer_role_from_prefix(prefix: str, role: str | None) -> None:
    from kit.probe.override import OverrideRefused, indexer_role

    if role is None:
        with pytest.raises(OverrideRefused, match="refusing to guess"):
            indexer_role(prefix)
    else:
        assert indexer_role(prefix) == role


def test_probe_env_carries_the_override_and_the_off_sink() -> None:
    env = probe_env({}, sink="off", target_topk="last")
    assert env[ENV_TARGET_TOPK] == "last" and env["KIT_PROBE_SINK"] == "off"
    assert ENV_TARGET_TOPK not in probe_env({})
    with pytest.raises(ValueError):
        probe_env({}, target_topk="first")
