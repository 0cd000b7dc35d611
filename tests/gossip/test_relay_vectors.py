"""``RelayStats.vectors_out`` counts the gradients sent, not the messages.

Before it, the only count was ``sent`` (messages): `swarm run`'s heartbeat took one dense
vector per message as the size the gradients would have had uncompressed, so with a
turn's two updates in one message its codec_ratio showed 2.0 for the identity codec, and
a pass (no gradient) counted as a whole vector.
"""

import asyncio

import numpy as np

from swarm.gossip import GradientRelay
from swarm.gossip.sim import SimHub


async def settle():
    for _ in range(20):
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)


def test_vectors_out_counts_each_gradient_of_a_turn_own_and_forwarded_and_no_pass():
    async def main():
        hub = SimHub(topology="ring")
        relays = [GradientRelay(link, 16, codec="identity", topology="ring") for link in hub.add_many(4)]
        try:
            a, rest = relays[0], relays[1:]
            rng = np.random.default_rng(0)
            a.publish(rng.standard_normal(16), clock=0, hold=True)
            a.publish(None, clock=1, hold=True)                    # a pass inside the turn
            a.publish(rng.standard_normal(16), clock=2)            # one message: two gradients, one pass
            a.publish(None, clock=3)                               # a pass alone: a message, no gradient
            await settle()
            assert a.stats.sent == 2 * 2                           # two messages, one each way round the ring
            assert a.stats.vectors_out == 2 * 2
            # passed on, a message carries the same gradients: with the identity codec every
            # relay's payload is one dense vector (d float32) per gradient it counts
            assert sum(r.stats.forwarded for r in rest) > 0
            for r in relays:
                assert r.stats.bytes_out == r.stats.vectors_out * 16 * 4, r.stats
        finally:
            for r in relays:
                r.close()
            await hub.close()
    asyncio.run(main())
