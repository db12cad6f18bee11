"""A PyTorch-profiler (Kineto) trace as a trace source: what torch.profiler's export_chrome_trace and
sglang's `/start_profile` (`*.trace.json.gz`, one per TP rank, or sglang's merged trace) write.

What the trace carries, in the protocol's terms (kit.trace.source):
    ranges     record_function ranges (category user_annotation) named `DOMAIN/name` by the kit's probe
               (kit.probe.ranges.profiler_name): a Kineto trace has no NVTX domains
    threads    (process, pid, tid) of CPU-side rows, numbered in order of appearance: the gtid
    calls      cuda_runtime / cuda_driver rows whose name holds "Launch", with their `correlation`
    kernels    kernel rows, joined to their launch by (process, correlation); a kernel replayed from a CUDA
               graph carries the correlation of its cudaGraphLaunch and, with newer Kineto, `graph id` and
               `graph node id` -- but no graph-node creation events: nothing leads from a replayed kernel
               back to the capture-time ranges (the nsys graph method's path), so such rounds are counted
               by kernel names inside their round (kit.analysis.replay)
    processes  one per file; in sglang's merged trace every pid is prefixed by its rank ("[TP01] 12345"),
               and kernels belong to the rank their label names

What it cannot answer is refused at open, in one line: a damaged or truncated file, GPU activity that was
off (launch calls without kernels), kernels of several unlabelled processes. A trace without the kit's
ranges opens like an nsys report without them, and its verdict is inconclusive in the same words (exit 3).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from kit.errors import TraceError
from kit.probe import ranges as probe_ranges
from kit.trace.kineto_parse import Events, Parsed, parse
from kit.trace.source import GraphLaunchKernels, Kernels, NvtxStatus, TraceSource, matches_kernel

_GRAPH_LAUNCH = ("cudaGraphLaunch", "cuGraphLaunch")


class KinetoSource(TraceSource):
    """A parsed Kineto trace; every answer is a numpy selection over its columns."""

    source = "kineto"
    ranges_hint = "was the kit's probe on (KIT_PROBE_SINK=torch) and the profile window inside decoding?"

    def __init__(self, path: Path, parsed: Parsed) -> None:
        self.path = path
        self.warnings: list[str] = []
        self.exported_from = None
        self.parsed = parsed
        ann, rt, k = parsed.annotations, parsed.runtime, parsed.kernels
        self._threads, self._ann_g, self._rt_g = _threads(ann, rt)
        self._proc_pid = self._process_pids(rt, ann)
        self._pid_of_gtid = (
            self._proc_pid[self._threads[:, 0]] if len(self._threads) else np.zeros(0, np.int64)
        )
        launch = np.array(["Launch" in n for n in rt.names], dtype=bool)
        graph = np.array([any(g in n for g in _GRAPH_LAUNCH) for n in rt.names], dtype=bool)
        self._is_launch = launch[rt.name] if len(rt) else np.zeros(0, dtype=bool)
        self._is_graph = graph[rt.name] if len(rt) else np.zeros(0, dtype=bool)
        self._kernel_pid = self._proc_pid[k.proc] if len(k) else np.zeros(0, dtype=np.int64)
        self._check()

    # ---- what the file can answer -------------------------------------------------------------
    def _process_pids(self, rt: Events, ann: Events) -> np.ndarray:
        """The OS pid of each process (rank): the one pid its launch calls (else its ranges) come from."""
        n = len(self.parsed.processes)
        out = np.full(n, -1, dtype=np.int64)
        for proc in range(n):
            pids = sorted({int(p) for p in rt.pid[rt.proc == proc] if p >= 0})
            if not pids:
                pids = sorted({int(p) for p in ann.pid[ann.proc == proc] if p >= 0})
            if len(pids) > 1 and len(self.parsed.kernels):
                label = self.parsed.processes[proc] or "the trace"
                raise TraceError(
                    f"{self.path}: {len(pids)} processes ({', '.join(map(str, pids[:8]))}) launch kernels in "
                    f"{label} without rank labels, so no kernel can be told to its process: analyse each "
                    "rank's trace file, or sglang's merged trace (its pids carry [TPnn])",
                    path=self.path,
                )
            out[proc] = pids[0] if pids else proc
        if len(set(out.tolist())) < n:  # two ranks with one OS pid (several hosts): keep them apart
            self.warnings.append("ranks on several hosts share OS pids: pids are numbered rank * 10**8 + pid")
            out = np.arange(n, dtype=np.int64) * 10**8 + np.maximum(out, 0)
        return out

    def _check(self) -> None:
        p, k = self.parsed, self.parsed.kernels
        launches = int(self._is_launch.sum())
        if launches and not len(k):
            raise TraceError(
                f"{self.path}: CPU events only (GPU activity off): {launches} CUDA launch calls but no "
                "kernel; "
                "the indexer launches are GPU kernels: profile with activities CPU and GPU (sglang: "
                '"activities": ["CPU", "GPU"])',
                path=self.path,
            )
        if not len(k) and not launches:
            self.warnings.append(
                "PyTorch-profiler trace without GPU activity (a CPU run): indexer calls are the probe's "
                "record_function ranges, not GPU kernels"
            )
        if len(p.processes) > 1:
            self.warnings.append(
                f"merged trace of {len(p.processes)} ranks ({', '.join(p.processes)}): rounds counted per "
                "rank"
            )

    def describe(self) -> dict[str, str | None]:
        meta = self.parsed.meta
        return {
            "report": str(self.path),
            "source": self.source,
            "format": "PyTorch profiler (Kineto) Chrome trace",
            "schema_version": None if "schemaVersion" not in meta else str(meta["schemaVersion"]),
            "parser": self.parsed.parser,
            "ranks": ", ".join(self.parsed.processes) if self.parsed.processes != [""] else None,
            "exported_from": None,
        }

    # ---- ranges ---------------------------------------------------------------------------------
    def _ann_names(self, prefix: str) -> list[int]:
        return [i for i, n in enumerate(self.parsed.annotations.names) if n.startswith(prefix)]

    def nvtx_status(self, domain: str) -> NvtxStatus:
        prefix = probe_ranges.profiler_name("", domain) if domain else ""
        ids = (
            self._ann_names(prefix)
            if domain
            else [
                i for i, n in enumerate(self.parsed.annotations.names) if probe_ranges.PROFILER_SEP not in n
            ]
        )
        found = bool(ids) and bool(np.isin(self.parsed.annotations.name, ids).any())
        return NvtxStatus(domain, created=found, has_ranges=found)

    def range_names(self, domain: str) -> dict[str, int]:
        ann, prefix = self.parsed.annotations, probe_ranges.profiler_name("", domain)
        counts = np.bincount(ann.name, minlength=len(ann.names)) if len(ann) else np.zeros(len(ann.names))
        return {
            n[len(prefix) :]: int(c)
            for n, c in sorted(zip(ann.names, counts.tolist(), strict=True))
            if c and (n.startswith(prefix) if domain else probe_ranges.PROFILER_SEP not in n)
        }

    def domains(self) -> list[str]:
        sep = probe_ranges.PROFILER_SEP
        return sorted({n.split(sep, 1)[0] for n in self.parsed.annotations.names if sep in n})

    def range_columns_multi(
        self, domain: str, names: list[str], gtids: list[int] | None = None, with_end: bool = True
    ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        ann = self.parsed.annotations
        table = {n: i for i, n in enumerate(ann.names)}
        keep_g = None if gtids is None else np.isin(self._ann_g, np.asarray(gtids, dtype=np.int64))
        out = {}
        for name in names:
            ident = table.get(probe_ranges.profiler_name(name, domain))
            sel = ann.name == ident if ident is not None else np.zeros(len(ann), dtype=bool)
            if keep_g is not None:
                sel &= keep_g
            start = ann.start[sel]
            out[name] = (self._ann_g[sel], start, start + ann.dur[sel] if with_end else None)
        return out

    def pid_tid(self, gtid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        gtid = np.asarray(gtid, dtype=np.int64)
        return self._pid_of_gtid[gtid], self._threads[gtid, 2]

    # ---- CUDA ---------------------------------------------------------------------------------
    @property
    def has_kernels(self) -> bool:
        return len(self.parsed.kernels) > 0

    @property
    def has_runtime(self) -> bool:
        return len(self.parsed.runtime) > 0

    @property
    def kernels_have_pid(self) -> bool:
        return True

    @property
    def has_unlinked_graph_replays(self) -> bool:
        return bool(self._is_graph.any()) and self.has_kernels

    def launch_calls(self, threads: list[int], lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rt = self.parsed.runtime
        sel = self._is_launch & np.isin(self._rt_g, np.asarray(threads, dtype=np.int64))
        sel &= (rt.start >= lo) & (rt.start <= hi)
        return rt.corr[sel], rt.start[sel], self._rt_g[sel]

    def kernels_of(self, cids: np.ndarray, pids: list[int] | None, nodes: bool) -> Kernels:
        k = self.parsed.kernels
        sel = np.isin(k.corr, cids)
        proc = None
        if pids is not None:
            wanted = np.asarray(pids, dtype=np.int64)
            sel &= np.isin(self._kernel_pid, wanted)
            order = np.argsort(wanted)
            proc = order[np.searchsorted(wanted[order], self._kernel_pid[sel])]
        return Kernels(k.corr[sel], k.start[sel], k.dur[sel], proc, k.node[sel] if nodes else None)

    def has_graph_launch_calls(self) -> bool:
        return bool(self._is_graph.any())

    def _graph_launch_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(kernel rows replayed by a graph launch, the runtime row of each one's launch)."""
        rt, k = self.parsed.runtime, self.parsed.kernels
        calls = np.flatnonzero(self._is_graph)
        if not len(calls) or not len(k):
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        call_key = (self._proc_pid[rt.proc[calls]] << 32) + rt.corr[calls]
        kernel_key = (self._kernel_pid << 32) + k.corr
        order = np.argsort(call_key, kind="stable")
        pos = np.minimum(np.searchsorted(call_key[order], kernel_key), len(order) - 1)
        hit = call_key[order][pos] == kernel_key
        return np.flatnonzero(hit), calls[order[pos[hit]]]

    def graph_launch_kernels(self) -> GraphLaunchKernels | None:
        if not self.has_graph_launch_calls():
            return None
        k = self.parsed.kernels
        rows, calls = self._graph_launch_rows()
        return GraphLaunchKernels(
            gtid=self._rt_g[calls],
            cid=self.parsed.runtime.corr[calls],
            start=k.start[rows],
            end=k.start[rows] + k.dur[rows],
            name=k.name[rows],
            alt_name=np.full(len(rows), -1, dtype=np.int64),
        )

    def kernel_name_ids(self, patterns: Sequence[str]) -> list[int]:
        return [i for i, n in enumerate(self.parsed.kernels.names) if matches_kernel(n, patterns)]

    def round_kernels(
        self, gtid: int, start: int, end: int, graph: bool
    ) -> list[tuple[int, int, str, int, int]]:
        rt, k = self.parsed.runtime, self.parsed.kernels
        sel = self._is_launch & (self._rt_g == gtid) & (rt.start >= start) & (rt.start < end)
        calls = np.flatnonzero(sel)
        if not len(calls) or not len(k):
            return []
        pid = int(self._pid_of_gtid[gtid])
        keys = {int(rt.corr[c]): c for c in calls}
        rows = np.flatnonzero(np.isin(k.corr, list(keys)) & (self._kernel_pid == pid))
        out = [
            (
                int(k.start[r]),
                int(k.start[r] + k.dur[r]),
                k.names[k.name[r]],
                gtid,
                int(rt.start[keys[int(k.corr[r])]]),
            )
            for r in rows
        ]
        return sorted(out)


def _threads(ann: Events, rt: Events) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Thread table rows (process, pid, tid) of the CPU-side events, and each event's row (its gtid)."""
    both = (
        np.concatenate(
            [np.stack([ann.proc, ann.pid, ann.tid], axis=1), np.stack([rt.proc, rt.pid, rt.tid], axis=1)]
        )
        if len(ann) + len(rt)
        else np.zeros((0, 3), dtype=np.int64)
    )
    if not len(both):
        return both, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    table, inverse = np.unique(both, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    return table, inverse[: len(ann)], inverse[len(ann) :]


def open_kineto(path: Path) -> KinetoSource:
    """The registry's opener for `.json` / `.json.gz` traces."""
    return KinetoSource(path, parse(path))
