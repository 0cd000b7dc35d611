"""Replication resends back off for a target that acknowledges nothing.

A target that receives pushes but never acknowledges them (a hung peer until the
coordinator declares it dead, a peer that drops them) was sent every item it had
not acknowledged again every ``ack_timeout``. Now each round of resends to it
doubles its wait, up to ``ack_timeout_max``; its next ack resets it, and a target
that leaves the first k hands its items to the next one at once.
"""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

import numpy as np
import pytest
from swarmtest import until

from fakelink import Hub
from swarm.buffer import Federation, ReplayBuffer, federation
from swarm.coordinator import Coordinator
from swarm.errors import ReplayError
from swarm.peer import Peer

SCHEMA = {"obs": ("float32", (3,)), "action": ("int64", ())}


def items(n, start=0):
    k = np.arange(start, start + n)
    return {"obs": np.tile(k[:, None], (1, 3)).astype(np.float32), "action": k}


def peer(hub, name, nbrs, **kw):
    buf = ReplayBuffer(SCHEMA, 1000, first_seq=0, seed=0, peer_id=name)
    return buf, Federation(buf, hub.link(name, nbrs), seed=1, **kw)


@pytest.fixture
def clock(monkeypatch):
    """The federation's monotonic clock, driven by the test (seconds)."""
    now = [0.0]
    monkeypatch.setattr(federation, "time", SimpleNamespace(monotonic=lambda: now[0]))
    return now


def test_resends_to_a_silent_target_back_off_to_the_cap(clock):
    """ack_timeout 1, ack_timeout_max 30 (the default), a flush every 0.25 s, 10 items sent at 0 to b, which never
    acks: resend rounds at 1.25 (past the deadline), then after waits of 2, 4, 8, 16 and
    30: 3.25, 7.25, 15.25, 31.25, 61.25, 91.25, ... Before, a round at every deadline
    (1.25, 2.5, 3.75, ...): 51 in the first 64 s."""
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b"], share=0.0, replicas=1, ack_timeout=1.0)   # cap: 30 s
        hub.link("b", ["a"])                    # receives everything, acknowledges nothing
        a.add(items(10))
        rounds = []
        for step in range(int(184 / 0.25) + 1):
            clock[0] = step * 0.25
            before = fa.stats.pushed
            await fa.flush()
            await hub.settle()
            if fa.stats.pushed > before and clock[0] > 0:
                rounds.append(clock[0])
            assert fa.stats.pushed - before in (0, 10)
        await hub.close()
        assert rounds == [1.25, 3.25, 7.25, 15.25, 31.25, 61.25, 91.25, 121.25, 151.25, 181.25]
        assert fa.stats.resent == 100 and fa.stats.pushed == 110
        # still trying: nothing acknowledged, nothing reported safe
        assert fa.take_acknowledged() == [] and fa.stats.under_replicated == 10
    asyncio.run(main())


def test_an_acking_target_beside_a_silent_one_gets_each_item_once_and_a_lost_push_after_one_timeout(clock):
    """replicas=2: b never acks, c does. c gets every item once and acknowledges it;
    one push to c that is lost is sent again at the first flush past its deadline
    (one ack_timeout), while b's resends wait longer and longer."""
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b", "c"], share=0.0, replicas=2, ack_timeout=1.0)
        hub.link("b", ["a", "c"])
        c, fc = peer(hub, "c", ["a", "b"], share=0.0)
        c_link = hub.links["c"]
        arrived = None
        for step in range(200):                 # 50 s, an item per flush
            clock[0] = step * 0.25
            a.add(items(1, step))
            if step == 100:                     # c misses this flush's push (item 100, at 25 s)
                push = c_link._handlers.pop(federation.PUSH)
            await fa.flush()
            if step == 100:
                c_link._handlers[federation.PUSH] = push
            await hub.settle()
            if arrived is None and ("a", 100) in c.ids():
                arrived = clock[0]
        await hub.close()
        assert arrived == 26.25                 # the first flush past its deadline (26)
        assert sorted(s for _, s in c.ids()) == list(range(200))
        assert fc.stats.received == 200 and fc.stats.duplicates == 0
        assert "c" not in fa._backoff and fa._backoff["b"][0] == 30.0
        # c's copies count, b's never: no item is held by two
        assert fa.take_acknowledged() == [] and fa.stats.under_replicated == 200
    asyncio.run(main())


