"""A neighbour that is alive, and that the coordinator reaches, but that its neighbours
cannot reach (its inbound path cut: a firewall, a lost port forward, a one-way route)
went unnoticed: the link broke once (one ``suspect``, which the coordinator's probe over
the neighbour's own healthy connection refuted), its redials, unanswered or refused,
fired nothing more, nothing was logged, ``swarm status`` showed a healthy swarm, and
every gossip round waited ``send_timeout`` on the dead link's full queue (a lockstep
ring fell from ~9 to ~1.3 rounds a second, for as long as the cut lasted).

Now a link without a handshake for ``LINK_CONNECT_TIMEOUT_S`` is logged once at
WARNING with the neighbour's address and why (no answer, refused), counted
(``unreachable``, in the heartbeat's stats, ``swarm status``, ``--watch`` and
``/metrics``), sends on it fail at once, and its return is logged once.

The neighbour's advertised address is a relay in front of its ROUTER; the bound is set
to 2 s here (10 s in use), as tests/peer/test_link_vanished.py does."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest
from swarmtest import Forwarder, free_port, until

from swarm.cli import format_status, query_status
from swarm.coordinator import Coordinator
from swarm.coordinator.report import PeerRates, format_table, prometheus, status_document
from swarm.peer import Peer
from swarm.peer import peer as peer_mod

BOUND_S = 2.0


def _warnings(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "swarm.peer" and r.levelno == logging.WARNING and text in r.getMessage()]


async def _warned_cannot_reach_b(caplog) -> str:
    """a's one warning that it cannot reach b, once it comes."""
    await until(lambda: _warnings(caplog, "cannot reach b"), 3 * BOUND_S + 5, "a's warning that it cannot reach b")
    (warned,) = _warnings(caplog, "cannot reach b")
    return warned


@pytest.fixture
def relayed(monkeypatch, caplog) -> tuple[Forwarder, int]:
    """The relay that stands for b's advertised address, and the port b binds; the bound
    at BOUND_S, and the peers' log in ``caplog``."""
    monkeypatch.setattr(peer_mod, "LINK_CONNECT_TIMEOUT_S", BOUND_S)
    caplog.set_level(logging.INFO, logger="swarm.peer")
    b_port = free_port()
    return Forwarder(("127.0.0.1", free_port()), ("127.0.0.1", b_port)), b_port


@contextlib.asynccontextmanager
async def _linked(relay: Forwarder, b_port: int, got: list[str]):
    """A coordinator, a, and b behind ``relay`` (its advertised address), linked to each
    other; what b gets as "tick" goes into ``got``. All closed on the way out."""
    coord = Coordinator(bind="tcp://127.0.0.1:*", http_bind="")
    peers: list[Peer] = []
    try:
        await coord.start()
        await relay.up()
        peers.append(Peer(id="a", coordinators=[coord.address], rank=0))
        await peers[0].start()
        peers.append(Peer(id="b", coordinators=[coord.address], rank=1, bind=f"tcp://127.0.0.1:{b_port}",
                          advertise=f"tcp://127.0.0.1:{relay.listen[1]}"))
        await peers[1].start()
        a, b = peers
        b.on("tick", lambda m: got.append(m.src))
        for p in peers:
            await p.wait_view(lambda v: len(v.members) == 2, 10)
            await p.wait_linked(10)
        yield coord, a, b
    finally:
        for p in peers:
            await p.close()
        await coord.close()
        relay.close()


def test_a_neighbour_that_does_not_answer_is_logged_counted_shown_and_not_waited_for(
        syns_dropped_when_full, relayed, caplog):
    (relay, b_port), got = relayed, []
    relay_port = relay.listen[1]

    async def main() -> None:
        async with _linked(relay, b_port, got) as (coord, a, b):
            relay.vanish()   # b's advertised address no longer answers; b's own connections are fine

            warned = await _warned_cannot_reach_b(caplog)
            assert f"tcp://127.0.0.1:{relay_port}" in warned and "does not answer" in warned, warned
            assert a.counters.unreachable == 1 and b.counters.unreachable == 0
            assert a.view.member("b") is not None   # the coordinator still lists b: it reaches it

            # a send to b fails at once, as to a full queue, not after its timeout: before,
            # once the queue had filled, each one waited its whole timeout
            while a.send_nowait("b", "tick"):
                pass
            dropped = a.counters.dropped_out
            assert await asyncio.wait_for(a.send("b", "tick", timeout=3600), 10) is False
            assert a.counters.dropped_out == dropped + 1

            # swarm status, --watch and /metrics show it, on a's row (b reaches a)
            def a_lists_b(st: dict) -> bool:
                rows = {r["id"]: r for r in st["members"]}
                return rows["a"]["stats"].get("unreachable_ids") == ["b"]

            st = None
            for _ in range(100):
                st = await query_status(coord.address, 2.0)
                if a_lists_b(st):
                    break
                await asyncio.sleep(0.1)
            assert a_lists_b(st), st
            assert {r["id"]: r["stats"]["unreachable"] for r in st["members"]} == {"a": 1, "b": 0}
            (a_line,) = [ln for ln in format_status(st).splitlines() if ln.startswith("a ")]
            assert "cannot reach b" in a_line, format_status(st)
            doc = status_document(st, PeerRates())
            rows = {p["id"]: p for p in doc["peers"]}
            assert rows["a"]["unreachable"] == 1 and rows["a"]["last_error"].startswith("cannot reach b")
            assert rows["b"]["unreachable"] == 0 and "cannot reach" not in rows["b"]["last_error"]
            assert 'swarm_peer_unreachable_neighbours{run="",peer="a",rank="0"} 1' in prometheus(doc)
            (a_row,) = [ln for ln in format_table(doc, width=1000).splitlines() if ln.startswith("a ")]
            assert "cannot reach b" in a_row, a_row
            assert len(_warnings(caplog, "cannot reach b")) == 1   # once, not at every redial

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_refused_neighbour_is_logged_once_and_again_once_it_is_back(relayed, caplog):
    (relay, b_port), got = relayed, []
    relay_port = relay.listen[1]

    async def main() -> None:
        async with _linked(relay, b_port, got) as (coord, a, b):
            # nothing listens at b's advertised address any more (connections refused), and
            # the connection through it is cut
            relay.server.close()
            relay.server = None
            relay.cut()

            warned = await _warned_cannot_reach_b(caplog)
            assert f"tcp://127.0.0.1:{relay_port}" in warned and "refuses" in warned, warned
            assert a.counters.unreachable == 1
            assert await a.send("b", "tick", timeout=3600) is False

            await relay.up()
            await until(lambda: _warnings(caplog, "reaches b"), 10, "a's word that it reaches b again")
            await until(lambda: a.counters.unreachable == 0, 5, "a's count of unreachable neighbours back at 0")
            assert await a.send("b", "tick", timeout=5) is True
            await until(lambda: got, 5, "a's send reaching b")
            assert len(_warnings(caplog, "cannot reach b")) == 1 and len(_warnings(caplog, "reaches b")) == 1

    asyncio.run(asyncio.wait_for(main(), 60))
