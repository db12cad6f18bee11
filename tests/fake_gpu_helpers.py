"""The sglang backend's whole path without a GPU, for `kit batch` tests: fake sglang builds and a fake nsys.

- `fake_build(root, state)`: a folder as `kit stage install` makes one per build. Its sglang is the fake
  tree of fake_sglang_helpers (every probe target there), whose NextN layer carries the top-k the `state`
  way (bug or fix, as `kit verify` reads it), and whose `python -m sglang.launch_server` serves the
  stand-in HTTP server (sglang_standin_helpers): a bug build draws num_steps - 1 indexer launches per
  round, a fix build 1, either with index sharing switched off (the off arm) num_steps - 1.
- `fake_nsys(path)`: an executable that answers --version, runs `profile ... -o BASE PROGRAM` (the
  program records every /start_profile it gets into BASE's record), and `export` turns that record into a
  SQLite report (synthetic_schema) with one window per /start_profile: a warm-up round outside it, then
  `num_steps` of the window's rounds, each with the build's launches.
- `host_env(tmp_path, **more)`: the environment of a driver's call (scripts/h200_*.sh) on a fake host in
  `tmp_path`, with the fake nsys.
- `tokenizer_model(root)`: a DSA model directory with the kit's byte-level tokenizer (real transformers
  loading, no download).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from textwrap import dedent
from typing import TYPE_CHECKING

from kit.paths import REPO

if TYPE_CHECKING:
    from synthetic_schema import SynthReport

HERE = REPO / "tests"
RECORD_ENV = "FAKE_NSYS_RECORD"  # set by the fake nsys for its program: where the server records windows

NEXTN = """
class DeepseekModelNextN:
    def forward(self, input_ids, positions, forward_batch):
        hidden_states, residual, topk_indices = self.decoder(
            positions, forward_batch, prev_topk_indices={read}
        )
        {write}
        return hidden_states
