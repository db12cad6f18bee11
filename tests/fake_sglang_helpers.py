"""A fake sglang tree, shaped like 0.5.14 at the boundary the probe touches (same module paths,
class and method names, same call structure: draft() -> draft_forward or graph execute ->
_replay_graph, capture_one_shape -> draft_forward, ModelRunner.forward per draft step, an Indexer
bound per instance at __init__ like MultiPlatformOp, built with the target's `model.layers.<i>` or the
NextN draft's `model.decoder` prefix, whose _get_topk_paged/_ragged hand their logits to
metadata.topk_transform). Real sglang needs a GPU; this does not.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

from kit.probe import probe_env

FILES = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/layers/__init__.py": "",
    "sglang/srt/layers/attention/__init__.py": "",
    "sglang/srt/layers/attention/dsa/__init__.py": "",
    "sglang/srt/layers/attention/dsa/dsa_indexer.py": """
        class MultiPlatformOp:
            def __init__(self):
                self._forward_method = self.forward_cuda  # bound per instance, as in sglang

            def __call__(self, *args, **kwargs):
                return self._forward_method(*args, **kwargs)


        class Indexer(MultiPlatformOp):
            def __init__(self, layer_id=0, index_topk=4, prefix=""):
                super().__init__()
                self.layer_id = layer_id
                self.index_topk = index_topk
                self.prefix = prefix

            def _get_topk_paged(self, forward_batch, layer_id, q_fp8, weights, metadata):
                logits = q_fp8 * weights  # stands in for fp8_paged_mqa_logits
                return metadata.topk_transform(logits, self.index_topk)

            def _get_topk_ragged(
                self, enable_dual_stream, forward_batch, layer_id, q_fp8, weights, metadata, topk_result=None
            ):
                logits = q_fp8 * weights  # stands in for fp8_mqa_logits
                return metadata.topk_transform(logits, self.index_topk, ks=None)

            def forward_indexer(self, x):
                return ("topk", x)

            def forward_cuda(self, x, paged=True):
                if paged:
                    return ("topk", x)
                return self.forward_indexer(x)
    """,
    "sglang/srt/model_executor/__init__.py": "",
    "sglang/srt/model_executor/model_runner.py": """
        from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer


        class ModelRunner:
            def __init__(self, layers=1, paged=True):
                self.indexers = [Indexer(layer_id=i, prefix=self._prefix(i)) for i in range(layers)]
                self.paged = paged

            def _prefix(self, i):
                return f"model.layers.{i}.self_attn.indexer"

            def forward(self, forward_batch):
                prev = forward_batch.get("prev_topk")
                out = prev
                for ix in self.indexers:  # the NextN gate: the indexer runs only without reusable indices
                    out = prev if prev is not None else ix(forward_batch["x"], paged=self.paged)
                return out


        class DraftModelRunner(ModelRunner):
            def _prefix(self, i):  # NextN: one decoder layer, layer_id 0 like the target's first
                return "model.decoder.self_attn.indexer"
    """,
    "sglang/srt/model_executor/runner/__init__.py": "",
    "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py": """
        class DecodeCudaGraphRunner:
            def __init__(self, model_runner, capture_bs=(1,)):
                self.model_runner = model_runner
                self.capture_bs = capture_bs
                self.graphs = {}
                self.capture()

            def capture(self):
                for bs in reversed(self.capture_bs):
                    self.capture_one_shape(bs, None)

            def capture_one_shape(self, size, forward, stream_idx=None, variant_label=None):
                for _ in range(2):  # warm-up run, then the captured run
                    self.model_runner.forward({"x": size})
                self.graphs[size] = True
    """,
    "sglang/srt/managers/__init__.py": "",
    "sglang/srt/managers/scheduler_components/__init__.py": "",
    "sglang/srt/managers/scheduler_components/profiler_manager.py": """
        class SchedulerProfilerManager:
            def _start_profile(self, stage=None):
                return "started"

            def _stop_profile(self, stage=None):
                return "stopped"
    """,
    "sglang/srt/speculative/__init__.py": "",
    "sglang/srt/speculative/eagle_draft_cuda_graph_runner.py": """
        from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner


        class EAGLEDraftCudaGraphRunner(DecodeCudaGraphRunner):
            def __init__(self, eagle_worker, capture_bs=(1, 2)):
                self.eagle_worker = eagle_worker
                super().__init__(eagle_worker.draft_runner, capture_bs)

            def capture_one_shape(self, size, forward, stream_idx=None, variant_label=None):
                for _ in range(2):  # sglang's backend runs run_once for warm-up and for the capture
                    self.eagle_worker.draft_forward({"x": size})
                self.graphs[size] = True

            def _replay_graph(self, shape_key, forward_batch):
                return ("replayed", shape_key)  # no Python draft loop at replay

            def execute(self, forward_batch):
                return self._replay_graph(forward_batch["bs"], forward_batch)
    """,
    "sglang/srt/speculative/eagle_draft_extend_cuda_graph_runner.py": """
        from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner


        class EAGLEDraftExtendCudaGraphRunner(DecodeCudaGraphRunner):
            def capture_one_shape(self, size, forward, stream_idx=None, variant_label=None):
                self.model_runner.forward({"x": size})
                self.graphs[size] = True
    """,
    "sglang/srt/speculative/eagle_worker_v2.py": """
        from sglang.srt.model_executor.model_runner import DraftModelRunner, ModelRunner
        from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
        from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner
        from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import (
            EAGLEDraftExtendCudaGraphRunner,
        )


        class EagleDraftWorker:
            def __init__(self, mode, num_steps, cuda_graph):
                self.mode = mode  # "bug": every step recomputes; "fix": the first step's top-k is reused
                self.speculative_num_steps = num_steps
                self.draft_runner = DraftModelRunner(layers=1)
                self.cuda_graph_runner = EAGLEDraftCudaGraphRunner(self) if cuda_graph else None
                self.cuda_graph_runner_for_draft_extend = (
                    EAGLEDraftExtendCudaGraphRunner(self.draft_runner) if cuda_graph else None
                )

            def draft(self, batch):
                if self.cuda_graph_runner is not None:
                    return self.cuda_graph_runner.execute(batch)
                return self.draft_forward(batch)

            def draft_forward(self, forward_batch):
                prev = None
                for i in range(self.speculative_num_steps):
                    if i == self.speculative_num_steps - 1:
                        break  # num_steps - 1 draft forwards per round
                    step_batch = dict(forward_batch, prev_topk=prev if self.mode == "fix" else None)
                    prev = self.draft_runner.forward(step_batch)
                return prev

            def draft_extend(self):
                pass

            def _draft_extend_for_decode(self, batch, result=None):
                return self.draft_runner.forward({"x": batch["x"]})


        class EAGLEWorkerV2:
            def __init__(self, mode="bug", num_steps=5, cuda_graph=False, target_layers=3):
                self.target_runner = ModelRunner(layers=target_layers)
                self.target_graphs = DecodeCudaGraphRunner(self.target_runner) if cuda_graph else None
                self.draft_worker = EagleDraftWorker(mode, num_steps, cuda_graph)

            def forward_batch_generation(self, batch):
                self.draft_worker.draft(batch)
                self.verify(batch)
                self.draft_worker._draft_extend_for_decode(batch)

            def verify(self, batch):
                return self.target_runner.forward({"x": batch["x"]})
    """,
}

DRIVER = """
import json, multiprocessing, os, sys


