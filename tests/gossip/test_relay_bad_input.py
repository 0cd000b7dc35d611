"""The relay's public calls refuse what they cannot do before anything changes: a clock
or update count the wire cannot carry, a publish after close, a ``take(before=...)``
that is not a clock; numpy ints are ints, as swarm.checks.is_int says."""

import asyncio
import math

import numpy as np
import pytest

from swarm.errors import ConfigError, GossipError
from swarm.gossip import GradientRelay
from swarm.gossip.sim import SimHub


async def settle():
    """Let every queued delivery and forward run (the hub delivers on the next loop turns)."""
    for _ in range(20):
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)


def ef_pair(hub, **kw):
    """Two relays on a ring with error feedback: a residual that a failed publish must keep."""
    return [GradientRelay(link, 4, codec="ef+topk:0.5", **kw) for link in hub.add_many(2)]


@pytest.mark.parametrize("clock", [2**63, 2**64, 2**70])
@pytest.mark.parametrize("off_loop", [False, True])
def test_a_clock_the_wire_cannot_carry_is_refused_before_anything_changes(clock, off_loop):
    """Such a clock used to fail on the wire after the codec ran: the residual had moved, the
    gradient was counted as published and lost; off the loop nothing was raised at all. It is
    a ConfigError now, in the calling thread, and a held update of the turn stays held."""
    async def main():
        hub = SimHub(topology="ring")
        a, b = ef_pair(hub)
        g0, g1, g2 = (np.array(v, np.float32) for v in ([1, 2, 3, 4], [4, 3, 2, 1], [0, 1, 0, 2]))
        sent = [a.publish(g0, clock=0)]
        sent.append(a.publish(g1, clock=1, hold=True))   # held for the turn's last update
        residual, messages = a._codec.residual.copy(), hub.messages_sent
        call = (lambda: asyncio.to_thread(a.publish, g2, clock)) if off_loop else None
        with pytest.raises(ConfigError, match=f"clock = {clock}: must be an int from 0 to 2\\*\\*63 - 1"):
            if call is not None:
                await call()
            else:
                a.publish(g2, clock=clock)
        await settle()
        np.testing.assert_array_equal(a._codec.residual, residual)
        assert a.stats.published == 2 and hub.messages_sent == messages and b.pending == 1
        assert not hub.errors
        # the turn goes on: the held update and the next one go in one message
        sent.append(a.publish(g2, clock=2))
        await settle()
        np.testing.assert_allclose(np.sum(sent, axis=0) + a._codec.residual, g0 + g1 + g2, atol=1e-6)
        assert [g.tolist() for g in b.take(before=3)] == [g.tolist() for g in sent]
        assert not hub.errors
        await hub.close()
    asyncio.run(main())


def test_the_largest_clock_goes_through():
    async def main():
        hub = SimHub(topology="ring")
        a, b = ef_pair(hub)
        out = a.publish(np.ones(4, np.float32), clock=np.int64(2**63 - 1))
        await settle()
        assert [g.tolist() for g in b.take()] == [out.tolist()] and not hub.errors
        await hub.close()
    asyncio.run(main())


def test_a_wait_for_a_clock_the_wire_cannot_carry_is_refused():
    async def main():
        hub = SimHub(topology="ring")
        a, _ = ef_pair(hub)
        with pytest.raises(ConfigError, match=f"clock = {2**64}"):
            a.wait(2**64, 0.0, every=4)
        assert a.stats.waited_s == 0 and a.stats.wait_timeouts == 0
        await hub.close()
    asyncio.run(main())


def test_an_update_count_the_wire_cannot_carry_is_refused():
    """note_digest's count rides on the next publish: checked where it is given, so that
    publish does not fail on the wire after the codec ran."""
    async def main():
        hub = SimHub(topology="ring")
        a, b = ef_pair(hub, state=lambda: ({}, []))
        with pytest.raises(ConfigError, match=f"note_digest\\({2**64}, 'ab'\\)"):
            a.note_digest(2**64, "ab")
        assert a._digest_out is None and a._own_digests == {}
        out = a.publish(np.ones(4, np.float32), clock=0)   # goes, without a digest
        await settle()
        assert [g.tolist() for g in b.take()] == [out.tolist()] and not hub.errors
        a.note_digest(np.int64(3), "cd")                  # a numpy count is an int
        assert a._digest_out == [3, "cd"] and type(a._digest_out[0]) is int
        await hub.close()
    asyncio.run(main())


@pytest.mark.parametrize("off_loop", [False, True])
def test_publish_after_close_raises_and_sends_nothing(off_loop):
    async def main():
        hub = SimHub(topology="ring")
        a, b = ef_pair(hub)
        a.publish(np.array([1, 2, 3, 4], np.float32))
        await settle()
        assert b.take() and not hub.errors
        a.close()
        await settle()
        residual, messages = a._codec.residual.copy(), hub.messages_sent
        for grad in (np.ones(4, np.float32), None):
            with pytest.raises(GossipError, match=f"relay {a.link.id} is closed"):
                if off_loop:
                    await asyncio.to_thread(a.publish, grad, 1)
                else:
                    a.publish(grad, clock=1)
        await settle()
        assert hub.messages_sent == messages and b.pending == 0 and not hub.errors
        assert a.stats.published == 1 and a.stats.passed == 0 and a.stats.sent == 1
        np.testing.assert_array_equal(a._codec.residual, residual)
        await hub.close()
    asyncio.run(main())


@pytest.mark.parametrize("before,shown", [
    ("x", "'x'"), (math.nan, "nan"), (-5, "-5"), (1.5, "1.5"), (True, "True"), (2**64, str(2**64)),
])
def test_take_before_that_is_not_a_clock_is_refused_and_takes_nothing(before, shown):
    async def main():
        hub = SimHub(topology="ring")
        a, b = ef_pair(hub)
        b.publish(np.ones(4, np.float32), clock=2)
        await settle()
        with pytest.raises(ConfigError, match=f"before = {shown}: must be an int"):
            a.take(before=before)
        assert a.pending == 1 and a.stats.taken == 0 and a._taken_to == -1
        assert len(a.take(before=np.int64(3))) == 1   # a numpy clock is a clock
        await hub.close()
    asyncio.run(main())


def test_numpy_ints_are_ints_and_bools_are_not():
    """GradientRelay checked isinstance(x, int): np.int64 was refused and True taken for 1."""
    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(3)
        a, b, c = (GradientRelay(link, np.int64(4), max_pending=np.int32(8), hops=np.int64(1))
                   for link in links)
        assert type(a.d) is int and type(a._max_pending) is int and type(a.hops) is int
        out = a.publish(np.ones(4, np.float32))
        await settle()
        # one hop: the neighbours get it and pass nothing on (on a ring of 3, both are neighbours)
        assert [g.tolist() for g in b.take()] == [out.tolist()] == [g.tolist() for g in c.take()]
        assert b.stats.forwarded == 0 and not hub.errors
        (extra,) = hub.add_many(1)
        for kw, match in [(dict(d=True), "d = True"), (dict(d=4, max_pending=True), "max_pending = True"),
                          (dict(d=4, hops=True), "hops = True"), (dict(d=np.int64(0)), "d = ")]:
            with pytest.raises(ConfigError, match=match):
                GradientRelay(extra, **kw)
        await hub.close()
    asyncio.run(main())
