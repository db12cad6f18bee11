"""The H200 host drivers run end to end here before they cost device time: scripts/h200_task.sh (kit host
task: data/matrices/h200_task.yaml's modes through kit batch) on the fake GPU stack (fake sglang builds
whose server is the HTTP stand-in, the fake nsys, the task checkpoint), in a temporary host folder
(KIT_HOST_TMP). A driver that runs its servers but finds none of their runs (the first real Kineto attempt:
single-cell run directories are named by the run id alone) fails here."""

from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from fake_gpu_helpers import driver_checkout, fake_build, host_env
from task_helpers import task_checkpoint

from kit.errors import EXIT
from kit.paths import REPO
from kit.sglang_src.releases import BASELINE, PATCHED


def _host(tmp_path: Path) -> dict[str, str]:
    host = tmp_path / "host"
    fake_build(host / "kit-sgl" / f"sglang-{BASELINE}", "bug")
    fake_build(host / "kit-sgl" / f"sglang-{PATCHED}", "fix")
    for shared in ("deps", "fallback"):  # what the matrix's builds name beside each build's folder
        (host / "kit-sgl" / shared).mkdir()
    shutil.copytree(task_checkpoint()[0], host / "kit-task")
    return host_env(tmp_path, KIT_RUNNER="plain")  # kit batch without Jupyter: notebooks tested elsewhere


def _call(env: dict[str, str], out: Path, step: str, deadline: str = "900", script: str = "h200_task.sh"):
    view = driver_checkout(out.parent)
    cmd = ["bash", str(view / "scripts" / script), str(out), step, deadline]
    return subprocess.run(cmd, cwd=view, env=env, capture_output=True, text=True, timeout=900)


def _cells(batch: Path) -> list[str]:
    return sorted(p.parent.name for p in batch.glob("*/params.json"))


GATE = re.compile(
    r"compare sglang-(\S+?)-ctx\d+-\S+: .*gate (PASS|FAIL)(: \S+: \S+ \(\w+\) takes other verify)?"
)


def _gates(text: str) -> dict[str, str]:
    """workload -> the gates of its pairs (PASS or FAIL: the first check named). On the fake stack the
    same-target pairs pass; the moving-target ones fail the share model alone, since the HTTP stand-in's
    verify rounds do not follow the task's share model there (a stand-in's limit, not the kit's)."""
    gates: dict[str, str] = {}
    for line in text.splitlines():
        found = GATE.search(line)
        if found:
            w = found[1]
            g = found[2] + (" share model" if found[3] else "")
            assert gates.get(w, g) == g, line
            gates[w] = g
    return gates


def test_the_kineto_step_runs_analyses_and_trims_every_cell(tmp_path: Path) -> None:
    """Two servers at once (JOBS=2, as on the H200), each KV pool capped; every Kineto trace gets the
    classifier's analysis and a trimmed copy that comes back; the long window's whole trace comes back in
    pieces that join to the host's file; a second call starts no server. The fake's Kineto traces hold the
    bug's launches whatever the build, so the fix's torch cells fail their verdicts: exit 1, a check
    failed."""
    env = {**_host(tmp_path), "JOBS": "2"}
    out = tmp_path / "out"
    r = _call(env, out, "kineto")
    assert r.returncode == EXIT["fail"], r.stdout + r.stderr
    runs = Path(env["KIT_HOST_TMP"]) / "kit-task-runs"
    kineto, long = runs / "h200_task-kineto", runs / "h200_task-kineto-long"
    names = _cells(kineto)
    assert names == sorted(
        f"sglang-{a}-same-target-ctx65536-s5-{m}-cuda{p}"
        for a in ("bug", "fix", "off")
        for m in ("graph", "eager")
        for p in ("-torch", "")
    )
    assert _cells(long) == ["sglang-bug-same-target-ctx65536-s5-graph-cuda-torch"]
    for cell in [kineto / n for n in names] + [long / _cells(long)[0]]:
        assert (cell / "outputs.jsonl").is_file() and (cell / "verdict.json").is_file(), cell.name
        server = json.loads((cell / "plan.json").read_text())["server_cmd"]
        assert "--max-total-tokens=524288" in server  # JOBS > 1: each server's KV pool capped in tokens
        if cell.name.endswith("-torch"):
            assert (cell / "trimmed" / "trace.json.gz").is_file() and (cell / "classifier").is_dir()
            assert (out / f"{cell.parent.name}.{cell.name}.trimmed.json.gz").is_file()
    log = (out / "log-kineto.txt").read_text()
    assert log.count("classifier ") == 7 and log.count("trim ") == 7, log
    assert (out / "runs-kineto.tgz").is_file()
    cell = long / _cells(long)[0]
    pieces = sorted(out.glob(f"h200_task-kineto-long.{cell.name}.trace.json.gz.*"))
    assert (
        pieces and b"".join(p.read_bytes() for p in pieces) == (cell / "profile.trace.json.gz").read_bytes()
    )
    params = json.loads((cell / "params.json").read_text())
    assert (params["profile_steps"], params["max_new_tokens"], params["num_requests"]) == (100, 720, 2)
    assert params["model_path"] == f"{env['KIT_HOST_TMP']}/kit-task"  # the matrix's /tmp, relocated
    again = _call({**env, "JOBS": "1"}, out, "kineto")
    assert again.returncode == EXIT["fail"]  # the same verdicts, read back
    assert "12 cells: 0 run, 12 already complete" in (out / "batch-kineto.txt").read_text()
    assert "1 cells: 0 run, 1 already complete" in (out / "batch-kineto-long.txt").read_text()


