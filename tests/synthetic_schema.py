"""Hand-built SQLite files that follow the nsys 2025.3 SQLite export schema as NVIDIA documents it (the
tables StringIds, NVTX_EVENTS, CUPTI_ACTIVITY_KIND_KERNEL/_RUNTIME, CUDA_GRAPH_NODE_EVENTS, metadata).

SYNTHETIC: no GPU and no nsys 2025.3 here, so the eager/graph/classifier methods are tested on tables
built to the documented table/column names, not on real reports. Tests using these are named
`..._synthetic_schema`; the lead replaces them with real H200 reports when they exist.
"""

from __future__ import annotations

import itertools
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA = """
CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT);
CREATE TABLE META_DATA_CAPTURE (name TEXT NOT NULL, value TEXT);
CREATE TABLE TARGET_INFO_GPU (id INTEGER, name TEXT);
CREATE TABLE TARGET_INFO_CUDA_DEVICE (gpuId INTEGER, cudaId INTEGER, pid INTEGER);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
  category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER,
  domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, doubleValue REAL, uint32Value INTEGER,
  int32Value INTEGER, floatValue REAL, jsonTextId INTEGER, jsonText TEXT);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER,
  globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER,
  callchainId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER,
  contextId INTEGER, streamId INTEGER, correlationId INTEGER, globalPid INTEGER, demangledName INTEGER,
  shortName INTEGER NOT NULL, mangledName INTEGER, launchType INTEGER, gridX INTEGER, blockX INTEGER,
  graphNodeId INTEGER, sharedMemoryExecuted INTEGER);
CREATE TABLE CUDA_GRAPH_NODE_EVENTS (start INTEGER NOT NULL, end INTEGER, eventClass INTEGER,
  globalTid INTEGER, nameId INTEGER, graphNodeId INTEGER, originalGraphNodeId INTEGER);
"""
DOMAIN = "pr29654"


def gtid(pid: int, tid: int | None = None) -> int:
    """nsys serialized globalTid: 1 << 48 | pid << 24 | tid (as in the 2022.4 exports made here)."""
    return (1 << 48) | (pid << 24) | (pid if tid is None else tid)


