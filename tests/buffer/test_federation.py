"""Federation over an in-memory link: share, pull, dedupe, clip, replication that loses nothing."""

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from fakelink import Hub
from swarm.buffer import federation
from swarm.buffer import Federation, Items, RateLimiter, ReplayBuffer
from swarm.errors import PeerTimeout, ReplayError

SCHEMA = {"obs": ("float32", (3,)), "action": ("int64", ())}


def items(n, start=0):
    k = np.arange(start, start + n)
    return {"obs": np.tile(k[:, None], (1, 3)).astype(np.float32), "action": k}


def peer(hub, name, nbrs, cap=1000, **kw):
    buf = ReplayBuffer(SCHEMA, cap, first_seq=0, seed=hash(name) % 100, peer_id=name,
                       limiter=kw.pop("limiter", None))
    return buf, Federation(buf, hub.link(name, nbrs), seed=1, **kw)


def run(coro):
    return asyncio.run(coro)


def test_share_newest_to_every_neighbour_keeps_ids_and_origin_times():
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b", "c"], share=0.25)
        b, _ = peer(hub, "b", ["a"])
        c, _ = peer(hub, "c", ["a"])
        a.add(items(40), times=123.0)
        assert await fa.flush() == 20
        await hub.settle()
        await hub.close()
        for other in (b, c):
            assert len(other) == 10
            assert sorted(s for _, s in other.ids()) == list(range(30, 40))
            assert {p for p, _ in other.ids()} == {"a"}
            s = other.sample(10)
            assert (s.origin_times == 123.0).all()
            assert (s.batch["obs"][:, 0] == s.batch["action"]).all()
    run(main())


def test_share_by_priority_sends_the_highest():
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b"], share=0.1, share_by="priority")
        b, _ = peer(hub, "b", ["a"])
        idx = a.add(items(50))
        a.update_priorities(idx, np.arange(50.0)[::-1])   # item 0 highest
        await fa.flush()
        await hub.settle()
        await hub.close()
        assert sorted(s for _, s in b.ids()) == [0, 1, 2, 3, 4]
    run(main())


def test_duplicates_and_echoes_are_dropped():
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b"], share=1.0)
        b, fb = peer(hub, "b", ["a", "c"], share=1.0)
        c, fc = peer(hub, "c", ["b"], share=1.0)
        a.add(items(5))
        await fa.flush()
        await hub.settle()
        # b re-sends what it got: c gets them once, a drops its own items
        b._listeners[0](np.arange(5))
        await fb.flush()
        await hub.settle()
        b._listeners[0](np.arange(5))
        await fb.flush()
        await hub.settle()
        await hub.close()
        assert len(a) == 5 and len(b) == 5 and len(c) == 5
        assert fa.stats.duplicates == 10 and fc.stats.duplicates == 5
        assert sorted(c.ids()) == [("a", i) for i in range(5)]
    run(main())


def test_received_priorities_are_clipped():
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b"], share=1.0)
        b, _ = peer(hub, "b", ["a"], priority_clip=2.0)
        idx = a.add(items(3))
        a.update_priorities(idx, [1e6, 1e6, 1e6])            # a floods with top priority
        b.add(items(3, 100))
        await fa.flush()
        await hub.settle()
        await hub.close()
        s = b.items(np.arange(6))
        got = dict(zip(s.seqs.tolist(), s.priorities.tolist()))
        assert all(p <= 2.0 for p in s.priorities)
        assert len(b) == 6 and max(got.values()) == pytest.approx(2.0)
    run(main())


def test_pull_a_batch_from_a_neighbour():
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b"], share=0.0)
        b, fb = peer(hub, "b", ["a"], share=0.0)
        a.add(items(100))
        got = await fb.pull("a", 30)
        await hub.settle()
        assert 0 < got <= 30 and len(b) == got
        assert all(p == "a" for p, _ in b.ids())
        hub.link("mute", [])                             # a peer with no federation never answers
        with pytest.raises(PeerTimeout, match="mute"):
            await fb.pull("mute", 10, timeout=0.05)
        hub.kill("a")
        assert await fb.pull("a", 10) == 0               # unreachable: the send is refused
        assert fb.stats.send_failures == 1
        await hub.close()
    run(main())


