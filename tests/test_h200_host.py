"""kit.pipeline.host, what the H200 drivers run on the GPU host around `kit batch`, and the drivers' size:
each scripts/h200_*.sh keeps to host set-up (issue 33, item 5), the rest is here where tests reach it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
from fake_gpu_helpers import driver_checkout, host_env
from packed_helpers import plain, plain_run

from kit.errors import EXIT, UsageError
from kit.paths import REPO
from kit.pipeline import host, host_builds

MAX_LOGIC_LINES = 40


def logic_lines(script: Path) -> int:
    """Lines that are neither blank nor a comment (a continued command counts each of its lines)."""
    return sum(1 for ln in script.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#"))


def test_every_h200_driver_keeps_to_40_lines_of_logic() -> None:
    scripts = sorted((REPO / "scripts").glob("h200_*.sh"))
    counts = {s.name: logic_lines(s) for s in scripts}
    assert {"h200_task.sh", "h200_task_settings.sh", "h200_evidence.sh", "h200_upstream.sh"} <= set(counts)
    assert "h200_sglang.sh" in counts and "h200_mutants.sh" in counts
    over = {n: c for n, c in counts.items() if c > MAX_LOGIC_LINES}
    assert not over, f"over {MAX_LOGIC_LINES} lines of logic: {over}"
    # the count itself: a comment, a blank line and an indented comment are not logic; a command is
    probe = REPO / "scripts" / "h200_evidence.sh"
    assert logic_lines(probe) == sum(
        1 for ln in probe.read_text().splitlines() if re.match(r"^\s*[^#\s]", ln)
    )


def _tree(root: Path) -> None:
    run = root / "b" / "sglang-bug-ctx4096"
    (run / "torch_traces").mkdir(parents=True)
    for name in ("verdict.json", "rounds.csv", "profile.sqlite", "profile.nsys-rep", "profile.trace.json.gz"):
        (run / name).write_text(name)
    (run / "torch_traces" / "rank0.json").write_text("{}")
    (root / "kernel-check.txt").write_text("ok")
    (root / "other").mkdir()


def test_pack_brings_back_the_small_files_and_leaves_reports_and_traces(tmp_path: Path) -> None:
    _tree(tmp_path / "runs")
    tgz = host.pack(tmp_path / "out" / "runs.tgz", tmp_path / "runs")
    with tarfile.open(tgz) as tar:
        names = set(tar.getnames())
    assert "./b/sglang-bug-ctx4096/verdict.json" in names and "./kernel-check.txt" in names
    assert not [n for n in names if n.endswith((".sqlite", ".nsys-rep", ".trace.json.gz")) or "torch_" in n]
    assert not list((tmp_path / "out").glob(".*part"))  # written beside and renamed
    some = host.pack(tmp_path / "some.tgz", tmp_path / "runs", ("b*", "kernel-check.*"), ("*.nsys-rep",))
    with tarfile.open(some) as tar:
        names = set(tar.getnames())
    assert "b/sglang-bug-ctx4096/profile.sqlite" in names and "kernel-check.txt" in names
    assert not [n for n in names if n.startswith("other") or n.endswith(".nsys-rep")]


def test_one_deadline_for_a_call() -> None:
    clock = host.Clock(100.0, start=0.0)
    assert clock.left() == 0.0  # long past: nothing left, never negative
    fresh = host.Clock.starting_now(100.0)
    assert 99.0 < fresh.left() <= 100.0
    with pytest.raises(UsageError):
        host.Clock.starting_now(-1)


def test_a_batch_is_packed_while_it_runs_and_its_exit_code_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tarball is refreshed while the batch runs (here a batch that takes a second) and once after; the
    batch's exit code and summary come back, and an error the kit names is its one line, exit 2."""
    from kit.pipeline import batch as batch_mod

    calls: list[float] = []
    seen: dict[str, Any] = {}

    def slow(m: Any, runs: Path, **how: Any) -> batch_mod.BatchResult:
        seen.update(how, batch=m.batch, cells=len(m.cells))
        time.sleep(1.0)
        return batch_mod.BatchResult(runs / "b", [])

    monkeypatch.setattr(batch_mod, "run_batch", slow)
    log = tmp_path / "batch.txt"
    call = host.BatchCall("h200_mini", "glm5", tmp_path / "runs", 42.0)
    rc = host.batch(call, log, lambda: calls.append(time.monotonic()), every_s=0.1)
    assert rc == 0 and len(calls) >= 5
    assert seen["resume"] and seen["deadline_s"] == 42.0 and seen["runner"] == "plain"
    assert seen["batch"] == "h200_mini-glm5" and seen["cells"] == 4 and not seen["progress"]
    text = log.read_text()
    assert text.startswith("kit batch h200_mini --mode glm5 --runner plain") and "0 cells" in text
    bad = host.BatchCall("no-such-matrix", None, tmp_path / "runs", 1.0)
    assert host.batch(bad, log, lambda: None) == 2
    assert log.read_text().splitlines()[-1].startswith("kit batch: error: matrix no-such-matrix not found")


