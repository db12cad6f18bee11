"""TCP ports for sglang servers that start side by side on one host.

What a single-node sglang server opens (read in server_args.py `PortArgs.init_new` of 0.5.14, the patched
build, 0.5.16 and 0.5.17; tokenizer, scheduler, detokenizer, rpc and metrics talk over ZMQ `ipc://` files,
not TCP, without DP attention, which the kit refuses):
- the HTTP port, `--port`;
- the NCCL / torch.distributed store port, `--nccl-port`, else `get_free_port()`: bind port 0, read the
  port the OS gave, close, bind it again much later: a check-then-use race with every other process;
- a gRPC port `--port` + 10000: 0.5.14 (and the fix) derive it and check it <= 65535 even with gRPC off;
  0.5.16 and 0.5.17 only with gRPC on; never bound with gRPC off.

Two ways a side-by-side start lost its server on the H200 (data/results/mutants/h200-part/logs/,
issue 33): two allocations that check a port free before either binds it, and a TCP SELF-CONNECT: while
the server starts, the kit polls `/health` on a port nothing listens on yet; when that port lies in the
OS's ephemeral range, the kernel may give the poll's socket that very port as its source, the socket
connects to itself (it reads back its own `GET /health HTTP/1.1`), and while it is open the server's bind
fails with EADDRINUSE. Measured on this VM: 58,543 polls of one port in 2.3 s took it
(tests/test_ports.py reproduces it).

So every port the kit hands a server lies BELOW the ephemeral range (a source port is never taken from
there, so no poll or outgoing connection of any process can hold it), both ports are passed explicitly,
and they are RESERVED: a registry file in the temporary directory, changed only under an exclusive lock,
records each leased port with its owner's pid until the server stops (a dead owner's ports return).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import random
import re
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kit.backends.sglang.http import HOST
from kit.errors import ServerError
from kit.proc import pid_alive

PORT_MIN = 20000
GRPC_OFFSET = 10000  # sglang checks --port + 10000 <= 65535
# sglang 0.5.14 exits at start-up when --port + 10000 passes 65535 ("SGLANG_GRPC_PORT (70475) must be between
# 1 and 65535", seen on an H200 host where the OS had handed out 60475): the highest --port it takes.
SGLANG_PORT_MAX = 65535 - GRPC_OFFSET
EPHEMERAL_DEFAULT = (32768, 60999)  # Linux's default ip_local_port_range
REGISTRY = "pr29654-kit-ports.json"


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The OS's ephemeral (source) port range; Linux's default where it cannot be read."""
    try:
        lo, hi = (int(x) for x in path.read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return EPHEMERAL_DEFAULT


def usable() -> range:
    """Ports the kit may hand a server: from PORT_MIN up to just below the ephemeral range (and low enough
    for sglang's +10000 gRPC check)."""
    top = min(ephemeral_range()[0], SGLANG_PORT_MAX + 1)
    if top <= PORT_MIN:
        raise ServerError(
            f"no ports below the ephemeral range to give sglang: net.ipv4.ip_local_port_range starts at "
            f"{ephemeral_range()[0]}, at or below {PORT_MIN}; raise it or pass --port"
        )
    return range(PORT_MIN, top)


def chosen_port_warning(port: int | None) -> str | None:
    """A warning for a --port the user chose inside the ephemeral range, where a poll can take it."""
    lo, hi = ephemeral_range()
    if port is None or not lo <= port <= hi:
        return None
    return (
        f"port {port} lies in the ephemeral range {lo}-{hi}: a /health poll there can connect to itself and "
        f"hold the port the server binds (a start-up dying on it is retried once); leave port unset or pick "
        f"one in {usable().start}..{usable().stop - 1}"
    )


def port_busy(port: int, host: str = HOST) -> bool:
    """Whether something on this host holds `port` (a bind fails)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


@contextlib.contextmanager
def _registry(where: Path) -> Iterator[dict[str, int]]:
    """The reservations (port -> owner pid, dead owners dropped), under an exclusive lock; written back."""
    path = where / REGISTRY
    try:
        where.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_suffix(".lock"), "a+")  # noqa: SIM115 (closed by the with below)
    except OSError as e:
        raise ServerError(
            f"cannot reserve sglang's ports: {where} is not writable ({e.strerror}); set TMPDIR to a "
            "writable folder shared by this host's kit runs"
        ) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            held = json.loads(path.read_text()) if path.exists() else {}
        except (OSError, ValueError):
            held = {}
        held = {k: v for k, v in held.items() if isinstance(v, int) and pid_alive(v)}
        yield held
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(held, sort_keys=True))
        tmp.replace(path)


@dataclass
class PortLease:
    """Ports reserved for one server until `release` (or its owner's death)."""

    ports: tuple[int, ...]
    where: Path
    owner: int = field(default_factory=os.getpid)

    def release(self) -> None:
        with _registry(self.where) as held:
            for p in self.ports:
                if held.get(str(p)) == self.owner:
                    del held[str(p)]


def lease(n: int, *, where: Path | None = None, rng: random.Random | None = None) -> PortLease:
    """`n` free ports below the ephemeral range that no live kit process has reserved, reserved for this
    one. `where`: the registry's folder (default: the temporary directory, shared by the host's kit runs)."""
    where = Path(tempfile.gettempdir()) if where is None else where
    if n == 0:  # --port given on a follower node: nothing to reserve
        return PortLease((), where)
    span = usable()
    rng = rng or random.Random()
    start = rng.randrange(len(span))
    with _registry(where) as held:
        got: list[int] = []
        for i in range(len(span)):
            port = span[(start + i) % len(span)]
            if str(port) in held or port_busy(port):
                continue
            got.append(port)
            if len(got) == n:
                break
        if len(got) < n:
            raise ServerError(
                f"fewer than {n} free TCP ports in {span.start}..{span.stop - 1} (below the ephemeral range) "
                "on this host: stop other servers or pass --port"
            )
        for p in got:
            held[str(p)] = os.getpid()
    return PortLease(tuple(got), where)


_BIND = re.compile(r"Errno 98|address already in use|EADDRINUSE", re.IGNORECASE)


def bind_error(log: Path) -> str | None:
    """The server log's last line saying a port it binds was taken (a transient start-up failure), or None."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    hits = [ln.strip() for ln in lines if _BIND.search(ln)]
    return hits[-1][:300] if hits else None