def test_rate_limits_bound_sharing_traffic():
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b"], share=1.0, rate=1e-3, burst=7)
        b, fb = peer(hub, "b", ["a"], limiter=RateLimiter(min_size=1, samples_per_insert=1.0, tolerance=3))
        a.add(items(50))
        assert await fa.flush() == 7                    # burst of 7 items, then the bucket is dry
        await hub.settle()
        assert fa.stats.throttled == 43
        # b takes no more than its learner can use: min_size + tolerance/spi = 4 items
        assert len(b) == 4 and fb.stats.throttled == 3
        await hub.close()
    run(main())


def test_duplicates_take_no_room_from_fresh_items_in_the_same_message():
    # The limiter's room was counted before duplicates were dropped: a message holding
    # 2 fresh items then 2 that b had was trimmed to its last 2 (the duplicates), and
    # b stored nothing though it had room for both fresh ones.
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b"])
        b, fb = peer(hub, "b", ["a"], limiter=RateLimiter(min_size=1, samples_per_insert=1.0, tolerance=3))
        idx = a.add(items(4))
        await fa._send_items("b", "buf.push", a.items(idx[:2]), {"rid": 0, "ack": False})
        await hub.settle()
        assert len(b) == 2 and b.limiter.insert_room() == 2
        mixed = a.items(idx[[2, 3, 0, 1]])                  # fresh 2, 3, then duplicates 0, 1
        await fa._send_items("b", "buf.push", mixed, {"rid": 0, "ack": False})
        await hub.settle()
        await hub.close()
        assert sorted(s for _, s in b.ids()) == [0, 1, 2, 3]
        assert (fb.stats.stored, fb.stats.duplicates, fb.stats.throttled) == (4, 2, 0)
    run(main())


def test_past_its_room_a_message_keeps_its_last_fresh_items():
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b"])
        b, fb = peer(hub, "b", ["a"], limiter=RateLimiter(min_size=1, samples_per_insert=1.0, tolerance=1))
        idx = a.add(items(5))
        await fa._send_items("b", "buf.push", a.items(idx[:1]), {"rid": 0, "ack": False})
        await hub.settle()
        assert b.limiter.insert_room() == 1
        await fa._send_items("b", "buf.push", a.items(idx[[1, 0, 2, 0, 3]]), {"rid": 0, "ack": False})
        await hub.settle()
        await hub.close()
        assert sorted(s for _, s in b.ids()) == [0, 3]
        assert (fb.stats.stored, fb.stats.duplicates, fb.stats.throttled) == (2, 2, 2)
    run(main())


def test_malformed_items_are_dropped_and_counted():
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b"])
        b, fb = peer(hub, "b", ["a"])
        other = Items({"obs": np.zeros((2, 4), np.float32), "action": np.zeros(2, np.int64)}, ["a"],
                      np.zeros(2, np.int32), np.arange(2), np.zeros(2), np.ones(2))
        await fa._send_items("b", "buf.push", other, {"rid": 0, "ack": False})
        await hub.link("x", ["b"]).send("b", "buf.push", {"fields": ["obs"]}, [np.zeros(1)])
        await hub.settle()
        await hub.close()
        assert len(b) == 0 and fb.stats.dropped_messages == 2
        assert any("obs" in e for e in fb.stats.errors)
    run(main())


def test_bad_federation_config_is_named():
    hub = Hub()
    buf = ReplayBuffer(SCHEMA, 8)
    inf, nan = float("inf"), float("nan")
    for kw, word in [({"share": 2}, "share"), ({"share_by": "random"}, "share_by"),
                     ({"replicas": -1}, "replicas"), ({"priority_clip": 0}, "priority_clip"),
                     ({"share": "0.1"}, "share"), ({"priority_clip": nan}, "priority_clip"),
                     ({"priority_clip": "x"}, "priority_clip"), ({"rate": inf}, "rate"),
                     ({"rate": 1.0, "burst": inf}, "burst"), ({"ack_timeout": "2"}, "ack_timeout"),
                     ({"send_timeout": inf}, "send_timeout")]:
        with pytest.raises(ReplayError, match=word):
            Federation(buf, hub.link("a", []), **kw)


