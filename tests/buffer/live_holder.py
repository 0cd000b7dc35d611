"""A peer process that only holds its neighbours' replicas, for tests/buffer/test_live.py.

    python live_holder.py COORD ID

Joins through COORD on a ring and runs a federation that shares and replicates
nothing of its own: it stores and acknowledges what neighbours replicate to it.
It ends by itself after 60 s, so a test that lost track of it leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import sys
import time

SCHEMA = {"obs": ("float32", (4,)), "action": ("int64", ())}


async def main(coord: str, pid: str) -> None:
    from swarm.buffer import Federation, ReplayBuffer
    from swarm.peer import Peer

    async with Peer(coordinators=[coord], id=pid, topology="ring") as peer:
        Federation(ReplayBuffer(SCHEMA, 10_000, peer_id=pid, seed=0), peer, share=0.0)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
