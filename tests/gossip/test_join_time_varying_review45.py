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


async def _sum_after_a_join(pause: float, seed: int) -> tuple[float, float, float]:
    """(the swarm's sum at the end, at the join, the longest stall of the loop after the join)."""
    hub = SimHub(topology="one_peer_exponential", seed=3)
    rng = np.random.default_rng(seed)
    xs, engines, tasks = [], [], []

    def add(pid: str) -> None:
        x = rng.normal(0, 1, D).astype(np.float32) + 10 * (len(xs) + 1)
        xs.append(x)
        engines.append(Gossip(hub.add(pid), x, topology="one_peer_exponential", sync="lockstep",
                              round_timeout=0.3, seed=3))

    async def run(g: Gossip) -> None:
        while g.t < END:
            await g.round()
            await asyncio.sleep(pause)

    stall = [0.0]

    async def watch() -> None:
        loop = asyncio.get_running_loop()
        while True:
            t0 = loop.time()
            await asyncio.sleep(0.005)
            stall[0] = max(stall[0], loop.time() - t0 - 0.005)

    try:
        for i in range(5):
            add(f"p{i:02d}")
        tasks += [asyncio.create_task(run(g)) for g in engines]
        await asyncio.sleep(30 * pause)
        add("p05")
        tasks.append(asyncio.create_task(run(engines[-1])))
        expected = float(sum(x.astype(np.float64).sum() for x in xs))
        watcher = asyncio.create_task(watch())
        await asyncio.gather(*tasks)
        watcher.cancel()
        return float(sum(x.astype(np.float64).sum() for x in xs)), expected, stall[0]
    finally:
        for t in tasks:
            t.cancel()
        for g in engines:
            g.close()
        await hub.close()


@pytest.mark.parametrize(("pause", "seed"), [(0.013, 0), (0.02, 0), (0.02, 1)])
def test_a_joiner_keeps_its_share_on_a_time_varying_graph(pause, seed, caplog):
    caplog.set_level(logging.ERROR)
    # The join costs the neighbour that waits for the joiner's skipped round a whole
    # round_timeout, and the rounds queued behind it end 20-140 ms before their deadlines:
    # a loop stalled that long just then (a loaded CI worker) gives up on a sender and
    # moves the sum, as docs/gossip.md says. Such a run says nothing of the bug (which lost
    # the share with no stall at all), so it is run again, at most twice.
    runs = []
    for _ in range(3):
        got, expected, stall = asyncio.run(asyncio.wait_for(_sum_after_a_join(pause, seed), 120))
        runs.append((got, expected, round(stall, 3)))
        if abs(got - expected) <= 1e-5 * abs(expected) or stall < 0.02:
            break
    assert abs(got - expected) <= 1e-5 * abs(expected), runs