def test_the_tp_step_at_tp_1_is_the_dry_run_of_its_path(tmp_path: Path) -> None:
    """TP=1 runs the TP 4 step on one GPU (batch h200_task-tp1): one server per arm, one after the other
    (each with the GPU to itself, so its timings count), 64k and 500k, both workloads, each cell's verdict
    naming its one rank; a second call starts no server. The off arm is each pair's control: the same-target
    gates pass; the moving-target ones fail the share model, the stand-in's limit (_gates): exit 1."""
    env = {**_host(tmp_path), "TP": "1"}
    out = tmp_path / "out"
    r = _call(env, out, "tp4")
    assert r.returncode == EXIT["fail"], r.stdout + r.stderr
    batch = Path(env["KIT_HOST_TMP"]) / "kit-task-runs" / "h200_task-tp1"
    cells = _cells(batch)
    assert cells == sorted(
        f"sglang-{a}-{w}-ctx{c}-s5-graph-cuda"
        for a in ("bug", "fix", "off")
        for c in (65536, 500000)
        for w in ("same-target", "moving-target")
    )
    for name in cells:
        v = json.loads((batch / name / "verdict.json").read_text())
        n = 1 if "-fix-" in name else 4  # off: the patched build with sharing off computes as the bug
        assert v["status"] == "pass" and [x["observed_counts"] for x in v["ranks"]] == [{str(n): 10}], name
        server = json.loads((batch / name / "plan.json").read_text())["server_cmd"]
        assert not any("--max-total-tokens" in a for a in server)  # the GPU is the arm's own
        assert server[server.index("--tp-size") + 1] == "1"
    assert len({(batch / n / "profile.nsys-rep").resolve() for n in cells}) == 3  # one server per arm
    text = (out / "batch-tp4.txt").read_text()
    assert _gates(text) == {"same-target": "PASS", "moving-target": "FAIL share model"}, text
    assert (out / "runs-tp4.tgz").is_file()
    again = _call(env, out, "tp4")
    assert "12 cells: 0 run, 12 already complete" in (out / "batch-tp4.txt").read_text(), again.stdout


def test_a_step_cut_short_keeps_what_finished_and_the_next_call_resumes(
    tmp_path: Path,
) -> None:
    """The H200 dry run's lesson (its deadline interrupted both kit runs and left finished cells unjudged),
    as kit batch does it: no cell starts after the deadline (the tp4 step's: DEADLINE_S less 300 s), a cell
    that started finishes and is judged, the call exits 3 (cells left), and the next call runs only the
    cells left, none again."""
    env = {**_host(tmp_path), "TP": "1"}
    out = tmp_path / "out"
    batch = Path(env["KIT_HOST_TMP"]) / "kit-task-runs" / "h200_task-tp1"
    r = _call(env, out, "tp4", "310")  # 10 s to start cells in: the bug server's first cells at most
    assert r.returncode == EXIT["inconclusive"], r.stdout + r.stderr
    first = _cells(batch)
    assert 1 <= len(first) < 12 and all("-bug-" in n for n in first), first
    for name in first:
        assert json.loads((batch / name / "verdict.json").read_text())["status"] == "pass", name
    before = {n: (batch / n / "verdict.json").stat().st_mtime for n in first}
    r = _call(env, out, "tp4")
    assert r.returncode == EXIT["fail"], r.stdout + r.stderr  # done; the moving-target gates (_gates)
    assert len(_cells(batch)) == 12
    assert {n: (batch / n / "verdict.json").stat().st_mtime for n in first} == before  # none run again


