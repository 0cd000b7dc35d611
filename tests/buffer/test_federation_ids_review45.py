"""Review 45: a Federation built as docs/buffer.md showed (a ReplayBuffer with no
``peer_id``) never shared anything: every peer stamped its items with the default id
"local", which is also each receiver's own, so each receiver dropped every item it got as
one of its own (counted as duplicates, nothing said). A buffer left at the default id
and still empty now takes its peer's id; one with another id is refused.

Two real Peers and a coordinator on loopback (swarmtest.linked_pair)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from swarmtest import linked_pair, until

from swarm.buffer import Federation, ReplayBuffer
from swarm.buffer.replay import ReplayError

SCHEMA = {"obs": ("float32", (4,)), "tag": ("int64", ())}


def _items(tags: range) -> dict[str, np.ndarray]:
    return {"obs": np.zeros((len(tags), 4), np.float32), "tag": np.array(tags)}


def test_buffers_made_without_a_peer_id_share_their_items_under_their_peers_ids():
    async def main():
        async with linked_pair() as (a, b):
            ba, bb = ReplayBuffer(SCHEMA, 100), ReplayBuffer(SCHEMA, 100)   # as docs/buffer.md makes them
            fa, fb = Federation(ba, a, share=1.0), Federation(bb, b, share=1.0)
            try:
                assert (ba.peer_id, bb.peer_id) == ("a", "b")
                ba.add(_items(range(5)))
                bb.add(_items(range(100, 103)))
                await fa.flush()
                await fb.flush()
                await until(lambda: len(ba) == 8 and len(bb) == 8, 10.0, "each peer's items at the other")
                assert sorted(int(t) for t in bb.items(np.arange(8)).fields["tag"]) == [*range(5), *range(100, 103)]
                assert fa.stats.duplicates == fb.stats.duplicates == 0
                assert {o for o, _ in bb.ids()} == {"a", "b"}
            finally:
                fa.close()
                fb.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_buffer_under_another_id_is_refused_and_left_as_it_was():
    async def main():
        async with linked_pair() as (a, _b):
            named = ReplayBuffer(SCHEMA, 100, peer_id="c")
            # at the default id, but holding items of a neighbour under a's id
            holds_a, from_a = ReplayBuffer(SCHEMA, 100), ReplayBuffer(SCHEMA, 10, peer_id="a")
            holds_a.insert(from_a.items(from_a.add(_items(range(2)))))
            for buf, shown in ((named, "'c'"), (holds_a, "'local'")):
                with pytest.raises(ReplayError, match=f"the buffer's peer_id {shown} is not the link's id 'a'.*"
                                                      r"peer_id=<the peer's id>"):
                    Federation(buf, a)
            assert (named.peer_id, holds_a.peer_id) == ("c", "local")
            assert {o for o, _ in holds_a.ids()} == {"a"}

    asyncio.run(asyncio.wait_for(main(), 60))
