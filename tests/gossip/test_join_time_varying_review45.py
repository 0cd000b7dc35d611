"""Review 45: on a time-varying graph (one_peer_exponential, lockstep), a peer that joined
a running swarm lost part of its share. It took a later round number; a neighbour waited
out the round it skipped and marked it late; and since on such a graph a sender sends to
a peer only in the rounds it is one, no message cleared the mark: when the joiner was next
that neighbour's sender, on time, the neighbour did not wait for it and mixed nobody, and
the half of the edge the joiner had applied was lost (the sum fell 1.8%, in 10 of 15 runs).

Each engine runs its rounds in a task of its own, as live peers do (docs/gossip.md)."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from swarm.gossip import Gossip
from swarm.gossip.sim import SimHub

D, END = 100, 80


async def _sum_after_a_join(pause: float, seed: int) -> tuple[float, float]:
    hub = SimHub(topology="one_peer_exponential", seed=3)
    rng = np.random.default_rng(seed)
    xs, engines, tasks = [], [], []

    def add(pid: str) -> None:
        x = rng.normal(0, 1, D).astype(np.float32) + 10 * (len(xs) + 1)
        xs.append(x)
        # 3 s, not 0.3: a round that gives up on a sender moves the sum (docs/gossip.md), and
        # under load (14) a neighbour gave up on the joiner's first message at 0.3 s in 3 of
        # 3 runs; the bug this guards never waited for the joiner at all
        engines.append(Gossip(hub.add(pid), x, topology="one_peer_exponential", sync="lockstep",
                              round_timeout=3.0, seed=3))

    async def run(g: Gossip) -> None:
        while g.t < END:
            await g.round()
            await asyncio.sleep(pause)

    try:
        for i in range(5):
            add(f"p{i:02d}")
        tasks += [asyncio.create_task(run(g)) for g in engines]
        await asyncio.sleep(30 * pause)
        add("p05")
        tasks.append(asyncio.create_task(run(engines[-1])))
        expected = float(sum(x.astype(np.float64).sum() for x in xs))
        await asyncio.gather(*tasks)
        return float(sum(x.astype(np.float64).sum() for x in xs)), expected
    finally:
        for t in tasks:
            t.cancel()
        for g in engines:
            g.close()
        await hub.close()


@pytest.mark.parametrize(("pause", "seed"), [(0.013, 0), (0.02, 0), (0.02, 1)])
def test_a_joiner_keeps_its_share_on_a_time_varying_graph(pause, seed, caplog):
    caplog.set_level(logging.ERROR)
    got, expected = asyncio.run(asyncio.wait_for(_sum_after_a_join(pause, seed), 120))
    assert abs(got - expected) <= 1e-5 * abs(expected), (got, expected)
