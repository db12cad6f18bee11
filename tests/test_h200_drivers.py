"""The H200 host drivers run end to end here before they cost device time: scripts/h200_task.sh on the fake
GPU stack (fake sglang builds whose server is the HTTP stand-in, the fake nsys, the task checkpoint), in a
temporary host folder (KIT_HOST_TMP). A driver that runs its servers but finds none of their runs (the first
real Kineto attempt: single-cell run directories are named by the run id alone) fails here."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from fake_gpu_helpers import fake_build, fake_nsys
from task_helpers import task_checkpoint

from kit.paths import REPO


def _host(tmp_path: Path) -> dict[str, str]:
    host = tmp_path / "host"
    fake_build(host / "kit-sgl" / "sglang-0.5.14", "bug")
    fake_build(host / "kit-sgl" / "sglang-0.5.14+pr29654", "fix")
    shutil.copytree(task_checkpoint()[0], host / "kit-task")
    env = dict(os.environ)
    env.update(
        KIT_HOST_TMP=str(host),
        KIT_JIT_ROOT=str(host / "root"),  # the JIT caches it packs and restores: not this machine's
        KIT_NSYS=str(fake_nsys(tmp_path / "nsys")),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",  # python3: this interpreter
        KIT_GIT_SHA="test",
    )
    return env


def test_the_kineto_step_runs_analyses_and_trims_every_cell(tmp_path: Path) -> None:
    env = {**_host(tmp_path), "JOBS": "2", "STAGGER_S": "0"}  # two servers at once, as on the H200
    out = tmp_path / "out"
    r = subprocess.run(
        ["bash", str(REPO / "scripts" / "h200_task.sh"), str(out), "kineto", "900"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    task = Path(env["KIT_HOST_TMP"]) / "kit-task-runs" / "task"
    names = [
        f"kineto-{p}-{a}-{m}" for a in ("bug", "fix") for m in ("graph", "eager") for p in ("torch", "nsys")
    ] + ["kineto-torch-bug-graph-long"]
    for name in names:
        cell = task / name
        assert (cell / "outputs.jsonl").is_file(), name
        assert (cell / "verdict.json").is_file(), (name, (out / "log-kineto.txt").read_text())
        server = json.loads((cell / "plan.json").read_text())["server_cmd"]
        assert "--max-total-tokens=524288" in server  # JOBS > 1: each server's KV pool capped in tokens
        if "-torch-" in name:
            assert (cell / "trimmed" / "trace.json.gz").is_file() and (cell / "classifier").is_dir(), name
    log = (out / "log-kineto.txt").read_text()
    assert log.count("analyze ") == 9 and "rc=0" in log
    assert (out / "runs-kineto.tgz").is_file()
    # the long window's whole trace comes back in pieces that join to the host's file
    pieces = sorted(out.glob("kineto-torch-bug-graph-long.trace.json.gz.*"))
    whole = (task / "kineto-torch-bug-graph-long" / "profile.trace.json.gz").read_bytes()
    assert pieces and b"".join(p.read_bytes() for p in pieces) == whole
    long = json.loads((task / "kineto-torch-bug-graph-long" / "params.json").read_text())
    assert long["profile_steps"] == 100 and long["num_requests"] == 2
    assert long["model_path"].endswith("kit-task")  # a task workload: kit run refuses any other checkpoint
    again = subprocess.run(
        ["bash", str(REPO / "scripts" / "h200_task.sh"), str(out), "kineto", "900"],
        cwd=REPO,
        env={**env, "JOBS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.stdout.count("already run") == 9  # a second call starts no server


def test_the_tp_step_at_tp_1_is_the_dry_run_of_its_path(tmp_path: Path) -> None:
    """TP=1 runs the TP 4 step on one GPU: one arm after the other (the H200's way, so that each has the GPU
    to itself and its timings count), 64k and 500k, both workloads, each cell's verdict naming its one rank;
    the second arm gets what is left of the step's deadline, not a deadline of its own; a second call starts
    no server. (Both arms at once, JOBS=2: the next test.)"""
    env = {**_host(tmp_path), "TP": "1"}
    out = tmp_path / "out"
    cmd = ["bash", str(REPO / "scripts" / "h200_task.sh"), str(out), "tp4", "900"]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    task = Path(env["KIT_HOST_TMP"]) / "kit-task-runs" / "task"
    cells = sorted(p.name for p in task.glob("tp1-*-ctx*"))
    assert cells == [
        f"tp1-{a}-ctx{c}-{w}"
        for a in ("bug", "fix")
        for c in (500000, 65536)
        for w in ("moving-target", "same-target")
    ]
    for name in cells:
        v = json.loads((task / name / "verdict.json").read_text())
        n = 4 if "-bug-" in name else 1
        assert v["status"] == "pass" and [x["observed_counts"] for x in v["ranks"]] == [{str(n): 10}], name
        server = json.loads((task / name / "plan.json").read_text())["server_cmd"]
        assert not any("--max-total-tokens" in a for a in server)  # the GPU is the arm's own
        assert server[server.index("--tp-size") + 1] == "1"
    log = (out / "log-tp4.txt").read_text()
    left = {a: int(re.search(rf"kit run tp1-{a}: (\d+) s to the deadline", log)[1]) for a in ("bug", "fix")}
    assert left["bug"] <= 900 and left["fix"] < left["bug"], log
    assert (out / "runs-tp4.tgz").is_file()
    again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert again.stdout.count("already run") == 2


def test_a_cut_short_tp_step_still_judges_the_cells_that_finished(tmp_path: Path) -> None:
    """The H200 dry run's lesson: its deadline interrupted both kit runs in their first 500k cell, and the
    64k cells that had finished, whose server report nothing had exported, went unjudged. Interrupted the
    same way here (SIGINT, as the drivers' deadline sends, once both arms' first 500k cell has answered), the
    64k cells are judged through the server's .nsys-rep and no cut-short cell passes."""
    env = {**_host(tmp_path), "JOBS": "2", "STAGGER_S": "0", "TP": "1"}
    host, out = env["KIT_HOST_TMP"], tmp_path / "out"
    task = Path(host) / "kit-task-runs" / "task"
    cmd = ["bash", str(REPO / "scripts" / "h200_task.sh"), str(out), "tp4", "900"]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    first = [task / f"tp1-{a}-ctx500000-same-target" / "outputs.jsonl" for a in ("bug", "fix")]
    give_up = time.monotonic() + 600
    while not all(f.is_file() and f.stat().st_size for f in first):
        assert proc.poll() is None and time.monotonic() < give_up, "the 500k cells never started"
        time.sleep(0.05)
    # to `timeout` (it passes the one SIGINT on, as at the deadline): a second one would be a double Ctrl-C
    subprocess.run(["pkill", "-INT", "-f", f"^timeout .*kit.cli run .*{host}"], check=True)
    stdout, _ = proc.communicate(timeout=600)
    log = (out / "log-tp4.txt").read_text()
    assert proc.returncode == 0 and log.count("rc=130") == 2, stdout + log  # both runs were cut short
    for a, n in (("bug", 4), ("fix", 1)):
        for w in ("same-target", "moving-target"):
            cell = task / f"tp1-{a}-ctx65536-{w}"
            assert (cell / "profile.nsys-rep").is_symlink() and not (cell / "error.json").exists()
            v = json.loads((cell / "verdict.json").read_text())
            assert v["status"] == "pass" and set(v["launches_per_round"]) == {n}, (cell.name, log)
            server = json.loads((cell / "plan.json").read_text())["server_cmd"]
            assert "--max-total-tokens=2097152" in server  # two servers on one GPU: each pool capped
    for cell in task.glob("tp1-*-ctx500000-*"):
        verdict = cell / "verdict.json"
        if (cell / "error.json").exists() and verdict.exists():
            assert json.loads(verdict.read_text())["status"] != "pass", cell.name


