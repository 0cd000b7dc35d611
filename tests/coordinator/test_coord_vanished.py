"""A standby whose failed handshakes hold it back, and whose other coordinator's host
then vanishes without a TCP reset (powered off, a cable pulled, a firewall that drops),
takes that one as down within seconds: its dial is not left to the OS, which gives up
after about 127 s. A coordinator that accepts connections but is slow to answer is
not called down by that dial timeout.

The vanished host is a loopback listener whose accept queue is full: the kernel drops
further SYNs unanswered, as for a host that is gone (no root needed)."""

from __future__ import annotations

import asyncio
import socket

import pytest
from swarmtest import answered, free_port, until

from swarm import Coordinator
from swarm.coordinator import server

#: the ZMTP 3.0 greeting of a coordinator that runs with --keys (it offers CURVE, as server):
#: one without keys fails the handshake with a mechanism mismatch, and libzmq gives up on the
#: address, so the standby dials again itself every takeover_s
CURVE_GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"CURVE".ljust(20, b"\0") + b"\x01" + bytes(31)


class Host:
    """A loopback listener whose accept queue holds one connection (backlog 0), and the
    connections a test takes from it or opens to it (closed at the end)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(0)
        host, port = self.sock.getsockname()
        self.addr = f"tcp://{host}:{port}"
        self.held: list[socket.socket] = []

    async def accept(self) -> socket.socket:
        """The standby's dial, accepted."""
        self.sock.settimeout(15)
        conn, _ = await asyncio.to_thread(self.sock.accept)
        self.held.append(conn)
        return conn


@pytest.fixture
def host(caplog, monkeypatch):
    caplog.set_level("WARNING", logger="swarm.coordinator")
    monkeypatch.setattr(server, "CONNECT_TIMEOUT_S", 3.0)   # 10 s in use: the same, sooner
    h = Host()
    yield h
    for s in h.held:
        s.close()
    h.sock.close()


def _standby(host: Host) -> Coordinator:
    return Coordinator(bind=f"tcp://127.0.0.1:{free_port()}", others=[host.addr], http_bind="")


def _greet_and_wait_for_close(conn: socket.socket, timeout: float) -> None:
    conn.settimeout(timeout)
    conn.sendall(CURVE_GREETING)
    while conn.recv(4096):   # the standby's greeting; then it closes: the handshake failed
        pass


def test_a_standby_held_back_by_a_host_that_vanished_takes_over_within_seconds(syns_dropped_when_full, caplog, host):
    # the standby's dial to the vanished host waited for the OS to give up (about 127 s),
    # and until then its failed handshake held it back: no coordinator was active
    async def main() -> None:
        c = _standby(host)
        await c.start()
        try:
            conn = await host.accept()
            await asyncio.to_thread(_greet_and_wait_for_close, conn, 15)
            # the host vanishes: the one place in its accept queue taken (never accepted),
            # the kernel drops every further SYN. The standby dials again only takeover_s
            # after the failed handshake, so this connection gets the place first
            host.held.append(socket.create_connection(host.sock.getsockname(), timeout=2))
            assert not answered(host.sock.getsockname(), 0.5), "a connection to the vanished host was answered"

            await until(lambda: "but not taking over" in caplog.text, 10, what="the failed handshake holding back")
            assert "cannot talk to coordinator" in caplog.text and "runs with --keys" in caplog.text
            assert c.mode == "standby"
            # a generous deadline, far below the OS's 127 s
            await until(lambda: c.mode == "active", 20, what="the standby taking over from the vanished host")
            n = f"{server.CONNECT_TIMEOUT_S:g}"
            assert f"{host.addr}: it did not answer a connection within {n} s" in caplog.text, caplog.text
            assert "no longer hold this one back" in caplog.text and "nothing listens there" not in caplog.text
            (other,) = c.status()["others"]
            assert other["state"] == "no answer", other
            assert other["error"].startswith(f"it did not answer a connection within {n} s"), other
        finally:
            await c.close()

    asyncio.run(main())


def test_a_coordinator_that_accepts_connections_but_is_slow_to_answer_keeps_its_connection(caplog, host):
    # the dial timeout is the TCP connect's alone: a host whose kernel accepts but whose
    # coordinator says nothing for longer (busy, stopped) is left to the handshake's timeout
    async def main() -> None:
        c = _standby(host)
        await c.start()
        try:
            conn = await host.accept()
            conn.settimeout(server.CONNECT_TIMEOUT_S + 2)
            # silent for longer than the dial timeout: the standby must not close this connection
            try:
                while await asyncio.to_thread(conn.recv, 4096):   # its greeting, then nothing
                    pass
                pytest.fail("the standby closed the connection to a host that accepts it but is slow")
            except TimeoutError:
                pass
            assert "did not answer a connection" not in caplog.text, caplog.text
            (other,) = c.status()["others"]
            assert other["state"] == "no answer" and other["error"] == "", other
        finally:
            await c.close()

    asyncio.run(main())
