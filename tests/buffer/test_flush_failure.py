"""A send that raises loses no item: what it carried goes at the next flush (or ride).

Before, a flush took its new items off the list before sending: a send that raised
(the link failed, the wire refused the message) lost them, to sharing and, when the
share step raised first, to replication too.
"""

import asyncio
import logging
import math

import numpy as np
import pytest

from fakelink import Hub
from swarm import wire
from swarm.buffer import Federation, ReplayBuffer
from swarm.errors import ReplayError

SCHEMA = {"obs": ("float32", (2,))}


def obs(n, start=0):
    return {"obs": np.tile(np.arange(start, start + n, dtype=np.float32)[:, None], (1, 2))}


def seqs(buf):
    return sorted(s for _, s in buf.ids())


def raising_once(link, t, dst=None, exc=RuntimeError("link down")):
    """``link.send`` raises ``exc`` the first time it is asked to send a ``t`` (to ``dst``);
    returns the (dst, type) of every send that went through."""
    went, orig, armed = [], link.send, [True]

    async def send(to, typ, *args, **kw):
        if armed[0] and typ == t and dst in (None, to):
            armed[0] = False
            raise exc
        ok = await orig(to, typ, *args, **kw)
        went.append((to, typ))
        return ok

    link.send = send
    return went


def limited(link, max_bytes):
    """``link.send`` refuses, as a peer with a small ``max_message_mb`` does, a message
    over ``max_bytes`` (a WireError from the real encoder, before anything is sent)."""
    orig, limits = link.send, wire.Limits(max_message_bytes=max_bytes)

    async def send(dst, t, body=None, arrays=(), **kw):
        wire.encode(t, link.id, body=body, arrays=arrays, limits=limits)
        return await orig(dst, t, body, arrays, **kw)

    link.send = send


def test_shared_items_go_at_the_next_flush_after_a_send_raised():
    async def main():
        hub = Hub()
        a = ReplayBuffer(SCHEMA, 64, first_seq=0, peer_id="a")
        la = hub.link("a", ["b", "c"])
        fa = Federation(a, la, share=1.0)
        b, c = ReplayBuffer(SCHEMA, 64, peer_id="b"), ReplayBuffer(SCHEMA, 64, peer_id="c")
        fb, fc = Federation(b, hub.link("b", ["a"])), Federation(c, hub.link("c", ["a"]))
        raising_once(la, "buf.push", dst="b")
        a.add(obs(5))
        try:
            with pytest.raises(RuntimeError, match="link down"):
                await fa.flush()
            await hub.settle()
            assert len(b) == 0
            a.add(obs(2, 5))
            assert await fa.flush() == 2 * 7
            await hub.settle()
        finally:
            await hub.close()
        assert seqs(b) == seqs(c) == list(range(7))
        assert fb.stats.duplicates == fc.stats.duplicates == 0   # each went once
        assert fa.stats.pushed == 14 and fa._owed == {}
    asyncio.run(main())


def test_a_share_that_raised_loses_no_item_to_replication():
    """Before: the share step raised before the new items were put in the replica
    table: they were neither shared nor ever replicated (under_replicated 0). The
    share goes to c; b, the replica target, gets no share push of them."""
    async def main():
        hub = Hub()
        a = ReplayBuffer(SCHEMA, 64, first_seq=0, peer_id="a")
        la = hub.link("a", ["b", "c"])
        fa = Federation(a, la, share=1.0, replicas=1)
        b = ReplayBuffer(SCHEMA, 64, peer_id="b")
        Federation(b, hub.link("b", ["a"]))
        c = ReplayBuffer(SCHEMA, 64, peer_id="c")
        Federation(c, hub.link("c", ["a"]))
        went = raising_once(la, "buf.push", dst="c")
        a.add(obs(3))
        try:
            with pytest.raises(RuntimeError):
                await fa.flush()
            assert fa.stats.under_replicated == 3 and went == [("b", "buf.resync"), ("c", "buf.resync")]
            await fa.flush()
            await hub.settle()
        finally:
            await hub.close()
        assert seqs(b) == [0, 1, 2] and seqs(c) == [0, 1, 2]
        assert sorted(fa.take_acknowledged()) == [("a", 0), ("a", 1), ("a", 2)]
        assert fa.stats.under_replicated == 0
    asyncio.run(main())


