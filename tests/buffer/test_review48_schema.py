"""A neighbour whose replay items have another layout is warned of once (review 48).

Its every batch was refused (``stats.dropped_messages``, ``stats.errors``), logged at
DEBUG only: a 3-ring sharing replay for 10 s with one peer's ``obs`` of 6 values beside
4 dropped 191-384 messages a peer, and nothing a hand-built loop reads said why.
Both ends are live Peers in this event loop, over ZeroMQ on loopback.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest
from swarmtest import until

from swarm.buffer import Federation, ReplayBuffer
from swarm.coordinator import Coordinator
from swarm.peer import Peer

pytestmark = pytest.mark.timeout(60)

MINE = {"obs": ("float32", (4,)), "action": ("int64", ())}


def _batch(schema: dict, n: int) -> dict[str, np.ndarray]:
    return {k: np.ones((n, *shape), dtype) for k, (dtype, shape) in schema.items()}


@pytest.mark.parametrize("theirs, named", [
    ({"obs": ("float32", (6,)), "action": ("int64", ())}, ["'obs' float32 (6,)", "'obs' float32 (4,)"]),
    ({"state": ("float32", (4,)), "action": ("int64", ())}, ["'state' float32 (4,)", "'obs' float32 (4,)"]),
], ids=["shape", "names"])
def test_items_of_another_layout_are_warned_of_once_per_neighbour(theirs, named, caplog):
    caplog.set_level(logging.WARNING, logger="swarm.buffer.federation")

    async def main():
        async with Coordinator(bind="tcp://127.0.0.1:*") as coord:
            peers = [Peer(coordinators=[coord.address], id=f"p{i}", rank=i, topology="ring") for i in range(2)]
            try:
                for p in peers:
                    await p.start()
                for p in peers:
                    await p.wait_view(lambda v: len(v.members) == 2, timeout=10.0)
                    await p.wait_linked(10.0)
                odd = ReplayBuffer(theirs, 1000, peer_id="p0", seed=0)
                mine = ReplayBuffer(MINE, 1000, peer_id="p1", seed=1)
                sender, receiver = Federation(odd, peers[0], share=1.0), Federation(mine, peers[1], share=0.0)
                odd.add(_batch(theirs, 10))
                assert await sender.flush() == 10
                await until(lambda: receiver.stats.dropped_messages == 1, 10.0, "the first batch refused")
                first = [r.getMessage() for r in caplog.records]
                for _ in range(10):
                    odd.add(_batch(theirs, 10))
                    assert await sender.flush() == 10
                await until(lambda: receiver.stats.dropped_messages == 11, 10.0, "every batch refused")
                return first, [r.getMessage() for r in caplog.records], receiver, mine
            finally:
                for p in peers:
                    await p.close()

    first, later, receiver, mine = asyncio.run(main())
    assert len(first) == 1, first
    assert "from neighbour 'p0'" in first[0] and all(s in first[0] for s in named), first
    assert later == first
    assert receiver.stats.stored == 0 and len(mine) == 0
    assert len(receiver.stats.errors) == 11