def test_acks_and_items_with_an_unhashable_rid_are_dropped_and_counted():
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b"], share=0.0, replicas=1)
        b, _ = peer(hub, "b", ["a"])
        x = hub.link("x", ["a"])
        a.add(items(3))
        await fa.flush()                       # a replication push is in flight: b will ack it
        await x.send("a", "buf.ack", {"rid": [1], "n": 3})
        await x.send("a", "buf.items", {"rid": {"k": 1}, "fields": ["obs", "action"], "peers": ["x"]},
                     fa._arrays(a.items(np.arange(3))))
        await hub.settle()
        await hub.close()
        assert fa.stats.dropped_messages == 2 and all("rid" in e for e in fa.stats.errors)
        assert len(a) == 3 and len(fa.take_acknowledged()) == 3     # the real ack still counted
    run(main())


def test_kill_a_peer_with_replication_k1_every_acknowledged_item_survives():
    """In-process: the peer is 'killed' by cutting it off the hub mid-stream."""
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b", "c"], share=0.0, replicas=1, ack_timeout=0.05)
        b, _ = peer(hub, "b", ["a", "c"], cap=10_000)
        c, _ = peer(hub, "c", ["a", "b"], cap=10_000)
        rng = np.random.default_rng(0)
        acked = []
        for step in range(30):
            a.add(items(int(rng.integers(1, 20)), 1000 * step))
            await fa.flush()
            acked += fa.take_acknowledged()
            if step == 12:
                hub.kill("b")          # a's first replica target dies: a must re-replicate to c
            await hub.settle(rounds=int(rng.integers(0, 3)))
            await asyncio.sleep(0.01)
        for _ in range(10):            # let timeouts fire and resends land
            await asyncio.sleep(0.06)
            await fa.flush()
            acked += fa.take_acknowledged()
            await hub.settle()
        acked += fa.take_acknowledged()
        assert len(set(acked)) == len(acked)                # each id handed out once
        assert len(fa._table) == 0 and fa.stats.under_replicated == 0   # no ack state kept for safe items
        hub.kill("a")
        await hub.close()
        assert len(acked) == a.total_added                  # everything got replicated in the end
        survivors = set(b.ids()) | set(c.ids())
        lost = [i for i in acked if i not in survivors]
        assert not lost, lost[:5]
        assert fa.stats.resent > 0                          # the kill of b was noticed
    run(main())


def test_acked_items_survive_their_holder_restarting_and_then_the_origin_dying():
    """b acks a's items, b restarts empty (as from an old checkpoint), then a dies: b has them again."""
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b", "c"], share=0.0, replicas=1, ack_timeout=0.05)
        b, fb = peer(hub, "b", ["a", "c"], cap=10_000, share=0.0, replicas=1)
        acked = []
        for step in range(5):
            a.add(items(10, 100 * step))
            await fa.flush()
            await hub.settle()
            acked += fa.take_acknowledged()
        assert len(acked) == 50 and len(b.ids()) == 50
        b2, fb2 = peer(hub, "b", ["a", "c"], cap=10_000, share=0.0, replicas=1)   # b restarted: empty
        await fb2.flush()              # its first flush says buf.resync to its neighbours
        await hub.settle()
        await fa.flush()               # a replicates what b had acknowledged again
        await hub.settle()
        acked += fa.take_acknowledged()
        hub.kill("a")
        await hub.close()
        assert len(acked) == len(set(acked)) == 50             # re-acks are not handed out twice
        assert set(acked) <= set(b2.ids())
        assert fa.stats.rereplicated == 50
    run(main())


