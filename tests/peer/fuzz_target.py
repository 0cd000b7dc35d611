"""A peer process with gossip and a federated buffer attached, for the fuzz test.

    python fuzz_target.py COORDINATOR ID

Prints ``READY <address>`` once joined; leaves on SIGTERM. Every second it
prints ``RSS <kB> MALFORMED <n>`` so the test can watch its memory.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import numpy as np

from swarm.buffer import Federation, ReplayBuffer
from swarm.gossip import Gossip
from swarm.peer import Peer


def rss_kb() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


async def main(coord: str, pid: str) -> None:
    peer = Peer(id=pid, coordinators=[coord], join_timeout_s=20)
    x = np.zeros(1000, np.float32)
    gossip = Gossip(peer, x, topology="ring", codec="int8", gamma=0.5, sync="async")
    buf = ReplayBuffer({"obs": ("float32", (4,)), "r": ("float32", ())}, capacity=10_000)
    fed = Federation(buf, peer, share=0.5)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with peer:
        print("READY", peer.address, flush=True)
        while not stop.is_set():
            print("RSS", rss_kb(), "MALFORMED", peer.counters.malformed, "X", float(np.abs(x).max()),
                  "BUF", len(buf), flush=True)
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except asyncio.TimeoutError:
                pass
    del gossip, fed


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
