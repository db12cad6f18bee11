"""Ports for side-by-side sglang servers (kit.backends.sglang.ports, issue 33): a health poll can take a port
in the ephemeral range from the server it waits for, check-then-use allocation hands two servers one port,
and a start-up lost to a taken port is retried once, on new ports, and recorded."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sglang_standin_helpers as standin
from sglang_run_helpers import GLM52_CONFIG, make_model, run_on_standin

from kit.backends.sglang import launch, ports
from kit.backends.sglang.http import SglangClient
from kit.errors import ServerError


def _self_connect(port: int, seconds: float = 60.0) -> socket.socket | None:
    """Connect to `port` (nothing listens) until the kernel hands the client that very port as its source."""
    t = time.monotonic()
    while time.monotonic() - t < seconds:
        s = socket.socket()
        try:
            s.connect(("127.0.0.1", port))
            return s
        except ConnectionRefusedError:
            s.close()
    return None


def test_a_poll_of_a_port_in_the_ephemeral_range_takes_it_and_the_kit_hands_out_none_there() -> None:
    """The H200's lost servers: a /health poll of a port nothing listens on yet connects to ITSELF when the
    port lies in the ephemeral range, reads back its own request, and holds the port: the server's bind
    then fails with EADDRINUSE. The kit's ports lie below that range, where no source port is taken."""
    lo, hi = ports.ephemeral_range()
    # an even port: Linux's connect() tries even source ports first (the H200's lost ports were 52672, 48200)
    port = next(p for p in range((lo + hi) // 2 & ~1, hi, 2) if not ports.port_busy(p))
    s = _self_connect(port)
    assert s is not None, f"no self-connect to {port} within 60 s"
    with s:
        assert s.getsockname() == s.getpeername() == ("127.0.0.1", port)
        s.sendall(b"GET /health HTTP/1.1\r\n\r\n")
        assert s.recv(64).startswith(b"GET /health HTTP/1.1")  # what http.client reads as a BadStatusLine
        with socket.socket() as server, pytest.raises(OSError) as taken:
            server.bind(("127.0.0.1", port))
        assert taken.value.errno == errno.EADDRINUSE
    span = ports.usable()
    assert span.start >= ports.PORT_MIN and span.stop <= lo and span.stop - 1 + ports.GRPC_OFFSET <= 65535
    assert all(p < lo for p in ports.lease(8).ports)


def test_a_health_poll_that_reads_no_http_is_no_answer_not_a_crash() -> None:
    """A listener that echoes the request (what a self-connected poll reads) makes get_status None."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        echo = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import socket\ns=socket.fromfd({srv.fileno()},2,1)\nc,_=s.accept()\n"
                "c.sendall(c.recv(100))\nc.close()",
            ],
            pass_fds=(srv.fileno(),),
        )
        try:
            assert SglangClient(port).get_status("/health", timeout=5) is None
        finally:
            echo.wait(10)


def _todays_free_port(rng: random.Random) -> int:
    """The allocation the kit had before this issue (http.free_port): a random start in 20000..55535, the
    first port a bind check finds free; nothing reserved it until the server bound it."""
    start = rng.randrange(20000, 55536)
    return next(p for p in [*range(start, 55536), *range(20000, start)] if not ports.port_busy(p))


def _start_side_by_side(allocate, n: int, tmp: Path) -> list[int]:
    """n stand-in servers started at once, each binding its NCCL store port and then its HTTP port as sglang
    does; every allocation is made before any server binds (the servers take seconds to start). Returns
    each server's exit code after 3 s (None: still serving)."""
    procs = []
    for k in range(n):
        http, nccl = allocate(k)
        log = open(tmp / f"server-{k}.log", "w")  # noqa: SIM115 (closed with the process below)
        cmd = standin.command(http, nccl_port=nccl)
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True), log))
    time.sleep(3)
    codes = [p.poll() for p, _ in procs]
    for p, log in procs:  # the stand-in leaves a "scheduler" child: stop the whole session
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)
        log.close()
    return codes


