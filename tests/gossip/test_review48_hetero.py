"""Peers with different settings in one swarm (review 48): each on a live swarm, a
Coordinator and Peers in this event loop over ZeroMQ on loopback (gossip.test_live).

* A neighbour much faster than an async peer sent it more messages between two of its
  rounds than the backlog holds; the oldest was dropped whatever it was, the full state
  that repaired the gap among them, and the slow peer stayed out of sync for good.
* Neighbours with codecs of different families refused each other's every delta (each
  engine decoded with its own family), at DEBUG only.
* Neighbours with different gammas moved the swarm's mean with every round ok and
  nothing said.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from gossip.test_live import LiveSwarm
from swarm.gossip import Gossip
from swarm.compress import get_codec
from swarm.gossip.engine import _MAX_PENDING, T_DELTA, T_FULL

pytestmark = pytest.mark.timeout(120)

D = 1000


def _vectors(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [(rng.standard_normal(D) + 10 * i).astype(np.float32) for i in range(n)]


def _total(xs: list[np.ndarray]) -> float:
    return float(sum(x.astype(np.float64).sum() for x in xs))


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("swarm.")]


@pytest.mark.parametrize("codec", ["fp16", "topk:0.1"])
def test_an_async_peer_far_slower_than_its_neighbour_stays_in_sync(codec):
    # A 2-ring in async mode: p01 runs 50 rounds for each of p00's, more messages than
    # p00's backlog holds (_MAX_PENDING + max_staleness = 33). Before, the overflow dropped
    # the full state that repaired p00's copy (behind it, more than 33 deltas), so p00
    # mixed nobody in most rounds and p01 sent it a full state every other round.
    fast_per_slow, slow_rounds = 50, 12
    assert fast_per_slow > _MAX_PENDING + 1

    async def main():
        async with LiveSwarm(2, "ring") as sw:
            xs = _vectors(2)
            slow, fast = (Gossip(p, x, topology="ring", codec=codec, gamma="auto", sync="async")
                          for p, x in zip(sw.peers, xs))
            results = []
            try:
                for _ in range(slow_rounds):
                    for _ in range(fast_per_slow):
                        await fast.round()
                    # messages arrive in order: once the last is held, every one has come
                    last = fast.t - 1
                    async with asyncio.timeout(20):
                        while not ((c := slow._in.get("p01")) and c.pending
                                   and c.pending[-1].body["r"] == last):
                            await asyncio.sleep(0.005)
                    results.append(await slow.round())
            finally:
                slow.close()
                fast.close()
            return slow, fast, results

    slow, fast, results = asyncio.run(main())
    later = results[2:]   # the first rounds join: the first full state, the first mix
    assert all(r.ok for r in later), [(r.round, r.reason) for r in results]
    assert slow.stats.out_of_sync <= len(results), slow.stats
    assert slow.stats.nacks_sent <= 2, slow.stats
    assert fast.stats.full_sent <= 2, fast.stats


@pytest.mark.parametrize("sync", ["lockstep", "bounded"])
def test_a_backlog_past_its_bound_keeps_the_newest_full_state_and_what_builds_on_it(sync):
    # p00 runs no round while p01's stream sends it a full state, 20 deltas, a second full
    # state (after a gap) and 18 deltas: past the bound (33) the messages before the second
    # full state go, superseded by it. Before, the oldest went one at a time: the first
    # full state first, then each delta behind it was out of sync and nacked in the round.
    codec = get_codec("topk:0.1")
    rng = np.random.default_rng(1)
    msgs = [(T_FULL, {"r": 0, "ver": 10}, [rng.standard_normal(D).astype(np.float32)])]
    msgs += [(T_DELTA, {"r": r, "ver": 10 + r, "meta": (e := codec.encode(rng.standard_normal(D)
                                                                          .astype(np.float32))).meta},
              list(e.frames)) for r in range(1, 21)]
    msgs += [(T_FULL, {"r": 21, "ver": 100}, [rng.standard_normal(D).astype(np.float32)])]
    msgs += [(T_DELTA, {"r": r, "ver": 79 + r, "meta": (e := codec.encode(rng.standard_normal(D)
                                                                          .astype(np.float32))).meta},
              list(e.frames)) for r in range(22, 40)]

    async def main():
        async with LiveSwarm(2, "ring") as sw:
            held, sender = sw.peers
            g = Gossip(held, np.zeros(D, np.float32), topology="ring", codec="topk:0.1", gamma=0.2,
                       sync=sync, round_timeout=20.0)
            try:
                for t, body, arrays in msgs:
                    assert await sender.send("p00", t, body, arrays, timeout=5.0)
                async with asyncio.timeout(20):
                    while not ((c := g._in.get("p01")) and c.pending and c.pending[-1].body["r"] == 39):
                        await asyncio.sleep(0.005)
                kept = [m.body["ver"] for m in g._in["p01"].pending]
                first = await g.round()
            finally:
                g.close()
            return g, kept, first

    g, kept, first = asyncio.run(main())
    assert kept == [100, *range(101, 119)], kept
    assert g.stats.backlog_dropped == 21
    assert first.participants == ["p01"], first
    assert (g.stats.out_of_sync, g.stats.nacks_sent) == (0, 0), g.stats


@pytest.mark.parametrize("codecs", [("int8", "topk:0.1"), ("identity", "ef+topk:0.1"), ("fp16", "qsgd:4")])
def test_neighbours_with_codecs_of_different_families_average(codecs, caplog):
    # Each engine decodes a delta by the family its meta names. Before, each decoded with
    # its own, refused every delta (rejected_malformed, at DEBUG), nacked it and got a full
    # state: a full state every round, and averaging in every other round only. Both use
    # one gamma, so lockstep keeps the sum, and nothing is warned of.
    caplog.set_level(logging.WARNING)

    async def main():
        async with LiveSwarm(2, "ring") as sw:
            xs = _vectors(2)
            before = _total(xs)
            engines = [Gossip(p, x, topology="ring", codec=c, gamma=0.2, round_timeout=20.0)
                       for p, x, c in zip(sw.peers, xs, codecs)]
            try:
                rounds = [await asyncio.gather(*(g.round() for g in engines)) for _ in range(20)]
            finally:
                for g in engines:
                    g.close()
            return xs, before, engines, rounds

    xs, before, engines, rounds = asyncio.run(main())
    assert all(r.ok for rs in rounds for r in rs), [[(r.round, r.reason) for r in rs] for rs in rounds]
    assert [g.stats.rejected_malformed for g in engines] == [0, 0]
    assert all(g.stats.full_sent <= 2 for g in engines), [g.stats for g in engines]
    assert abs(_total(xs) - before) <= 1e-5 * abs(before), (_total(xs), before)
    assert _warnings(caplog) == []


def test_a_neighbour_with_another_gamma_is_warned_of_once(caplog):
    # gamma="auto" with top-10% on one peer and top-50% on the other: steps 0.2 and 1.0.
    # Every round is ok and nothing is refused, but the two ends of the edge move by
    # different steps and the sum over peers moves; each engine says so once, naming
    # its neighbour and both gammas.
    caplog.set_level(logging.WARNING)

    async def main():
        async with LiveSwarm(2, "ring") as sw:
            xs = _vectors(2)
            engines = [Gossip(p, x, topology="ring", codec=c, gamma="auto", round_timeout=20.0)
                       for p, x, c in zip(sw.peers, xs, ["topk:0.1", "topk:0.5"])]
            try:
                rounds = [await asyncio.gather(*(g.round() for g in engines)) for _ in range(30)]
            finally:
                for g in engines:
                    g.close()
            return engines, rounds

    engines, rounds = asyncio.run(main())
    assert [g.gamma for g in engines] == [0.2, 1.0]
    assert all(r.ok for rs in rounds for r in rs)
    said = _warnings(caplog)
    assert len(said) == 2, said
    assert sum("neighbour 'p01' mixes with gamma=1, this engine with 0.2" in m for m in said) == 1, said
    assert sum("neighbour 'p00' mixes with gamma=0.2, this engine with 1" in m for m in said) == 1, said
