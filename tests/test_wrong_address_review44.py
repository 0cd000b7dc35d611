"""`swarm status` and `swarm peer` pointed at the wrong thing (forty-fourth review): a
peer's address, copied from its first line, was blamed on the timeout; a frozen
coordinator (or anything that accepts a TCP connection and never speaks ZeroMQ) was
called not running, or a keys problem. Real processes and sockets on loopback; each
process and socket is ended by its handle, also on failure."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

from swarmtest import ROOT, SWARM, free_port, freeze, wait_for

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
