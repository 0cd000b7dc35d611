"""Handlers come off a peer: Peer.off/off_view, and close() on the objects that
register them (Gossip, GradientRelay, Federation), so that an object rebuilt on a
long-lived peer replaces the old one instead of running beside it, and the old
one is freed. Two real peers and a coordinator on loopback, in one event loop."""

from __future__ import annotations

import asyncio
import gc
import weakref

import numpy as np
import pytest
import zmq.asyncio

from swarm import wire
from swarm.buffer import Federation, ReplayBuffer
from swarm.coordinator import Coordinator
from swarm.errors import GossipError, ReplayError
from swarm.gossip import Gossip, GradientRelay
from swarm.peer import Peer
from swarmtest import until

SCHEMA = {"obs": ("float32", (3,)), "action": ("int64", ())}


def items(n: int, start: int = 0) -> dict[str, np.ndarray]:
    k = np.arange(start, start + n)
    return {"obs": np.tile(k[:, None], (1, 3)).astype(np.float32), "action": k}


def two_peers(test):
    """Run ``await test(a, b)`` with two linked peers (a ring of 2); everything is
    closed by its handle, also when the test fails."""
    async def main():
        ctx = zmq.asyncio.Context(io_threads=1)
        coord = Coordinator(bind="tcp://127.0.0.1:*", context=ctx)
        peers: list[Peer] = []
        try:
            await coord.start()
            peers = [Peer(coordinators=[coord.address], id=f"p{i}", rank=i, context=ctx) for i in range(2)]
            await asyncio.gather(*(p.start() for p in peers))
            await until(lambda: all(len(p.view.members) == 2 for p in peers)
                        and peers[0].view.epoch == peers[1].view.epoch, 10.0, "a 2-member view")
            await asyncio.gather(*(p.wait_linked(10.0) for p in peers))
            await test(*peers)
        finally:
            for p in peers:
                await p.close()
            await coord.close()
            ctx.term()
    asyncio.run(main())


def freed(ref: weakref.ref) -> bool:
    gc.collect()
    return ref() is None


def test_off_takes_one_handler_off():
    wire.register_type("t_off.x")
    wire.register_type("t_off.mark")

    async def test(a: Peer, b: Peer) -> None:
        got: list[str] = []
        marks: list[int] = []
        h = lambda msg: got.append(msg.t)   # noqa: E731
        b.on("t_off.x", h)
        b.on("t_off.mark", lambda msg: marks.append(1))
        assert await a.send(b.id, "t_off.x")
        await until(lambda: got, 5.0, "the first message")
        assert b.off("t_off.x", h) is True
        assert b.off("t_off.x", h) is False        # not registered any more
        assert b.off("t_off.nothing", h) is False
        unhandled = b.counters.unhandled
        # one link, in order: once the mark is in, the second x was dispatched
        assert await a.send(b.id, "t_off.x")
        assert await a.send(b.id, "t_off.mark")
        await until(lambda: marks, 5.0, "the mark")
        assert got == ["t_off.x"]
        assert b.counters.unhandled == unhandled + 1

        cb = lambda view: None   # noqa: E731
        b.on_view(cb)
        assert b.off_view(cb) is True
        assert b.off_view(cb) is False
    two_peers(test)


def test_closed_gossip_is_freed_and_its_successor_gets_the_messages():
    async def test(a: Peer, b: Peer) -> None:
        old = Gossip(a, np.zeros(64, np.float32), round_timeout=5.0)
        old.close()
        old.close()    # twice: nothing more
        with pytest.raises(GossipError, match="closed"):
            await old.round()
        new = Gossip(a, np.zeros(64, np.float32), round_timeout=5.0)
        other = Gossip(b, np.ones(64, np.float32), round_timeout=5.0)
        res, _ = await asyncio.gather(new.round(), other.round())
        assert res.bytes_in > 0 and set(new._in) == {b.id}
        assert not old._in and old.stats.bytes_in == 0       # the closed one heard nothing
        ref = weakref.ref(old)
        del old
        assert freed(ref)
        # an engine that was never closed stays registered (and alive), as before
        kept = weakref.ref(Gossip(a, np.zeros(64, np.float32)))
        assert not freed(kept)
    two_peers(test)


def test_closed_relay_is_freed_and_its_successor_gets_the_gradients():
    async def test(a: Peer, b: Peer) -> None:
        old = GradientRelay(a, 8)
        await asyncio.to_thread(old.close)   # from a consumer thread: off at the loop's next pass
        new = GradientRelay(a, 8)
        other = GradientRelay(b, 8)
        other.publish(np.arange(8, dtype=np.float32))
        taken: list[np.ndarray] = []
        await until(lambda: taken.extend(new.take()) or taken, 5.0, "the gradient at the new relay")
        np.testing.assert_array_equal(taken[0], np.arange(8, dtype=np.float32))
        assert old.take() == [] and old.stats.received == 0
        ref = weakref.ref(old)
        del old
        assert freed(ref)
    two_peers(test)


def test_closed_federation_is_freed_and_its_successor_gets_the_items():
    async def test(a: Peer, b: Peer) -> None:
        buf_a = ReplayBuffer(SCHEMA, 100, peer_id=a.id)
        buf_b = ReplayBuffer(SCHEMA, 100, peer_id=b.id)
        old = Federation(buf_a, a)
        old.close()
        new = Federation(buf_a, a)
        other = Federation(buf_b, b, share=1.0)
        buf_b.add(items(4))
        assert await other.flush() == 4
        await until(lambda: new.stats.stored == 4, 5.0, "the items at the new federation")
        assert old.stats.received == 0
        buf_a.add(items(3))                  # the buffer no longer feeds the closed one
        assert old._new == [] and len(new._new) == 1
        with pytest.raises(ReplayError, match="closed"):   # it waited out its timeout for an answer
            await old.pull(b.id, 4, timeout=30)            # that could not reach it
        ref = weakref.ref(old)
        del old
        assert freed(ref)                    # though its buffer lives on
    two_peers(test)


def test_a_closed_gossip_on_the_in_memory_hub_is_freed_too():
    """SimLink (swarm.gossip.sim, the in-process network of the scripts and tests) had no
    off/off_view: a closed engine stayed held by its view callback."""
    from swarm.gossip.sim import SimHub

    async def main() -> None:
        hub = SimHub(topology="ring")
        a, b = hub.add_many(2)
        old = Gossip(a, np.zeros(16, np.float32))
        old.close()
        new = Gossip(a, np.zeros(16, np.float32))
        other = Gossip(b, np.ones(16, np.float32))
        res, _ = await asyncio.gather(new.round(), other.round())
        assert res.ok and res.participants == [b.id]
        assert old.stats.bytes_in == 0
        ref = weakref.ref(old)
        del old
        assert freed(ref)

    asyncio.run(main())
