"""How fast does a PyTorch-profiler (Kineto) trace of about 200 MB become a verdict, next to
HolisticTraceAnalysis (HTA, the reference Kineto loader on PyPI) merely loading the same file?

Traces: sglang-like decode loops written to the Kineto schema by tests/kineto_synth.py (SYNTHETIC: no GPU
here; the CPU-side layout is torch 2.13's, the GPU events follow Kineto's writer), bug arm, num_steps 5,
eager (every kernel launched on its own) and graph (the draft loop one cudaGraphLaunch per round), with
python_function / cpu_op filler per launch as sglang's with_stack=True profile has, gzipped as sglang
writes them. Timed, each as a fresh process (imports included), best of --repeat:
  kit       kit.analysis.analyze.analyze(trace) -> rounds.csv + verdict.json
  HTA load  hta.trace_analysis.TraceAnalysis(trace_dir=...) (parses the trace into its DataFrame; no analysis)
With --real TRACE (repeatable), a trace sglang itself wrote (its /start_profile) is timed the same way
beside them, its rounds and event mix read from the file. Writes data/bench_kineto.md with provenance.

    .venv/bin/python scripts/bench_kineto.py [--mb 200] [--repeat 3] [--hta-repeat 2] [--real TRACE.json.gz]
        [--out FILE.md]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import _checkout  # noqa: F401  (this checkout's kit first on sys.path)

from kit.paths import REPO

sys.path.insert(0, str(REPO / "tests"))  # the tests' helpers

import kineto_synth as ks  # noqa: E402

from kit import provenance  # noqa: E402

KIT = """
import json, sys, time
t0 = time.perf_counter()
from kit.analysis.analyze import analyze
v = analyze(sys.argv[1], sys.argv[2], arm=sys.argv[3], num_steps=5)
print(json.dumps({"s": time.perf_counter() - t0, "status": v["status"], "method": v["method"],
                  "rounds": v["num_rounds"], "observed": v["observed_counts"],
                  "parser": v["report"]["parser"]}))
"""
HTA = """
import json, logging, sys, time
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
from hta.common.trace_parser import get_default_trace_parsing_backend
logging.disable(logging.WARNING)
ta = TraceAnalysis(trace_dir=sys.argv[1])
print(json.dumps({"s": time.perf_counter() - t0, "rows": len(ta.t.get_trace(0)),
                  "backend": str(get_default_trace_parsing_backend())}))