def test_the_kernels_window_falls_back_to_the_torch_indexer_when_the_check_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kernel_check runs for real (here it fails: no CUDA): every variant then runs the torch indexer in a
    batch named ...-torch-fallback (control keeps its name), ragged is skipped, each batch gets what is left
    of the one deadline, and the call's code is the last batch's that was not 0."""
    seen: list[list[str]] = []
    codes = iter([0, 3, 0, 1, 0])

    def fake_batch(call: host.BatchCall, log: Path, refresh: Any, every_s: float = 0) -> int:
        seen.append(call.args())
        log.write_text(f"batch {call.mode}\n")
        refresh()
        return next(codes)

    monkeypatch.setattr(host, "batch", fake_batch)
    out, runs = tmp_path / "out", tmp_path / "runs"
    rc = host.evidence(out, "kernels", 300, runs, None)
    assert rc == 1
    modes = [a[a.index("--mode") + 1] for a in seen]
    assert modes == ["kernels-base", "kernels-b4", "kernels-s3", "kernels-glm5", "kernels-control"]
    names = [a[a.index("--batch") + 1] for a in seen]
    assert names[:4] == [f"h200_mini-kernels-{v}-torch-fallback" for v in ("base", "b4", "s3", "glm5")]
    assert names[4] == "h200_mini-kernels-control"
    assert all(a[a.index("--set") + 1] == "indexer_impl=torch" and "--resume" in a for a in seen)
    left = [float(a[a.index("--deadline") + 1]) for a in seen]
    assert left == sorted(left, reverse=True) and left[0] <= 300
    log = (out / "log-kernels.txt").read_text()
    assert "skip kernels-ragged" in log and "kit batch --mode kernels-glm5: exit 1" in log
    assert "indexer_impl=torch" in log  # kernel_check's own line about the fallback
    assert (runs / "kernel-check.txt").is_file() and (out / "results-kernels.tgz").is_file()
    assert "nsys:" in (out / "host-kernels.txt").read_text()


def test_the_evidence_driver_sets_the_host_up_and_hands_the_call_to_the_kit(tmp_path: Path) -> None:
    """scripts/h200_evidence.sh end to end here: with no GPU the matrix's cells are refused in kit batch's
    checks (exit 2, one line), which the driver returns, with the log, the facts and both tarballs."""
    out, view = tmp_path / "out", driver_checkout(tmp_path)
    env = host_env(tmp_path)
    r = subprocess.run(
        ["bash", str(view / "scripts" / "h200_evidence.sh"), str(out), "fixtures", "30"],
        cwd=view,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    log = (out / "log-fixtures.txt").read_text()
    assert "torch sees no CUDA GPU" in log and "kit batch --mode fixtures: exit 2" in log
    assert (out / "results-fixtures.tgz").is_file() and (out / "fixtures.tgz").is_file()
    assert "kit git sha: test" in (out / "host-fixtures.txt").read_text()
    bad = subprocess.run(
        ["bash", str(view / "scripts" / "h200_evidence.sh"), str(out), "nope"],
        cwd=view,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "unknown mode 'nope'" in bad.stderr


def test_kit_host_facts_and_pack_from_the_command_line(tmp_path: Path) -> None:
    """`kit host facts FILE -- LINE...` and `kit host pack TGZ RUNS_DIR`, as a host shell calls them."""
    _tree(tmp_path / "runs")
    env = host_env(tmp_path)
    script = (
        f"python3 -m kit.cli host facts {tmp_path}/facts.txt -- '--jobs: 2' two >/dev/null && "
        f"python3 -m kit.cli host pack {tmp_path}/runs.tgz {tmp_path}/runs >/dev/null"
    )
    r = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = (tmp_path / "facts.txt").read_text().splitlines()
    assert lines[2:5] == ["kit git sha: test", "--jobs: 2", "two"] and lines[1].startswith("torch ")
    with tarfile.open(tmp_path / "runs.tgz") as tar:
        names = tar.getnames()
    assert "./b/sglang-bug-ctx4096/verdict.json" in names and not [n for n in names if "profile" in n]


# --- scripts/h200_sglang.sh: kit host sglang (kit/pipeline/host_sglang.py)


def _sglang_call(tmp_path: Path, mode: str, gains: tuple[str, ...] = (), jobs: int = 1) -> Any:
    from kit.pipeline import host_sglang

    dirs = host_sglang.HostDirs(tmp_path / "host", site=tmp_path / "site")
    clock = host.Clock.starting_now(host_sglang.default_deadline(mode))
    return host_sglang.SglangCall(tmp_path / "out", mode, clock, dirs, jobs, gains=gains)


def test_each_sglang_mode_runs_its_batches_within_one_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each mode's matrix, matrix mode and batch (CKPT_GAINS' tag and --set model_path on every one), JOBS
    as -j; the grid's modes start cells for 360 s, the others 540, and a second batch gets what the first
    left; the call's code is the last batch's that was not 0; the SQLite fixtures come back when they fit."""
    from kit.pipeline import host_sglang

    seen: list[list[str]] = []
    left: list[float] = []
    codes = iter([3, 0, 0, 0, 1, 0, 0])

    def fake_batch(call: host.BatchCall, log: Path, refresh: Any, every_s: float = 0) -> int:
        seen.append(call.args())
        left.append(call.deadline_s)
        log.write_text(f"batch {call.batch}\n")
        time.sleep(0.05)
        return next(codes)

    monkeypatch.setattr(host, "batch", fake_batch)
    monkeypatch.setattr(host_sglang.SglangCall, "jit_pack", lambda self: None)
    tag = "-attn_out-5.5"
    calls = {m: _sglang_call(tmp_path / m, m, ("attn_out=5.5",), jobs=4) for m in ("grid", "latest", "noise")}
    calls |= {m: _sglang_call(tmp_path / m, m) for m in ("warm", "part-b", "steps3")}
    for c in calls.values():
        (c.ckpt).mkdir(parents=True)
        (c.ckpt / "kit-checkpoint.json").write_text("{}")
    cell = calls["grid"].dirs.runs / f"h200_pr29654{tag}"
    for name in (
        "b-ctx4096-s5-graph-cuda",
        "a-ctx4096-s5-eager-cuda",
        "c-ctx16384-graph-cuda",
        "d-ctx80000-cuda",
    ):
        (cell / name).mkdir(parents=True)
        (cell / name / "profile.sqlite").write_text(name)
    assert calls["grid"].run(tmp_path) == 3
    rcs = [calls[m].run(tmp_path) for m in ("latest", "warm", "part-b", "steps3", "noise")]
    assert rcs == [0, 0, 0, 1, 0]

    def arg(a: list[str], flag: str) -> str | None:
        return a[a.index(flag) + 1] if flag in a else None

    got = [(a[0], arg(a, "--mode"), arg(a, "--batch"), arg(a, "--set"), arg(a, "-j")) for a in seen]
    ckpt = f"model_path={calls['grid'].ckpt}"
    assert got == [
        ("h200_pr29654", None, f"h200_pr29654{tag}", ckpt, "4"),
        ("h200_pr29654", "latest", f"h200_pr29654-latest{tag}", ckpt.replace("grid", "latest"), "4"),
        ("h200_pr29654", "warm", "h200_pr29654-warm", None, "1"),
        ("h200_pr29654", "part-b", "h200_pr29654", None, "1"),
        ("h200_sglang", "steps3", "h200_sglang-steps3", None, "1"),
        ("h200_sglang", "graph-4k", f"h200_sglang-graph{tag}", ckpt.replace("grid", "noise"), "4"),
        ("h200_sglang", "noise", f"h200_sglang-noise{tag}", ckpt.replace("grid", "noise"), "4"),
    ]
    assert 355 < left[0] <= 360 and 355 < left[1] <= 360 and 535 < left[2] <= 540 and 355 < left[3] <= 360
    assert left[6] < left[5] <= 540  # noise: the second batch gets what the first left
    out = calls["grid"].out
    log = (out / f"log-grid{tag}.txt").read_text()
    assert f"batch h200_pr29654{tag}" in log and "kit batch h200_pr29654 (plain): exit 3 (0 done" in log
    assert (out / f"batch-grid{tag}.txt").is_file() and (out / f"results-grid{tag}.tgz").is_file()
    with tarfile.open(out / f"sqlite-grid{tag}.tgz") as tar:  # the 4k cells, then 16k: the first two by name
        assert tar.getnames() == [
            f"h200_pr29654{tag}/{n}-ctx4096-s5-{k}-cuda/profile.sqlite"
            for n, k in (("a", "eager"), ("b", "graph"))
        ]
    noise = calls["noise"].out
    assert {p.name for p in noise.glob("batch-*")} == {f"batch-graph-4k{tag}.txt", f"batch-noise{tag}.txt"}
    assert "kit noise rc=2 (verdict in" in (noise / f"log-noise{tag}.txt").read_text()  # no runs: its error
    assert not list(calls["warm"].out.glob("sqlite-*")) and not list(calls["steps3"].out.glob("sqlite-*"))
    assert (
        host_sglang.sqlite_fixtures(tmp_path / "big.tgz", calls["grid"].dirs.runs, f"h200_pr29654{tag}", 10)
        is None
    )
    assert not (tmp_path / "big.tgz").exists()  # over the limit: nothing comes back
    assert [host_sglang.default_deadline(m) for m in host_sglang.MODES] == [540] * 3 + [360] * 6 + [540] * 4