def test_the_arm_steps_fill_one_batch_and_each_pair_is_compared_with_its_control(
    tmp_path: Path,
) -> None:
    """bug, fix and off each run their own server into batch h200_task; the base grid's compare pass then
    compares each bug/fix pair whose control ran, and until then says it waits (the step itself is done:
    exit 0)."""
    env = _host(tmp_path)
    out = tmp_path / "out"
    batch = Path(env["KIT_HOST_TMP"]) / "kit-task-runs" / "h200_task"
    for arm in ("bug", "fix"):
        r = _call(env, out, arm)
        assert r.returncode == EXIT["pass"], r.stdout + r.stderr
        assert "compare: waits for the arms not run yet" in r.stdout
    assert not list(batch.glob("compare-*"))
    r = _call(env, out, "off")
    assert r.returncode == EXIT["fail"], r.stdout + r.stderr
    assert _gates(r.stdout) == {"same-target": "PASS", "moving-target": "FAIL share model"}, r.stdout
    assert len(_cells(batch)) == 18
    compared = sorted(p.parent.name for p in batch.glob("compare-*/comparison.json"))
    assert compared == sorted(
        f"compare-sglang-{w}-ctx{c}-s5-graph-cuda"
        for c in (4096, 65536, 500000)
        for w in ("same-target", "moving-target")
    )
    for name in _cells(batch):
        params = json.loads((batch / name / "params.json").read_text())
        assert (params["num_requests"], params["concurrency"], params["max_new_tokens"]) == (8, 2, 96)


def test_the_arms_step_runs_the_three_steps_cells_in_one_call_side_by_side(tmp_path: Path) -> None:
    """JOBS=3 ... arms: the 18 cells of bug, fix and off in one call, their servers at once with the KV pools
    capped, into the same batch, and the same pairs compared and judged as after the three steps."""
    env = {**_host(tmp_path), "JOBS": "3"}
    out = tmp_path / "out"
    batch = Path(env["KIT_HOST_TMP"]) / "kit-task-runs" / "h200_task"
    r = _call(env, out, "arms")
    assert r.returncode == EXIT["fail"], r.stdout + r.stderr  # the moving-target gates (_gates)
    assert _gates(r.stdout) == {"same-target": "PASS", "moving-target": "FAIL share model"}, r.stdout
    assert len(_cells(batch)) == 18 and len(list(batch.glob("compare-*/comparison.json"))) == 6
    for name in _cells(batch):
        params = json.loads((batch / name / "params.json").read_text())
        assert "--max-total-tokens=2097152" in params["extra_args"], name
        assert "--mem-fraction-static=0.9" in params["extra_args"], name


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """A bad step, a negative deadline, JOBS=0: one line naming it, exit 2 (an error), no traceback; the
    upstream driver takes only its own steps."""
    env = _host(tmp_path)
    out = tmp_path / "out"
    for step, deadline, extra, said in (
        ("bogus", "900", {}, "unknown step 'bogus'"),
        ("bug", "-5", {}, "the deadline must be >= 0"),
        ("bug", "900", {"JOBS": "0"}, "JOBS must be >= 1"),
    ):
        r = _call({**env, **extra}, out, step, deadline)
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("kit host:")]
        assert r.returncode == EXIT["error"] and len(lines) == 1 and said in lines[0], r.stderr
        assert "Traceback" not in r.stderr + r.stdout
    r = _call(env, out, "bug", script="h200_upstream.sh")
    assert r.returncode == EXIT["error"] and "unknown step bug" in r.stderr


