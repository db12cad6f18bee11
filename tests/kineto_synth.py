"""Synthetic PyTorch-profiler (Kineto) traces that follow the Chrome-trace schema torch.profiler exports.

SYNTHETIC: there is no GPU here, so every GPU-side field (cuda_runtime launch calls, kernels with their
`correlation`, the `graph id` / `graph node id` newer Kineto writes on kernels replayed from a CUDA graph,
ac2g flow events) is written to the schema as Kineto's JSON writer lays it out, not recorded. The CPU
side is laid out exactly as torch 2.13's export_chrome_trace writes it (one key per line, `dur` then a
lone comma); the mini engine's real CPU traces (tests/fixtures/kineto/) check that layout.

`sglang_like` builds what sglang's `/start_profile` would record with the kit's probe (sink torch): per
decode iteration a target verify, a `pr29654/draft_round` with its draft steps (eager) or one replay of the
draft-loop graph (graph), and the draft extend; the indexer's kernels run in the target, in the draft steps
(every step for bug/off, the first for fix) and in the extend. `filler` adds python_function and cpu_op
events per launch, as with_stack=True does, to reach realistic sizes.
"""

from __future__ import annotations

import gzip
import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

DOMAIN = "pr29654"
INDEXER_KERNELS = (
    "void act_quant_kernel<128>(float const*, __nv_fp8_e4m3*, float*, int)",
    "void paged_mqa_logits_metadata<64>(int const*, int*, int)",
    "void deep_gemm::sm90_fp8_paged_mqa_logits<64, 128, 2>(__nv_fp8_e4m3 const*, float*)",
    "void topk_transform_prefill_kernel<2048>(float const*, int*, int)",
)
STEP_KERNELS = (
    "void at::native::(anonymous namespace)::indexSelectSmallIndex<float, long, unsigned int, 2, 2, -2>(int)",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off",
    "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::silu_kernel"
    "(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda(float)#1}, std::array<char*, 2> >"
    "(int, {lambda(float)#1}, std::array<char*, 2>)",
    "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<576, 64, 64, 4>, true>(Flash_fwd_params)",
)
LAYOUTS = ("torch", "kineto", "compact")


def ts(ns: int) -> str:
    """Kineto's time text: microseconds with three decimals (exact nanoseconds)."""
    return f"{ns // 1000}.{ns % 1000:03d}"


