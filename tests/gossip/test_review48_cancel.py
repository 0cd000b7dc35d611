"""Review 48, cancellation: on Python 3.11 the round waited for its neighbours with
``asyncio.wait_for``, which returns when a cancel lands in the pass its awaitable ends
in, so a cancelled round (a caller's deadline, a TaskGroup, Ctrl-C) mixed and returned;
and a round did not notice its peer closing: it waited out ``round_timeout`` and blamed
its neighbours, as did every round after. Real peers on loopback."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from swarmtest import linked_pair

from swarm.errors import GossipError
from swarm.gossip import Gossip
from swarm.gossip.engine import T_FULL

D = 1000


def test_a_cancel_that_lands_as_a_state_arrives_is_not_lost():
    # The cancel comes from a handler that runs right after the engine's own for the
    # same message: the round is woken and cancelled in one pass. It returned a
    # RoundResult with b as participant, x mixed (mean 0.5), t advanced.
    async def main() -> None:
        async with linked_pair() as (a, b):
            xa, xb = np.ones(D, np.float32), np.zeros(D, np.float32)
            ga, gb = Gossip(a, xa, round_timeout=10.0), Gossip(b, xb, round_timeout=10.0)
            try:
                ra = asyncio.create_task(ga.round())
                await asyncio.sleep(0.2)               # a has sent its state and waits for b's
                a.on(T_FULL, lambda msg: ra.cancel())  # registered after the engine's handler
                await gb.round()
                with pytest.raises(asyncio.CancelledError):
                    await ra
                assert ga.t == 0
                assert np.array_equal(xa, np.ones(D, np.float32))
            finally:
                ga.close()
                gb.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_round_waiting_when_its_peer_closes_raises_and_so_does_the_next():
    # b runs no second round, so a's waits for it. Before, it waited out round_timeout
    # and returned "no neighbour's state arrived in time", as did every later round.
    async def main() -> None:
        async with linked_pair() as (a, b):
            xa, xb = np.ones(D, np.float32), np.zeros(D, np.float32)
            ga, gb = Gossip(a, xa, round_timeout=10.0), Gossip(b, xb, round_timeout=10.0)
            try:
                await asyncio.gather(ga.round(), gb.round())
                before = xa.copy()
                rnd = asyncio.create_task(ga.round())
                await asyncio.sleep(0.2)
                assert not rnd.done()                  # waiting for b
                await a.close()
                with pytest.raises(GossipError, match="gossip engine of peer 'a': its peer closed"):
                    await rnd
                assert ga.t == 1 and np.array_equal(xa, before)
                for call in (ga.round, lambda: ga.bootstrap(timeout=1.0)):
                    with pytest.raises(GossipError, match="its peer closed"):
                        await call()
            finally:
                ga.close()
                gb.close()

    asyncio.run(asyncio.wait_for(main(), 60))
