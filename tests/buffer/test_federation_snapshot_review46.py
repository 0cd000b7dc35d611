"""Review 46: a replay snapshot saved as the releases before showed (a ReplayBuffer with no
``peer_id``, so its items stamped "local") could not be shared after the upgrade: Federation
refused it with advice a loaded buffer cannot follow. Its own items now go out under the
peer's id, and its increments still load on top of its full snapshot."""

from __future__ import annotations

import asyncio

import numpy as np
from swarmtest import linked_pair, until

from swarm.buffer import Federation, ReplayBuffer
from swarm.buffer.persist import load_incremental, save_incremental

SCHEMA = {"obs": ("float32", (4,)), "tag": ("int64", ())}


def _items(tags: range) -> dict[str, np.ndarray]:
    return {"obs": np.zeros((len(tags), 4), np.float32), "tag": np.array(tags)}


def test_a_snapshot_of_a_buffer_made_without_a_peer_id_is_shared_under_the_peers_id(tmp_path):
    old = ReplayBuffer(SCHEMA, 100, seed=0)      # as docs/buffer.md's quick start makes it
    old.add(_items(range(5)))
    old.save(tmp_path / "snap")
    since = old._next

    async def main():
        async with linked_pair() as (a, b):
            buf = ReplayBuffer.load(tmp_path / "snap")
            assert buf.peer_id == "local"
            peer_b = ReplayBuffer(SCHEMA, 100, peer_id="b")
            fa, fb = Federation(buf, a, share=1.0), Federation(peer_b, b, share=1.0)
            try:
                assert buf.peer_id == "a" and {o for o, _ in buf.ids()} == {"a"}
                buf.add(_items(range(5, 8)))
                await fa.flush()
                await until(lambda: len(peer_b) == 3, 10.0, "a's new items at b")
                assert {o for o, _ in peer_b.ids()} == {"a"}
                save_incremental(buf, tmp_path / "inc", since)
                return sorted(buf.ids())
            finally:
                fa.close()
                fb.close()

    ids = asyncio.run(asyncio.wait_for(main(), 60))
    # the increment (origin 0 named "a") goes on top of the full snapshot (named "local")
    back = load_incremental(ReplayBuffer.load(tmp_path / "snap"), tmp_path / "inc")
    assert back.peer_id == "a"
    assert sorted(back.ids()) == ids
    assert sorted(int(t) for t in back.items(np.arange(8)).fields["tag"]) == list(range(8))