def test_each_analysed_run_gets_the_classifier_and_each_report_one_placement(tmp_path: Path) -> None:
    """After a batch: the NVTX-free classifier beside each analysed graph run (not eager ones, not runs
    without a verdict), the indexer's placement once per report (a shared server's cells link to one), a
    classifier that fails said in the log; what is there already is not done again."""
    fixture = REPO / "tests" / "fixtures" / "h200_sglang" / "graph-bug-ctx4096"
    call = _sglang_call(tmp_path, "grid")
    call.out.mkdir(parents=True)
    batch = call.dirs.runs / "b"
    server = batch / "server-bug"
    server.mkdir(parents=True)
    shutil.copyfile(plain(fixture / "profile.sqlite.xz"), server / "profile.sqlite")  # plain on the host
    runs = {}
    for name in (
        "bug-ctx4096-s5-graph",
        "bug-ctx80000-s5-graph",
        "bug-ctx4096-s5-eager",
        "x-ctx4096-s5-graph",
    ):
        runs[name] = run = plain_run(fixture, batch / f"sglang-{name}-cuda")
        (run / "verdict.json").write_text("{}")
        if "graph" in name and "x-" not in name:
            (run / "profile.sqlite").unlink()
            (run / "profile.sqlite").symlink_to(server / "profile.sqlite")
    (runs["x-ctx4096-s5-graph"] / "profile.sqlite").write_text("not a report")
    unanalysed = plain_run(fixture, batch / "sglang-fix-ctx4096-s5-graph-cuda")
    call.classify("b")
    for name in ("bug-ctx4096-s5-graph", "bug-ctx80000-s5-graph"):
        assert (runs[name] / "classifier" / "verdict.json").is_file()
        assert not (runs[name] / "placement.txt").exists()
    assert "draft_round   4 in 8" in (server / "placement.txt").read_text()  # one, beside the shared report
    assert not (runs["bug-ctx4096-s5-eager"] / "classifier").exists()  # eager: nothing for it to count
    assert "draft_round" in (runs["bug-ctx4096-s5-eager"] / "placement.txt").read_text()
    assert not (unanalysed / "classifier").exists() and not (unanalysed / "placement.txt").exists()
    log = call.log.read_text()
    assert "classifier sglang-x-ctx4096-s5-graph-cuda: failed, see" in log and "not a report" not in log
    (server / "placement.txt").write_text("kept")
    call.classify("b")  # again: what is there stays
    assert (server / "placement.txt").read_text() == "kept"
    assert call.log.read_text().count("classifier sglang-x") == 1  # its folder is there: as the driver did