def test_acked_items_go_to_a_new_holder_when_the_old_one_leaves():
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b", "c"], share=0.0, replicas=1, ack_timeout=0.05)
        b, _ = peer(hub, "b", ["a", "c"], cap=10_000)
        c, _ = peer(hub, "c", ["a", "b"], cap=10_000)
        a.add(items(30))
        await fa.flush()
        await hub.settle()
        acked = fa.take_acknowledged()
        assert len(acked) == 30 and not c.ids()
        hub.kill("b")                  # the holder dies: c is a's first neighbour now
        await fa.flush()
        await hub.settle()
        hub.kill("a")
        await hub.close()
        assert set(acked) <= set(c.ids())
    run(main())


def test_rereplication_forgets_acks_older_than_its_window():
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b", "c"], share=0.0, replicas=1, rereplicate_s=0.05)
        b, _ = peer(hub, "b", ["a", "c"], cap=10_000)
        c, _ = peer(hub, "c", ["a", "b"], cap=10_000)
        a.add(items(30))
        await fa.flush()
        await hub.settle()
        await asyncio.sleep(0.1)
        await fa.flush()               # the acks are older than the window now: forgotten
        assert fa._recent == {}
        hub.kill("b")
        await fa.flush()
        await hub.settle()
        await hub.close()
        assert fa.stats.rereplicated == 0 and not c.ids()
    run(main())



def _flush_one_item_per_quarter_second(monkeypatch, cap, flushes):
    """a adds one item per flush, b acks each; the federation's clock gains 0.25 s a
    flush (rereplicate_s 300: buckets of 4.6875 s, 19 flushes each). Then b restarts."""
    now = [0.0]
    monkeypatch.setattr(federation, "time", SimpleNamespace(monotonic=lambda: now[0]))

    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b"], cap=cap, share=0.0, replicas=1)
        b, _ = peer(hub, "b", ["a"], cap=10_000)
        for i in range(flushes):
            a.add(items(1, i))
            await fa.flush()
            await hub.settle()
            now[0] += 0.25
        assert fa.stats.acked == flushes
        recent = list(fa._recent["b"])
        b2, fb2 = peer(hub, "b", ["a"], cap=10_000)      # b restarted: empty
        await fb2.flush()                                # says buf.resync
        await hub.settle()
        await fa.flush()
        await hub.settle()
        await hub.close()
        return a, b2, fa, recent

    return run(main())


def test_rereplication_remembers_acks_in_time_buckets_not_one_entry_per_ack(monkeypatch):
    # An entry per ack was one per flush for 300 s: 20,000 (~9 MB) after 150 s of a fast run.
    a, b2, fa, recent = _flush_one_item_per_quarter_second(monkeypatch, 10_000, 1000)
    assert len(recent) <= 65 < 1000                          # 250 s in buckets of 300/64 s
    assert _held(recent) == 1000
    assert fa.stats.rereplicated == 1000 and set(a.ids()) <= set(b2.ids())


def test_rereplication_forgets_seqs_the_ring_has_overwritten(monkeypatch):
    # Only items still in the local ring can be sent again: a ring of 100 needs no
    # more than its 100 newest local seqs (and the open bucket's 19 acks).
    a, b2, fa, recent = _flush_one_item_per_quarter_second(monkeypatch, 100, 1000)
    assert _held(recent) <= 100 + 19
    assert fa.stats.rereplicated == 100 and set(a.ids()) <= set(b2.ids())


def _held(buckets):
    """Seqs remembered in a holder's buckets (the open one keeps its acks' arrays apart)."""
    return sum(a.size for _, parts in buckets for a in parts)


