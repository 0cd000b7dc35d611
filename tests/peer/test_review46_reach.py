"""With the coordinator down (killed, frozen), a neighbour that died or froze was logged,
``LINK_CONNECT_TIMEOUT_S`` later, as a neighbour whose address takes no connections from
this host while "the coordinator reaches it over its own connection": both false then
(the coordinator reaches nobody; the neighbour is gone), and the advice sent the
operator to check addresses that were fine (review rW). Now, while the peer's own
connection to its coordinator is down, the warning says that the coordinator does not
answer, so the view cannot drop a neighbour that died or froze; with the coordinator
up it reads as before.

The bound is set to 2 s here (10 s in use), as tests/peer/test_unreachable_review45.py does."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest
from swarmtest import freeze, until

from peer.test_unreachable_review45 import BOUND_S, _linked, _warned_cannot_reach_b, relayed  # noqa: F401 (a fixture)
from swarm.peer import Peer
from swarm.peer import peer as peer_mod

COORD_UP = "The view still lists b (the coordinator reaches it over its own connection)"


@pytest.mark.parametrize("fault", ["killed", "frozen"])
def test_a_neighbour_lost_while_the_coordinator_is_down_is_not_blamed_on_its_address(
        procs, monkeypatch, caplog, fault):
    monkeypatch.setattr(peer_mod, "LINK_CONNECT_TIMEOUT_S", BOUND_S)
    caplog.set_level(logging.INFO, logger="swarm.peer")
    coord = procs.coordinator(None)
    b = procs.start("peer", "--coordinator", coord.addr, "--id", "b", name="b")

    async def main() -> None:
        a = Peer(id="a", coordinators=[coord.addr], join_timeout_s=20)
        try:
            await a.start()
            await a.wait_view(lambda v: v.member("b") is not None, 20)
            await a.wait_linked(20)
            coord.kill()
            coord.wait()
            await until(lambda: not a._dials[0].up, 10, "a's connection to the coordinator down")
            if fault == "killed":
                b.kill()
                b.wait()
            else:
                await asyncio.to_thread(freeze, b.pid)
            warned = await _warned_cannot_reach_b(caplog)
            assert COORD_UP not in warned, warned
            assert f"The coordinator {coord.addr} does not answer either" in warned, warned
            assert "so the view cannot drop b if it died or froze" in warned, warned
        finally:
            await a.close()

    try:
        asyncio.run(asyncio.wait_for(main(), 90))
    finally:
        if b.poll() is None:
            os.kill(b.pid, signal.SIGCONT)


def test_a_neighbour_the_coordinator_reaches_is_still_blamed_on_its_address(relayed, caplog):
    # the coordinator up: the wording is the one from before, that names the address
    relay, b_port = relayed

    async def main() -> None:
        async with _linked(relay, b_port, []) as (coord, a, b):
            relay.server.close()
            relay.server = None
            relay.cut()
            warned = await _warned_cannot_reach_b(caplog)
            assert COORD_UP in warned and "check that its address (its peer.advertise)" in warned, warned
            assert "does not answer either" not in warned, warned

    asyncio.run(asyncio.wait_for(main(), 60))