def test_receive_keeps_each_staged_folder_in_its_store_once(tmp_path: Path) -> None:
    """.stage-K/.stageK: 0.5.14's store; .stageNN[_K]: the later release NN's (from the release registry);
    .stage-nb*: the notebooks'; .stage-jit*: left to jit_restore. A received per-call folder (PREFIX-K,
    PREFIX_K) is removed, a whole pack (.stage3, .stage-nb) kept; a damaged part is refused (its folder
    stays, exit 2), the others still received."""
    from kit.sglang_src import stage

    assert host_builds.later_releases() == ("0.5.16", "0.5.17")
    call = _sglang_call(tmp_path, "receive")
    call.out.mkdir(parents=True)
    tree = tmp_path / "tree"
    (tree / "d").mkdir(parents=True)
    (tree / "d" / "f").write_bytes(os.urandom(3000))
    here = tmp_path / "repo"
    stage.pack_tree(tree, ["d"], here / ".stage-jit-0", part_bytes=1 << 20)
    for name in (".stage-0", ".stage3", ".stage16_1", ".stage17", ".stage-nb", ".stage18"):
        shutil.copytree(here / ".stage-jit-0", here / name)
    part = next((here / ".stage17").glob("part-*"))
    part.write_bytes(b"x" + part.read_bytes()[1:])
    assert call.receive(here) == 2
    d = call.dirs
    for store in (d.store, d.later_store("0.5.16"), d.store_nb):
        assert stage.status(store)["missing"] == [], store
    assert stage.status(d.later_store("0.5.17"))["have"] == 0  # the damaged part: not kept
    kept = [".stage-jit-0", ".stage-nb", ".stage17", ".stage18", ".stage3"]
    assert sorted(p.name for p in here.iterdir()) == kept
    assert not (d.tmp / "kit-stage18").exists()  # no release 0.5.18 with a stage: 0.5.14's store
    assert d.store_for(".stage16x") == d.store and d.store_for(".stage-jit-3") is None
    assert d.store_for(".stage17_4") == d.tmp / "kit-stage17"
    assert d.pythonpath("0.5.17").split(os.pathsep)[1:3] == [
        f"{d.tmp}/kit-sgl17/sglang-0.5.17",
        f"{d.tmp}/kit-sgl17/deps",
    ]
    assert d.pythonpath("0.5.14+pr29654").split(os.pathsep)[1] == f"{d.tmp}/kit-sgl/sglang-0.5.14+pr29654"