def rank_main(mode, steps, graph, rounds, report, windows=1):
    import kit.probe.install as pi  # only to report what the probe did; sglang itself never imports kit
    from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    from sglang.srt.managers.scheduler_components.profiler_manager import SchedulerProfilerManager

    w = EAGLEWorkerV2(mode=mode, num_steps=steps, cuda_graph=graph)
    for _ in range(windows):  # one window per cell of a server
        w.forward_batch_generation({"x": -1, "bs": 1})  # a round before the window (a warm-up)
        SchedulerProfilerManager()._start_profile()  # /start_profile's window begins
        for i in range(rounds):
            w.forward_batch_generation({"x": i, "bs": 1})
        SchedulerProfilerManager()._stop_profile()  # num_steps forwards later: the window ends
    with open(report, "w") as f:
        json.dump({"pid": os.getpid(), "wrapped": hasattr(Indexer.forward_cuda, pi.MARK),
                   "hook": pi.installed()}, f)


def rank_main_plain(report):
    from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    EAGLEWorkerV2(mode="bug", num_steps=3, cuda_graph=True).forward_batch_generation({"x": 0, "bs": 1})
    with open(report, "w") as f:
        json.dump({
            "pid": os.getpid(),
            "wrapped": any(hasattr(f, "__kit_probe_target__") for f in vars(Indexer).values()),
            "finders": [type(f).__name__ for f in sys.meta_path],
            "kit_imported": "kit" in sys.modules,
        }, f)