def test_a_silent_target_that_starts_acking_gets_its_backlog_at_once(clock):
    """b is silent for 100 s (its wait at the 30 s cap), then acknowledges: its first ack
    resets the wait, and the items it missed go on the next flush past their deadline,
    not up to 30 s later."""
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b"], share=0.0, replicas=1, ack_timeout=1.0)
        b_link = hub.link("b", ["a"])
        for step in range(400):
            clock[0] = step * 0.25
            a.add(items(1, step))
            await fa.flush()
            await hub.settle()
        assert fa._backoff["b"][0] == 30.0 and fa.take_acknowledged() == []
        b = ReplayBuffer(SCHEMA, 1000, seed=0, peer_id="b")
        Federation(b, b_link, share=0.0)        # b acknowledges from now on
        clock[0] = 100.0
        a.add(items(1, 400))
        await fa.flush()                        # item 400 goes and is acked
        await hub.settle()
        assert "b" not in fa._backoff
        assert [s for _, s in fa.take_acknowledged()] == [400]
        clock[0] = 100.25
        await fa.flush()                        # the waiting items past their deadline go now
        await hub.settle()
        assert sorted(s for _, s in fa.take_acknowledged()) == list(range(397))
        clock[0] = 101.0                        # and those pushed in the last second at theirs
        await fa.flush()
        await hub.settle()
        await hub.close()
        assert sorted(s for _, s in fa.take_acknowledged()) == [397, 398, 399]
        assert fa.stats.under_replicated == 0 and len(b) == 401
    asyncio.run(main())


def test_a_silent_target_that_dies_hands_its_items_to_the_next_at_once(clock):
    """replicas=1: b never acks and its wait has grown to 30 s; when it leaves the
    neighbourhood its items go to c on the next flush."""
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b", "c"], share=0.0, replicas=1, ack_timeout=1.0)
        hub.link("b", ["a", "c"])
        c, _ = peer(hub, "c", ["a", "b"], share=0.0)
        a.add(items(20))
        for step in range(400):
            clock[0] = step * 0.25
            await fa.flush()
            await hub.settle()
        assert fa._backoff["b"][0] == 30.0 and not c.ids()
        hub.kill("b")
        clock[0] = 100.0
        await fa.flush()
        await hub.settle()
        await hub.close()
        assert sorted(s for _, s in fa.take_acknowledged()) == list(range(20))
        assert sorted(s for _, s in c.ids()) == list(range(20)) and fa._backoff == {}
    asyncio.run(main())


def test_resent_counts_items_only_when_they_are_pushed_again(clock):
    """replicas=1: b takes 10 pushes, acknowledges none, and leaves the view with no
    neighbour to take its place. stats.resent counted the 10 at once, though nothing went
    again; now they wait uncounted (under_replicated) until c joins and gets them."""
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b"], share=0.0, replicas=1, ack_timeout=1.0)
        hub.link("b", ["a"])                    # silent: acknowledges nothing
        a.add(items(10))
        await fa.flush()
        await hub.settle()
        assert (fa.stats.pushed, fa.stats.resent) == (10, 0)
        hub.links["a"].set_neighbours([])       # b leaves; no successor
        for t in (0.5, 5.0):                    # before and past the pushes' deadline
            clock[0] = t
            await fa.flush()
            assert (fa.stats.pushed, fa.stats.resent, fa.stats.under_replicated) == (10, 0, 10)
        c, _ = peer(hub, "c", ["a"], share=0.0)
        hub.links["a"].set_neighbours(["c"])    # the 10 go to c: now they are resent
        clock[0] = 5.25
        await fa.flush()
        await hub.settle()
        await hub.close()
        assert (fa.stats.pushed, fa.stats.resent) == (20, 10)
        assert sorted(s for _, s in c.ids()) == list(range(10))
        assert len(fa.take_acknowledged()) == 10 and fa.stats.under_replicated == 0
    asyncio.run(main())


def test_resent_does_not_count_items_whose_other_holder_is_left(clock):
    """replicas=2: b acknowledges, c is silent and leaves. The items c did not acknowledge
    stay with b, one holder short, and go to no one: none is resent until d joins."""
    async def main():
        hub = Hub()
        a, fa = peer(hub, "a", ["b", "c"], share=0.0, replicas=2, ack_timeout=1.0)
        b, _ = peer(hub, "b", ["a", "c"], share=0.0)
        hub.link("c", ["a", "b"])               # silent
        a.add(items(10))
        await fa.flush()
        await hub.settle()
        hub.links["a"].set_neighbours(["b"])    # c leaves
        clock[0] = 5.0
        await fa.flush()
        await hub.settle()
        assert (fa.stats.pushed, fa.stats.resent, fa.stats.under_replicated) == (20, 0, 10)
        d, _ = peer(hub, "d", ["a", "b"], share=0.0)
        hub.links["a"].set_neighbours(["b", "d"])
        clock[0] = 5.25
        await fa.flush()
        await hub.settle()
        await hub.close()
        assert (fa.stats.pushed, fa.stats.resent) == (30, 10)
        assert sorted(s for _, s in d.ids()) == list(range(10)) and len(b.ids()) == 10
        assert len(fa.take_acknowledged()) == 10
    asyncio.run(main())


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, "30", None])
def test_a_bad_ack_timeout_max_is_named(bad):
    hub = Hub()
    with pytest.raises(ReplayError, match="ack_timeout_max"):
        Federation(ReplayBuffer(SCHEMA, 10, peer_id="a"), hub.link("a", []), ack_timeout_max=bad)