def test_rereplication_after_a_holder_dies_sends_exactly_the_acks_in_the_window(monkeypatch):
    """Pins what is replicated again and what is forgotten, with many acks in a bucket.

    rereplicate_s 64: buckets of 1 s. One item acked every 0.25 s for 5 s: buckets
    opened at 0, 1.25, 2.5 and 3.75 s, each taking the acks until 1 s after it opened
    (5, 5, 5 and 5 acks; the last one open). b dies at 66.3 s: the buckets that closed
    before 66.3 - 64 = 2.3 s (items 0-9) are forgotten, the others (items 10-19) go
    to c, a's first neighbour now.
    """
    now = [0.0]
    monkeypatch.setattr(federation, "time", SimpleNamespace(monotonic=lambda: now[0]))

    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b", "c"], share=0.0, replicas=1, rereplicate_s=64.0)
        b, _ = peer(hub, "b", ["a", "c"])
        c, _ = peer(hub, "c", ["a", "b"])
        for i in range(20):
            now[0] = 0.25 * i
            a.add(items(1, i))
            await fa.flush()
            await hub.settle()
        assert fa.stats.acked == 20 and not c.ids()
        assert [len(parts) for _, parts in fa._recent["b"]] == [1, 1, 1, 5]   # closed ones joined
        assert _held(fa._recent["b"]) == 20
        now[0] = 66.3
        hub.kill("b")
        await fa.flush()
        await hub.settle()
        await hub.close()
        assert sorted(s for _, s in c.ids()) == list(range(10, 20))
        assert fa.stats.rereplicated == 10 and "b" not in fa._recent
    run(main())

def test_riding_on_the_relay_shares_new_items_with_the_neighbours_only():
    """Federation(ride=True) as a GradientRelay's rider: each message of a peer's own
    carries the share of its items added since the one before; flush() sends none."""
    from swarm.gossip import GradientRelay
    from swarm.gossip.sim import SimHub

    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(4)
        bufs = [ReplayBuffer(SCHEMA, 1000, first_seq=0, seed=i, peer_id=ln.id) for i, ln in enumerate(links)]
        feds = [Federation(b, ln, share=0.5, seed=1, ride=True) for b, ln in zip(bufs, links)]
        relays = [GradientRelay(ln, 8, topology="ring", rider=f) for ln, f in zip(links, feds)]
        bufs[0].add(items(10))
        assert await feds[0].flush() == 0             # riding: nothing of its own to push
        relays[0].publish(np.ones(8), clock=0)
        await asyncio.sleep(0.01)
        for b in (bufs[1], bufs[3]):                  # the neighbours: the newest half
            assert sorted(s for _, s in b.ids()) == [5, 6, 7, 8, 9]
            s = b.sample(5)
            assert (s.batch["obs"][:, 0] == s.batch["action"]).all()
        assert len(bufs[2]) == 0                      # two hops away: the gradient only
        assert relays[2].stats.received == 1
        bufs[0].add(items(4, start=10))
        relays[0].publish(None, clock=1)              # a pass carries the items added since
        relays[0].publish(None, clock=2)              # and then there are none
        await asyncio.sleep(0.01)
        assert sorted(s for _, s in bufs[1].ids()) == [5, 6, 7, 8, 9, 12, 13]
        assert feds[0].stats.pushed == 2 * 7 and feds[1].stats.stored == 7
        assert relays[1].stats.riders_in == 2
        assert not hub.errors
    run(main())


def test_a_bad_ride_is_dropped_and_counted_and_its_gradient_goes_through():
    from swarm.gossip import GradientRelay
    from swarm.gossip.relay import GRAD
    from swarm.gossip.sim import SimHub

    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(3)
        bufs = [ReplayBuffer(SCHEMA, 100, first_seq=0, seed=i, peer_id=ln.id) for i, ln in enumerate(links)]
        feds = [Federation(b, ln, seed=1, ride=True) for b, ln in zip(bufs, links)]
        relays = [GradientRelay(ln, 4, rider=f) for ln, f in zip(links, feds)]
        body = {"o": links[0].id, "s": 1, "h": 1, "c": 0, "meta": {"codec": "identity", "n": 4}}
        wrong = {"fields": ["obs"], "peers": [links[0].id]}          # the schema has two fields
        await links[0].send(links[1].id, GRAD, dict(body, x=[wrong, 1]),
                            [np.ones(4, np.float32), np.zeros(3, np.float32)])
        await asyncio.sleep(0.01)
        assert len(bufs[1]) == 0 and feds[1].stats.dropped_messages == 1
        assert "obs" in feds[1].stats.errors[0]
        assert [g.tolist() for g in relays[1].take()] == [[1, 1, 1, 1]]
    run(main())


