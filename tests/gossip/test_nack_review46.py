"""Review 46: one lost delta to a receiver a few rounds behind (bounded sync lets it) cost
max_staleness + 1 full states instead of one: the receiver nacked each delta queued behind
the gap as it reached it, and each nack made the sender send the whole state again, although
the first one already repaired the copy (at d = 1e7, 160-320 MB per loss per receiver). A
nack of a version before the last full state sent to that receiver is now left alone."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from swarm.gossip import Gossip
from swarm.gossip.sim import SimHub


@pytest.mark.parametrize("codec,staleness", [("fp16", 4), ("qsgd:4", 4), ("fp16", 8)])
def test_a_lagging_receiver_gets_one_full_state_per_gap(codec, staleness):
    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(3)
        rng = np.random.default_rng(0)
        xs = [rng.standard_normal(500).astype(np.float32) for _ in range(3)]
        eng = [Gossip(link, x, topology="ring", codec=codec, gamma=0.5, sync="bounded", max_staleness=staleness,
                      round_timeout=0.5) for link, x in zip(links, xs)]
        for _ in range(3):
            await asyncio.gather(*(e.round() for e in eng))
        # p001's next delta is lost to both receivers (a version skipped), and it runs
        # `staleness` rounds ahead of them
        eng[1]._out[""].ver += 1
        for _ in range(staleness):
            await eng[1].round()
        before = eng[1].stats.full_sent
        for _ in range(12):
            await asyncio.gather(*(e.round() for e in eng))
        for _ in range(staleness):   # the receivers catch up with what p001 sent
            await asyncio.gather(eng[0].round(), eng[2].round())
        for e in eng:
            e.close()
        await hub.close()
        return eng, xs, eng[1].stats.full_sent - before

    eng, xs, full = asyncio.run(main())
    assert full == 2, full   # one to each receiver (was 10 at max_staleness 4, 18 at 8)
    assert eng[1].stats.nacks_stale >= 2 * (staleness - 1)
    # and the copies are whole again: caught up, each receiver's copy of p001 is p001's own
    own = eng[1]._out[""].hat
    for e in (eng[0], eng[2]):
        np.testing.assert_array_equal(e._in["p001"].hat, own)
