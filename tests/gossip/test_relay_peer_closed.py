"""A relay whose peer closed first (its loop failed, say, and it left) says so with a
GossipError at every call of the consumer thread, on real peers, direct or not."""

from __future__ import annotations

import numpy as np
import pytest
from swarmtest import start_sync_ring

from swarm.errors import GossipError
from swarm.gossip import GradientRelay

D = 8


@pytest.mark.parametrize("direct", [True, False])
def test_every_call_after_the_peer_closed_raises_gossip_error(procs, direct):
    """With direct, poll, wait and take raised a raw zmq.ZMQError ("Socket operation on
    non-socket") once the peer had closed the relay's inbox, and publish returned as if
    it had sent; without, publish raised RuntimeError("Event loop is closed") and wait
    and take went on as if the peer were there. Each now raises GossipError saying the
    peer closed, and publish counts nothing as published."""
    peers, relays = [], []
    try:
        start_sync_ring(procs, peers, 2, "q")

        async def make(sp):
            return GradientRelay(sp.peer, D, direct=direct)
        relays = [sp.call(make(sp)) for sp in peers]
        if direct:
            assert all(r.ready(timeout=10) for r in relays)
        peers[0].close()   # before its relay
        r = relays[0]
        calls = {"poll": r.poll, "wait": lambda: r.wait(5, 0.1), "take": r.take,
                 "publish": lambda: r.publish(np.ones(D, np.float32), clock=0)}
        if direct:
            calls["ready"] = lambda: r.ready(timeout=0.1)
        for name, call in calls.items():
            with pytest.raises(GossipError, match="relay q0: its peer closed"):
                call()
        assert r.stats.published == 0 and r.stats.sent == 0
        r.close()   # closing it again does nothing
    finally:
        for rr in relays:
            rr.close()
        for sp in peers:
            sp.close()
