"""Review 46: gradient exchange on a hypercube. When one of 4 peers left, the view callback
that sends the last turn again asked for the routes of a hypercube of 3, which raised
ConfigError: each remaining peer exited with code 2 before its budget (swarm run exit 1,
and restart_dead did not restart them). A view the topology cannot take now has no
neighbours and no routes, as parameter exchange already had, and the relay goes on."""

from __future__ import annotations

import asyncio

import numpy as np

from swarm.gossip import GradientRelay
from swarm.gossip.sim import SimHub

D = 8


def test_a_hypercube_that_a_peer_leaves_keeps_its_relays_running():
    async def main() -> None:
        hub = SimHub(topology="hypercube")
        links = hub.add_many(4)
        relays = {link.id: GradientRelay(link, D, topology="hypercube") for link in links}
        g = np.zeros(D, np.float32)
        g[1] = 1.0
        relays["p001"].publish(g, clock=1)   # a turn to send again when the view changes
        hub.remove("p000")                   # a hypercube of 3: no routes, no neighbours
        await asyncio.sleep(0.05)
        assert not hub.errors
        assert links[1].neighbours() == []
        relays["p002"].publish(g, clock=2)   # and publishing goes on: to no one
        (back,) = hub.add_many(1)            # 4 again: the routes come back
        relays[back.id] = GradientRelay(back, D, topology="hypercube")
        await asyncio.sleep(0.05)
        relays["p003"].publish(g * 3, clock=3)
        await asyncio.sleep(0.05)
        took = {pid: [float(x.sum()) for x in r.take()] for pid, r in relays.items() if pid != "p000"}
        # p003's gradient reaches the other three members of the new hypercube
        assert all(3.0 in sums for pid, sums in took.items() if pid != "p003"), took
        await hub.close()

    asyncio.run(main())
