"""Sharing beside replication sends each item once to a neighbour that holds replicas.

Before, with ``share > 0`` and ``replicas >= 1`` every shared item went to each of
the first ``replicas`` neighbours twice in the same flush: as a share push (no ack)
and as a replication push (with ack), which the receiver dropped as a duplicate.
Measured in a 2-peer ``swarm run`` (share 1.0, replicas 1): 3,040 items pushed for
1,500 added, 1,410 duplicates at the receiver. Both pushes store the item the same
way (same buffer, same id, same priority clip); the replication push also bypasses
the receiver's sample-to-insert limiter and is acknowledged, so it alone suffices.
"""

import asyncio

import numpy as np
import pytest

from fakelink import Hub
from swarm.buffer import Federation, ReplayBuffer
from swarm.buffer.limiter import TokenBucket

SCHEMA = {"obs": ("float32", (2,))}


def obs(n, start=0):
    return {"obs": np.tile(np.arange(start, start + n, dtype=np.float32)[:, None], (1, 2))}


def seqs(buf):
    return sorted(s for _, s in buf.ids())


def peer(hub, name, nbrs, **kw):
    buf = ReplayBuffer(SCHEMA, 1000, first_seq=0, peer_id=name)
    return buf, Federation(buf, hub.link(name, nbrs), seed=1, **kw)


def raising_once(link, t, dst):
    """``link.send`` raises the first time it is asked to send a ``t`` to ``dst``."""
    orig, armed = link.send, [True]

    async def send(to, typ, *args, **kw):
        if armed[0] and typ == t and to == dst:
            armed[0] = False
            raise RuntimeError("link down")
        return await orig(to, typ, *args, **kw)

    link.send = send


@pytest.mark.parametrize("share", [1.0, 0.1])   # 0.1: Federation's default
def test_two_peers_sharing_and_replicating_send_each_item_once(share):
    """Before: share=1.0 pushed 200 items for 100 (100 duplicates at b); 0.1 pushed 110."""
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b"], share=share, replicas=1)
        b, fb = peer(hub, "b", ["a"], share=share, replicas=1)
        try:
            for k in range(4):                     # several flushes, both ways
                a.add(obs(25, 25 * k))
                b.add(obs(25, 25 * k))
                await fa.flush()
                await fb.flush()
                await hub.settle()
        finally:
            await hub.close()
        for src, dst, fsrc, fdst in ((a, b, fa, fb), (b, a, fb, fa)):
            assert [s for p, s in dst.ids() if p == src.peer_id] == list(range(100))
            assert fsrc.stats.pushed == 100 and fdst.stats.received == 100
            assert fdst.stats.duplicates == 0 and fdst.stats.stored == 100
            assert len(fsrc.take_acknowledged()) == 100 and fsrc.stats.under_replicated == 0
            assert fsrc.stats.throttled == 0 and fsrc.stats.resent == 0
    asyncio.run(main())


def test_a_replica_target_gets_its_items_once_and_the_other_neighbour_the_share():
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b", "c"], share=1.0, replicas=1)
        b, fb = peer(hub, "b", ["a"])
        c, fc = peer(hub, "c", ["a"])
        a.add(obs(40))
        try:
            assert await fa.flush() == 80
            await hub.settle()
        finally:
            await hub.close()
        assert seqs(b) == seqs(c) == list(range(40))
        assert fb.stats.received == fc.stats.received == 40          # before: b 80
        assert fb.stats.duplicates == fc.stats.duplicates == 0
        assert fa.stats.pushed == 80 and len(fa.take_acknowledged()) == 40
    asyncio.run(main())


def test_a_replicated_item_takes_no_share_tokens():
    """Before: the share push to the target b spent the burst of 10, and c got nothing."""
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b", "c"], share=1.0, replicas=1)
        fa.bucket = TokenBucket(1.0, 10, clock=lambda: 0.0)   # 10 tokens, never refilled
        b, fb = peer(hub, "b", ["a"])
        c, fc = peer(hub, "c", ["a"])
        a.add(obs(30))
        try:
            await fa.flush()
            await hub.settle()
        finally:
            await hub.close()
        assert seqs(b) == list(range(30))                  # replication is not throttled
        assert seqs(c) == list(range(20, 30))              # the newest 10, within the rate
        assert fa.stats.throttled == 20 and fa.stats.pushed == 40
        assert fb.stats.duplicates == 0
    asyncio.run(main())


def test_items_owed_to_a_neighbour_that_becomes_a_target_go_once():
    """A share to c raised, so its items stay owed to c; then b (the target) dies and c
    is the target. Before: c got them as the owed share and as replicas (40 duplicates)."""
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b", "c"], share=1.0, replicas=1)
        b, fb = peer(hub, "b", ["a"])
        c, fc = peer(hub, "c", ["a"])
        raising_once(fa.link, "buf.push", "c")
        a.add(obs(40))
        try:
            with pytest.raises(RuntimeError, match="link down"):
                await fa.flush()
            await hub.settle()
            assert fa._owed["c"].size == 40 and len(c) == 0
            hub.kill("b")
            await fa.flush()
            await hub.settle()
        finally:
            await hub.close()
        assert seqs(c) == list(range(40))
        assert fc.stats.received == 40 and fc.stats.duplicates == 0
        assert fa._owed == {} and len(fa.take_acknowledged()) == 40
    asyncio.run(main())


def test_a_replication_push_that_raised_goes_at_the_next_flush_as_the_only_copy():
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b"], share=1.0, replicas=1, ack_timeout=600.0)
        b, fb = peer(hub, "b", ["a"])
        raising_once(fa.link, "buf.push", "b")
        a.add(obs(10))
        try:
            with pytest.raises(RuntimeError, match="link down"):
                await fa.flush()
            await hub.settle()
            assert len(b) == 0 and fa.stats.under_replicated == 10
            assert await fa.flush() == 10
            await hub.settle()
        finally:
            await hub.close()
        assert seqs(b) == list(range(10)) and fb.stats.duplicates == 0
        assert len(fa.take_acknowledged()) == 10 and fa.stats.resent == 0
    asyncio.run(main())


def test_riding_leaves_to_replication_the_neighbours_that_all_hold_replicas():
    """ride=True: a's only neighbour is its replica target, so nothing rides (before: each
    item rode to b and was pushed to it again by flush). With a neighbour that is not a
    target beside it, the ride goes, to both (one message for all neighbours)."""
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b"], share=1.0, replicas=1, ride=True)
        b, fb = peer(hub, "b", ["a"])
        a.add(obs(20))
        assert fa.ride() is None
        try:
            assert await fa.flush() == 20
            await hub.settle()
        finally:
            await hub.close()
        assert seqs(b) == list(range(20)) and fb.stats.duplicates == 0
        assert fa.stats.pushed == 20 and len(fa.take_acknowledged()) == 20

        hub = Hub()
        a, fa = peer(hub, "a", ["b", "c"], share=1.0, replicas=1, ride=True)
        a.add(obs(5))
        body, arrays = fa.ride()
        assert arrays[-3].tolist() == list(range(5)) and fa.stats.pushed == 2 * 5
    asyncio.run(main())