"""
# bug: the top-k is carried on the per-step ForwardBatch copy; fix: on spec_info (EagleDraftInput)
STATE_FILES = {
    "bug": (
        "(forward_batch.topk_indices if forward_batch.reuse_mtp_topk_indices else None)",
        "forward_batch.topk_indices = topk_indices",
        "topk_indices: object = None\n    reuse_mtp_topk_indices: bool = False",
        "future_indices: object = None",
    ),
    "fix": (
        "(forward_batch.spec_info.mtp_topk_indices if forward_batch.reuse_mtp_topk_indices else None)",
        "forward_batch.spec_info.mtp_topk_indices = topk_indices",
        "reuse_mtp_topk_indices: bool = False",
        "mtp_topk_indices: object = None",
    ),
}
LAUNCH_SERVER = """
import sys
sys.path.insert(0, {tests!r})
import fake_gpu_helpers
fake_gpu_helpers.serve(sys.argv[1:], {state!r}, {die_after!r}, {ready_after!r}, {generate_delay!r})
"""
CRASH = """
import sys
print("Capture cuda graph bs [1, 2]", flush=True)
sys.exit({line!r})
"""


def fake_build(
    root: Path,
    state: str,
    die_after: int | None = None,
    ready_after: float = 0.2,
    serves: str | None = None,
    crash: str | None = None,
    generate_delay: float = 0.0,
) -> Path:
    """A fake sglang build in `root` (see the module doc). die_after: its server exits right after its
    n-th /generate (a server that dies between cells); ready_after: seconds before /health answers.
    Wrong fixes (the mutation suite): `serves`, the state its server launches as (a build kit verify calls
    fix that draws the bug's launches); `crash`, a server that prints this line and exits while starting;
    generate_delay: seconds each /generate takes (cells long enough that servers' turns contend)."""
    from fake_sglang_helpers import make_fake_sglang

    make_fake_sglang(root)
    read, write, fb_fields, ed_fields = STATE_FILES[state]
    files = {
        "_version.py": "__version__ = version = '0.5.14'\n",
        "srt/models/__init__.py": "",
        "srt/models/deepseek_nextn.py": NEXTN.format(read=read, write=write),
        "srt/model_executor/forward_batch_info.py": (
            f"from dataclasses import dataclass\n@dataclass\nclass ForwardBatch:\n    {fb_fields}\n"
        ),
        "srt/speculative/eagle_info.py": (
            "from dataclasses import dataclass\n@dataclass\nclass EagleDraftInput:\n"
            f"    topk_p: object = None\n    {ed_fields}\n"
        ),
        "srt/speculative/share_gate.py": "class ShareGate:\n    def enter(self, forward_batch):\n"
        "        forward_batch.reuse_mtp_topk_indices = True\n",
        "launch_server.py": CRASH.format(line=crash)
        if crash
        else LAUNCH_SERVER.format(
            tests=str(HERE),
            state=serves or state,
            die_after=die_after,
            ready_after=ready_after,
            generate_delay=generate_delay,
        ),
    }
    for rel, text in files.items():
        (root / "sglang" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "sglang" / rel).write_text(dedent(text))
    return root


def serve(
    argv: list[str], state: str, die_after: int | None, ready_after: float, generate_delay: float = 0.0
) -> None:
    """`python -m sglang.launch_server ARGS` of a fake build: the stand-in on --port."""
    import sglang_standin_helpers as standin

    ap = argparse.ArgumentParser()
    ap.add_argument("--port", required=True)
    ap.add_argument("--speculative-num-steps", type=int, default=5)
    ap.add_argument("--json-model-override-args", default="{}")
    args, _ = ap.parse_known_args(argv)
    sharing = json.loads(args.json_model_override_args).get("index_share_for_mtp_iteration", True)
    launches = 1 if state == "fix" and sharing else args.speculative_num_steps - 1
    record = os.environ.get(RECORD_ENV)
    cmd = ["--port", args.port, "--ready-after", str(ready_after), "--generate-delay", str(generate_delay)]
    if record:
        with open(record, "a") as f:
            f.write(
                json.dumps(
                    {"endpoint": "server", "launches": launches, "num_steps": args.speculative_num_steps}
                )
                + "\n"
            )
        cmd += ["--record", record]
    if die_after is not None:
        cmd += ["--die-after", str(die_after)]
    sys.argv = ["sglang_standin_helpers", *cmd]
    standin.main()


NSYS = """#!{python}
import sys
sys.path.insert(0, {tests!r})
import fake_gpu_helpers
fake_gpu_helpers.nsys_main(sys.argv[1:])
"""


def fake_nsys(path: Path) -> Path:
    path.write_text(NSYS.format(python=sys.executable, tests=str(HERE)))
    path.chmod(0o755)
    return path


def driver_checkout(tmp_path: Path) -> Path:
    """A view of this checkout (links to its top-level entries, no dot-folders) for a driver to run in: a
    driver takes the staged folders it finds beside it (.stage*, .stage-jit*: received, then removed) and
    installs .whl's nvtx, so one run in the checkout itself would eat a developer's staged parts."""
    view = tmp_path / "checkout"
    if view.is_dir():
        return view
    view.mkdir()
    for entry in REPO.iterdir():
        if not entry.name.startswith(".") and entry.name not in ("build", "runs"):
            (view / entry.name).symlink_to(entry)
    return view


def host_env(tmp_path: Path, **more: str) -> dict[str, str]:
    """This environment as a GPU host's driver call sees it, every test alike: the host's /tmp folders in
    tmp_path/host (KIT_HOST_TMP), the JIT caches under tmp_path/root (never this machine's), the fake nsys,
    this interpreter as python3, a commit for the facts (KIT_GIT_SHA); `more`: the test's own (JOBS...)."""
    return dict(
        os.environ,
        KIT_HOST_TMP=str(tmp_path / "host"),
        KIT_JIT_ROOT=str(tmp_path / "root"),
        KIT_NSYS=str(fake_nsys(tmp_path / "nsys")),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        KIT_GIT_SHA="test",
        **more,
    )


def nsys_main(argv: list[str]) -> None:
    if argv[:1] == ["--version"]:
        print("NVIDIA Nsight Systems version 2099.1.1-fake")
        return
    if argv[:1] == ["profile"]:
        i = argv.index("-o")
        base, program = argv[i + 1], argv[i + 2 :]
        record = Path(base + ".record.jsonl")
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # like nsys: finish the report rather than die
        rc = subprocess.Popen(program, env={**os.environ, RECORD_ENV: str(record)}).wait()
        lines = record.read_text().splitlines() if record.exists() else []
        Path(base + ".nsys-rep").write_text(json.dumps({"app_exit": rc, "record": lines}))
        return
    if argv[:1] == ["export"]:
        out, rep = argv[argv.index("-o") + 1], argv[-1]
        _report(json.loads(Path(rep).read_text())["record"], Path(out))
        return
    sys.exit(f"fake nsys: unsupported {argv}")


def draft_round(r: SynthReport, g: int, launches: int, num_steps: int = 5) -> None:
    """One eager draft round of num_steps - 1 draft steps, the indexer in the first `launches` of them."""
    from synthetic_schema import INDEXER_KERNELS

    rnd = r.push(g, "draft_round")
    for step in range(num_steps - 1):
        st = r.push(g, "draft_step")
        if step < launches:
            ix = r.push(g, "indexer")
            for k in INDEXER_KERNELS:
                r.eager_kernel(g, k)
            r.pop(ix)
        r.pop(st)
    r.pop(rnd)


def _report(lines: list[str], out: Path) -> None:
    """One window per /start_profile: a warm-up round (1 launch) outside it, then the window's rounds."""
    from synthetic_schema import SynthReport, gtid

    from kit.probe.targets import WINDOW_END, WINDOW_START

    calls = [json.loads(x) for x in lines]
    server = next(c for c in calls if c["endpoint"] == "server")
    r = SynthReport(out)
    g = gtid(7000)

    for call in (c for c in calls if c["endpoint"] == "/start_profile"):
        draft_round(r, g, 1, server["num_steps"])
        r.pop(r.push(g, WINDOW_START))
        for _ in range(call["body"]["num_steps"]):
            draft_round(r, g, server["launches"], server["num_steps"])
        r.pop(r.push(g, WINDOW_END))
    r.write()


def tokenizer_model(root: Path, name: str = "model") -> Path:
    """A GLM-5.2-like DSA config (index sharing on) with the kit's byte-level tokenizer."""
    from sglang_run_helpers import GLM52_CONFIG, make_model

    from kit.checkpoint.files import tokenizer_files

    d = make_model(root, GLM52_CONFIG, name)
    for fname, obj in tokenizer_files(512, 1 << 20).items():
        (d / fname).write_text(json.dumps(obj))
    return d