def rank_main_topk(report):  # each indexer's top-k over the same scores, paged and ragged
    import torch
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    class Metadata:  # frozen, like sglang's DSAIndexerMetadata: the probe must not set attributes on it
        __slots__ = ()
        page_size = 64

        def topk_transform(self, logits, topk, ks=None):
            return torch.topk(logits, topk, dim=-1).indices.sort(dim=-1).values

    w = EAGLEWorkerV2(mode="bug", num_steps=3, cuda_graph=False, target_layers=2)
    scores = torch.rand(2, 16, generator=torch.Generator().manual_seed(0))
    out = {"scores_topk": Metadata().topk_transform(scores, 4).tolist()}
    for role, runner in (("target", w.target_runner), ("draft", w.draft_worker.draft_runner)):
        for ix in runner.indexers:
            one = torch.ones(())
            paged = ix._get_topk_paged(None, ix.layer_id, scores.clone(), one, Metadata())
            ragged = ix._get_topk_ragged(False, None, ix.layer_id, scores.clone(), one, Metadata())
            out.setdefault(role, []).append(
                {"prefix": ix.prefix, "paged": paged.tolist(), "ragged": ragged.tolist()}
            )
    with open(report, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")  # like sglang's scheduler processes
    args = json.loads(sys.argv[1])
    if args.pop("plain", False):
        target = rank_main_plain
    elif args.pop("topk", False):
        target = rank_main_topk
    else:
        target = rank_main
    p = ctx.Process(target=target, kwargs=args)
    p.start()
    p.join()
    sys.exit(p.exitcode)
"""


def make_fake_sglang(root: Path, drop: tuple[str, ...] = ()) -> Path:
    """Write the fake tree under root (root/sglang/...); `drop` lists 'Class.method' to leave out."""
    for rel, body in FILES.items():
        text = textwrap.dedent(body).lstrip("\n")
        for qual in drop:
            text = _drop_method(text, qual)
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def _drop_method(text: str, qual: str) -> str:
    """Rename `def method` inside `class Cls` so the AST check no longer finds it."""
    cls, method = qual.split(".")
    out, in_cls = [], False
    for line in text.splitlines():
        if line.startswith("class "):
            in_cls = line.startswith(f"class {cls}(") or line.startswith(f"class {cls}:")
        if in_cls and line.strip().startswith(f"def {method}("):
            line = line.replace(f"def {method}(", f"def {method}_renamed(")
        out.append(line)
    return "\n".join(out) + "\n"


def run_driver(
    tmp: Path,
    fake_root: Path,
    args: dict,
    probe: bool = True,
    recorder: Path | None = None,
    extra_env: dict | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess:
    """Run the driver (a main process that spawns one 'rank') with the probe's environment."""
    driver = tmp / "driver.py"
    driver.write_text(DRIVER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIT_PROBE")}
    env["PYTHONPATH"] = str(fake_root)
    if probe:
        env.update(probe_env(env, sink="recorder", recorder=recorder or tmp / "rec.sqlite"))
    else:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(Path(probe_env(env)["PYTHONPATH"].split(os.pathsep)[0])), str(fake_root)]
        )
    env.update(extra_env or {})
    return subprocess.run(
        [sys.executable, str(driver), json.dumps(args)],
        env=env,
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def read_ranges(db: Path) -> list[tuple[int, int, int, str]]:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT start, end, tid, name FROM kit_ranges ORDER BY start, end DESC").fetchall()
    finally:
        con.close()


def inside(outer: tuple, inner: tuple) -> bool:
    return outer[2] == inner[2] and outer[0] <= inner[0] and inner[1] <= outer[1] and outer is not inner