def test_a_deadline_signals_the_kit_run_once_and_nothing_else_in_its_group(tmp_path: Path) -> None:
    """CI's failure at 5ca91ef: plain `timeout -s INT` signals the run and then its whole process group, the
    run again; the second SIGINT, landing apart, read as a second Ctrl-C, which stops nsys before it writes
    its report, and the finished 64k cells above had none. The drivers' deadline must reach the run alone,
    once: here a process beside it in its group must get no SIGINT (plain `timeout` gives it one)."""
    rec = tmp_path / "rec.py"
    rec.write_text(
        "import signal, sys, time\n"
        "def on_int(*_):\n"
        "    open(sys.argv[1], 'a').write('INT\\n')\n"
        "    if sys.argv[2] == 'run': sys.exit(130)\n"
        "signal.signal(signal.SIGINT, on_int)\n"
        "time.sleep(float(sys.argv[3]))\n"
        "open(sys.argv[1], 'a').write('done\\n')\n"
    )
    run, beside = tmp_path / "run.txt", tmp_path / "beside.txt"
    inner = f"python3 {rec} {beside} beside 3 & exec python3 {rec} {run} run 30"
    env = dict(os.environ, KIT_HOST_TMP=str(tmp_path / "host"), KIT_JIT_ROOT=str(tmp_path / "root"))
    script = f"source scripts/h200_task_settings.sh; until_deadline 1 bash -c {shlex.quote(inner)}"
    r = subprocess.run(
        ["bash", "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 124, r.stderr  # the deadline passed
    give_up = time.monotonic() + 30
    while "done" not in (beside.read_text() if beside.exists() else ""):
        assert time.monotonic() < give_up, "the process beside the run never finished"
        time.sleep(0.1)
    assert run.read_text() == "INT\n" and beside.read_text() == "done\n"


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
    assert manifest["kind"] == "tree" and manifest["files"] == 2 and len(manifest["parts"]) == 3
    assert manifest["dirs"] == [f"{home}/.cache/flashinfer", f"{home}/.triton"]  # tvm-ffi, deep_gemm absent
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
