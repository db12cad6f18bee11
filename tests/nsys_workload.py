"""A draft-loop-shaped NVTX workload for tests and benchmarks: no model, only the ranges.

Pushes, through kit.probe.ranges (sink nvtx or recorder), the ranges our probes push in a real run:
per round `draft_round` > (num_steps - 1) x `draft_step` > `indexer` (bug/off: in every step; fix: in step 0
only), plus decoys that must NOT be counted: target-model `indexer` ranges in `verify`/`prefill` and in
`draft_extend` outside rounds, the same names in another domain and in the default domain, indexer
ranges on a second thread while rounds run, and optionally a round left open at exit.

    python tests/nsys_workload.py --pattern bug --rounds 5 --num-steps 4 [--decoys] [--procs 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path

from kit.probe import ranges as nr


def spin(us: float) -> None:
    """Busy-wait a little so ranges have a visible, nonzero width."""
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def draft_round(pattern: str, num_steps: int, work_us: float) -> None:
    with nr.annotate(nr.ROUND):
        for step in range(num_steps - 1):  # the loop breaks before the last forward
            with nr.annotate(nr.STEP):
                if pattern in ("bug", "off") or step == 0:
                    with nr.annotate(nr.INDEXER):
                        spin(work_us)
                spin(work_us)


def target_forward(kind: str, layers: int, work_us: float) -> None:
    """verify / prefill / draft_extend: indexer calls outside any draft round."""
    with nr.annotate(kind):
        for _ in range(layers):
            with nr.annotate(nr.INDEXER):
                spin(work_us)


def decoy_domains() -> None:
    """The same range names in another domain and in the default domain (nvtx sink only)."""
    import nvtx

    for domain in ("otherdomain", None):
        kw = {"domain": domain} if domain else {}
        nvtx.push_range(message=nr.ROUND, **kw)
        for _ in range(3):
            nvtx.push_range(message=nr.INDEXER, **kw)
            nvtx.pop_range(**kw)
        nvtx.pop_range(**kw)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pattern", choices=("bug", "fix", "off"), required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--num-steps", type=int, default=4)
    ap.add_argument("--work-us", type=float, default=20.0)
    ap.add_argument("--decoys", action="store_true", help="add the ranges that must not be counted")
    ap.add_argument("--unclosed", action="store_true", help="leave one round (with an indexer) open at exit")
    ap.add_argument("--procs", type=int, default=1, help="run the pattern in this many processes")
    ap.add_argument("--sink", choices=("nvtx", "recorder"), default="nvtx")
    ap.add_argument("--recorder-path", type=Path)
    args = ap.parse_args(argv)

    children = []
    for _ in range(args.procs - 1):
        rest = _drop_value(list(sys.argv[1:] if argv is None else argv), "--procs")
        cmd = [sys.executable, __file__, *(c for c in rest if not c.startswith("--procs="))]
        children.append(subprocess.Popen(cmd))

    nr.configure(args.sink, args.recorder_path)
    stop = threading.Event()
    other = None
    if args.decoys:
        target_forward(nr.PREFILL, 3, args.work_us)

        def other_thread() -> None:
            while not stop.is_set():
                with nr.annotate(nr.INDEXER):
                    spin(args.work_us)
                time.sleep(0.0005)

        other = threading.Thread(target=other_thread)
        other.start()
    for _ in range(args.rounds):
        draft_round(args.pattern, args.num_steps, args.work_us)
        if args.decoys:
            target_forward(nr.VERIFY, 3, args.work_us)
            target_forward(nr.EXTEND, 1, args.work_us)
    if other is not None:
        stop.set()
        other.join()
    if args.decoys and args.sink == "nvtx":
        decoy_domains()
    for child in children:
        if child.wait() != 0:
            return 1
    nr.flush()
    if args.unclosed and args.sink == "nvtx":
        import nvtx

        nvtx.push_range(message=nr.ROUND, domain=nr.DOMAIN)
        nvtx.push_range(message=nr.INDEXER, domain=nr.DOMAIN)
    return 0


def _drop_value(cmd: list[str], flag: str) -> list[str]:
    """Remove `flag VALUE` pairs so child processes do not spawn children of their own."""
    out, skip = [], False
    for c in cmd:
        if skip:
            skip = False
            continue
        if c == flag:
            skip = True
            continue
        out.append(c)
    return out


if __name__ == "__main__":
    sys.exit(main())
