"""Buffer defects found by review 40: unchecked sum-tree range writes, a rebase far back
past the priority cap, a refused priority ride cut to its newest items, rides after
close, and duplicate pushes to a target demoted and promoted again."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from fakelink import Hub
from swarm.buffer import Federation, ReplayBuffer, SumTree, federation
from swarm.errors import ReplayError

SCHEMA = {"x": ("int64", ())}
BAD = [np.nan, -1.0, np.inf, -np.inf]


def ones(cap):
    t = SumTree(cap)
    t.set_range(0, np.ones(cap))
    return t


def snapshot(t):
    return t._tree.tolist(), t._bmin.tolist(), t.total, t.min


# ------------------------------------------------ sum-tree range writes
@pytest.mark.parametrize("bad", BAD)
def test_set_range_refuses_a_value_that_is_not_finite_and_non_negative(bad):
    """Before: set_range took NaN, negative and infinite leaves (set() refused them): the
    total became NaN or inf, or a negative leaf was left out of the minimum."""
    t = ones(300)                              # several blocks of the block minimum
    before = snapshot(t)
    with pytest.raises(ReplayError, match="finite and >= 0"):
        t.set_range(10, np.array([1.0, bad, 2.0]))
    with pytest.raises(ReplayError, match="finite and >= 0"):
        t.set_range(0, np.full(300, bad))
    assert snapshot(t) == before


@pytest.mark.parametrize("n", [1, 5, 0])
@pytest.mark.parametrize("bad", BAD)
def test_fill_range_refuses_a_value_that_is_not_finite_and_non_negative(bad, n):
    """Before: fill_range wrote the value unchecked, on its one-leaf path and its run path."""
    t = ones(300)
    before = snapshot(t)
    with pytest.raises(ReplayError, match="finite and >= 0"):
        t.fill_range(3, n, bad)
    assert snapshot(t) == before


@pytest.mark.parametrize("bad", BAD)
def test_assign_and_scale_refuse_leaves_that_are_not_finite_and_non_negative(bad):
    """Before: assign() (and scale(), through set_range) replaced the leaves unchecked."""
    t = ones(8)
    before = snapshot(t)
    leaves = np.ones(8)
    leaves[5] = bad
    with pytest.raises(ReplayError, match="finite and >= 0"):
        t.assign(leaves)
    with pytest.raises(ReplayError, match="finite and >= 0"):
        t.scale(bad)
    assert snapshot(t) == before
    t.assign(np.arange(8.0))                   # good leaves still go in
    assert t.total == 28.0 and t.min == 1.0


# ------------------------------------------------ rebase far back
def test_a_rebase_back_that_would_lift_a_priority_past_the_cap_is_refused():
    """Before: only an overflowing total was refused. A base moved 709.7 s back (decay 1)
    lifted a leaf to 1.6e308, past the cap float max / (4 * capacity) that every other
    write keeps: one update_priorities at the cap then made the total inf, and sampling
    drew from an infinite law (probabilities 0 or NaN)."""
    buf = ReplayBuffer(SCHEMA, 2, decay=1.0, seed=0, clock=lambda: 1000.0)
    buf.add({"x": np.arange(1)})
    buf.add({"x": np.arange(1)}, times=990.0)
    before = buf._tree.leaves.tolist(), buf._base
    with pytest.raises(ReplayError, match="would overflow"):
        buf.rebase(1000.0 - 709.7)
    assert (buf._tree.leaves.tolist(), buf._base) == before
    p = buf.probabilities()
    buf.rebase(1000.0 - 500.0)                 # a base moved back within the cap still works
    np.testing.assert_allclose(buf.probabilities(), p, rtol=1e-9)
    assert (buf._tree.leaves <= buf._max_raw).all()


# ------------------------------------------------ rides
def ranked_backwards(buf, n):
    """n new items, item k with priority n - k: the highest are the first seqs."""
    idx = buf.add({"x": np.arange(n)})
    buf.update_priorities(idx, np.arange(float(n), 0.0, -1.0))


def test_a_refused_priority_ride_rides_again_highest_priority_first():
    """Before: the items of a refused ride were cut to the smaller ride cap by index, the
    newest kept: with share_by="priority" the lowest-priority half of them rode first
    (seqs 25-49 of a share of 0-49, whose priorities fall with the seq)."""
    buf = ReplayBuffer(SCHEMA, 1000, seed=0, first_seq=0, peer_id="c")
    fed = Federation(buf, Hub().link("c", ["d"]), share=0.5, share_by="priority", ride=True)
    ranked_backwards(buf, 100)
    body, arrays = fed.ride()
    assert sorted(arrays[2].tolist()) == list(range(50))          # the seqs: the highest 50
    fed.refused()                                                 # the cap is now 25
    body, arrays = fed.ride()
    assert sorted(arrays[2].tolist()) == list(range(25))
    assert arrays[2].tolist() == list(range(24, -1, -1))          # the preferred last, as _pick
    body, arrays = fed.ride()
    assert sorted(arrays[2].tolist()) == list(range(25, 50))
    assert fed.ride() is None
    fed.close()


def test_a_refused_newest_ride_still_rides_again_newest_first():
    """The change must leave share_by="newest" as it was: the newest half first."""
    buf = ReplayBuffer(SCHEMA, 1000, seed=0, first_seq=0, peer_id="c")
    fed = Federation(buf, Hub().link("c", ["d"]), share=1.0, ride=True)
    buf.add({"x": np.arange(40)})
    fed.ride()
    fed.refused()
    assert fed.ride()[1][2].tolist() == list(range(20, 40))
    assert fed.ride()[1][2].tolist() == list(range(20))
    fed.close()


def test_ride_and_arrive_after_close_send_and_store_nothing():
    """Before: a closed federation (it "receives and collects nothing more") still gave
    the items added before close(), and a refused ride's, to the relay in ride(), and
    stored what arrive() was handed."""
    buf = ReplayBuffer(SCHEMA, 100, seed=0, first_seq=0, peer_id="c")
    fed = Federation(buf, Hub().link("c", ["d"]), share=1.0, ride=True)
    buf.add({"x": np.arange(10)})
    assert fed.ride() is not None
    fed.refused()                              # these 10 would ride again
    buf.add({"x": np.arange(5)})
    fed.close()
    assert fed.ride() is None and fed.stats.pushed == 0
    other = ReplayBuffer(SCHEMA, 100, seed=0, first_seq=0, peer_id="d")
    ride = Federation(other, Hub().link("d", ["c"]), share=1.0, ride=True)
    other.add({"x": np.arange(3)})
    body, arrays = ride.ride()
    fed.arrive("d", body, arrays)
    assert len(buf) == 15 and fed.stats.received == 0
    assert fed.stats.dropped_messages == 1 and "closed" in fed.stats.errors[0]
    ride.close()


# ------------------------------------------------ a target demoted and promoted again

@pytest.fixture
def clock(monkeypatch):
    """The federation's monotonic clock, driven by the test (seconds)."""
    now = [0.0]
    monkeypatch.setattr(federation, "time", SimpleNamespace(monotonic=lambda: now[0]))
    return now