def test_side_by_side_servers_collide_with_todays_allocation_and_not_with_leases(tmp_path: Path) -> None:
    """Four servers at once, the seeded collision: each allocator starts its scan at the same place (the
    same seed, as two kit processes' random starts can be). Today's check-then-use allocation gives all
    four the same ports and three die binding them; leases reserve each port, so all four serve."""
    old = _start_side_by_side(
        lambda k: (_todays_free_port(random.Random(7)), _todays_free_port(random.Random(8))), 4, tmp_path
    )
    assert old.count(None) == 1 and all(c not in (None, 0) for c in old if c is not None), old
    assert sum("Address already in use" in f.read_text() for f in tmp_path.glob("server-*.log")) == 3
    leases = [ports.lease(2, where=tmp_path, rng=random.Random(7)) for _ in range(4)]
    new = _start_side_by_side(lambda k: leases[k].ports, 4, tmp_path)
    assert new == [None] * 4, new
    assert len({p for lease in leases for p in lease.ports}) == 8
    for lease in leases:
        lease.release()
    assert json.loads((tmp_path / ports.REGISTRY).read_text()) == {}


def test_an_unwritable_registry_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"  # a folder that cannot be made (as root, a mode would not stop it)
    blocked.write_text("")
    with pytest.raises(ServerError, match="is not writable .*set TMPDIR") as err:
        ports.lease(2, where=blocked / "sub")
    assert "\n" not in str(err.value)


def test_a_dead_owners_reservations_return(tmp_path: Path) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    (tmp_path / ports.REGISTRY).write_text(json.dumps({"20001": int(gone.stdout)}))
    lease = ports.lease(1, where=tmp_path, rng=random.Random(0))
    held = json.loads((tmp_path / ports.REGISTRY).read_text())
    assert "20001" not in held and held == {str(lease.ports[0]): lease.owner}


def test_a_start_up_lost_to_a_taken_port_is_retried_once_on_new_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first lease's HTTP port is taken when the server binds it: the start-up dies with EADDRINUSE, the
    kit sets its log aside, leases new ports and starts again once; provenance.json says so."""
    model = make_model(tmp_path, GLM52_CONFIG)
    real, calls = launch._lease, []
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]

    def first_taken(p):
        calls.append(1)
        got = real(p)
        if len(calls) == 1:  # as if another process bound it between the lease and the server's bind
            got.release()
            got = ports.PortLease((taken, *got.ports[1:]), got.where)
        return got

    monkeypatch.setattr(launch, "_lease", first_taken)
    with holder:
        run_dir = run_on_standin(model, tmp_path)
    prov = json.loads((run_dir / "provenance.json").read_text())
    (retry,) = prov["start_retries"]
    assert retry["port"] == taken and "Address already in use" in retry["why"]
    assert (run_dir / "attempt-1-server.log").is_file() and len(calls) == 2
    assert (run_dir / "outputs.jsonl").is_file()
    plan = json.loads((run_dir / "plan.json").read_text())
    assert str(retry["port"]) not in plan["server_cmd"]


def test_no_free_port_is_one_error_and_leaves_no_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = make_model(tmp_path, GLM52_CONFIG)
    one = ports.lease(1, where=tmp_path).ports[0]
    monkeypatch.setattr(ports, "usable", lambda: range(one, one + 1))
    with socket.socket() as sock:  # the one usable port is taken
        sock.bind(("127.0.0.1", one))
        with pytest.raises(ServerError, match=f"fewer than 2 free TCP ports in {one}..{one}"):
            run_on_standin(model, tmp_path)
    assert not (tmp_path / "runs" / "b").exists() or not any((tmp_path / "runs" / "b").iterdir())


def test_a_chosen_port_in_the_ephemeral_range_runs_with_a_warning(tmp_path: Path) -> None:
    lo, hi = ports.ephemeral_range()
    port = next(p for p in range(lo, hi) if not ports.port_busy(p))
    assert ports.chosen_port_warning(None) is None and ports.chosen_port_warning(ports.usable().start) is None
    run_dir = run_on_standin(make_model(tmp_path, GLM52_CONFIG), tmp_path, port=port)
    warnings = json.loads((run_dir / "provenance.json").read_text())["warnings"]
    assert any(w.startswith(f"port {port} lies in the ephemeral range") for w in warnings), warnings