def test_the_jit_cache_travels_as_a_stage_and_is_restored_once_whole_across_calls(tmp_path: Path) -> None:
    """The JIT caches come back as a tree stage (parts with sha256); a call carries a part or two beside the
    repository: each call keeps the parts it carried, the cache is unpacked only once the store is whole,
    once, and a part that does not match its sha256 is refused, not kept."""
    home = "home/u"
    made = tmp_path / "made"
    cache = made / home / ".cache" / "flashinfer"
    cache.mkdir(parents=True)
    (cache / "kernel.so").write_bytes(os.urandom(2_500_000))  # incompressible: 3 parts of 1 MiB
    (made / home / ".triton").mkdir()
    (made / home / ".triton" / "k.json").write_text("{}")
    inductor = made / "tmp" / f"torchinductor_{getpass.getuser()}"  # torch.compile's cache: /tmp, not HOME
    inductor.mkdir(parents=True)
    (inductor / "fx.bin").write_text("graph")
    out = tmp_path / "out"
    out.mkdir()

    def sh(cwd: Path, script: str, check: bool = True, **extra: str) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, HOME=f"/{home}", KIT_HOST_TMP=str(tmp_path / "host"), KIT_JIT_PART_MIB="1")
        env.update(extra, PYTHONPATH=str(REPO))
        return subprocess.run(
            ["bash", "-c", f"source {REPO / 'scripts' / 'jit_cache.sh'}; {script}"],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            check=check,
        )

    sh(tmp_path, f"jit_pack {out}", KIT_JIT_ROOT=str(made))
    manifest = json.loads((out / "jit-stage" / "manifest.json").read_text())
    assert manifest["kind"] == "tree" and manifest["files"] == 3 and len(manifest["parts"]) == 3
    # tvm-ffi, deep_gemm absent
    assert manifest["dirs"] == [
        f"{home}/.cache/flashinfer",
        f"{home}/.triton",
        inductor.relative_to(made).as_posix(),
    ]
    restored = tmp_path / "there"
    restored.mkdir()
    names = [p["name"] for p in manifest["parts"]]

    def call(k: int, parts: list[str], bad: bool = False) -> subprocess.CompletedProcess[str]:
        repo = tmp_path / f"call{k}"
        for i, name in enumerate(parts):
            d = repo / f".stage-jit-{i}"
            d.mkdir(parents=True)
            shutil.copy(out / "jit-stage" / "manifest.json", d)
            shutil.copy(out / "jit-stage" / name, d)
            if bad:
                (d / name).write_bytes(b"x" + (d / name).read_bytes()[1:])
        repo.mkdir(exist_ok=True)
        return sh(repo, "jit_restore", check=not bad, KIT_JIT_ROOT=str(restored))

    got = restored / home / ".cache" / "flashinfer" / "kernel.so"
    r = call(0, names[:1])
    assert not got.exists() and "not all parts received yet" in r.stderr
    assert not (tmp_path / "call0" / ".stage-jit-0").exists()  # received: not checked again
    r = call(1, names[1:2], bad=True)  # a damaged part: refused, the folder kept, nothing unpacked
    assert r.returncode != 0 and "sha256 differs" in r.stderr and not got.exists()
    assert (tmp_path / "call1" / ".stage-jit-0").exists()
    r = call(2, names[1:])
    assert got.read_bytes() == (cache / "kernel.so").read_bytes() and r.stderr == ""
    got.write_bytes(b"changed here")  # restored once: a later call leaves the caches alone
    r = call(3, [])
    assert got.read_bytes() == b"changed here" and r.stderr == ""


def test_every_driver_hands_the_kit_the_notebooks_wheels_once_installed(tmp_path: Path) -> None:
    """The shared settings put the host's notebooks wheels (kit-nb/deps) on the kit's path once installed,
    so kit batch's runner "auto" finds papermill: h200_task.sh and h200_mutants.sh set their own path
    without them and ran plain, with no report.html, on the H100 on 2026-12-05."""
    view, host = driver_checkout(tmp_path), tmp_path / "host"
    env = host_env(tmp_path)
    settings = "source scripts/h200_task_settings.sh"
    script = f'repo={view}; tmp={host}; cd "$repo"; {settings}; printf %s "$PYTHONPATH"'

    def path() -> list[str]:
        r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout.split(os.pathsep)

    base = ["/tmp/kit-site", f"{host}/kit-sgl/deps", str(view), f"{host}/kit-sgl/fallback"]
    assert path() == base
    (host / "kit-nb" / "deps").mkdir(parents=True)
    assert path() == [base[0], f"{host}/kit-nb/deps", *base[1:]]
    for name in ("h200_task.sh", "h200_mutants.sh", "h200_sglang.sh"):  # one home for the kit's path
        assert "PYTHONPATH=" not in (REPO / "scripts" / name).read_text(), name