def peer(hub, name, nbrs, **kw):
    buf = ReplayBuffer(SCHEMA, 1000, first_seq=0, seed=0, peer_id=name)
    return buf, Federation(buf, hub.link(name, nbrs), seed=1, share=0.0, **kw)


def triangle(hub):
    """a (first replica target: b, ack_timeout 1 s), b and c, each the others' neighbour."""
    return (peer(hub, "a", ["b", "c"], replicas=1, ack_timeout=1.0), peer(hub, "b", ["a", "c"]),
            peer(hub, "c", ["a", "b"]))


async def flap(hub, fa, clock, after_first=None):
    """a's first target b is pushed 10 items at 0 (then ``after_first()`` runs), is second
    at 0.25 (c is pushed them) and first again at 0.5, all before b's ack comes back and
    within one ack_timeout (1 s)."""
    link = hub.links["a"]
    await fa.flush()
    if after_first is not None:
        after_first()
    for t, order in ((0.25, ["c", "b"]), (0.5, ["b", "c"])):
        clock[0] = t
        link.set_neighbours(order)
        await fa.flush()
    await hub.settle()


def test_a_target_demoted_and_promoted_again_within_ack_timeout_is_not_pushed_twice(clock):
    """Before: promoted again, b had its slot back with nothing on the way, and got the
    10 items a second time while the first push of them still awaited its ack."""
    async def main():
        hub = Hub()
        try:
            (a, fa), (_, fb), (_, fc) = triangle(hub)
            a.add({"x": np.arange(10)})
            await flap(hub, fa, clock)
            assert (fb.stats.received, fb.stats.duplicates) == (10, 0)
            assert fa.stats.pushed == 20 and fa.stats.resent == 0          # to b once, to c once
            assert sorted(s for _, s in fa.take_acknowledged()) == list(range(10))
            for f in (fa, fb, fc):
                f.close()
        finally:
            await hub.close()
    asyncio.run(main())


def test_a_target_demoted_and_promoted_again_gets_no_backoff_step_for_a_push_it_answered(clock):
    """Before: b, promoted again, got the 10 items again and acknowledged them at once; the
    first push (lost) then timed out and backed b off all the same, so that its next lost
    push waited 2 s, not 1. Now the first push's timeout is b's only one, and the resend
    that follows it is acknowledged: b is not backed off."""
    async def main():
        hub = Hub()
        try:
            (a, fa), (b, fb), (_, fc) = triangle(hub)
            b_link = hub.links["b"]
            push = b_link._handlers.pop(federation.PUSH)              # b misses the first push
            a.add({"x": np.arange(10)})
            await flap(hub, fa, clock, after_first=lambda: b_link._handlers.__setitem__(federation.PUSH, push))
            clock[0] = 1.25                                           # past the first push's deadline
            await fa.flush()
            await hub.settle()
            assert fa._backoff == {}
            assert sorted(s for _, s in b.ids()) == list(range(10)) and fb.stats.duplicates == 0
            assert sorted(s for _, s in fa.take_acknowledged()) == list(range(10))
            for f in (fa, fb, fc):
                f.close()
        finally:
            await hub.close()
    asyncio.run(main())
