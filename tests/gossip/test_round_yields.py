"""A round that waits for nobody still lets the peer's receive loop run.

In async mode (or with every sender late) a round has nothing to wait for, and its
sends need not suspend: a caller that ran rounds back to back, with no other await
between them (training steps in the same thread), kept the peer's receive loop
from running, so a neighbour's state that had already reached the socket was taken
in only when a full send queue made a round wait (the seventh round here). Real
peers on loopback, in one loop, closed by their handles.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import numpy as np

from swarm.coordinator import Coordinator
from swarm.gossip import Gossip
from swarm.peer import Peer


def test_rounds_run_back_to_back_take_in_what_a_neighbour_sent():
    async def main() -> int:
        async with Coordinator(bind="tcp://127.0.0.1:*") as coord:
            peers = [Peer(id=f"p{i}", rank=i, coordinators=[coord.address]) for i in range(2)]
            try:
                await asyncio.gather(*(p.start() for p in peers))
                await peers[0].wait_view(lambda v: len(v.members) == 2, 10)
                await asyncio.gather(*(p.wait_linked(10) for p in peers))
                gs = [Gossip(p, np.full(100, i, np.float32), topology="ring", sync="async")
                      for i, p in enumerate(peers)]
                await gs[1].round()     # p1's state goes to p0
                time.sleep(1.0)         # blocking, as a training step is: it reaches p0's socket
                for n in range(1, 21):
                    r = await gs[0].round()
                    if r.participants:
                        assert r.participants == ["p1"]
                        return n
                raise AssertionError("p0 never took in p1's state in 20 rounds")
            finally:
                for p in peers:
                    with contextlib.suppress(Exception):
                        await p.close()

    # the first round's yield lets the receive loop see the socket, the second's
    # dispatch the message, the third takes it in
    assert asyncio.run(main()) <= 3