@dataclass
class SynthReport:
    """Builds one report; timestamps are handed out by a clock so ranges nest as written."""

    path: Path
    strings: dict[str, int] = field(default_factory=dict)
    nvtx: list[tuple] = field(default_factory=list)
    runtime: list[tuple] = field(default_factory=list)
    kernels: list[tuple] = field(default_factory=list)
    nodes: list[tuple] = field(default_factory=list)
    domains: dict[tuple[int, str], int] = field(default_factory=dict)
    t: int = 1000
    _cid: dict[int, itertools.count] = field(default_factory=dict)
    _node: dict[int, itertools.count] = field(default_factory=dict)  # graph node ids are per process

    def sid(self, s: str) -> int:
        return self.strings.setdefault(s, len(self.strings) + 1)

    def tick(self, dt: int = 10) -> int:
        self.t += dt
        return self.t

    def cid(self, pid: int) -> int:
        return next(self._cid.setdefault(pid, itertools.count(1)))

    # NVTX
    def domain(self, g: int, name: str = DOMAIN) -> int:
        pid = (g >> 24) & 0xFFFFFF
        if (pid, name) not in self.domains:
            did = 1 + sum(1 for p, _ in self.domains if p == pid)
            self.domains[(pid, name)] = did
            self.nvtx.append((self.tick(), None, 75, name, g, None, did))
        return self.domains[(pid, name)]

    def node_id(self, g: int) -> int:
        return next(self._node.setdefault((g >> 24) & 0xFFFFFF, itertools.count(100)))

    def push(
        self, g: int, name: str, domain: str = DOMAIN, *, inline: bool = False, start_end: bool = False
    ) -> list:
        """A push/pop range (eventType 59) or a start/end range (60); text registered or inline."""
        text, text_id = (name, None) if inline else (None, self.sid(name))
        row = [self.tick(), None, 60 if start_end else 59, text, g, text_id, self.domain(g, domain)]
        self.nvtx.append(row)
        return row

    def pop(self, row: list) -> None:
        row[1] = self.tick()

    # CUDA
    def eager_kernel(self, g: int, name: str, gpu_delay: int = 500, dur: int = 50) -> None:
        pid = (g >> 24) & 0xFFFFFF
        c = self.cid(pid)
        t = self.tick()
        self.runtime.append((t, t + 5, 1, g, c, self.sid("cudaLaunchKernel_v7000")))
        self.kernels.append(
            (t + gpu_delay, t + gpu_delay + dur, c, (pid << 24) | (1 << 48), self.sid(name), None)
        )

    def capture_node(self, g: int) -> int:
        """A kernel node created during stream capture (its launch call runs, no kernel executes)."""
        pid = (g >> 24) & 0xFFFFFF
        node = self.node_id(g)
        t = self.tick()
        self.runtime.append((t, t + 5, 1, g, self.cid(pid), self.sid("cudaLaunchKernel_v7000")))
        self.nodes.append((t + 1, t + 2, 0, g, self.sid("Graph Node Creation"), node, None))
        return node

    def instantiate(self, g: int, captured: list[int]) -> list[int]:
        """cudaGraphInstantiate: one new node per captured node, pointing back via originalGraphNodeId."""
        out = []
        for orig in captured:
            node = self.node_id(g)
            t = self.tick(1)
            self.nodes.append((t, t + 1, 0, g, self.sid("Graph Node Creation"), node, orig))
            out.append(node)
        return out

    def graph_launch(self, g: int, nodes: list[int], names: list[str], dur: int = 40) -> None:
        pid = (g >> 24) & 0xFFFFFF
        c = self.cid(pid)
        t = self.tick()
        self.runtime.append((t, t + 5, 1, g, c, self.sid("cudaGraphLaunch_v10000")))
        ks = t + 300
        for node, name in zip(nodes, names, strict=True):
            self.kernels.append((ks, ks + dur, c, (pid << 24) | (1 << 48), self.sid(name), node))
            ks += dur + 3

    def write(self, *, with_nvtx: bool = True) -> Path:
        con = sqlite3.connect(self.path)
        con.executescript(SCHEMA)
        con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in self.strings.items()])
        con.executemany(
            "INSERT INTO META_DATA_EXPORT VALUES (?, ?)",
            [("EXPORT_SCHEMA_VERSION", "3.x-synthetic"), ("EXPORT_PRODUCT_VERSION", "2025.3.1-synthetic")],
        )
        if with_nvtx:
            con.executemany(
                "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId, domainId) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [tuple(r) for r in self.nvtx],
            )
        else:
            con.execute("DROP TABLE NVTX_EVENTS")
        con.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, "
            "nameId) VALUES (?, ?, ?, ?, ?, ?)",
            self.runtime,
        )
        con.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL "
            "(start, end, correlationId, globalPid, shortName, graphNodeId) VALUES (?, ?, ?, ?, ?, ?)",
            self.kernels,
        )
        con.executemany("INSERT INTO CUDA_GRAPH_NODE_EVENTS VALUES (?, ?, ?, ?, ?, ?, ?)", self.nodes)
        con.commit()
        con.close()
        return self.path


# One indexer call: the indexer kernel names of the nsys 2025.3.1 exports from H200
# (tests/fixtures/h200_sglang), with a head-gate GEMM in the middle (not an indexer kernel by name: the
# classifier must bridge it).
INDEXER_KERNELS = (
    "smxx_paged_mqa_logits_metadata",
    "gemm_weights_proj",
    "sm90_fp8_paged_mqa_logits",
    "topk_kernel",
)

FORWARD_KERNEL = "indexSelectSmallIndex"  # the token-embedding lookup: one per model forward