@dataclass
class KinetoSynth:
    """One process's trace; a clock hands out times so that ranges nest as written."""

    pid: int = 4242
    tid: int = 4242
    device: int = 0
    stream: int = 7
    graph_ids: bool = True  # kernels replayed from a graph carry "graph id" / "graph node id"
    events: list[dict] = field(default_factory=list)
    t: int = 1_000_000
    _corr: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _ext: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    gpu_t: int = 0

    def tick(self, dt: int = 1000) -> int:
        self.t += dt
        return self.t

    def _x(self, cat: str, name: str, pid: int, tid: int, start: int, dur: int, args: dict | None) -> dict:
        ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": start, "dur": dur}
        if args is not None:
            ev["args"] = args
        self.events.append(ev)
        return ev

    @contextmanager
    def annotation(self, name: str, domain: str | None = DOMAIN) -> Iterator[None]:
        full = f"{domain}/{name}" if domain else name
        ev = self._x("user_annotation", full, self.pid, self.tid, self.tick(), 0, {})
        ev["args"] = {"External id": next(self._ext), "Record function id": 0, "Ev Idx": len(self.events)}
        yield
        ev["dur"] = self.tick() - ev["ts"]

    def filler(self, n: int) -> None:
        """python_function and cpu_op events as with_stack=True records around every op."""
        for i in range(n):
            start = self.tick(200)
            self._x(
                "python_function",
                f"sglang/srt/layers/linear.py({100 + i}): forward",
                self.pid,
                self.tid,
                start,
                150,
                {"Python parent id": i, "Python id": 1000 + i, "Python thread": 0},
            )
        start = self.tick(100)
        self._x(
            "cpu_op",
            "aten::mm",
            self.pid,
            self.tid,
            start,
            400,
            {"External id": next(self._ext), "Record function id": 0, "Ev Idx": len(self.events)},
        )

    def _gpu(self, after: int, dur: int) -> int:
        self.gpu_t = max(self.gpu_t, after + 3000) + 500
        start = self.gpu_t
        self.gpu_t += dur
        return start

    def _flow(self, ph: str, corr: int, pid: int, tid: int, at: int) -> None:
        ev = {"ph": ph, "id": corr, "pid": pid, "tid": tid, "ts": at, "cat": "ac2g", "name": "ac2g"}
        if ph == "f":
            ev["bp"] = "e"
        self.events.append(ev)

    def _kernel(self, name: str, corr: int, start: int, dur: int, graph: tuple[int, int] | None) -> None:
        args = {
            "queued": 0,
            "device": self.device,
            "context": 1,
            "stream": self.stream,
            "correlation": corr,
            "registers per thread": 32,
            "shared memory": 0,
            "blocks per SM": 0.5,
            "warps per SM": 2.0,
            "grid": [132, 1, 1],
            "block": [128, 1, 1],
            "est. achieved occupancy %": 12,
        }
        if graph is not None and self.graph_ids:
            args["graph id"], args["graph node id"] = graph
        self._x("kernel", name, self.device, self.stream, start, dur, args)
        self._flow("f", corr, self.device, self.stream, start)

    def launch(self, kernel: str, dur: int = 5000, filler: int = 0) -> None:
        """An eager launch: the op's CPU events, cudaLaunchKernel, its kernel and the ac2g flow."""
        if filler:
            self.filler(filler)
        corr = next(self._corr)
        start = self.tick(300)
        self._x(
            "cuda_runtime",
            "cudaLaunchKernel",
            self.pid,
            self.tid,
            start,
            800,
            {"cbid": 211, "correlation": corr},
        )
        self._flow("s", corr, self.pid, self.tid, start)
        self.tick(900)
        self._kernel(kernel, corr, self._gpu(start, dur), dur, None)

    def graph_launch(self, kernels: list[str], graph_id: int, dur: int = 5000) -> None:
        """cudaGraphLaunch: every replayed kernel carries the launch's correlation id (and its node)."""
        corr = next(self._corr)
        start = self.tick(300)
        self._x(
            "cuda_runtime",
            "cudaGraphLaunch",
            self.pid,
            self.tid,
            start,
            2000,
            {"cbid": 311, "correlation": corr},
        )
        self._flow("s", corr, self.pid, self.tid, start)
        self.tick(2100)
        gpu = self._gpu(start, 0)
        for i, name in enumerate(kernels):
            self._kernel(name, corr, gpu, dur, (graph_id, graph_id * 1000 + i))
            gpu += dur + 200
        self.gpu_t = gpu

    # ---- output --------------------------------------------------------------------------------------

    def metadata(self, label: str | None = None) -> list[dict]:
        pid = self.pid if label is None else f"{label} {self.pid}"
        dev = self.device if label is None else f"{label} {self.device}"
        out = [
            {"ph": "M", "name": "process_name", "ts": 0, "pid": pid, "tid": 0, "args": {"name": "python"}},
            {"ph": "M", "name": "process_labels", "ts": 0, "pid": pid, "tid": 0, "args": {"labels": "CPU"}},
            {"ph": "M", "name": "process_name", "ts": 0, "pid": dev, "tid": 0, "args": {"name": "python"}},
            {"ph": "M", "name": "process_labels", "ts": 0, "pid": dev, "tid": 0, "args": {"labels": "GPU 0"}},
        ]
        return out

    def trace_events(self, label: str | None = None) -> list[dict]:
        events = self.metadata(label)
        for ev in self.events:
            if label is not None:
                ev = {**ev, "pid": f"{label} {ev['pid']}"}
            events.append(ev)
        return events


def _event_text(ev: dict, layout: str) -> str:
    if layout == "torch":  # one key per line; `dur` then a lone comma before args (torch 2.13)
        lines = []
        for k, v in ev.items():
            if k == "args":
                continue
            value = ts(v) if k in ("ts", "dur") and isinstance(v, int) else json.dumps(v)
            lines.append(f'    "{k}": {value}')
        body = ",\n".join(lines)
        if "args" in ev:
            args = ", ".join(f'"{k}": {json.dumps(v)}' for k, v in ev["args"].items())
            body += f'\n    ,\n    "args": {{\n      {args}\n    }}'
        return "  {\n" + body + "\n  }"
    # kineto's own writer: several keys per line
    head = ", ".join(
        f'"{k}": {ts(v) if k in ("ts", "dur") and isinstance(v, int) else json.dumps(v)}'
        for k, v in ev.items()
        if k != "args"
    )
    if "args" in ev:
        args = ",\n      ".join(f'"{k}": {json.dumps(v)}' for k, v in ev["args"].items())
        return f'  {{\n    {head},\n    "args": {{\n      {args}\n    }}\n  }}'
    return f"  {{\n    {head}\n  }}"


def write_trace(
    path: Path,
    traces: list[KinetoSynth],
    *,
    layout: str = "torch",
    labels: list[str] | None = None,
    device_properties: bool = True,
) -> Path:
    """Write one Chrome trace of one process (or several, merged as sglang's ProfileMerger labels them:
    `labels` like "[TP00]"), gzipped when `path` ends in .gz."""
    events: list[dict] = []
    for i, tr in enumerate(traces):
        events += tr.trace_events(labels[i] if labels else None)
    props = [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150000000000}] if device_properties else []
    head = {"schemaVersion": 1, "deviceProperties": props, "displayTimeUnit": "ms", "baseTimeNanoseconds": 1}
    if layout == "compact":  # json.dumps of the whole trace, as sglang's merger writes it (us as floats)
        doc = {**head, "traceEvents": [_float_times(ev) for ev in events], "traceName": str(path)}
        text = json.dumps(doc)
    else:
        parts = ",\n".join(_event_text(ev, layout) for ev in events)
        text = (
            "{\n"
            + ",\n".join(f'  "{k}": {json.dumps(v)}' for k, v in head.items())
            + ',\n  "traceEvents": [\n'
            + parts
            + ',\n  {\n    "name": "Record Window End", "ph": "i", "s": "g",\n'
            + '    "pid": "", "tid": "", "ts": 0.000\n  }'
            + f'\n  ],\n  "traceName": {json.dumps(str(path))}\n}}'
        )
    data = text.encode()
    if path.name.endswith(".gz"):
        data = gzip.compress(data, compresslevel=1)
    path.write_bytes(data)
    return path


