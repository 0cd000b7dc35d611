"""A relay recognises copies by (origin, number) within a window of _SEQ_WINDOW numbers
below the origin's newest; one older than that is dropped as seen. It may have been a
first copy, held up on a way that stalled (a forwarder frozen past its death passes on
what it held once it wakes) while the origin's later messages came another way: its
gradient is then lost, and ``stats.stale`` counts it apart from the copies within the
window. Real peers on loopback; the held-up forwarder is played by a peer that sends
such a message itself."""

from __future__ import annotations

import time

import numpy as np
from swarmtest import free_port

from swarm.gossip import GradientRelay
from swarm.gossip.relay import _SEQ_WINDOW, GRAD
from swarm.peer import SyncPeer

D = 4
META = {"codec": "identity", "n": D}


def test_a_message_older_than_the_window_is_dropped_and_counted_stale(procs):
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs.start("coordinator", "--bind", addr, name="coord")
    peers: list[SyncPeer] = []
    relay = None
    try:
        for r, pid in enumerate(["r", "o", "f"]):
            peers.append(SyncPeer(coordinators=[addr], id=pid, rank=r, topology="full", join_timeout_s=20).start())
        for sp in peers:
            sp.call(sp.peer.wait_view(lambda v: len(v.members) == 3, timeout=20), timeout=25)
        receiver, origin, forwarder = peers

        async def make() -> GradientRelay:
            return GradientRelay(receiver.peer, D)
        relay = receiver.call(make())

        def send(sp: SyncPeer, seq: int) -> None:
            body = {"o": "o", "s": seq, "h": 1, "c": 0, "meta": META}
            assert sp.send("r", GRAD, body, [np.full(D, float(seq), np.float32)], timeout=5)

        def arrived(n: int) -> None:
            deadline = time.monotonic() + 20
            while relay.stats.received + relay.stats.duplicates < n:
                assert time.monotonic() < deadline, relay.stats
                time.sleep(0.01)

        top = 10 * _SEQ_WINDOW
        send(origin, top)                          # the origin's newest, straight from it
        send(forwarder, top)                       # its copy, the long way round
        send(forwarder, top - 10)                  # within the window, never seen: taken
        arrived(3)
        s = relay.stats
        assert (s.received, s.duplicates, s.stale) == (2, 1, 0), s
        send(forwarder, top - _SEQ_WINDOW)         # too old to tell: dropped, counted stale
        arrived(4)
        assert (s.received, s.duplicates, s.stale) == (2, 2, 1), s
        assert sorted(float(g[0]) for g in relay.take()) == [top - 10, top]
    finally:
        if relay is not None:
            relay.close()
        for sp in peers:
            sp.close()
