"""Federation defects found by review 39: a rate-limited priority share, rides of
arrays that are no numpy arrays, flush and run after close."""

import asyncio

import numpy as np
import pytest

from fakelink import Hub
from swarm.buffer import Federation, ReplayBuffer
from swarm.errors import ReplayError

SCHEMA = {"x": ("int64", ())}


def buffer(name):
    return ReplayBuffer(SCHEMA, 1000, seed=0, first_seq=0, peer_id=name)


def ranked(buf, n):
    """n new items, item k with priority k: the highest are the last seqs."""
    idx = buf.add({"x": np.arange(n)})
    buf.update_priorities(idx, np.arange(float(n)))


# ------------------------------------------------ priority share under a rate
def test_a_rate_limited_priority_share_pushes_the_highest_priorities():
    """Before: the rate cut kept the last of the share, which _pick ordered highest
    first, so the lowest-priority items of the share went (seqs 50-59, not 90-99)."""
    async def main():
        hub = Hub()
        try:
            a, b = buffer("a"), buffer("b")
            fa = Federation(a, hub.link("a", ["b"]), share=0.5, share_by="priority", rate=0.001, burst=10)
            fb = Federation(b, hub.link("b", ["a"]))
            ranked(a, 100)
            await fa.flush()
            await hub.settle()
            assert sorted(s for _, s in b.ids()) == list(range(90, 100))
            assert fa.stats.throttled == 40
            fa.close()
            fb.close()
        finally:
            await hub.close()
    asyncio.run(main())


def test_a_rate_limited_priority_ride_carries_the_highest_priorities():
    """Before: a ride cut by the rate carried the lowest-priority items of its share."""
    c = buffer("c")
    fc = Federation(c, Hub().link("c", ["d"]), share=0.5, share_by="priority", rate=0.001, burst=10,
                    ride=True)
    ranked(c, 100)
    body, arrays = fc.ride()
    assert sorted(arrays[2].tolist()) == list(range(90, 100))      # the seqs
    # what a refused ride would send again is what rode
    assert sorted(c.items(fc._ridden[0]).seqs.tolist()) == list(range(90, 100))
    fc.close()


def test_an_unlimited_newest_share_is_unchanged():
    """The order change must not touch share_by='newest' under a rate: the newest go."""
    async def main():
        hub = Hub()
        try:
            a, b = buffer("a"), buffer("b")
            fa = Federation(a, hub.link("a", ["b"]), share=0.5, rate=0.001, burst=10)
            fb = Federation(b, hub.link("b", ["a"]))
            ranked(a, 100)
            await fa.flush()
            await hub.settle()
            assert sorted(s for _, s in b.ids()) == list(range(90, 100))
            fa.close()
            fb.close()
        finally:
            await hub.close()
    asyncio.run(main())


# ------------------------------------------------ rides of non-arrays
GOOD = [np.zeros((2, 2), np.float32), np.zeros(2, np.int32), np.arange(2), np.zeros(2), np.ones(2)]


def _with(i, value):
    arrays = list(GOOD)
    arrays[i] = value
    return arrays


@pytest.mark.parametrize("arrays", [
    _with(1, [[0], [0, 0]]),            # ragged origins
    _with(2, [[1], [2, 3]]),            # ragged seqs
    _with(2, [1, 2]),                   # seqs a plain list
    _with(3, [[1.0], [2.0, 3.0]]),      # ragged times
], ids=["ragged origins", "ragged seqs", "list seqs", "ragged times"])
def test_arrive_counts_and_drops_arrays_that_are_not_numpy_arrays(arrays):
    """Before: a list of seqs raised AttributeError, ragged origins or times a raw
    ValueError, on the thread that takes gradients in."""
    buf = ReplayBuffer({"obs": ("float32", (2,))}, 16, seed=0, first_seq=0, peer_id="b")
    fed = Federation(buf, Hub().link("b", ["a"]), ride=True)
    fed.arrive("a", {"fields": ["obs"], "peers": ["a"]}, arrays)
    assert fed.stats.dropped_messages == 1 and "numpy arrays" in fed.stats.errors[0]
    assert len(buf) == 0
    fed.arrive("a", {"fields": ["obs"], "peers": ["a"]}, GOOD)   # a good ride is still taken
    assert len(buf) == 2
    fed.close()


# ------------------------------------------------ after close
def test_flush_after_close_raises_and_ends_a_forgotten_run_task():
    """Before: flush() after close() went on pushing (pull() raised), and a run() task
    not cancelled resent replication pushes, whose acks were no longer handled, for ever."""
    async def main():
        hub = Hub()
        try:
            a, b = buffer("a"), buffer("b")
            fa = Federation(a, hub.link("a", ["b"]), replicas=1, ack_timeout=0.01, ack_timeout_max=0.01)
            fb = Federation(b, hub.link("b", ["a"]))
            a.add({"x": np.arange(5)})
            task = asyncio.create_task(fa.run(0.01))
            await asyncio.sleep(0)              # its first flush
            fa.close()
            pushed = fa.stats.pushed
            with pytest.raises(ReplayError, match="closed"):
                async with asyncio.timeout(10):
                    await task
            with pytest.raises(ReplayError, match="closed"):
                await fa.flush()
            await hub.settle()
            assert fa.stats.pushed == pushed
            fb.close()
        finally:
            await hub.close()
    asyncio.run(main())
