"""The relay's public calls refuse what they cannot do before anything changes: a clock
or update count the wire cannot carry, a publish, wait or ready after close, a
``take(before=...)`` that is not a clock, a ride or a gradient the wire would refuse;
numpy ints are ints, as swarm.checks.is_int says. Receivers refuse a clock that no
publish sends."""

import asyncio
import dataclasses
import math

import numpy as np
import pytest

from swarm import wire
from swarm.errors import ConfigError, GossipError, WireError
from swarm.gossip import GradientRelay
from swarm.gossip.relay import _HEADER_ROOM, GRAD
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


def test_wait_and_ready_after_close_raise_at_once():
    """wait() on a closed relay waited out its whole timeout (nothing can arrive any more),
    and ready() said it was for direct mode; both raise the relay's closed error now."""
    async def main():
        hub = SimHub(topology="ring")
        a, b = ef_pair(hub)
        b.publish(np.ones(4, np.float32), clock=1)   # b (rank 1) took its turn at clock 1 of every 4
        await settle()
        a.close()
        await settle()
        with pytest.raises(GossipError, match=f"relay {a.link.id} is closed"):
            await asyncio.to_thread(a.wait, 6, 0.5, every=4, first=0)   # b's turn at 5 never comes
        with pytest.raises(GossipError, match=f"relay {a.link.id} is closed"):
            a.ready(timeout=0.5)
        assert a.stats.waited_s == 0 and a.stats.wait_timeouts == 0
        assert a.pending == 1 and len(a.take()) == 1   # what came before close can still be taken
        await hub.close()
    asyncio.run(main())


class Gives:
    """A rider whose ride() returns what the test set, and that keeps what arrives."""

    def __init__(self) -> None:
        self.gives, self.got = None, []

    def ride(self):
        return self.gives

    def arrive(self, src, body, arrays):
        self.got.append((src, body, [a.tolist() for a in arrays]))


class Refusable(Gives):
    """A rider told when its ride could not go."""

    def __init__(self) -> None:
        super().__init__()
        self.refused_n = 0

    def refused(self):
        self.refused_n += 1


@pytest.mark.parametrize("off_loop", [False, True])
def test_a_ride_too_large_beside_the_gradients_is_left_off_and_the_gradients_go(off_loop):
    """A well-formed ride that does not fit beside the turn's updates (61 arrays where 60
    frames are left) raised WireError in the publishing thread, which ended a learner's
    training; the gradients now go without it, counted, and the rider is told."""
    async def main():
        hub = SimHub(topology="ring")
        riders = [Refusable(), Gives()]
        a, b = [GradientRelay(link, 4, codec="ef+topk:0.5", rider=r) for link, r in zip(hub.add_many(2), riders)]
        g = [np.array(v, np.float32) for v in ([1, 2, 3, 4], [4, 3, 2, 1])]
        riders[0].gives = ({"n": 1}, [np.ones(1, np.float32)] * 61)   # 2 + 2 frames are the turn's
        sent = [a.publish(g[0], clock=0, hold=True)]
        sent.append(await asyncio.to_thread(a.publish, g[1], 1) if off_loop else a.publish(g[1], clock=1))
        await settle()
        assert (a.stats.rider_refused, riders[0].refused_n, a.stats.published) == (1, 1, 2)
        assert [x.tolist() for x in b.take(before=2)] == [x.tolist() for x in sent]
        assert riders[1].got == [] and not hub.errors
        await hub.close()
    asyncio.run(main())


