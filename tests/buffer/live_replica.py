"""A replicating peer process for tests/buffer/test_live.py (it gets killed with SIGKILL).

    python live_replica.py COORD ID N OUTFILE

Joins through COORD, waits for an N-member view, then forever adds a batch of
items to its buffer and flushes its federation (``replicas=1``). After every
flush it writes the sequence numbers of the items its neighbours have
acknowledged to OUTFILE (atomically: a temp file renamed over it), so that
whatever the test reads was acknowledged before the kill.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

SCHEMA = {"obs": ("float32", (4,)), "action": ("int64", ())}


async def main(coord: str, pid: str, n: int, out: Path) -> None:
    from swarm.buffer import Federation, ReplayBuffer
    from swarm.peer import Peer

    async with Peer(coordinators=[coord], id=pid, topology="ring") as peer:
        await peer.wait_view(lambda v: len(v.members) == n, timeout=30.0)
        await peer.wait_linked(30.0)
        buf = ReplayBuffer(SCHEMA, 100_000, first_seq=0, peer_id=pid, seed=0)
        fed = Federation(buf, peer, share=0.0, replicas=1, ack_timeout=0.5)
        k = 0
        acked: list[int] = []
        deadline = time.monotonic() + 60      # never outlive a test that lost track of us
        while time.monotonic() < deadline:
            a = np.arange(k, k + 16)
            buf.add({"obs": np.tile(a[:, None], (1, 4)).astype(np.float32), "action": a})
            k += 16
            await fed.flush()
            await asyncio.sleep(0.02)
            acked += [s for _, s in fed.take_acknowledged()]
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(acked))
            os.replace(tmp, out)


if __name__ == "__main__":
    a = sys.argv[1:]
    asyncio.run(main(a[0], a[1], int(a[2]), Path(a[3])))
