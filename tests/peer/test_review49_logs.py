"""Review 49: what a peer's and a coordinator's logs say of junk, of a coordinator
outage, and of a frozen peer that thaws after its rank went to another.

- Malformed messages were logged at most once per 10 s per ZMQ connection (its routing
  id), which a sender makes anew for free: a flood over new connections logged one
  line per frame, each naming the sender by an opaque routing id, not its address.
- A peer with one coordinator address logged nothing when the coordinator went away,
  nor when it came back.
- A peer started without a rank, frozen until declared dead while a new peer took its
  rank, was refused on thawing ("rank 0 is held by ...; another process holds this
  peer's place") and stopped for good, though it had never asked for that rank.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys

import zmq
import zmq.asyncio
from swarmtest import ROOT, free_port, freeze, reap_all, until

from swarm import transport
from swarm.coordinator import Coordinator
from swarm.coordinator.table import ALIVE, DEAD
from swarm.errors import WireError
from swarm.peer import Peer

DROPPED = "dropped malformed message"


def _dropped(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "swarm.transport" and DROPPED in r.getMessage()]


async def _junk_over_new_connections(addr: str, n: int, count) -> None:
    """Send one junk message on each of ``n`` DEALERs opened one after another (a new
    connection, so a new routing id, each), waiting until ``count()`` has seen it."""
    ctx = zmq.asyncio.Context()
    try:
        for i in range(n):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(addr)
            try:
                await s.send_multipart([b"junk", b"\xff\x00garbage"])
                await until(lambda: count() == i + 1, 10, what=f"junk message {i + 1} counted")
            finally:
                s.close()
    finally:
        ctx.term()


def test_junk_over_new_connections_to_a_peer_is_logged_once_naming_its_address(caplog, monkeypatch):
    # 50 connections, 50 routing ids: 50 lines before; the window is long here so that
    # a slow machine cannot make a second line due
    monkeypatch.setattr(transport, "BAD_INPUT_LOG_S", 600.0)
    caplog.set_level(logging.WARNING, logger="swarm.transport")

    async def main() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:0", http_bind="") as coord:
            async with Peer(id="p", coordinators=[coord.address]) as peer:
                await _junk_over_new_connections(peer.address, 50, lambda: peer.counters.malformed)
                assert peer.counters.malformed == 50 and peer._bad.count == 50

    asyncio.run(main())
    (line,) = _dropped(caplog)
    assert line.startswith("peer p: dropped malformed message from 127.0.0.1: "), line
    assert "\\x00" not in line, line   # the routing id is left to DEBUG


def test_junk_over_new_connections_to_a_coordinator_is_logged_once_naming_its_address(caplog, monkeypatch):
    monkeypatch.setattr(transport, "BAD_INPUT_LOG_S", 600.0)
    caplog.set_level(logging.WARNING, logger="swarm.transport")

    async def main() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:0", http_bind="") as coord:
            await _junk_over_new_connections(coord.address, 50, lambda: coord.malformed)
            assert coord.malformed == 50 and coord._bad.count == 50

    asyncio.run(main())
    (line,) = _dropped(caplog)
    assert line.startswith("coordinator: dropped malformed message from 127.0.0.1: "), line


def test_junk_under_ever_new_sender_ids_is_logged_a_bounded_number_of_times(caplog, monkeypatch):
    # a handler's WireError is keyed by the src the sender wrote: 50 srcs made 50 lines.
    # A few per window in all, the next saying how many went unlogged
    monkeypatch.setattr(transport, "BAD_INPUT_LOG_S", 600.0)
    bad = transport.BadInput("peer T")
    with caplog.at_level(logging.WARNING, logger="swarm.transport"):
        for i in range(50):
            bad(f"src{i}", WireError("x must be an int"))
    assert bad.count == 50 and bad.by_reason == {"x must be an int": 50}
    logged = len(_dropped(caplog))
    assert 1 <= logged <= 5, _dropped(caplog)
    monkeypatch.setattr(transport, "BAD_INPUT_LOG_S", 0.0)   # the window over
    with caplog.at_level(logging.WARNING, logger="swarm.transport"):
        bad("src0", WireError("x must be an int"))
    assert _dropped(caplog)[-1].endswith(f"(51 dropped so far, {50 - logged} not logged since the last line)"), \
        _dropped(caplog)[-1]


def test_a_lone_coordinator_that_goes_and_comes_back_is_logged_once_each_way(caplog):
    # with one coordinator address the peer said nothing of the outage, at any level
    caplog.set_level(logging.INFO, logger="swarm.peer")
    addr = f"tcp://127.0.0.1:{free_port()}"

    def about_coord() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.name == "swarm.peer" and r.levelno >= logging.WARNING and addr in r.getMessage()]

    async def main() -> None:
        coord = Coordinator(bind=addr, http_bind="", rejoin_grace_s=0.2)
        await coord.start()
        peer = Peer(id="p", coordinators=[addr])
        try:
            await peer.start()
            e0 = peer.epoch
            await coord.close()
            await until(about_coord, 10, what="the outage logged")
            await asyncio.sleep(3)   # no more lines while it lasts
            (lost,) = about_coord()
            assert lost == (f"peer p: lost its connection to coordinator {addr}; the view cannot change until "
                            "it is back; is it running?"), lost
            coord = Coordinator(bind=addr, http_bind="", rejoin_grace_s=0.2)
            await coord.start()
            await peer.wait_view(lambda v: v.epoch > e0 and v.member("p") is not None, timeout=15)
            await until(lambda: len(about_coord()) == 2, 10, what="the return logged")
            await asyncio.sleep(5)
            lines = about_coord()
            assert len(lines) == 2, lines
            assert lines[1].startswith(f"peer p: coordinator {addr} answers again after "), lines[1]
            assert "(rejoined, epoch " in lines[1], lines[1]
        finally:
            await peer.close()
            await coord.close()

    asyncio.run(main())


_FROZEN = r"""
import asyncio, logging, sys
from swarm import Peer

logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")

async def main():
    p = Peer(coordinators=[sys.argv[1]], id="a")   # no rank: the coordinator picks
    await p.start()
    print("joined", p.rank, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    print("state", p.state.value, p.rank, flush=True)
    await p.close()
    print("closed", flush=True)

asyncio.run(main())
"""


def test_a_frozen_peer_whose_rank_was_given_away_rejoins_under_another(tmp_path):
    # it asked for no rank, yet its rejoin asked for the one it had been given: refused,
    # "another process holds this peer's place", and the process stopped
    out = tmp_path / "a.log"

    async def main() -> None:
        procs: list[subprocess.Popen] = []
        try:
            async with Coordinator(bind="tcp://127.0.0.1:0", http_bind="") as coord:
                with open(out, "w") as f:
                    a = subprocess.Popen([sys.executable, "-c", _FROZEN, coord.address], stdin=subprocess.PIPE,
                                         stdout=f, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
                procs.append(a)
                await until(lambda: "joined 0" in out.read_text(), 30, what="peer a joined with rank 0")
                await asyncio.to_thread(freeze, a.pid)
                b = Peer(id="b", coordinators=[coord.address])   # no rank either
                try:
                    try:
                        await until(lambda: coord.table.get("a").state == DEAD, 15, what="frozen a declared dead")
                        await b.start()
                        assert b.rank == 0   # a's, free
                    finally:
                        os.kill(a.pid, signal.SIGCONT)
                    await until(lambda: coord.table.get("a").state == ALIVE, 15, what="a back in the table")
                    await b.wait_view(lambda v: set(v.ids) == {"a", "b"}, timeout=15)
                    ranks = {m.id: m.rank for m in b.view.members}
                    assert ranks["a"] != ranks["b"], ranks
                    a.stdin.write("\n")
                    a.stdin.flush()
                    await until(lambda: "closed" in out.read_text(), 15, what="a closed")
                finally:
                    await b.close()
                assert await asyncio.to_thread(a.wait, 15) == 0
            log = out.read_text()
            assert f"state running {ranks['a']}" in log, log
            assert "ERROR" not in log and "another process holds" not in log, log
        finally:
            reap_all(procs)

    asyncio.run(main())