@pytest.mark.parametrize("gives,match", [
    (({"n": np.int64(1)}, []), "np.int64 cannot go on the wire"),
    (({"n": 1}, [np.ones(2, complex)]), "dtype complex128 cannot go on the wire"),
    (({"s": "x" * (1 << 17)}, []), "str of 131072 bytes, more than the limit"),
    (("junk", []), "not None or \\(body dict, list of numpy arrays\\)"),
    (({"n": 1}, [[1, 2]]), "not None or"),
    ({"n": 1}, "not None or"),
])
@pytest.mark.parametrize("off_loop", [False, True])
def test_a_ride_the_wire_refuses_is_refused_before_anything_changes(gives, match, off_loop):
    """Such a ride failed on the wire after the codec ran (the residual had moved, the
    gradient was counted as published, the held update was gone); off the loop it was only
    logged, and a malformed one went out. It is a WireError in the calling thread now."""
    async def main():
        hub = SimHub(topology="ring")
        riders = [Gives(), Gives()]
        a, b = [GradientRelay(link, 4, codec="ef+topk:0.5", rider=r) for link, r in zip(hub.add_many(2), riders)]
        g = [np.array(v, np.float32) for v in ([1, 2, 3, 4], [4, 3, 2, 1], [0, 1, 0, 2])]
        sent = [a.publish(g[0], clock=0), a.publish(g[1], clock=1, hold=True)]   # one held for the turn
        await settle()
        residual, stats, messages = a._codec.residual.copy(), dataclasses.asdict(a.stats), hub.messages_sent
        riders[0].gives = gives
        with pytest.raises(WireError, match=f"relay {a.link.id}: the rider's ride\\(\\) gave .*{match}"):
            if off_loop:
                await asyncio.to_thread(a.publish, g[2], 2)
            else:
                a.publish(g[2], clock=2)
        await settle()
        np.testing.assert_array_equal(a._codec.residual, residual)
        assert dataclasses.asdict(a.stats) == stats and hub.messages_sent == messages and len(a._held) == 1
        assert b.pending == 1 and riders[1].got == [] and not hub.errors
        # the turn goes on with a ride the wire takes: the held update and the next in one message
        riders[0].gives = ({"n": 2}, [np.arange(3)])
        sent.append(a.publish(g[2], clock=2))
        await settle()
        assert [x.tolist() for x in b.take(before=3)] == [x.tolist() for x in sent]
        assert riders[1].got == [(a.link.id, {"n": 2}, [[0, 1, 2]])] and not hub.errors
        np.testing.assert_allclose(np.sum(sent, axis=0) + a._codec.residual, np.sum(g, axis=0), atol=1e-6)
        await hub.close()
    asyncio.run(main())


def limited(link, limits):
    """``link`` with the message limits of a Peer whose max_message_mb is small: what it
    sends must fit them (WireError, as from a Peer's send, otherwise)."""
    link.limits = limits
    send = link.send_nowait

    def send_nowait(dst, t, body=None, arrays=()):
        wire.encode(t, link.id, body=body, arrays=arrays, limits=limits)
        return send(dst, t, body, arrays)
    link.send_nowait = send_nowait
    return link


@pytest.mark.parametrize("codec,limits,match", [
    ("identity", wire.Limits(max_message_bytes=1 << 20), "d = 300000: a gradient encoded by 'identity' takes "
                                                         "up to 1200000 bytes in 1 frames"),
    ("ef+topk:0.5", wire.Limits(max_frames=1), "in 2 frames, more than a message on this link may carry"),
])
def test_a_gradient_longer_than_a_message_may_carry_is_refused_at_construction(codec, limits, match):
    """Every publish of such a relay failed on the wire, after the codec had run."""
    async def main():
        hub = SimHub(topology="ring")
        a, _ = hub.add_many(2)
        with pytest.raises(ConfigError, match=match):
            GradientRelay(limited(a, limits), 300_000, codec=codec)
        assert a._handlers == {}   # nothing registered
        await hub.close()
    asyncio.run(main())


def test_a_turn_longer_than_a_message_may_carry_goes_in_several():
    """Held updates went in one message however many bytes they made: five of 40 kB sent
    at once failed on the wire of a 180 kB limit (on the loop after the codec ran; off it,
    only logged, and the whole turn was lost). As many go in a message as fit."""
    d = 10_000
    per_update = 4 * d + (d - 1) // 255   # identity, and the margin every codec gets

    async def main():
        hub = SimHub(topology="ring")
        la, lb = hub.add_many(2)
        limits = wire.Limits(max_message_bytes=_HEADER_ROOM + 3 * per_update + 1000)   # 3 updates fit
        a, b = GradientRelay(limited(la, limits), d), GradientRelay(lb, d)
        rng = np.random.default_rng(0)
        sent = [a.publish(rng.standard_normal(d), clock=k, hold=k < 4) for k in range(5)]
        await settle()
        assert hub.messages_sent == 2 and not hub.errors   # the turn's clocks 0-2, then 3-4
        assert await asyncio.to_thread(b.wait, 5, 5.0, every=5, first=0, span=5)
        assert [g.tolist() for g in b.take(before=5)] == [g.tolist() for g in sent]
        await hub.close()
    asyncio.run(main())


