"""Receivers keep a bounded number of inbound public copies (``Gossip._in``).

Outbound per-receiver streams were capped at ``_MAX_EDGE_STREAMS``, but a receiver
kept a copy (4·d bytes) of every sender it had ever heard from: under random
pairing that grew to n − 1 copies a peer (1 GB at 256 peers and d = 1e6), and in a
ring filled one join at a time rank 0 kept a copy of every former neighbour.
"""

import asyncio

import numpy as np

from swarm.gossip import Gossip
from swarm.gossip import engine
from swarm.gossip.engine import _MAX_EDGE_STREAMS
from swarm.gossip.sim import SimHub, consensus_error, run_rounds

# twice the senders' stream cap (random pairing and static graphs: _MAX_EDGE_STREAMS)
BOUND = 2 * _MAX_EDGE_STREAMS


def make(n, d=200, topology="random_pairing", **kw):
    hub = SimHub(topology=topology)
    links = hub.add_many(n)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(d).astype(np.float32) + i for i in range(n)]
    engines = [Gossip(l, x, topology=topology, codec="ef+topk:0.1", gamma="auto", **kw)
               for l, x in zip(links, xs)]
    return hub, xs, engines


def test_random_pairing_keeps_at_most_the_bound_of_copies_and_converges():
    # 30 peers meet up to 29 partners; each kept a copy of every one of them
    async def main():
        hub, xs, engines = make(30)
        m0 = np.stack(xs).astype(np.float64).mean(0)
        e0 = consensus_error(xs)
        most = 0
        for _ in range(250):
            await run_rounds(engines, 1)
            most = max(most, max(len(g._in) for g in engines))
            if consensus_error(xs, e0) < 1e-3:
                break
        m = np.stack(xs).astype(np.float64).mean(0)
        assert most == BOUND                              # reached, and never passed
        assert consensus_error(xs, e0) < 1e-3
        assert np.linalg.norm(m - m0) / np.linalg.norm(m0) < 1e-6   # lockstep keeps the mean
        assert not hub.errors
    asyncio.run(main())


def test_async_random_pairing_bounds_the_copies_with_nothing_to_apply():
    # async rounds interleave: a copy may hold a message that arrived after its
    # receiver's round; such copies are kept until a round applies them
    async def main():
        hub, xs, engines = make(30, sync="async")
        e0 = consensus_error(xs)
        idle = 0
        for _ in range(100):
            await run_rounds(engines, 1)
            idle = max(idle, max(sum(not c.pending for c in g._in.values()) for g in engines))
        assert idle <= BOUND
        assert consensus_error(xs, e0) < 0.1
        assert not hub.errors
    asyncio.run(main())


def test_a_ring_filled_one_join_at_a_time_drops_former_neighbours_copies():
    async def main():
        hub = SimHub(topology="ring")
        rng = np.random.default_rng(1)
        engines = {}

        def join(link):
            engines[link.id] = Gossip(link, rng.standard_normal(64).astype(np.float32),
                                      topology="ring", codec="ef+topk:0.1", gamma="auto", sync="async")
        for link in hub.add_many(3):
            join(link)
        for k in range(3, 30):
            join(hub.add(f"p{k:03d}"))
            await run_rounds(list(engines.values()), 2)
        p0 = engines["p000"]
        assert sorted(hub.links["p000"].neighbours()) == ["p001", "p029"]
        assert len(p0._in) <= BOUND and {"p001", "p029"} <= set(p0._in)
        assert not hub.errors
    asyncio.run(main())


def test_a_delta_from_a_sender_whose_copy_was_dropped_is_nacked_and_answered_full(monkeypatch):
    # Keeping no more copies than this round's senders (8 peers: one partner a round)
    # drops copies whose senders still hold a stream to us. Their next delta meets a
    # new copy without a version: it is counted and nacked, that partner is left out
    # of that round, and the sender's next message to us is a full state, so no pair
    # misses two meetings in a row.
    monkeypatch.setattr(engine, "_IN_COPIES_PER_STREAM", 0)

    async def main():
        hub, xs, engines = make(8, d=64)
        e0 = consensus_error(xs)
        rounds = await run_rounds(engines, 200)
        assert max(len(g._in) for g in engines) <= 1
        assert consensus_error(xs, e0) < 0.1   # slower: half the meetings fail here
        assert not hub.errors
        return engines, rounds
    engines, rounds = asyncio.run(main())
    for k, g in enumerate(engines):
        meetings: dict[str, list[bool]] = {}
        for res in (rnd[k] for rnd in rounds):
            for j in res.participants:
                meetings.setdefault(j, []).append(True)
            for j in res.missing:
                meetings.setdefault(j, []).append(False)
        missed = sum(m.count(False) for m in meetings.values())
        assert missed > 0 and g.stats.out_of_sync == g.stats.nacks_sent == missed
        for j, m in meetings.items():
            assert not any(not a and not b for a, b in zip(m, m[1:])), (g.link.id, j, m)
