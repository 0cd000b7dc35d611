"""One gossiping peer process for tests/gossip/test_live.py.

    python live_worker.py COORD ID RANK N D ROUNDS OUTDIR [CODEC GAMMA]

Joins through COORD, waits for an N-member view, runs ROUNDS lockstep rounds
of the gossip engine on a vector seeded by RANK, writing its round number to
OUTDIR/ID.round after each round and its final vector to OUTDIR/ID.npy; then
stays in the swarm (so late neighbours are not cut off) until OUTDIR/stop
exists, and leaves.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import numpy as np


def initial(rank: int, d: int) -> np.ndarray:
    return np.random.default_rng(1000 + rank).standard_normal(d).astype(np.float32) + rank


async def main(coord: str, pid: str, rank: int, n: int, d: int, rounds: int, out: Path,
               codec: str, gamma: float) -> None:
    from swarm.gossip import Gossip
    from swarm.peer import Peer

    x = initial(rank, d)
    async with Peer(coordinators=[coord], id=pid, rank=rank, topology="ring") as peer:
        await peer.wait_view(lambda v: len(v.members) == n, timeout=30.0)
        await peer.wait_linked(30.0)
        g = Gossip(peer, x, topology="ring", codec=codec, gamma=gamma, round_timeout=5.0)
        for _ in range(rounds):
            await g.round()
            (out / f"{pid}.round").write_text(str(g.t))
            # paced, so that a test can act between rounds (a d = 2000 round takes
            # about a millisecond: unpaced, all rounds are over before a kill lands)
            await asyncio.sleep(0.03)
        tmp = out / f"{pid}.tmp.npy"
        np.save(tmp, x)
        tmp.rename(out / f"{pid}.npy")
        deadline = time.monotonic() + 60
        while not (out / "stop").exists() and time.monotonic() < deadline:
            # keep answering neighbours that are still finishing their rounds
            await g.round()
            await asyncio.sleep(0.01)


if __name__ == "__main__":
    a = sys.argv[1:]
    asyncio.run(main(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), int(a[5]), Path(a[6]),
                     a[7] if len(a) > 7 else "identity", float(a[8]) if len(a) > 8 else 1.0))