# The rest of a draft forward around the indexer (an MTP layer + lm head); many kernels between calls.
LAYER_BEFORE = ("rmsnorm_kernel", "q_a_proj_gemm", "kv_a_proj_gemm", "q_b_proj_gemm")
LAYER_AFTER = (
    "sparse_mla_attn",
    "o_proj_gemm",
    "moe_gate_gemm",
    "moe_experts_gemm",
    "lm_head_gemm",
    "argmax_kernel",
)


def draft_loop_graph(
    path: Path,
    pattern: str,
    num_steps: int,
    rounds: int,
    pids: tuple[int, ...] = (4000,),
    verify: bool = True,
    nvtx: bool = True,
    indexer_kernels: tuple[str, ...] = INDEXER_KERNELS,
    forwards: bool = False,
) -> Path:
    """sglang-shaped CUDA-graph run: the whole draft loop captured once per process, then replayed inside a
    `draft_round` range per round; a target `verify` graph with indexer calls replays outside rounds.
    `indexer_kernels`: one indexer call's kernels (another GPU architecture's names). pattern "reuse": the
    draft loop runs no indexer (0.5.15+ reuses the target's top-k). `forwards`: each forward starts with a
    token-embedding lookup, as in sglang's graphs (what the classifier finds the draft loop by)."""
    r = SynthReport(path)
    for pid in pids:
        g = gtid(pid)
        cap = r.push(g, "graph_capture")
        rnd = r.push(g, "draft_round")  # the capture-time round: launches nothing, must be left out
        captured, names = [], []
        for step in range(num_steps - 1):
            st = r.push(g, "draft_step")
            for k in (FORWARD_KERNEL,) * forwards + LAYER_BEFORE:
                captured.append(r.capture_node(g))
                names.append(k)
            if pattern == "bug" or (step == 0 and pattern != "reuse"):
                ix = r.push(g, "indexer")
                for k in indexer_kernels:
                    captured.append(r.capture_node(g))
                    names.append(k)
                r.pop(ix)
            for k in LAYER_AFTER:
                captured.append(r.capture_node(g))
                names.append(k)
            r.pop(st)
        r.pop(rnd)
        vcap = r.push(g, "verify")
        vnodes, vnames = [], []
        for k in (FORWARD_KERNEL,) * forwards:
            vnodes.append(r.capture_node(g))
            vnames.append(k)
        for _layer in range(3):
            ix = r.push(g, "indexer")
            for k in indexer_kernels:
                vnodes.append(r.capture_node(g))
                vnames.append(k)
            r.pop(ix)
        r.pop(vcap)
        r.pop(cap)
        draft_exec = r.instantiate(g, captured)
        verify_exec = r.instantiate(g, vnodes)
        for _ in range(rounds):
            rr = r.push(g, "draft_round")
            r.graph_launch(g, draft_exec, names)
            r.pop(rr)
            if verify:
                vr = r.push(g, "verify")
                r.graph_launch(g, verify_exec, vnames)
                r.pop(vr)
    return r.write(with_nvtx=nvtx)


def draft_loop_eager(
    path: Path, pattern: str, num_steps: int, rounds: int, pids: tuple[int, ...] = (5000,)
) -> Path:
    """Eager run: every kernel launched inside the NVTX ranges; GPU execution lags the launch."""
    r = SynthReport(path)
    for pid in pids:
        g = gtid(pid)
        for _ in range(rounds):
            rnd = r.push(g, "draft_round")
            for step in range(num_steps - 1):
                st = r.push(g, "draft_step")
                for k in LAYER_BEFORE:
                    r.eager_kernel(g, k)
                if pattern == "bug" or step == 0:
                    ix = r.push(g, "indexer")
                    for k in INDEXER_KERNELS:
                        r.eager_kernel(g, k, gpu_delay=2000)  # runs on the GPU after the round ended
                    r.pop(ix)
                r.pop(st)
            r.pop(rnd)
            ver = r.push(g, "verify")
            ix = r.push(g, "indexer")
            r.eager_kernel(g, INDEXER_KERNELS[1])
            r.pop(ix)
            r.pop(ver)
    return r.write()