@pytest.mark.parametrize("clock", [None, "3", 1.0, True, -1, -5, 2**63, 2**64 - 1])
@pytest.mark.parametrize("where", ["gradient", "held part", "pass"])
def test_a_relayed_clock_that_no_publish_sends_is_refused(clock, where):
    """A gradient with no int clock was queued at clock -1 (ahead of every turn) and one
    with a negative clock at that clock; docs/gossip.md said receivers refuse both."""
    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(3)
        relays = [GradientRelay(link, 4) for link in links]
        b, c = relays[1], relays[2]
        one = np.ones(4, np.float32)
        meta = {"codec": "identity", "n": 4}
        base = {"o": links[0].id, "s": 1, "h": 2, "c": 5, "meta": meta}
        body, arrays = {
            "gradient": (dict(base, c=clock), [one]),
            "held part": (dict(base, b=[[clock, meta, 1]]), [one, one]),
            "pass": (dict(base, c=clock, p=1, meta={}), []),
        }[where]
        if clock is None:
            body.pop("c", None)
        await links[0].send(b.link.id, GRAD, body, arrays)
        await settle()
        assert b.stats.rejected == 1 and b.pending == 0 and b.stats.received == b.stats.passes_in == 0
        assert b._clocks == {} and b._got == {}                          # no clock was taken
        assert c.stats.received == c.stats.passes_in == 0                 # nothing passed on
        assert len(hub.errors) == 1 and isinstance(hub.errors[0], WireError)
        assert "clock" in str(hub.errors[0])
        # the same message with a good clock goes through
        good = dict(body, s=2, c=5)
        if where == "held part":
            good["b"] = [[4, meta, 1]]
        await links[0].send(b.link.id, GRAD, good, arrays)
        await settle()
        assert b.stats.received + b.stats.passes_in == len(good.get("b", ())) + 1
        assert c.stats.received + c.stats.passes_in == len(good.get("b", ())) + 1
        await hub.close()
    asyncio.run(main())


def test_a_dense_gradient_that_fits_a_message_with_its_header_is_taken():
    """identity at d = 1,040,000 is 4,160,000 bytes, and its message fits 4 MiB: the relay
    refused it, reserving 64 KiB of header and a sparse codec's index slack for every codec.
    A small ride still goes with it (the 64 KiB kept for the header refused every one)."""
    async def main():
        hub = SimHub(topology="ring")
        a, b = hub.add_many(2)
        limits = wire.Limits(max_message_bytes=4 * 1024 * 1024)
        riders = [Gives(), Gives()]
        ra = GradientRelay(limited(a, limits), 1_040_000, codec="identity", rider=riders[0])
        rb = GradientRelay(b, 1_040_000, codec="identity", rider=riders[1])
        riders[0].gives = ({"n": 1}, [np.arange(4)])
        ra.publish(np.ones(1_040_000, np.float32), clock=0)
        await settle()
        (g,) = rb.take(before=1)
        assert g.shape == (1_040_000,) and float(g.sum()) == 1_040_000 and not hub.errors
        assert ra.stats.rider_refused == 0 and riders[1].got == [(a.id, {"n": 1}, [[0, 1, 2, 3]])]
        await hub.close()
    asyncio.run(main())


@pytest.mark.parametrize("t", [-math.inf, math.inf, math.nan])
def test_a_send_time_that_is_not_finite_leaves_the_lag_figures_finite(t):
    # a sender's t of -inf made lag_s and mean_lag_s infinite for good
    async def main():
        hub = SimHub(topology="ring")
        a, b, _ = hub.add_many(["A", "B", "C"])
        ra = GradientRelay(a, 4)
        await b.send("A", GRAD, {"o": "B", "s": 1, "h": 1, "c": 0, "t": t, "meta": {"codec": "identity", "n": 4}},
                     [np.ones(4, np.float32)])
        await settle()
        got = ra.take()
        return ra, got

    ra, got = asyncio.run(main())
    assert [g.tolist() for g in got] == [[1.0] * 4]
    assert math.isfinite(ra.stats.lag_s) and math.isfinite(ra.stats.mean_lag_s) and ra.stats.lag_s < 60