def test_install_installs_what_was_received_and_checks_each_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """install: 0.5.14's store into /tmp/kit-sgl and both its builds checked, each later release whose
    store holds a manifest (0.5.16 here, not 0.5.17) into its own folder, the notebooks' store; each build's
    smoke test with that build alone on PYTHONPATH; the checkpoint with CKPT_GAINS' gains in its folder. A
    failed install is shown and the call exits 1, before anything after it."""
    from kit import checkpoint
    from kit.errors import InputError
    from kit.pipeline import host_sglang
    from kit.probe import check
    from kit.sglang_src import stage, verify

    rec = tmp_path / "rec.jsonl"
    build = "os.environ['PYTHONPATH'].split(os.pathsep)[1]"  # the smoke test's build
    smoke = f"import os; open({str(rec)!r}, 'a').write('smoke ' + {build} + chr(10))"
    ran: list[str] = []

    class Choice:
        target_set, report = "0.5.14", {"missing": []}

        def describe(self) -> str:
            return "sglang 0.5.14: probe-target set 0.5.14"

    def install(store: Path, target: Path, beside: Path | None = None) -> dict:
        ran.append(
            f"stage install {store.name} {target.name}" + (f" --beside {beside.name}" if beside else "")
        )
        if target.name == "FAIL":
            raise InputError("a part is missing")
        return {"wheels": 1}

    monkeypatch.setattr(stage, "status", lambda store: ran.append(f"stage status {store.name}") or {})
    monkeypatch.setattr(stage, "install", install)
    monkeypatch.setattr(
        verify, "detect_state", lambda p: ran.append(f"verify {p.parent.name}") or {"state": "bug"}
    )
    monkeypatch.setattr(check, "choose", lambda p: ran.append(f"probe-check {p.parent.name}") or Choice())
    monkeypatch.setattr(
        checkpoint,
        "make_checkpoint",
        lambda out, gains: ran.append(f"make-checkpoint {out.name} {gains}") or {},
    )
    monkeypatch.setattr(host_builds, "SMOKE", [sys.executable, "-c", smoke])
    call = _sglang_call(tmp_path, "install", ("attn_out=5.5",))
    d = call.dirs
    for store in (d.store, d.later_store("0.5.16"), d.store_nb):
        store.mkdir(parents=True)
        (store / "manifest.json").write_text("{}")
    (d.target / "deps").mkdir(parents=True)
    call.out.mkdir(parents=True)
    assert call.install() == 0
    assert ran == [
        "stage status kit-stage",
        "stage install kit-stage kit-sgl",
        "verify sglang-0.5.14",
        "probe-check sglang-0.5.14",
        "verify sglang-0.5.14+pr29654",
        "probe-check sglang-0.5.14+pr29654",
        "stage install kit-stage16 kit-sgl16 --beside kit-sgl",
        "verify sglang-0.5.16",
        "probe-check sglang-0.5.16",
        "stage install kit-stage-nb kit-nb",
        "make-checkpoint kit-ckpt-attn_out-5.5 {'attn_out': 5.5}",
    ]
    assert rec.read_text().replace(str(d.tmp), "T").splitlines() == [
        "smoke T/kit-sgl/sglang-0.5.14",
        "smoke T/kit-sgl/sglang-0.5.14+pr29654",
        "smoke T/kit-sgl16/sglang-0.5.16",
    ]
    names = {p.name for p in call.out.iterdir()}
    assert {"install.json", "install16.json", "install-nb.json", "install-sizes.txt"} <= names
    assert {"smoke-0.5.14-pr29654.json", "verify-0.5.16.json", "probe-check-0.5.14.json"} <= names
    assert json.loads((call.out / "verify-0.5.16.json").read_text()) == {"state": "bug"}
    assert "/kit-sgl/deps" in (call.out / "install-sizes.txt").read_text()
    ran.clear()
    failing = _sglang_call(tmp_path / "again", "install")  # 0.5.16's install fails: nothing after it
    for store in (failing.dirs.store, failing.dirs.later_store("0.5.16"), failing.dirs.store_nb):
        store.mkdir(parents=True)
        (store / "manifest.json").write_text("{}")
    monkeypatch.setattr(host_sglang.HostDirs, "later_target", lambda self, v: self.tmp / "FAIL")
    failing.out.mkdir(parents=True)
    assert failing.install() == EXIT["error"]  # an error, never a failed verdict
    assert ran[-1] == "stage install kit-stage16 FAIL --beside kit-sgl" and len(ran) == 7
    assert "a part is missing" in (failing.out / "install16.json").read_text()


