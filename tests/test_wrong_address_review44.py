"""`swarm status` and `swarm peer` pointed at the wrong thing (forty-fourth review): a
peer's address, copied from its first line, was blamed on the timeout; a frozen
coordinator (or anything that accepts a TCP connection and never speaks ZeroMQ) was
called not running, or a keys problem. Real processes and sockets on loopback; each
process and socket is ended by its handle, also on failure."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import subprocess
import threading

import pytest
from swarmtest import ROOT, SWARM, free_port, freeze, wait_for

from swarm.cli import StatusUnavailable, query_status
from swarm.coordinator import Coordinator
from swarm.peer import Peer

ENV = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
for _key in ("SWARM_PARENT_PID", "SWARM_COORDINATOR"):
    ENV.pop(_key, None)


def swarm(*args: str) -> subprocess.CompletedProcess:
    """``swarm ARGS`` run to its end."""
    return subprocess.run([*SWARM, *args], capture_output=True, text=True, timeout=120, cwd=ROOT, env=ENV)


def test_status_and_join_at_a_peers_address_are_refused_by_that_peer(procs):
    """A peer's address given as --coordinator: the handshake with the peer's ROUTER
    succeeds, and the peer dropped `status` and `join` without a word, so both commands
    said the coordinator was busy or far away and to raise the timeout, which never
    helps. The peer now answers each with why: it is a peer, and where its coordinator is."""
    coord = procs.coordinator(None)
    at = f"tcp://127.0.0.1:{free_port()}"
    peer = procs.start("peer", "--id", "a", "--coordinator", coord.addr, "--bind", at, name="peer")
    wait_for(lambda: f"swarm peer a on {at}" in procs.log(peer), 60, what="the peer's first line")
    said = f"{at} is a swarm peer, not a coordinator; its coordinator is {coord.addr}"

    done = swarm("status", "--coordinator", at, "--timeout", "30")
    assert done.returncode == 2, done
    assert said in done.stderr and "busy or far away" not in done.stderr, done.stderr

    done = swarm("peer", "--id", "b", "--coordinator", at, "--set", "peer.join_timeout_s=30")
    assert done.returncode == 2, done
    assert said in done.stderr and "busy or far away" not in done.stderr, done.stderr
    assert peer.poll() is None, procs.log(peer)   # the peer that answered goes on


def test_status_at_a_peers_address_does_not_call_it_a_coordinator():
    """The peer's answer to `status` says it is no coordinator; the query's error began
    "coordinator at ADDR answered", naming the peer a coordinator in the same line."""
    async def main() -> str:
        async with Coordinator(bind="tcp://127.0.0.1:*", http_bind="") as coord:
            async with Peer(id="a", coordinators=[coord.address]) as peer:
                with pytest.raises(StatusUnavailable) as got:
                    await query_status(peer.address, 10.0)
                return str(got.value), peer.address
    said, at = asyncio.run(main())
    assert said.startswith(f"{at} answered but cannot send its status: {at} is a swarm peer, not a coordinator"), said


def _accepted_but_unanswered(addr: str) -> None:
    """Both commands at ``addr``, where a connection is accepted and its ZeroMQ handshake
    never answered: they say so, and blame neither keys nor a process not running."""
    said = f"a connection to {addr} was accepted but its handshake was never answered"
    done = swarm("status", "--coordinator", addr, "--timeout", "1")
    assert done.returncode == 2, done
    assert said in done.stderr and "--keys" not in done.stderr, done.stderr
    done = swarm("peer", "--id", "b", "--coordinator", addr, "--set", "peer.join_timeout_s=2")
    assert done.returncode == 2, done
    assert said in done.stderr and "--keys" not in done.stderr and "running there" not in done.stderr, \
        done.stderr


def test_a_frozen_coordinator_is_said_to_be_frozen_not_down_nor_keyed(procs):
    """A coordinator stopped with SIGSTOP: the kernel still accepts connections, nothing
    answers the handshake. `swarm status` hinted at --keys, `swarm peer` asked whether a
    coordinator runs there (it does, without keys)."""
    coord = procs.coordinator(None)
    try:
        freeze(coord.pid)
        _accepted_but_unanswered(coord.addr)
    finally:
        os.kill(coord.pid, signal.SIGCONT)
        coord.terminate()
        coord.wait(30)


def test_a_listener_that_never_speaks_zeromq_is_said_to_be_silent():
    """A plain TCP listener: the kernel accepts the connection, nothing is ever written."""
    listener = socket.socket()
    try:
        listener.bind(("127.0.0.1", free_port()))
        listener.listen(16)
        _accepted_but_unanswered(f"tcp://127.0.0.1:{listener.getsockname()[1]}")
    finally:
        listener.close()


class _ClosesOnce:
    """A TCP listener on loopback that resets its first connection as a ZeroMQ handshake
    begins (what a server with other keys does) and holds the later ones in silence."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", free_port()))
        self.listener.listen(16)
        self.addr = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.listener.accept()
            except OSError:   # closed
                return
            self.held.append(c)
            if len(self.held) == 1:
                c.recv(10)   # the greeting begins
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                c.close()    # a reset

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(10)
        for c in self.held:
            c.close()


@pytest.mark.slow
def test_both_commands_tell_an_address_that_once_refused_a_handshake_alike():
    """An address that closed one handshake (ZeroMQ with other keys answers so), then
    let one time out (libzmq's 30 s): `swarm status` took the close as an answer, and
    `swarm peer` forgot it once the timeout came (its count of closes in a row went
    back to 0) and called the address silent. Both now go by whether a handshake there
    was ever refused."""
    wait = "34"   # past the 30 s handshake timeout, which follows the close
    listeners = [_ClosesOnce(), _ClosesOnce()]
    runs: list[subprocess.Popen] = []
    try:
        status, peer = listeners
        runs.append(subprocess.Popen([*SWARM, "status", "--coordinator", status.addr, "--timeout", wait],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV))
        runs.append(subprocess.Popen([*SWARM, "peer", "--id", "b", "--coordinator", peer.addr,
                                      "--set", f"peer.join_timeout_s={wait}"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV))
        for run, listener in zip(runs, listeners):
            _, err = run.communicate(timeout=100)
            assert run.returncode == 2, err
            assert f"no coordinator answered at {listener.addr} within" in err, err
            assert "was accepted but its handshake was never answered" not in err, err
            assert len(listener.held) >= 2, err   # the reset, then one held in silence
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.communicate()
        for listener in listeners:
            listener.close()