def _float_times(ev: dict) -> dict:
    return {k: (v / 1000 if k in ("ts", "dur") and isinstance(v, int) else v) for k, v in ev.items()}


# ---- what sglang + the kit's probe would record -------------------------------------------------------


def sglang_like(
    arm: str = "bug",
    num_steps: int = 5,
    rounds: int = 4,
    *,
    mode: str = "eager",
    filler: int = 0,
    pid: int = 4242,
    device: int = 0,
    ranges: bool = True,
    graph_ids: bool = True,
    target_layers: int = 2,
) -> KinetoSynth:
    """A decode loop as the kit's probe marks it (sink torch) under sglang's /start_profile."""
    tr = KinetoSynth(pid=pid, tid=pid, device=device, graph_ids=graph_ids)
    steps = num_steps - 1
    shares = arm in ("fix", "upstream")

    @contextmanager
    def mark(name: str) -> Iterator[None]:
        if ranges:
            with tr.annotation(name):
                yield
        else:
            yield

    def indexer_kernels() -> list[str]:
        return list(INDEXER_KERNELS)

    def step_kernels(step: int) -> list[str]:
        body = [STEP_KERNELS[0], STEP_KERNELS[1]]
        if step == 0 or not shares:
            body += indexer_kernels()
        return body + [STEP_KERNELS[3], STEP_KERNELS[2]]

    def forward_kernels(layers: int = 1) -> list[str]:  # one model forward (one embedding lookup)
        layer = [STEP_KERNELS[1], *indexer_kernels(), STEP_KERNELS[3], STEP_KERNELS[2]]
        return [STEP_KERNELS[0], *(layer * layers)]

    for _ in range(rounds):
        tr.filler(filler)
        if mode == "graph":
            with mark("verify"):
                tr.graph_launch(forward_kernels(target_layers), graph_id=1)
            with mark("draft_round"):
                tr.launch("void at::native::copy_kernel<long>(int)", filler=filler)  # static inputs
                tr.graph_launch([k for s in range(steps) for k in step_kernels(s)], graph_id=2)
            with mark("draft_extend"):
                tr.graph_launch(forward_kernels(), graph_id=3)
            continue
        with mark("verify"):
            tr.launch(STEP_KERNELS[0], filler=filler)
            for _layer in range(target_layers):
                for k in forward_kernels()[1:]:
                    if k in INDEXER_KERNELS:
                        continue
                    tr.launch(k, filler=filler)
                with mark("indexer"):
                    for k in indexer_kernels():
                        tr.launch(k, filler=filler)
        with mark("draft_round"):
            for s in range(steps):
                with mark("draft_step"):
                    for k in step_kernels(s):
                        if k in INDEXER_KERNELS:
                            continue
                        tr.launch(k, filler=filler)
                    if s == 0 or not shares:
                        with mark("indexer"):
                            for k in indexer_kernels():
                                tr.launch(k, filler=filler)
        with mark("draft_extend"):
            with mark("indexer"):
                for k in indexer_kernels():
                    tr.launch(k, filler=filler)
    return tr


def strip_gpu(path_in: Path, path_out: Path) -> Path:
    """The same trace with GPU activity off: no kernels and no flows (cuda_runtime stays: torch records
    launch calls as CPU activity)."""
    opener = gzip.open if path_in.name.endswith(".gz") else open
    with opener(path_in, "rt") as fh:
        doc = json.load(fh)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in ("kernel", "ac2g")]
    data = json.dumps(doc).encode()
    path_out.write_bytes(gzip.compress(data) if path_out.name.endswith(".gz") else data)
    return path_out


def drop_ranges(path_in: Path, path_out: Path, names: tuple[str, ...] | None = None) -> Path:
    """The same trace without the probe's ranges named `names` (every range of the kit's domain when
    None): a trace whose ranges were lost or never recorded."""
    doc = json.loads(
        gzip.decompress(path_in.read_bytes()) if path_in.name.endswith(".gz") else path_in.read_text()
    )
    drop = None if names is None else {f"{DOMAIN}/{n}" for n in names}
    doc["traceEvents"] = [
        e
        for e in doc["traceEvents"]
        if not (
            e.get("cat") == "user_annotation"
            and (e.get("name", "").startswith(f"{DOMAIN}/") if drop is None else e.get("name") in drop)
        )
    ]
    data = json.dumps(doc).encode()
    path_out.write_bytes(gzip.compress(data) if path_out.name.endswith(".gz") else data)
    return path_out
