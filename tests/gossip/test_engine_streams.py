"""The gossip engine's per-receiver streams and its mixing weights across view changes.

A restarted stream (forgotten past the stream cap, dropped by a view change, or
voided by bootstrap()) began at version 1 again, so its versions were ones the
receiver could still hold from the stream's earlier life: with the restart's first
message lost, the next delta applied to that old copy and the two ends' copies
differed for good, silently. And a view change that landed mid-round left a round
mixing with the old view's weights while its neighbour mixed with the new one's.
"""

import asyncio

import numpy as np
import pytest

from gossip.test_engine import make
from swarm.gossip import Gossip, engine
from swarm.gossip.engine import T_DELTA, T_FULL
from swarm.gossip.sim import SimHub, consensus_error, run_rounds
from swarm.link import View


def lose_next(hub, src, dst):
    """The hub loses the next gossip state (delta or full) from ``src`` to ``dst``
    while send reports it sent, as a TCP queue does for a connection that breaks
    later. Returns the list that the lost message's (type, body) goes into."""
    lost = []
    send = hub._send

    def lossy(s, d, t, body, arrays, seq):
        if (s, d) == (src, dst) and t in (T_DELTA, T_FULL) and not lost:
            lost.append((t, dict(body)))
            return True
        return send(s, d, t, body, arrays, seq)
    hub._send = lossy
    return lost


def mismatched(engines):
    """(sender, receiver, version) of every receiver's copy that is at its sender's
    stream version but holds other values: both ends must hold the same copy."""
    bad = []
    for e in engines:
        for key, s in e._out.items():
            for f in engines:
                c = f._in.get(e.link.id)
                if f is e or (key and key != f.link.id) or c is None:
                    continue
                if c.ver == s.ver and c.ver >= 0 and not np.array_equal(c.hat, s.hat):
                    bad.append((e.link.id, f.link.id, s.ver))
    return bad


def total(xs):
    return float(np.stack(xs).astype(np.float64).sum())


def test_a_stream_forgotten_past_the_cap_restarts_above_the_versions_its_receiver_holds(monkeypatch):
    # Random pairing over 3 peers, one stream kept per peer, so meeting another
    # partner forgets the stream to the last one. p002 meets p000 in rounds 0 and 1
    # (p000's copy of it: version 2), p001 in rounds 2-6 (its stream to p000 is
    # forgotten), then p000 again in rounds 7 and 8. The restarted stream's first
    # message (a full state: version 2 when restarts began at 1) is lost; the next
    # delta (version 3) applied to p000's copy of version 2 from the first meetings.
    monkeypatch.setattr(engine, "_MAX_EDGE_STREAMS", 1)

    async def main():
        hub, _, xs, engines = make(3, d=64, topology="random_pairing", codec="topk:0.5", gamma=0.5,
                                   round_timeout=0.2)
        await run_rounds(engines, 2)
        assert engines[0]._in["p002"].ver == engines[2]._out["p000"].ver
        await run_rounds(engines, 5)
        assert "p000" not in engines[2]._out            # forgotten
        lost = lose_next(hub, "p002", "p000")
        bad = []
        for _ in range(23):
            await run_rounds(engines, 1)
            bad += mismatched(engines)
        assert lost and lost[0][0] == T_FULL and lost[0][1]["r"] == 7, lost
        assert not hub.errors
        return engines, bad
    engines, bad = asyncio.run(main())
    assert bad == []
    # the delta that found no copy of its base was counted, nacked and repaired by a full state
    assert engines[0].stats.out_of_sync >= 1 and engines[0].stats.nacks_sent >= 1
    assert engines[2].stats.full_sent >= 2


def test_a_stream_dropped_by_a_view_change_restarts_above_the_versions_its_receiver_holds():
    # Two peers, paired every round. p000 sees p001 leave the view and come back (p001,
    # frozen meanwhile, saw neither), so its stream to p001 was dropped. The new one
    # began at version 1 (a first delta against zero); lost, the next delta (version 2)
    # applied to p001's copy of version 1 from before, and the copies stayed apart for
    # good: the pair's sum drifted every round.
    async def main():
        hub, links, xs, engines = make(2, d=64, topology="random_pairing", codec="topk:0.5", gamma=0.5,
                                       round_timeout=0.2)
        await run_rounds(engines, 1)
        v = hub.view
        engines[0]._on_view(View(v.epoch + 1, tuple(m for m in v.members if m.id != "p001")))
        engines[0]._on_view(View(v.epoch + 2, v.members))
        lost = lose_next(hub, "p000", "p001")
        bad = []
        for _ in range(6):
            await run_rounds(engines, 1)
            bad += mismatched(engines)
        s0 = total(xs)
        e0 = consensus_error(xs)
        for _ in range(30):
            await run_rounds(engines, 1)
            bad += mismatched(engines)
        assert lost and not hub.errors
        return engines, xs, bad, s0, e0
    engines, xs, bad, s0, e0 = asyncio.run(main())
    assert bad == []
    assert engines[1].stats.out_of_sync >= 1 and engines[1].stats.nacks_sent >= 1
    assert total(xs) == pytest.approx(s0, rel=1e-5)     # lockstep, nothing lost: the sum stays
    assert consensus_error(xs, e0) < 1e-2