def test_the_sglang_driver_sets_the_host_up_and_hands_the_call_to_the_kit(tmp_path: Path) -> None:
    """scripts/h200_sglang.sh end to end here: the grid's batch is refused in kit batch's checks (no GPU,
    no builds: exit 2, its line), which the driver returns with the log, the batch's text, the facts (the
    runner named) and the tarball; a mode it does not know is one line and exit 2."""
    hosttmp, out = tmp_path / "host", tmp_path / "out"
    (hosttmp / "kit-ckpt").mkdir(parents=True)
    (hosttmp / "kit-ckpt" / "kit-checkpoint.json").write_text("{}")
    env, view = host_env(tmp_path, JOBS="2"), driver_checkout(tmp_path)

    def driver(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = ["bash", str(view / "scripts" / "h200_sglang.sh"), str(out), *args]
        return subprocess.run(cmd, cwd=view, env=env, capture_output=True, text=True, timeout=300)

    r = driver("grid", "30")
    assert r.returncode == 2, r.stdout + r.stderr
    log = (out / "log-grid.txt").read_text()
    assert "kit batch h200_pr29654 --batch h200_pr29654 --runner" in log
    assert 20 <= int(re.findall(r" -j 2 --deadline (\d+)", log)[0]) <= 30  # what is left of the call's 30 s
    assert "kit batch: error:" in log and "kit batch h200_pr29654 (" in log and "): exit 2 (0 done" in log
    assert (out / "batch-grid.txt").is_file() and (out / "results-grid.tgz").is_file()
    facts = (out / "host-grid.txt").read_text()
    assert "kit git sha: test" in facts and "kit batch runner: " in facts
    bad = driver("nope")
    assert bad.returncode == 2 and "unknown mode 'nope'" in bad.stderr


@pytest.mark.parametrize("cmd", ["sglang", "task", "mutants", "evidence"])
def test_an_out_the_system_refuses_is_one_line_and_exit_2(tmp_path: Path, cmd: str) -> None:
    """OUT under a file, or where the system refuses a folder (/sys): one line naming it, exit 2, before
    anything runs (it was a PermissionError 'unforeseen by the kit')."""
    (tmp_path / "afile").write_text("")
    for out, said in ((tmp_path / "afile" / "o", "is a file, not a folder"), (Path("/sys/kit-x"), "cannot")):
        step = {"sglang": "grid", "task": "bug", "mutants": "compare", "evidence": "graph"}[cmd]
        r = subprocess.run(
            [sys.executable, "-m", "kit.cli", "host", cmd, str(out), step, "--tmp", str(tmp_path)]
            if cmd != "evidence"
            else [sys.executable, "-m", "kit.cli", "host", cmd, str(out), step],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )
        lines = r.stderr.strip().splitlines()
        assert r.returncode == EXIT["error"] and len(lines) == 1 and said in lines[0], r.stderr
        assert "unforeseen" not in r.stderr and not out.exists()