def test_riding_without_a_relay_keeps_a_bounded_backlog():
    hub = Hub()
    buf = ReplayBuffer(SCHEMA, 1000, first_seq=0)
    fed = Federation(buf, hub.link("a", ["b"]), share=1.0, ride=True, max_items=16)
    for k in range(100):
        buf.add(items(1, start=k))
    assert len(fed._unridden) == 16 and fed._new == []
    body, arrays = fed.ride()                          # the newest 16
    assert arrays[-3].tolist() == list(range(84, 100))   # seqs
    assert fed.ride() is None


def test_share_is_the_fraction_of_new_items_however_few_each_flush_has():
    """share=0.1 with one item per flush sent every item (the count was rounded up to 1 each time)."""
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b"], share=0.1)
        b, _ = peer(hub, "b", ["a"])
        for k in range(50):
            a.add(items(1, k))
            await fa.flush()
        for k in range(10):                    # and three at a time
            a.add(items(3, 50 + 3 * k))
            await fa.flush()
        await hub.settle()
        await hub.close()
        assert len(b) == 8 and fa.stats.pushed == 8
        assert sorted(s for _, s in b.ids())[:5] == [9, 19, 29, 39, 49]   # every tenth
    run(main())


def test_share_splits_a_large_flush_into_messages_of_max_items():
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b"], share=1.0, max_items=16)
        b, _ = peer(hub, "b", ["a"])
        link, sizes = hub.links["a"], []
        send = link.send

        async def counting(dst, t, body=None, arrays=(), **kw):
            if t == "buf.push":
                sizes.append(len(arrays[-1]))
            return await send(dst, t, body, arrays, **kw)

        link.send = counting
        a.add(items(100))
        assert await fa.flush() == 100
        await hub.settle()
        await hub.close()
        assert sizes == [16] * 6 + [4]
        assert sorted(b.ids()) == [("a", s) for s in range(100)]
    run(main())


def test_an_item_decayed_to_nothing_does_not_sink_the_push_it_goes_in():
    """Its priority left as NaN (0·inf) and b dropped the whole message, the fresh items with it."""
    async def main():
        clock = [1e6]
        hub = Hub()
        a = ReplayBuffer(SCHEMA, 100, first_seq=0, decay=0.01, clock=lambda: clock[0], peer_id="a")
        b = ReplayBuffer(SCHEMA, 100, decay=0.01, clock=lambda: clock[0], peer_id="b")
        fa = Federation(a, hub.link("a", ["b"]), share=1.0)
        fb = Federation(b, hub.link("b", ["a"]))
        a.add(items(1), times=clock[0] - 1e5)          # 1000/decay old: its leaf is 0
        a.add(items(5, 1))
        await fa.flush()
        await hub.settle()
        await hub.close()
        assert fb.stats.dropped_messages == 0, fb.stats.errors
        assert sorted(b.ids()) == [("a", s) for s in range(6)]
        assert np.isfinite(b.sample(8).weights).all()
    run(main())


def test_a_holder_without_replicas_of_its_own_resyncs_after_a_restart():
    """Only a federation with replicas > 0 said buf.resync: a plain receiver that restarted empty
    never got back what it had acknowledged."""
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b", "c"], share=0.0, replicas=1)
        b, _ = peer(hub, "b", ["a"], cap=10_000, share=0.0)
        a.add(items(20))
        await fa.flush()
        await hub.settle()
        acked = fa.take_acknowledged()
        assert len(acked) == 20 and len(b) == 20
        b2, fb2 = peer(hub, "b", ["a"], cap=10_000, share=0.0)   # b restarted from nothing
        await fb2.flush()
        await hub.settle()
        await fa.flush()
        await hub.settle()
        await hub.close()
        assert set(acked) <= set(b2.ids()) and fa.stats.rereplicated == 20
    run(main())


def test_a_malformed_answer_to_a_pull_ends_it_with_nothing_stored():
    """A neighbour of another schema answers: the pull returns 0 at once instead of a PeerTimeout."""
    async def main():
        hub = Hub()
        other = ReplayBuffer({"obs": ("float32", (5,))}, 100, peer_id="a")
        other.add({"obs": np.zeros((10, 5), np.float32)})
        Federation(other, hub.link("a", ["b"]), share=0.0)
        b, fb = peer(hub, "b", ["a"], share=0.0)
        got = await fb.pull("a", 5, timeout=5.0)
        await hub.close()
        assert got == 0 and len(b) == 0
        assert fb.stats.dropped_messages == 1 and "schema" in fb.stats.errors[0]
    run(main())