def test_resends_to_a_live_peer_that_never_acks_back_off():
    """Real peers on loopback; b is a Peer without a federation (it takes the pushes and
    acknowledges none, and is never declared dead). 16 items go at once, then a flush every
    20 ms for 40 ack_timeouts: resend rounds at about 1, 3, 7, 15 and 31 ack_timeouts
    (the flushes only make them later). Before: one every ack_timeout or so (~30)."""
    tau = 0.1

    async def main():
        async with Coordinator(bind="tcp://127.0.0.1:*") as coord:
            a = Peer(coordinators=[coord.address], id="a", rank=0, topology="ring")
            b = Peer(coordinators=[coord.address], id="b", rank=1, topology="ring")
            try:
                for p in (a, b):
                    await p.start()
                for p in (a, b):
                    await p.wait_view(lambda v: len(v.members) == 2, timeout=20.0)
                    await p.wait_linked(20.0)
                buf = ReplayBuffer(SCHEMA, 1000, first_seq=0, peer_id="a", seed=0)
                fed = Federation(buf, a, share=0.0, replicas=1, ack_timeout=tau)
                buf.add(items(16))
                loop = asyncio.get_running_loop()
                t0 = loop.time()
                await fed.flush()
                while loop.time() - t0 < 40 * tau:
                    await asyncio.sleep(0.02)
                    await fed.flush()
                elapsed = loop.time() - t0
                assert "b" in a.view.ids and fed.take_acknowledged() == []
                rounds = (fed.stats.pushed - 16) // 16
                assert fed.stats.pushed % 16 == 0 and rounds >= 1
                # rounds k end past (2^k - 1) ack_timeouts: at most log2(elapsed / tau + 1)
                assert rounds <= math.log2(elapsed / tau + 1), (rounds, elapsed)
                # b got them all (and a's buf.resync); it handles neither
                await until(lambda: b.counters.unhandled >= 2 + rounds, 10.0, "the pushes at b")
            finally:
                for p in (a, b):
                    await p.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_an_acks_time_runs_from_when_its_push_went_not_from_before_a_wait(clock):
    # a push that waited 1.5 s on a full queue had its 1 s ack window set before the
    # wait: spent when it went, and the next flush resent it before any ack could come
    hub = Hub()
    buf, fa = peer(hub, "a", ["b"], share=0.0, replicas=1, ack_timeout=1.0, send_timeout=2.0)
    hub.link("b", ["a"])   # receives, acknowledges nothing (yet)
    send = fa.link.send

    async def full_queue(dst, t, body=None, arrays=(), *, timeout=None):
        if t == "buf.push":
            clock[0] += 1.5
        return await send(dst, t, body, arrays, timeout=timeout)

    fa.link.send = full_queue

    async def main():
        buf.add(items(4))
        await fa.flush()
        (deadline,) = [e[2] for e in fa._inflight.values()]
        await fa.flush()   # at once: within the ack window
        return deadline

    deadline = asyncio.run(main())
    assert deadline == pytest.approx(1.5 + 1.0) and fa.stats.pushed == 4 and fa.stats.resent == 0


def test_items_the_ring_overwrites_before_their_first_flush_count_as_unreplicated(clock):
    hub = Hub()
    buf = ReplayBuffer(SCHEMA, 100, first_seq=0, seed=0, peer_id="a")
    fa = Federation(buf, hub.link("a", ["b"]), share=0.0, replicas=1, seed=1)
    hub.link("b", ["a"])
    buf.add(items(100))
    buf.add(items(50, 100))              # the first 50 gone before anything could send them
    asyncio.run(fa.flush())
    assert fa.stats.unreplicated == 50


def test_push_ids_do_not_start_again_at_1_in_a_new_federation():
    # a late ack of the previous process's push 1 matched the new one's push 1
    hub = Hub()
    rids = set()
    for _ in range(2):
        buf = ReplayBuffer(SCHEMA, 100, first_seq=0, seed=0, peer_id="a")
        fa = Federation(buf, hub.link("a", ["b"]), share=0.0, replicas=1, seed=1)
        rids.add(next(fa._rid))
    assert len(rids) == 2 and 1 not in rids