def test_a_restarted_engine_that_bootstraps_sends_versions_its_old_process_never_sent():
    # A peer restarted under its id (a new engine on the same link) bootstraps, which
    # restarts its streams: their versions are above its old process's, which its
    # receivers still hold. From 1 again, a lost first full state (version 2) let the
    # next delta (version 3) apply to the copy of version 2 its old engine had sent.
    async def main():
        hub, links, xs, engines = make(3, d=64, topology="ring", codec="topk:0.5", gamma=0.5,
                                       round_timeout=0.2)
        await run_rounds(engines, 2)
        assert engines[1]._in["p000"].ver == engines[0]._out[""].ver
        engines[0].close()
        x = np.zeros(64, np.float32)
        new = Gossip(links[0], x, topology="ring", codec="topk:0.5", gamma=0.5, round_timeout=0.2)
        await new.bootstrap(donors=2, timeout=5.0)
        xs[0] = x
        engines = [new, *engines[1:]]
        lost = lose_next(hub, "p000", "p001")
        bad = []
        for _ in range(8):
            await run_rounds(engines, 1)
            bad += mismatched(engines)
        assert lost and lost[0][0] == T_FULL and not hub.errors
        return engines, bad
    engines, bad = asyncio.run(main())
    assert bad == []
    assert engines[1].stats.out_of_sync >= 1 and engines[1].stats.nacks_sent >= 1


def test_a_view_change_mid_round_mixes_both_ends_with_the_new_views_weights():
    # 3-ring, p002 leaves while p000's round (begun under the old view: weights 1/3)
    # waits; p001's round begins under the new one (2 peers: 1/2). p000 mixed with
    # 1/3 and p001 with 1/2, and the survivors' sum went from 120 to 100.
    async def main(mid_round):
        hub = SimHub(topology="ring")
        links = hub.add_many(3)
        xs = [np.full(4, v, np.float32) for v in (0.0, 30.0, 60.0)]
        engines = [Gossip(l, x, topology="ring", round_timeout=5.0) for l, x in zip(links, xs)]
        engines[2].close()                       # p002 runs no round: it is leaving
        s0 = float(xs[0].sum() + xs[1].sum())
        if mid_round:
            first = asyncio.create_task(engines[0].round())
            await asyncio.sleep(0)               # p000 has sent and waits, under the old view
            assert not first.done()
            hub.remove("p002")
            r1 = await engines[1].round()
            r0 = await first
        else:
            hub.remove("p002")
            r0, r1 = await asyncio.gather(engines[0].round(), engines[1].round())
        return s0, float(xs[0].sum() + xs[1].sum()), r0, r1, xs
    for mid_round in (False, True):
        s0, s1, r0, r1, xs = asyncio.run(main(mid_round))
        assert r0.participants == ["p001"] and r1.participants == ["p000"]
        assert s1 == pytest.approx(s0, rel=1e-6), mid_round
        np.testing.assert_array_equal(xs[0], xs[1])   # exact gossip of two: both at the mean
        assert xs[0][0] == 15.0


def test_a_view_change_mid_round_that_leaves_no_sender_says_so():
    # One-peer exponential over 4: in round 0 p000 mixes p003's state. p003 leaves
    # while p000 waits; under the new view (3 peers) p000's sender of round 0 is p002,
    # which p000 did not wait for and whose round-0 state does not mix p000's: nobody
    # is mixed, and the result says why. The round ends at the view change: a view
    # that landed before the round's wait began was looked at only once something
    # else woke it, so it waited out round_timeout for a sender that had left.
    async def main():
        hub, _, xs, engines = make(4, d=16, topology="one_peer_exponential", codec="topk:0.5",
                                   gamma=0.5, round_timeout=60.0)
        before = xs[0].copy()
        first = asyncio.create_task(engines[0].round())
        await asyncio.sleep(0)
        hub.remove("p003")
        res = await asyncio.wait_for(first, 30.0)
        return res, before, xs[0]
    res, before, x = asyncio.run(main())
    assert not res.ok and res.participants == [] and "view changed" in res.reason, res
    np.testing.assert_array_equal(x, before)