def test_items_wait_while_a_kth_neighbour_is_dead_and_go_to_it_when_it_comes_back():
    """replicas=2 with one of two neighbours dead: the items are held by one, wait (counted),
    and reach the other once it is back; before, they were never acknowledged nor sent to it."""
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b", "c"], share=0.0, replicas=2, ack_timeout=0.05)
        b, _ = peer(hub, "b", ["a", "c"])
        peer(hub, "c", ["a", "b"])
        hub.kill("c")
        a.add(items(30))
        for _ in range(3):
            await fa.flush()
            await hub.settle()
        assert fa.take_acknowledged() == [] and len(b) == 30
        assert fa.stats.pushed == 30                   # held by b: not pushed to it again
        assert fa.stats.under_replicated == 30 and len(fa._table) == 30
        hub.dead.discard("c")
        c, _ = peer(hub, "c", ["a", "b"])              # c back, empty
        await fa.flush()
        await hub.settle()
        acked = fa.take_acknowledged()
        await hub.close()
        assert sorted(c.ids()) == [("a", s) for s in range(30)]
        assert sorted(acked) == [("a", s) for s in range(30)]
        assert fa.stats.under_replicated == 0 and len(fa._table) == 0
    run(main())


def test_a_peer_without_neighbours_keeps_at_most_its_ring_waiting():
    """Alone, a replicating peer's waiting items are bounded by its buffer: those the ring
    overwrote are counted and forgotten (before, every seq ever added was kept)."""
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", [], cap=100, share=0.0, replicas=1)
        for step in range(10):
            a.add(items(40, 40 * step))
            await fa.flush()
        assert len(fa._table) == 100 and fa.stats.under_replicated == 100
        assert fa.stats.unreplicated == 300
        b, _ = peer(hub, "b", ["a"])
        hub.links["a"].set_neighbours(["b"])          # a neighbour joins
        await fa.flush()
        await hub.settle()
        acked = fa.take_acknowledged()
        await hub.close()
        assert sorted(b.ids()) == sorted(acked) == [("a", s) for s in range(300, 400)]
        assert fa.stats.under_replicated == 0
    run(main())


def test_an_ack_from_a_peer_the_push_did_not_go_to_changes_nothing():
    """c acks a push that went to b (same rid): before, that cancelled the push, so b's own
    ack was ignored and the items were never acknowledged."""
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b"], share=0.0, replicas=1)
        b, _ = peer(hub, "b", ["a"])
        c = hub.link("c", ["a"])
        a.add(items(5))
        await fa.flush()                               # the push to b is on its way, rid 1
        await c.send("a", "buf.ack", {"rid": 1, "n": 5})
        await hub.settle()
        await hub.close()
        assert len(b) == 5
        assert sorted(fa.take_acknowledged()) == [("a", s) for s in range(5)]
    run(main())


def test_a_resync_whose_send_failed_is_sent_again_at_the_next_flush():
    """Its send's False was ignored: a restarted holder whose neighbour's queue was full
    at its first flush never told it, and got back none of what it had acknowledged."""
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b"], share=0.0, replicas=1)
        b, _ = peer(hub, "b", ["a"], cap=10_000, share=0.0)
        a.add(items(20))
        await fa.flush()
        await hub.settle()
        assert len(fa.take_acknowledged()) == 20
        b2, fb2 = peer(hub, "b", ["a"], cap=10_000, share=0.0)   # b restarted from nothing
        send, tries = fb2.link.send, []

        async def full_once(dst, t, body=None, arrays=(), *, timeout=None):
            if t == "buf.resync":
                tries.append(dst)
                if len(tries) == 1:
                    return False   # a's queue stayed full
            return await send(dst, t, body, arrays, timeout=timeout)

        fb2.link.send = full_once
        await fb2.flush()
        await fb2.flush()
        await fb2.flush()          # told once: no more
        await hub.settle()
        await fa.flush()
        await hub.settle()
        await hub.close()
        assert tries == ["a", "a"] and fb2.stats.send_failures == 1
        assert len(b2) == 20 and fa.stats.rereplicated == 20
    run(main())