def test_a_replication_push_that_raised_goes_at_the_next_flush_without_backoff():
    """Before: the push counted as sent; it went again only past ack_timeout, as if its
    target had not answered (and the target's resends were backed off)."""
    async def main():
        hub = Hub()
        a = ReplayBuffer(SCHEMA, 64, first_seq=0, peer_id="a")
        la = hub.link("a", ["b"])
        fa = Federation(a, la, share=0.0, replicas=1, ack_timeout=600.0)
        b = ReplayBuffer(SCHEMA, 64, peer_id="b")
        Federation(b, hub.link("b", ["a"]))
        raising_once(la, "buf.push")
        a.add(obs(4))
        try:
            with pytest.raises(RuntimeError):
                await fa.flush()
            assert fa._inflight == {}
            assert await fa.flush() == 4
            await hub.settle()
        finally:
            await hub.close()
        assert seqs(b) == [0, 1, 2, 3]
        assert len(fa.take_acknowledged()) == 4
        assert fa.stats.resent == 0 and fa._backoff == {}
    asyncio.run(main())


def test_the_first_resync_reaches_every_neighbour_when_a_send_of_it_raised():
    """Before: it was marked sent before the first send: one that raised kept it from the rest."""
    async def main():
        hub = Hub()
        la = hub.link("a", ["b", "c"])
        fa = Federation(ReplayBuffer(SCHEMA, 8, peer_id="a"), la, share=0.0)
        for p in ("b", "c"):
            Federation(ReplayBuffer(SCHEMA, 8, peer_id=p), hub.link(p, ["a"]))
        went = raising_once(la, "buf.resync", dst="b")
        try:
            with pytest.raises(RuntimeError):
                await fa.flush()
            await fa.flush()
            await fa.flush()
        finally:
            await hub.close()
        assert sorted(went) == [("b", "buf.resync"), ("c", "buf.resync")]
    asyncio.run(main())


def test_items_stay_new_when_a_flush_raises_before_sending():
    """A decaying buffer whose clock goes bad: share_by="priority" reads priorities
    (which age by the clock) after the items were taken off the new list."""
    async def main():
        hub = Hub()
        now = [100.0]
        a = ReplayBuffer(SCHEMA, 64, peer_id="a", decay=0.01, clock=lambda: now[0])
        fa = Federation(a, hub.link("a", ["b"]), share=0.5, share_by="priority")
        b = ReplayBuffer(SCHEMA, 64, peer_id="b", clock=lambda: 100.0)
        Federation(b, hub.link("b", ["a"]))
        a.add(obs(4))
        now[0] = math.nan
        try:
            with pytest.raises(ReplayError, match="clock"):
                await fa.flush()
            now[0] = 101.0
            assert await fa.flush() == 2
            await hub.settle()
        finally:
            await hub.close()
        assert len(b) == 2
    asyncio.run(main())


def test_ride_keeps_its_items_when_it_raises():
    now = [100.0]
    a = ReplayBuffer(SCHEMA, 64, peer_id="a", decay=0.01, clock=lambda: now[0])
    fa = Federation(a, Hub().link("a", ["b"]), share=0.5, share_by="priority", ride=True)
    a.add(obs(4))
    now[0] = math.nan
    with pytest.raises(ReplayError, match="clock"):
        fa.ride()                                  # before: the items were gone
    now[0] = 101.0
    body, arrays = fa.ride()
    assert len(arrays[-3]) == 2                    # the seqs: share 0.5 of the 4
    b = ReplayBuffer(SCHEMA, 64, peer_id="b", clock=lambda: 200.0)
    fb = Federation(b, Hub().link("b", ["a"]))
    fb.arrive("a", body, arrays)
    assert len(b) == 2 and fb.stats.dropped_messages == 0


# ----------------------------------------------------- messages the wire refuses
@pytest.mark.parametrize("replicas, share", [(0, 1.0), (1, 0.0)])
def test_a_message_too_large_for_the_wire_goes_in_smaller_ones(replicas, share):
    """Before: the WireError went up out of every flush and the items were lost
    (shared) or never got through (replicated: resent whole each ack_timeout)."""
    async def main():
        hub = Hub()
        a = ReplayBuffer(SCHEMA, 256, first_seq=0, peer_id="a")
        la = hub.link("a", ["b"])
        fa = Federation(a, la, share=share, replicas=replicas)
        b = ReplayBuffer(SCHEMA, 256, peer_id="b")
        Federation(b, hub.link("b", ["a"]))
        limited(la, 3000)                      # ~36 bytes an item: a few dozen per message
        a.add(obs(200))
        try:
            assert await fa.flush() == 200
            await hub.settle()
            a.add(obs(50, 200))
            assert await fa.flush() == 50
            await hub.settle()
        finally:
            await hub.close()
        assert seqs(b) == list(range(250))
        assert 1 < fa._per_message < 200 and fa.stats.unsendable == 0
        if replicas:
            assert len(fa.take_acknowledged()) == 250 and fa.stats.under_replicated == 0
    asyncio.run(main())


