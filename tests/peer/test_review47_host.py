"""A peer in a host process and at its start (reviews rB and rC of the forty-seventh
session): two Peers of one process without ``id=`` got the same default id, and the
refusal of the second said to pass --id; a Peer built and never started held a zmq
context (a file each, and a ResourceWarning when collected); a ``peer.inbox_port``
already taken failed naming neither the key nor the inbox; a
coordinator name that does not resolve was said only once the join timed out; and a
``--coordinator`` or ``--bind`` with another scheme or a leading space was told that
swarm connects over IPv4 only."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import subprocess
import sys
import textwrap
import warnings

import pytest
from swarmtest import ROOT, free_port, status, wait_for

from swarm import cli
from swarm.coordinator import Coordinator
from swarm.errors import MembershipError, TransportError
from swarm.peer import Peer


def _open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


# ---------------------------------------------------------------- default ids


def test_peers_of_one_process_without_an_id_get_ids_of_their_own():
    """A multi-agent simulator, or a notebook cell run twice: the second start was refused
    ("peer id 'HOST-PID' is already alive ...; choose another --id")."""
    async def main() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*", http_bind="") as coord:
            a = Peer(coordinators=[coord.address])
            b = Peer(coordinators=[coord.address])
            try:
                await a.start()
                await b.start()
                await a.wait_view(lambda v: set(v.ids) == {a.id, b.id}, timeout=10)
            finally:
                await b.close()
                await a.close()
            base = f"{socket.gethostname()}-{os.getpid()}"
            assert a.id.startswith(base) and b.id.startswith(base) and a.id != b.id, (a.id, b.id)

    asyncio.run(main())


def test_the_first_peer_of_a_process_is_host_pid_and_later_ones_are_numbered():
    """Also in a child made by os.fork(): its first Peer is HOST-ITS_PID."""
    script = textwrap.dedent("""
        import os, socket
        from swarm.peer import Peer
        def ids():
            return [Peer(coordinators=["tcp://127.0.0.1:9"]).id for _ in range(3)]
        mine = ids()
        r, w = os.pipe()
        child = os.fork()
        if child == 0:
            os.write(w, repr((os.getpid(), ids())).encode())
            os._exit(0)
        os.close(w)
        theirs = eval(os.read(r, 4096))
        os.waitpid(child, 0)
        print(repr((socket.gethostname(), os.getpid(), mine, theirs)))
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    host, pid, mine, (child, theirs) = eval(p.stdout.strip().splitlines()[-1])
    assert mine == [f"{host}-{pid}", f"{host}-{pid}-2", f"{host}-{pid}-3"]
    assert theirs == [f"{host}-{child}", f"{host}-{child}-2", f"{host}-{child}-3"]


def test_an_id_in_use_is_refused_with_advice_for_the_api_and_the_command_line():
    async def main() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*", http_bind="") as coord:
            a = Peer(id="twin", coordinators=[coord.address])
            b = Peer(id="twin", coordinators=[coord.address])
            try:
                await a.start()
                with pytest.raises(MembershipError) as e:
                    await b.start()
            finally:
                await b.close()
                await a.close()
            said = str(e.value)
            assert "peer id 'twin' is already alive at" in said, said
            assert "id= in the Python API" in said and "--id" in said, said
            assert "another process" not in said and "stop the other process" not in said, said

    asyncio.run(main())


# ---------------------------------------------------------------- a peer never started


def test_a_peer_built_and_never_started_holds_no_context():
    gc.collect()   # what an earlier test of this worker left is closed now, not while counting
    before = _open_files()
    peers = [Peer(id=f"p{i}", coordinators=["tcp://127.0.0.1:9"]) for i in range(5)]
    assert _open_files() <= before   # none more (a collection meanwhile can only close some)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del peers
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]


def test_a_peer_never_started_closes_and_a_started_one_still_has_its_context():
    async def main() -> None:
        idle = Peer(id="idle", coordinators=["tcp://127.0.0.1:9"])
        await idle.close()
        await idle.close()   # twice: nothing more
        async with Coordinator(bind="tcp://127.0.0.1:*", http_bind="") as coord:
            a = Peer(id="a", coordinators=[coord.address])
            try:
                await a.start()
                s, _endpoint = a.open_inbox()   # a side channel uses the context too
                a.close_side(s)
            finally:
                await a.close()

    asyncio.run(main())


# ---------------------------------------------------------------- peer.inbox_port