def test_a_view_the_topology_cannot_take_mid_round_ends_the_round_as_before():
    # A hypercube of 4 loses a member mid-round: 3 is no hypercube. The round in
    # flight keeps its weights and drops the sender that left (the next round raises
    # ConfigError, naming the shape, as it did before).
    async def main():
        hub, _, xs, engines = make(4, d=16, topology="hypercube", round_timeout=60.0)
        engines[3].close()
        first = [asyncio.create_task(g.round()) for g in engines[:3]]
        await asyncio.sleep(0)
        hub.remove("p003")
        res = await asyncio.wait_for(asyncio.gather(*first), 30.0)
        with pytest.raises(Exception, match="power of two"):
            await engines[0].round()
        return res
    res = asyncio.run(main())
    assert [r.participants for r in res] == [["p001", "p002"], ["p000"], ["p000"]]


@pytest.mark.parametrize("topology", ["ring", "full"])
def test_a_member_joining_mid_round_leaves_the_round_as_it_began(topology):
    # 3 peers (ring and full: the same triangle, weights 1/3). p001's state to p000 is
    # held, so p001 and p002 finish round 0 under the old view (mixing p000 with 1/3)
    # while p000 waits; then p003 joins. The round p000 began keeps its senders and
    # weights: following the new view it dropped the edge to p002 (4-ring) or mixed
    # with 1/4 (full of 4) while its neighbours had mixed it by the old one, and the
    # three's sum moved (ring: 360 to 280).
    from gossip.test_relay_paths import HoldHub

    async def main():
        hub = HoldHub(topology=topology)
        links = hub.add_many(3)
        xs = [np.full(4, v, np.float32) for v in (0.0, 30.0, 60.0)]
        engines = [Gossip(lk, x, topology=topology, round_timeout=30.0) for lk, x in zip(links, xs)]
        s0 = total(xs)
        hub.hold = {("p001", "p000")}
        first = asyncio.create_task(engines[0].round())
        try:
            await asyncio.sleep(0)                   # p000 has sent and waits
            r1, r2 = await asyncio.wait_for(asyncio.gather(engines[1].round(), engines[2].round()), 30.0)
            assert not first.done()
            hub.add_many(1)                          # p003 joins (it runs no round 0)
            await asyncio.sleep(0.01)
            hub.release()
            r0 = await asyncio.wait_for(first, 30.0)
        finally:
            first.cancel()
        assert not hub.errors
        return s0, total(xs), r0, r1, r2
    s0, s1, r0, r1, r2 = asyncio.run(main())
    assert r0.participants == ["p001", "p002"], r0
    assert r1.participants == ["p000", "p002"] and r2.participants == ["p000", "p001"]
    assert s1 == pytest.approx(s0, rel=1e-6)


def test_a_member_leaving_a_full_graph_mid_round_moves_every_survivor_to_the_new_weights():
    # Full graph of 4 (weights 1/4); p003 leaves while all three survivors wait on it.
    # A sender of their round left, so each mixes by the new view (1/3): the same
    # weight at both ends of every edge, and the survivors' sum stays.
    async def main():
        hub = SimHub(topology="full")
        links = hub.add_many(4)
        xs = [np.full(4, v, np.float32) for v in (0.0, 30.0, 60.0, 90.0)]
        engines = [Gossip(lk, x, topology="full", round_timeout=30.0) for lk, x in zip(links, xs)]
        engines[3].close()                           # p003 runs no round: it is leaving
        s0 = total(xs[:3])
        tasks = [asyncio.create_task(g.round()) for g in engines[:3]]
        try:
            await asyncio.sleep(0.01)
            assert not any(t.done() for t in tasks)
            hub.remove("p003")
            res = await asyncio.wait_for(asyncio.gather(*tasks), 30.0)
        finally:
            for t in tasks:
                t.cancel()
        return s0, total(xs[:3]), res, xs
    s0, s1, res, xs = asyncio.run(main())
    assert [len(r.participants) for r in res] == [2, 2, 2]
    assert s1 == pytest.approx(s0, rel=1e-6)
    for x in xs[:3]:
        np.testing.assert_allclose(x, 30.0, rtol=1e-6)   # exact gossip of three: all at the mean