def test_a_target_that_dies_holding_acked_items_frees_its_slot_and_the_next_is_sent_them_all():
    """replicas=2: b acknowledges all 10 items, c never does (they stay under-replicated);
    b dies with its copies and d becomes a target. b's copies stop counting: d, which
    takes b's slot, is sent every item (it must not inherit b's "held" marks)."""
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b", "c", "d"], share=0.0, replicas=2, ack_timeout=100.0)
        b, _ = peer(hub, "b", ["a"], share=0.0)
        hub.link("c", ["a"])                          # receives, acknowledges nothing
        d, _ = peer(hub, "d", ["a"], share=0.0)
        a.add(items(10))
        await fa.flush()
        await hub.settle()
        assert len(b) == 10 and len(d) == 0
        assert fa.stats.pushed == 20 and fa.stats.under_replicated == 10
        hub.kill("b")                                 # d is among the first 2 now
        for _ in range(3):
            await fa.flush()
            await hub.settle()
        await hub.close()
        assert sorted(d.ids()) == [("a", s) for s in range(10)]
        assert fa.stats.pushed == 30                  # each item to d once; c's pushes still on the way
        # c still holds nothing acknowledged: nothing is safe, every item keeps its row
        assert fa.take_acknowledged() == [] and fa.stats.under_replicated == 10 and len(fa._table) == 10
    run(main())


def _restart_b_after_it_acked_beside_a_silent_c(hub):
    """a (replicas=2) pushes 10 items to b, which acks them, and to c, which never does;
    then b restarts empty. Returns (a's federation, the new b's buffer and federation)."""
    async def main():
        a, fa = peer(hub, "a", ["b", "c"], share=0.0, replicas=2, ack_timeout=100.0)
        b, _ = peer(hub, "b", ["a"], share=0.0)
        hub.link("c", ["a"])                          # receives, acknowledges nothing
        a.add(items(10))
        await fa.flush()
        await hub.settle()
        assert len(b) == 10 and fa.stats.pushed == 20 and fa.stats.under_replicated == 10
        b2, fb2 = peer(hub, "b", ["a"], share=0.0)    # b restarted from nothing
        await fb2.flush()                             # its first flush says buf.resync to a
        await hub.settle()
        return fa, b2, fb2
    return main()


def test_a_holder_that_restarts_while_its_items_are_under_replicated_is_sent_them_again():
    """replicas=2, c silent so the rows stay: b acknowledged the items, then restarted empty
    and resynced. Its slot must be neither "held" (the resync forgets its copies) nor "on
    the way" (its ack ended that push; no timeout would clear it): b gets them all again."""
    async def main():
        hub = Hub()
        fa, b2, _ = await _restart_b_after_it_acked_beside_a_silent_c(hub)
        assert fa.stats.rereplicated == 10
        await fa.flush()
        await hub.settle()
        await hub.close()
        assert sorted(b2.ids()) == [("a", s) for s in range(10)]
        assert fa.stats.pushed == 30
    run(main())


def test_a_resync_of_items_that_still_have_rows_keeps_one_row_each():
    """The resync re-adds items the table still has (c never acked them): each keeps its one
    row, so it goes to the restarted b once and then waits for c, flush after flush; a
    second row would be pushed again every flush (acks reach one row only)."""
    async def main():
        hub = Hub()
        fa, b2, _ = await _restart_b_after_it_acked_beside_a_silent_c(hub)
        for _ in range(4):
            await fa.flush()
            await hub.settle()
        await hub.close()
        assert len(b2) == 10 and sorted(b2.ids()) == [("a", s) for s in range(10)]
        assert fa.stats.pushed == 30 and fa.stats.resent == 0
        assert fa.stats.under_replicated == 10 and len(fa._table) == 10
        assert fa.take_acknowledged() == []
    run(main())