def test_an_inbox_port_in_use_is_refused_naming_the_key():
    """It said `cannot bind ...: Address already in use`, naming neither the key nor the
    inbox (about 17 s into a run, when the relay opened it)."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]

    async def main() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*", http_bind="") as coord:
            a = Peer(id="a", coordinators=[coord.address], inbox_port=port)
            try:
                await a.start()
                with pytest.raises(TransportError) as e:
                    a.open_inbox()
            finally:
                await a.close()
            assert f"peer.inbox_port = {port}" in str(e.value) and "in use" in str(e.value), str(e.value)

    try:
        asyncio.run(main())
    finally:
        taken.close()


def test_a_fixed_inbox_port_is_bound_only_when_an_inbox_is_opened():
    """Bound by every start for a while (own-diff review): a second peer of the same
    config (gossip.exchange = params, no relay) could not start, and the bound inbox
    nobody read took what anyone sent it."""
    port = free_port()

    async def main() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*", http_bind="") as coord:
            a = Peer(id="a", coordinators=[coord.address], inbox_port=port)
            try:
                await a.start()
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))   # free: no relay asked for it
                s, endpoint = a.open_inbox()
                assert endpoint == f"tcp://127.0.0.1:{port}"
                a.close_side(s)
            finally:
                await a.close()

    asyncio.run(main())


# ---------------------------------------------------------------- the command line


def test_a_coordinator_name_that_does_not_resolve_is_warned_of_at_start(procs, monkeypatch):
    """Nothing was said until the join timed out (60 s with the launcher advice); a
    warning, not a refusal: the name may resolve later (DNS not up yet)."""
    monkeypatch.delenv("SWARM_COORDINATOR", raising=False)
    host = "coordinatr-typo.invalid"
    p = procs.start("peer", "--coordinator", f"tcp://{host}:5555", "--id", "a",
                    "--set", "peer.join_timeout_s=600", name="peer")
    log = wait_for(lambda: "does not resolve" in procs.log(p) and procs.log(p), 60,
                   what="the warning of the name that does not resolve")
    assert p.poll() is None, log   # it goes on waiting for the coordinator
    line = next(ln for ln in log.splitlines() if "does not resolve" in ln)
    assert "WARNING" in line and f"--coordinator 'tcp://{host}:5555'" in line and host in line, line


@pytest.mark.parametrize("addr", ["http://127.0.0.1:5555", "TCP://127.0.0.1:5555", "tcp:/127.0.0.1:5555",
                                  "127.0.0.1:5555"])
@pytest.mark.parametrize("flag", ["--coordinator", "--bind"])
def test_an_address_without_tcp_is_told_the_scheme_not_ipv4(capsys, monkeypatch, flag, addr):
    monkeypatch.delenv("SWARM_COORDINATOR", raising=False)
    args = {"--coordinator": "tcp://127.0.0.1:9", "--bind": "tcp://127.0.0.1:*", flag: addr}
    assert cli.main(["peer", "--id", "a", *(x for kv in args.items() for x in kv)]) == 2
    err = capsys.readouterr().err
    assert f"{flag}" in err and "IPv4 only" not in err and "tcp://HOST:PORT" in err, err


@pytest.mark.parametrize("addr", ["tcp://[::1]:5555", "tcp://::1:5555", "tcp://127.0.0.1:5555:5556"])
def test_an_ipv6_looking_tcp_address_still_gets_the_ipv4_hint(capsys, monkeypatch, addr):
    monkeypatch.delenv("SWARM_COORDINATOR", raising=False)
    assert cli.main(["peer", "--id", "a", "--coordinator", addr]) == 2
    assert "swarm connects over IPv4 only" in capsys.readouterr().err


def test_spaces_around_bind_are_dropped_as_around_coordinator(procs):
    port = free_port()
    coord = procs.start("coordinator", "--bind", f" tcp://127.0.0.1:{port} ", name="coord")
    addr = f"tcp://127.0.0.1:{port}"
    try:
        wait_for(lambda: coord.poll() is None and status(addr, 0.5), 30, what=f"the coordinator at {addr}")
    except AssertionError as e:
        raise AssertionError(f"{e}; its log:\n{procs.log(coord)}") from None
    peer = procs.start("peer", "--coordinator", f" {addr}", "--bind", " tcp://127.0.0.1:* ", "--id", "a",
                       name="peer")
    try:
        wait_for(lambda: any(m["id"] == "a" for m in status(addr, 0.5)["members"]), 30, what="peer a in the view")
    except AssertionError as e:
        raise AssertionError(f"{e}; its log:\n{procs.log(peer)}") from None
