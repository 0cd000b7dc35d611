"""Late joiners and restarted peers take their parameters from several
neighbours (one slice each) instead of starting from scratch."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import zmq.asyncio

from swarm.coordinator import Coordinator
from swarm.errors import ConfigError, GossipError
from swarm.gossip import Gossip
from swarm.gossip.sim import consensus_error
from swarm.peer import Peer

pytestmark = pytest.mark.timeout(90)
D = 10_000


async def settle(peers: list[Peer], n: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not (len({p.view.epoch for p in peers}) == 1 and all(len(p.view.members) == n for p in peers)):
        assert time.monotonic() < deadline, [(p.id, p.view.epoch, len(p.view.members)) for p in peers]
        await asyncio.sleep(0.01)
    await asyncio.gather(*(p.wait_linked(timeout) for p in peers))


async def rounds(engines: list[Gossip], k: int) -> None:
    for _ in range(k):
        await asyncio.gather(*(g.round() for g in engines))


def test_late_joiner_and_restarted_peer_bootstrap_from_several_donors():
    async def main() -> None:
        ctx = zmq.asyncio.Context(io_threads=1)
        rng = np.random.default_rng(0)
        async with Coordinator(bind="tcp://127.0.0.1:*", context=ctx) as coord:
            peers, engines = [], []

            def add(pid: str, x: np.ndarray) -> tuple[Peer, Gossip]:
                p = Peer(id=pid, coordinators=[coord.address], topology="ring", context=ctx)
                g = Gossip(p, x, topology="ring", codec="identity", gamma=1.0, sync="lockstep",
                           round_timeout=3.0)
                peers.append(p)
                engines.append(g)
                return p, g

            try:
                for i in range(5):
                    add(f"p{i}", (rng.standard_normal(D) * 3 + i).astype(np.float32))
                await asyncio.gather(*(p.start() for p in peers))
                await settle(peers, 5)
                e0 = consensus_error([g.x for g in engines])
                await rounds(engines, 12)
                xs = [g.x for g in engines]
                spread = consensus_error(xs)
                assert spread < 1e-2 * e0, (spread, e0)

                # a late joiner with garbage parameters
                late, lg = add("late", np.full(D, 1e3, np.float32))
                await late.start()
                await settle(peers, 6)
                served0 = sum(g.stats.boot_served for g in engines[:5])
                donors = await lg.bootstrap(donors=3, timeout=5.0)
                assert len(donors) == 3 and len(set(donors)) == 3 and "late" not in donors
                assert sum(g.stats.boot_served for g in engines[:5]) - served0 == 3
                mean = np.mean(xs, axis=0)
                # at once as close to the swarm's mean as the swarm itself is, not at 1e3
                assert np.linalg.norm(lg.x - mean) <= spread
                await rounds(engines, 3)
                assert consensus_error([g.x for g in engines]) < 2 * spread

                # a peer restarts (same id, fresh process state) and bootstraps again
                i = 2
                await peers[i].close()
                await settle([p for j, p in enumerate(peers) if j != i], 5)
                p2 = Peer(id="p2", coordinators=[coord.address], topology="ring", context=ctx)
                g2 = Gossip(p2, np.zeros(D, np.float32), topology="ring", codec="identity",
                            sync="lockstep", round_timeout=3.0)
                peers[i], engines[i] = p2, g2
                await p2.start()
                await settle(peers, 6)
                assert len(await g2.bootstrap(donors=2)) == 2
                before = consensus_error([g.x for g in engines])
                await rounds(engines, 3)
                after = consensus_error([g.x for g in engines])
                assert after <= before + 1e-6 and after < 2 * spread, (before, after, spread)
            finally:
                for p in peers:
                    await p.close()
        ctx.term()

    asyncio.run(main())


def test_bootstrap_alone_and_bad_replies():
    async def main() -> None:
        ctx = zmq.asyncio.Context(io_threads=1)
        async with Coordinator(bind="tcp://127.0.0.1:*", context=ctx) as coord:
            a = Peer(id="a", coordinators=[coord.address], context=ctx)
            x = np.arange(100, dtype=np.float32)
            ga = Gossip(a, x, codec="identity")
            async with a:
                assert await ga.bootstrap() == []          # nobody to ask: x unchanged
                assert x[5] == 5
                b = Peer(id="b", coordinators=[coord.address], context=ctx)
                # b answers every request with a slice of the wrong size
                b.on("gsp_boot_req", lambda m: asyncio.ensure_future(
                    b.send(m.src, "gsp_boot", {**m.body}, [np.zeros(3, np.float32)])))
                async with b:
                    await settle([a, b], 2)
                    with pytest.raises(GossipError, match="no neighbour sent"):
                        await ga.bootstrap(donors=1, timeout=0.6)
                    assert x[5] == 5 and ga.stats.rejected_malformed >= 1   # nothing written
        ctx.term()

    asyncio.run(main())


@pytest.mark.parametrize("kw", [{"timeout": float("nan")}, {"timeout": None}, {"timeout": 0},
                                {"timeout": float("inf")}, {"donors": 0}, {"donors": 2.5},
                                {"donors": "3"}, {"donors": True}])
def test_bad_bootstrap_arguments_raise_at_once_and_change_nothing(kw):
    """A NaN timeout never ended (its deadline compares false forever) while the only
    neighbour stayed silent; None, a float or a string count raised TypeError."""
    async def main() -> None:
        ctx = zmq.asyncio.Context(io_threads=1)
        async with Coordinator(bind="tcp://127.0.0.1:*", context=ctx) as coord:
            a = Peer(id="a", coordinators=[coord.address], context=ctx)
            b = Peer(id="b", coordinators=[coord.address], context=ctx)   # no engine: never answers
            x = np.arange(100, dtype=np.float32)
            ga = Gossip(a, x, codec="identity")
            async with a, b:
                await settle([a, b], 2)
                with pytest.raises(ConfigError, match="donors|timeout"):
                    await asyncio.wait_for(ga.bootstrap(**kw), 5.0)
                assert np.array_equal(x, np.arange(100, dtype=np.float32)) and ga.t == 0
        ctx.term()

    asyncio.run(main())
