"""A peer that runs no round for a while (an evaluation, a checkpoint) while its
neighbours go on holds a bounded backlog of their messages, not every one of them."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest

from swarm.coordinator import Coordinator
from swarm.gossip import Gossip
from swarm.gossip.engine import _MAX_PENDING
from swarm.peer import Peer


@pytest.mark.parametrize("codec", ["identity", "topk:0.1"])
def test_a_paused_peer_holds_a_bounded_backlog_and_rejoins_the_rounds(codec):
    d, paused = 1000, 3 * _MAX_PENDING

    async def main() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*") as coord:
            peers = [Peer(id=f"p{i}", rank=i, coordinators=[coord.address]) for i in range(3)]
            try:
                await asyncio.gather(*(p.start() for p in peers))
                await peers[0].wait_view(lambda v: len(v.members) == 3, 10)
                await asyncio.gather(*(p.wait_linked(10) for p in peers))
                xs = [np.full(d, i, np.float32) for i in range(3)]
                gs = [Gossip(p, x, topology="ring", codec=codec, gamma="auto", round_timeout=0.05)
                      for p, x in zip(peers, xs)]
                for _ in range(3):
                    await asyncio.gather(*(g.round() for g in gs))
                for _ in range(paused):            # p0 runs no round
                    await asyncio.gather(*(g.round() for g in gs[1:]))
                g0 = gs[0]

                def held() -> int:
                    return sum(len(c.pending) for c in g0._in.values())

                async with asyncio.timeout(10):    # every message sent to p0 is held or dropped
                    while held() + g0.stats.backlog_dropped < 2 * paused:
                        await asyncio.sleep(0.01)
                sizes = [len(c.pending) for c in g0._in.values()]
                assert all(n <= _MAX_PENDING + g0.max_staleness for n in sizes), sizes
                assert g0.stats.backlog_dropped == 2 * (paused - _MAX_PENDING - g0.max_staleness)
                # p0 catches up: its first round takes its neighbours' last round, and mixes
                # their states (identity) or finds each copy's gap, left by the dropped
                # deltas, and asks for a full state (top-k)
                for g in gs:
                    g.round_timeout = 5.0
                first = await g0.round()
                assert first.round == max(g.t for g in gs[1:]) - 1, first
                if codec == "identity":
                    assert sorted(first.participants) == ["p1", "p2"] and g0.stats.nacks_sent == 0, first
                else:
                    assert first.participants == [] and g0.stats.nacks_sent == 2, first
                # p1 and p2 waited for p0 in vain while it ran no round, and (round_timeout is
                # 0.05 s) maybe for each other: they wait for such a neighbour again only once
                # a message from it has arrived. Their rounds take under a millisecond, so
                # without this wait they could run every round below before p0's message
                # reached them, and rightly leave p0 out.
                async with asyncio.timeout(10):
                    while any(g._late for g in gs):
                        await asyncio.sleep(0.01)
                # the three of them mix in step again, each running its rounds on its own
                # (top-k: p0's copies repaired by the full states it asked for)
                target = max(g.t for g in gs) + 5

                async def run(g: Gossip) -> list:
                    out = []
                    while g.t <= target:
                        out.append(await g.round())
                    return out

                results = await asyncio.gather(*(run(g) for g in gs))
                last = [(r[-1].round, sorted(r[-1].participants)) for r in results]
                assert last == [(target, ["p1", "p2"]), (target, ["p0", "p2"]), (target, ["p0", "p1"])], \
                    [[(x.round, x.participants) for x in r] for r in results]
                if codec != "identity":
                    assert all(g.stats.full_sent >= 1 for g in gs[1:]), [g.stats for g in gs[1:]]
                assert held() <= 2
            finally:
                for p in peers:
                    with contextlib.suppress(Exception):
                        await p.close()

    asyncio.run(main())