"""


def build(mode: str, mb: float, work: Path) -> tuple[Path, int, Counter]:
    """A bug-arm trace of about `mb` MB uncompressed: rounds scaled from a small probe trace."""
    probe = ks.write_trace(work / "probe.json", [ks.sglang_like("bug", 5, 20, mode=mode, filler=3)])
    rounds = max(1, round(20 * mb * 1e6 / probe.stat().st_size))
    tr = ks.sglang_like("bug", 5, rounds, mode=mode, filler=3)
    path = ks.write_trace(work / f"rank0-{mode}.trace.json.gz", [tr])
    cats = Counter(e.get("cat") for e in tr.events)
    return path, rounds, cats


def categories(trace: Path) -> Counter:
    """The event mix of a trace file (its traceEvents by category)."""
    return Counter(e.get("cat") for e in json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"])


def timed(name: str, trace: Path, arm: str, work: Path, a: argparse.Namespace) -> tuple:
    """kit's analysis and HTA's load of one trace, each best of its repeats in fresh processes."""
    kit = [fresh(KIT, str(trace), str(work / f"out{i}"), arm, cpus=a.cpus) for i in range(a.repeat)]
    hta_dir = work / "hta"
    hta_dir.mkdir()
    (hta_dir / trace.name).symlink_to(trace.resolve())
    hta = [fresh(HTA, str(hta_dir), cpus=a.cpus, may_fail=True) for _ in range(a.hta_repeat)]
    ok = [r for r in hta if "error" not in r]
    k, h = min(kit, key=lambda r: r["s"]), min(ok or hta, key=lambda r: r["s"])
    raw_mb = len(gzip.decompress(trace.read_bytes())) / 1e6
    print(name, f"{raw_mb:.0f} MB", "kit", round(k["s"], 2), "HTA", h, flush=True)
    return raw_mb, trace.stat().st_size / 1e6, k, h


def fresh(code: str, *args: str, cpus: str | None, may_fail: bool = False) -> dict:
    """One timed fresh process; with `may_fail`, a failure is a result (its time and last error line)."""
    cmd = [sys.executable, "-c", code, *args]
    if cpus:
        cmd = ["taskset", "-c", cpus, *cmd]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    if res.returncode != 0:
        last = next((x for x in reversed(res.stderr.splitlines()) if x.strip()), f"exit {res.returncode}")
        if may_fail:
            return {"s": time.perf_counter() - t0, "error": last.strip()[:160]}
        raise SystemExit(f"failed: {' '.join(cmd[:4])}...\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def kit_sha() -> str:
    """The kit's short commit, "-dirty" when tracked files differ from it (kit.provenance's reading)."""
    sha = provenance.git_sha() or "unknown"
    return sha[:7] + ("-dirty" if sha.endswith("-dirty") else "")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=200.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--hta-repeat", type=int, default=2)
    ap.add_argument("--cpus", default="0,1", help="taskset CPU list (the 2-core budget); empty: no pinning")
    ap.add_argument("--real", action="append", default=[], metavar="TRACE", help="a trace sglang wrote")
    ap.add_argument("--real-arm", default="bug", help="the arm of the --real traces")
    ap.add_argument("--out", default=str(REPO / "data" / "bench_kineto.md"))
    a = ap.parse_args()
    for real in a.real:  # before minutes of synthetic runs
        if not Path(real).is_file():
            ap.error(f"--real {real}: no such trace file (a .json.gz that sglang's /start_profile wrote)")
    load_start, sha = os.getloadavg(), kit_sha()  # the code that runs: read before the tables change the tree
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("eager", "graph"):
            work = Path(tmp) / mode
            work.mkdir()
            trace, rounds, cats = build(mode, a.mb, work)
            raw, gz, k, h = timed(mode, trace, "bug", work, a)
            rows.append((f"{mode} (synthetic)", rounds, raw, gz, cats, k, h))
        for n, real in enumerate(map(Path, a.real)):
            work = Path(tmp) / f"real{n}"
            work.mkdir()
            raw, gz, k, h = timed(real.name, real, a.real_arm, work, a)
            rows.append((f"sglang: `{label(real)}`", k["rounds"], raw, gz, categories(real), k, h))
    write(a, rows, load_start, sha, [origin(Path(r)) for r in a.real])
    print("wrote", a.out, "and", Path(a.out).with_suffix(".json"))


def label(trace: Path) -> str:
    """A run directory's trace by its cell's name (every cell's file is profile.trace.json.gz)."""
    return f"{trace.parent.name}/{trace.name}" if trace.name.startswith("profile.") else trace.name


def origin(trace: Path) -> dict:
    """Where a trace sglang wrote came from: its sha256 and size, and the run's provenance.json when the
    trace still sits in its run directory (a whole trace is too big to commit; the sha names it)."""
    out = {"trace": label(trace), "sha256": hashlib.sha256(trace.read_bytes()).hexdigest()}
    out["bytes"] = trace.stat().st_size
    prov = trace.parent / "provenance.json"
    if prov.is_file():
        p = json.loads(prov.read_text())
        sgl = (p.get("sglang") or {}).get("sglang_version")
        out["written_by"] = (
            f"sglang {sgl} ({p['arm']}) under its /start_profile on {p['gpu']['name']} "
            f"{p['gpu']['uuid'][:12]}, driver {p['gpu']['driver']}, torch {p['torch']['version']}, "
            f"kit {p['git_sha'][:7]}, {p['start'][:10]}"
        )
    return out


def mix(cats: Counter) -> str:
    return ", ".join(f"{c} {n:,}" for c, n in sorted(cats.items(), key=lambda kv: -kv[1]))


def write(a: argparse.Namespace, rows: list, load_start: tuple, sha: str, origins: list[dict]) -> None:
    """The table for people (OUT.md) and the same rows for the report and the tests (OUT.json)."""
    lines = [
        "# Kineto trace to a verdict vs HolisticTraceAnalysis's load (CPU)",
        "",
        "Made by `scripts/bench_kineto.py`. Traces: SYNTHETIC sglang-like decode loops written to the Kineto "
        "schema by `tests/kineto_synth.py` (bug arm, num_steps 5, 4 draft steps per round; no GPU here), "
        "gzipped, and (rows named sglang) traces sglang's own /start_profile wrote on the H200 "
        "(a trimmed fixture, `tests/fixtures/kineto/README.md`, holds only the categories the analysis "
        "reads, so it times the format, not a full trace's size; a whole trace is named by its sha256 "
        "below). Wall seconds, each a fresh process with its "
        "imports, best of "
        f"{a.repeat} (kit) / {a.hta_repeat} (HTA), pinned to CPUs {a.cpus or 'any'} (2 cores). kit = "
        "`kit.analysis.analyze.analyze(trace)` -> rounds.csv + verdict.json; HTA load = "
        "`TraceAnalysis(trace_dir=...)`, which only parses the trace into its DataFrame.",
        "The machine is shared (2 cores, other jobs running): read ratios, not absolute values. An HTA load "
        "that fails is shown with the time it took to fail (a lower bound of its load) and its last error "
        "line.",
        "",
        "| mode | rounds | MB (gzip) | events | kernels | launch calls | kit s | HTA load s | HTA / kit "
        "| verdict | parser |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for mode, rounds, raw, gz, cats, k, h in rows:
        events = sum(cats.values())
        if "error" in h:
            hta, ratio = f"failed after {h['s']:.2f} (`{h['error']}`)", "n/a"
        else:
            hta, ratio = f"{h['s']:.2f}", f"{h['s'] / k['s']:.1f}x"
        lines.append(
            f"| {mode} | {rounds:,} | {raw:.0f} ({gz:.1f}) | {events:,} | {cats['kernel']:,} | "
            f"{cats['cuda_runtime']:,} | {k['s']:.2f} | {hta} | {ratio} | "
            f"{k['status']} {k['method']} {k['observed']} | {k['parser']} |"
        )
    hta_backend = next((r[6]["backend"] for r in rows if "backend" in r[6]), "?")
    lines += [
        "",
        "Event mix per trace: " + "; ".join(f"{m}: {mix(cats)}" for m, _, _, _, cats, _, _ in rows),
        "",
        "Provenance:",
        "",
    ]
    prov = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, no GPU",
        "os": platform.platform(),
        "python": f"{platform.python_version()}; numpy {importlib.metadata.version('numpy')}; "
        f"pandas {importlib.metadata.version('pandas')}",
        "HolisticTraceAnalysis": f"{importlib.metadata.version('HolisticTraceAnalysis')} (parser backend "
        f"{hta_backend}: ijson is not installed, so HTA uses json.loads)",
        "git": sha,
        "cpus": a.cpus or "any",
        "load_avg_at_start": " ".join(f"{x:.2f}" for x in load_start),
        "load_avg_at_end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    lines += [
        *(
            f"- sglang trace `{o['trace']}`: sha256 {o['sha256']}, {o['bytes']:,} bytes"
            + (f"; written by {o['written_by']}" if "written_by" in o else "")
            for o in origins
        ),
        *(f"- {k}: {v}" for k, v in prov.items()),
    ]
    Path(a.out).write_text("\n".join(lines) + "\n")
    table = [
        {
            "trace": mode.removeprefix("sglang: `").rstrip("`"),
            "source": "sglang" if mode.startswith("sglang: ") else "synthetic",
            "rounds": rounds,
            "mb": round(raw, 1),
            "mb_gzip": round(gz, 2),
            "kit_s": k["s"],
            "hta_s": h["s"],
            "hta_error": h.get("error"),
            "status": k["status"],
            "method": k["method"],
            "observed": k["observed"],
            "parser": k["parser"],
        }
        for mode, rounds, raw, gz, _, k, h in rows
    ]
    doc = {
        "about": "made by scripts/bench_kineto.py; the same rows as the .md beside it",
        "rows": table,
        "sglang_traces": origins,
        "provenance": prov,
    }
    Path(a.out).with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
