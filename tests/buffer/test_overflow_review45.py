"""Review 45: new items a receiver had no room for are counted apart (``stats.overflow``),
not as duplicates. A push larger than the receiver's capacity keeps only its newest
``capacity`` items; the others used to count in ``stats.duplicates`` (3,000 pushed to a
ring of 1,000: ``duplicates=2000``, though none was one).

Two real Peers and a coordinator on loopback (swarmtest.linked_pair).
"""

from __future__ import annotations

import asyncio

import numpy as np
from swarmtest import linked_pair, until

from swarm.buffer import Federation, ReplayBuffer

SCHEMA = {"obs": ("float32", (4,)), "tag": ("int64", ())}


def test_a_push_larger_than_the_receiver_s_ring_counts_overflow_not_duplicates():
    async def main():
        async with linked_pair() as (a, b):
            ba = ReplayBuffer(SCHEMA, 10_000, peer_id="a", first_seq=0)
            bb = ReplayBuffer(SCHEMA, 1_000, peer_id="b", first_seq=0)
            fa, fb = Federation(ba, a, share=1.0), Federation(bb, b, share=0.0)
            try:
                idx = ba.add({"obs": np.zeros((3000, 4), np.float32), "tag": np.arange(3000)})
                assert await fa.flush() == 3000
                await until(lambda: fb.stats.received == 3000, 10.0, "a's push at b")
                s = fb.stats
                assert (s.stored, s.duplicates, s.throttled) == (1000, 0, 0), s
                assert s.overflow == 2000, s
                assert sorted(bb.ids()) == [("a", q) for q in range(2000, 3000)]   # the newest

                # the same 3,000 again: the 1,000 b holds are duplicates, and of the 2,000
                # it does not hold the newest 1,000 go in, the rest are overflow
                await fa._send_items("b", "buf.push", ba.items(idx), {"rid": 99, "ack": False})
                await until(lambda: fb.stats.received == 6000, 10.0, "the second push at b")
                assert (s.stored, s.duplicates, s.throttled, s.overflow) == (2000, 1000, 0, 3000), s
                assert sorted(bb.ids()) == [("a", q) for q in range(1000, 2000)]
                assert s.received == s.stored + s.overflow + s.duplicates + s.throttled
            finally:
                fa.close()
                fb.close()

    asyncio.run(asyncio.wait_for(main(), 60))