@pytest.mark.parametrize("replicas, share", [(0, 1.0), (1, 0.0)])
def test_an_item_too_large_for_the_wire_is_counted_dropped_and_logged(replicas, share, caplog):
    async def main():
        hub = Hub()
        big = {"obs": ("float32", (1000,))}    # 4 kB an item
        a = ReplayBuffer(big, 16, peer_id="a")
        la = hub.link("a", ["b"])
        fa = Federation(a, la, share=share, replicas=replicas)
        Federation(ReplayBuffer(big, 16, peer_id="b"), hub.link("b", ["a"]))
        limited(la, 3000)
        a.add({"obs": np.ones((3, 1000), np.float32)})
        try:
            with caplog.at_level(logging.WARNING, logger="swarm.buffer.federation"):
                assert await fa.flush() == 0
                assert await fa.flush() == 0
        finally:
            await hub.close()
        return fa

    fa = asyncio.run(main())
    assert fa.stats.unsendable == 3
    assert fa._owed == {} and fa.stats.under_replicated == 0 and fa._inflight == {}
    assert "one item" in fa.stats.errors[0]
    assert any("stats.unsendable" in r.getMessage() for r in caplog.records)


def test_a_pull_answer_too_large_for_the_wire_goes_smaller():
    """Before: the answer's WireError went up out of the handler and the pull timed out."""
    async def main():
        hub = Hub()
        a = ReplayBuffer(SCHEMA, 256, peer_id="a", seed=0)
        la = hub.link("a", ["b"])
        fa = Federation(a, la, share=0.0, seed=0)
        a.add(obs(200))
        b = ReplayBuffer(SCHEMA, 256, peer_id="b")
        fb = Federation(b, hub.link("b", ["a"]), share=0.0)
        limited(la, 3000)
        try:
            got = await fb.pull("a", 200, timeout=10.0)
        finally:
            await hub.close()
        return fa, b, got

    fa, b, got = asyncio.run(main())
    assert 0 < got == len(b) < 200 and fa.stats.served == got



def test_a_ride_too_large_for_the_relays_message_rides_again_in_halves():
    """The env steps before a peer's first turn leave 200 frames of 28 kB to ride on its
    first gradient message: more than a 4 MiB message holds. publish() raised WireError
    in the learner's thread (ending training) with the items counted as pushed; now the
    gradient goes alone, the federation halves its rides, and the items go next."""
    from swarm.gossip.relay import GradientRelay
    from swarm.gossip.sim import SimHub

    async def main():
        hub = SimHub(topology="ring")
        a, b = hub.add("a"), hub.add("b")
        a.limits = wire.Limits(max_message_bytes=4 * 1024 * 1024)   # a Peer with max_message_mb = 4
        schema = {"obs": ("uint8", (84, 84, 4))}
        buf, got = ReplayBuffer(schema, capacity=1000, peer_id="a"), ReplayBuffer(schema, capacity=1000, peer_id="b")
        fed = Federation(buf, a, share=1.0, ride=True)
        GradientRelay(b, d=1000, rider=Federation(got, b, share=1.0, ride=True))
        relay = GradientRelay(a, d=1000, rider=fed)
        buf.add({"obs": np.zeros((200, 84, 84, 4), np.uint8)})

        def learner():
            relay.publish(np.zeros(1000, np.float32), clock=0)   # the ride is left off
            relay.publish(np.zeros(1000, np.float32), clock=1)   # the newest 100 ride
            relay.publish(np.zeros(1000, np.float32), clock=2)   # then the other 100
        await asyncio.to_thread(learner)
        await asyncio.sleep(0.1)
        assert (relay.stats.rider_refused, relay.stats.published, fed._ride_cap) == (1, 3, 100)
        assert len(got) == 200 and fed.stats.pushed == 200 and fed.stats.unsendable == 0
        # refused() twice for one ride: the second does nothing (pushed went below 0 and
        # the items were queued twice)
        buf.add({"obs": np.zeros((4, 84, 84, 4), np.uint8)})
        assert fed.ride() is not None and fed.stats.pushed == 204
        fed.refused()
        fed.refused()
        assert fed.stats.pushed == 200 and fed._reride.size == 4
        await hub.close()
    asyncio.run(main())
