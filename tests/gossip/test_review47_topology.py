"""An engine built without ``topology=`` follows its link's own topology (review 47).

``Gossip(link, x)`` took ``topology="ring"`` whatever the link: a ``Peer(topology="grid")``
averaged along a ring, while ``peer.neighbours()``, the replay sharing and ``swarm
status`` showed its grid neighbours, and nothing said so.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from gossip.test_live import LiveSwarm
from swarm.errors import ConfigError
from swarm.gossip import Gossip, mixing_matrix
from swarm.gossip.sim import SimHub, run_rounds
from swarm.peer import Peer

pytestmark = pytest.mark.timeout(120)


def _vectors(n: int, d: int = 16) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [(rng.standard_normal(d) + 10 * i).astype(np.float32) for i in range(n)]


def test_an_engine_without_topology_mixes_with_the_peers_grid_neighbours():
    # A Coordinator and five Peers on a grid (2×3, the last row partial): the grid gives
    # p02 one neighbour (p01) and p04 two (p01, p03); a ring gives every peer two others.
    async def main():
        async with LiveSwarm(5, "grid") as sw:
            xs = _vectors(5)
            x0 = np.stack(xs).astype(np.float64)
            engines = [Gossip(p, x, codec="identity", gamma=1.0, round_timeout=30.0) for p, x in zip(sw.peers, xs)]
            try:
                results = await asyncio.gather(*(g.round() for g in engines))
            finally:
                for g in engines:
                    g.close()
            return [sorted(p.neighbours()) for p in sw.peers], engines, results, x0, xs
    neighbours, engines, results, x0, xs = asyncio.run(main())
    assert neighbours[2] == ["p01"] and neighbours[4] == ["p01", "p03"]   # the peers' grid
    assert [sorted(r.participants) for r in results] == neighbours
    assert [g.topology for g in engines] == ["grid"] * 5
    # one round of exact gossip is x ← W x with the grid's weights
    np.testing.assert_allclose(np.stack(xs), mixing_matrix("grid", 5) @ x0, rtol=1e-5, atol=1e-4)


def test_an_engine_without_topology_takes_a_peers_custom_edges():
    async def main():
        peer = Peer(coordinators=["tcp://127.0.0.1:1"], id="a", topology="custom", edges=[[0, 1], [1, 2]])
        try:
            g = Gossip(peer, np.zeros(4, np.float32))
            g.close()
        finally:
            await peer.close()
        return g
    g = asyncio.run(main())
    assert (g.topology, g.edges, g.seed) == ("custom", [[0, 1], [1, 2]], 0)


@pytest.mark.parametrize("hub_kw", [dict(topology="grid"), dict(topology="custom", edges=[(0, 2), (2, 4), (1, 3)]),
                                    dict(topology="random_pairing", seed=7)])
def test_an_engine_without_topology_follows_its_sim_hubs_graph(hub_kw):
    async def main():
        hub = SimHub(**hub_kw)
        links = hub.add_many(5)
        xs = _vectors(5)
        engines = [Gossip(link, x, round_timeout=30.0) for link, x in zip(links, xs)]
        try:
            # round 0: the graph SimLink.neighbours() reports (random pairing: its round 0)
            results = await run_rounds(engines, 1)
        finally:
            for g in engines:
                g.close()
        return links, engines, results
    links, engines, results = asyncio.run(main())
    g = engines[0]
    assert (g.topology, g.edges, g.seed) == (hub_kw["topology"], hub_kw.get("edges"), hub_kw.get("seed", 0))
    assert [sorted(r.participants) for r in results[0]] == [sorted(link.neighbours()) for link in links]


def test_an_explicit_topology_other_than_the_links_is_kept_and_logged_once(caplog):
    async def main():
        hub = SimHub(topology="grid")
        links = hub.add_many(5)
        with caplog.at_level(logging.INFO, logger="swarm.gossip.engine"):
            engines = [Gossip(link, x, topology="ring", round_timeout=30.0) for link, x in zip(links, _vectors(5))]
            # as its link's: nothing said (on a hub of its own: a second engine on one of
            # these links would take its handlers over)
            Gossip(SimHub(topology="grid").add("q"), np.zeros(16, np.float32), topology="grid").close()
        try:
            results = await run_rounds(engines, 2)
        finally:
            for g in engines:
                g.close()
        return results
    results = asyncio.run(main())
    said = [r for r in caplog.records if "differs from" in r.getMessage()]
    assert len(said) == 5, [r.getMessage() for r in caplog.records]
    assert said[0].levelno == logging.INFO
    assert "'ring'" in said[0].getMessage() and "'grid'" in said[0].getMessage()
    assert sorted(results[0][2].participants) == ["p001", "p003"]   # a ring's, as asked


def test_edges_without_a_topology_are_refused_naming_the_argument():
    async def main():
        hub = SimHub(topology="custom", edges=[(0, 1)])
        a, b = hub.add_many(2)
        with pytest.raises(ConfigError, match=r"^edges = .*topology='custom'"):
            Gossip(a, np.zeros(4, np.float32), edges=[(0, 1)])
        # an engine built after it on the same link averages as ever
        engines = [Gossip(a, np.zeros(4, np.float32)), Gossip(b, np.ones(4, np.float32))]
        try:
            (ra, rb), = await run_rounds(engines, 1)
        finally:
            for g in engines:
                g.close()
        return ra, rb
    ra, rb = asyncio.run(main())
    assert ra.participants == ["p001"] and rb.participants == ["p000"]


@pytest.mark.parametrize("args", [{}, {"topology": "ring"}, {"topology": "custom", "edges": [[0, 1]]}],
                         ids=["the hub's", "ring", "other edges"])
def test_an_engine_on_a_hub_of_a_custom_graph_without_edges_builds(args):
    # own-diff review 47: the hub's edges=[] became None, and comparing them raised TypeError
    async def main():
        hub = SimHub(topology="custom", edges=[])
        links = hub.add_many(2)
        g = Gossip(links[0], np.zeros(4, np.float32), **args)
        try:
            return g.topology
        finally:
            g.close()
            await hub.close()
    assert asyncio.run(main()) == args.get("topology", "custom")
