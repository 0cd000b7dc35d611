"""The gradient relay on the in-memory hub: every peer gets every gradient once,
bit for bit what its origin applied; bad gradients are refused and change nothing."""

import asyncio
import math
import re
import threading

import numpy as np
import pytest

from swarm.errors import ConfigError, WireError
from swarm.gossip import GradientRelay
from swarm.gossip.relay import GRAD
from swarm.gossip.sim import SimHub


async def settle(hub, relays):
    """Let every queued delivery and forward run (the hub delivers on the next loop turns)."""
    for _ in range(20):
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)


@pytest.mark.parametrize("topology,n", [("ring", 5), ("ring", 4), ("grid", 9), ("full", 4)])
def test_every_peer_gets_every_gradient_once(topology, n):
    async def main():
        hub = SimHub(topology=topology)
        links = hub.add_many(n)
        relays = [GradientRelay(link, 64, codec="ef+topk:0.25", topology=topology) for link in links]
        rng = np.random.default_rng(0)
        applied = [[] for _ in range(n)]       # what each peer would apply
        for _ in range(3):
            for i, r in enumerate(relays):
                applied[i].append(r.publish(rng.standard_normal(64)))
        await settle(hub, relays)
        for i, r in enumerate(relays):
            got = r.take()
            assert len(got) == 3 * (n - 1)
            applied[i].extend(got)
        # every peer holds the same multiset of vectors, so the same sum up to rounding
        sums = [np.sum(a, axis=0, dtype=np.float64) for a in applied]
        for s in sums[1:]:
            np.testing.assert_allclose(s, sums[0], rtol=0, atol=1e-9)
        assert not hub.errors
        assert all(r.stats.dropped == 0 and r.stats.rejected == 0 for r in relays)
        assert sum(r.stats.received for r in relays) == 3 * n * (n - 1)
        return relays
    relays = asyncio.run(main())
    sent = sum(r.stats.sent for r in relays)
    if topology == "ring":   # the two directions split the way round: one copy each
        assert sum(r.stats.duplicates for r in relays) == 0
        assert sent == 3 * n * (n - 1)
    else:                    # flooding: at least one send per delivery, duplicates dropped
        assert sent >= 3 * n * (n - 1)
        assert sum(r.stats.duplicates for r in relays) == sent - 3 * n * (n - 1)


def test_error_feedback_stays_at_the_origin():
    async def main():
        hub = SimHub(topology="ring")
        a, b = [GradientRelay(link, 100, codec="ef+topk:0.1") for link in hub.add_many(2)]
        rng = np.random.default_rng(1)
        inputs = [rng.standard_normal(100).astype(np.float32) for _ in range(20)]
        sent = [a.publish(g) for g in inputs]
        await settle(hub, [a, b])
        got = b.take()
        assert len(got) == 20
        for s, g in zip(sent, got):
            assert np.array_equal(s, g)              # the receiver applies what the origin applied
            assert np.count_nonzero(s) <= 10
        residual = a._codec.residual
        np.testing.assert_allclose(np.sum(sent, axis=0) + residual, np.sum(inputs, axis=0), atol=1e-4)
    asyncio.run(main())


def test_publish_from_another_thread():
    async def main():
        hub = SimHub(topology="ring")
        a, b = [GradientRelay(link, 8) for link in hub.add_many(2)]
        out = await asyncio.to_thread(a.publish, np.arange(8, dtype=np.float32))
        await settle(hub, [a, b])
        [got] = b.take()
        assert np.array_equal(got, out) and np.array_equal(out, np.arange(8, dtype=np.float32))
    asyncio.run(main())


def test_bad_gradients_are_refused():
    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(3)
        relays = [GradientRelay(link, 16) for link in links]
        a, b = relays[0], relays[1]
        with pytest.raises(ConfigError, match="length 15"):
            a.publish(np.zeros(15))
        bad = np.zeros(16)
        bad[3] = math.nan
        with pytest.raises(ConfigError, match="NaN"):
            a.publish(bad)
        huge = np.zeros(16)
        huge[3] = 1e20   # finite, but its square overflows float32: FlatAdam refuses it
        with pytest.raises(ConfigError, match="too large"):
            a.publish(huge)
        assert a.stats.published == 0
        # Malformed, non-finite and too large messages straight onto the wire (a neighbour's
        # 1e20 was passed on, and the consumer's FlatAdam raised out of its training loop)
        await links[0].send(b.link.id, GRAD, {"o": "peer0", "s": 4, "h": 2, "meta": {"codec": "identity", "n": 16}},
                            [huge.astype(np.float32)])
        nan = np.full(16, np.nan, np.float32)
        await links[0].send(b.link.id, GRAD, {"o": "peer0", "s": 1, "h": 2, "meta": {"codec": "identity", "n": 16}},
                            [nan])
        await links[0].send(b.link.id, GRAD, {"o": "peer0", "s": 2, "h": 2, "meta": {"codec": "identity", "n": 8}},
                            [np.zeros(8, np.float32)])
        await links[0].send(b.link.id, GRAD, {"s": 3}, [np.zeros(16, np.float32)])
        await settle(hub, relays)
        assert b.take() == [] and relays[2].take() == []
        assert b.stats.rejected == 4
        assert len(hub.errors) == 4 and all(isinstance(e, WireError) for e in hub.errors)
        # a good gradient afterwards still goes through, with the same numbers
        g = a.publish(np.ones(16))
        await settle(hub, relays)
        assert [x.tolist() for x in b.take()] == [g.tolist()]
    asyncio.run(main())


@pytest.mark.parametrize("kw,match", [
    (dict(clock=None), "clock = None"), (dict(clock="7"), "clock = '7'"), (dict(clock=-1), "clock = -1"),
    (dict(clock=1.5), "clock = 1.5"), (dict(clock=True), "clock = True"),
    (dict(grad=[1, 2, 3, 4]), "dtype int64"), (dict(grad="abcd"), "dtype <U4"),
    (dict(grad=np.ones(4, complex)), "dtype complex128"), (dict(grad=[[1.0], [2.0, 3.0]]), "array of floats"),
    (dict(grad=np.ones(5, np.float32)), "length 5"), (dict(grad=[1.0, math.inf, 3.0, 4.0]), "NaN or infinite"),
])
def test_bad_publish_arguments_change_nothing(kw, match):
    """Every argument is checked before the codec runs: nothing is sent and the error
    feedback residual keeps what it held, so sum(decoded) + residual = sum(inputs) holds."""
    async def main():
        hub = SimHub(topology="ring")
        a, b = [GradientRelay(link, 4, codec="ef+topk:0.25") for link in hub.add_many(2)]
        g0 = np.array([0.5, 0.1, 0.2, 0.3], np.float32)
        sent = [a.publish(g0, clock=0)]
        residual, messages = a._codec.residual.copy(), hub.messages_sent
        with pytest.raises(ConfigError, match=match):
            a.publish(**{"grad": np.array([1, 2, 3, 4], np.float32), "clock": 1, **kw})
        assert hub.messages_sent == messages and a.stats.published == 1
        np.testing.assert_array_equal(a._codec.residual, residual)
        g1 = np.array([1, 2, 3, 4], np.float32)
        sent.append(a.publish(g1, clock=1))
        np.testing.assert_allclose(np.sum(sent, axis=0) + a._codec.residual, g0 + g1, atol=1e-6)
        await settle(hub, [a, b])
        assert [g.tolist() for g in b.take()] == [g.tolist() for g in sent]
    asyncio.run(main())


def test_an_upper_case_ef_prefix_keeps_the_residual_at_the_origin():
    async def main():
        hub = SimHub(topology="ring")
        a, b = [GradientRelay(link, 8, codec="EF+topk:0.25") for link in hub.add_many(2)]
        assert type(a._decoder).__name__ == "TopK"
        g = np.arange(8, dtype=np.float32)
        sent = a.publish(g)
        await settle(hub, [a, b])
        [got] = b.take()
        assert np.array_equal(got, sent) and np.count_nonzero(sent) == 2
        np.testing.assert_array_equal(sent + a._codec.residual, g)
    asyncio.run(main())


def test_bad_construction_is_a_config_error_and_registers_nothing():
    hub = SimHub(topology="ring")
    (link,) = hub.add_many(1)
    with pytest.raises(ConfigError, match="event loop"):
        GradientRelay(link, 4)          # not on the peer's loop
    assert GRAD not in link._handlers

    async def main():
        for kw, match in [(dict(rider=5), "rider = 5"), (dict(rider=Numbered().ride), r"ride\(\) and arrive"),
                          (dict(codec=None), "codec = None"), (dict(codec="ef+gzip"), "gzip")]:
            with pytest.raises(ConfigError, match=match):
                GradientRelay(link, 4, **kw)
            assert GRAD not in link._handlers
    asyncio.run(main())


@pytest.mark.parametrize("args,kw,match", [
    ((4, math.nan), {}, "timeout = nan"), ((4, math.inf), {}, "timeout = inf"), ((4, -1.0), {}, "timeout = -1"),
    ((4, None), {}, "timeout = None"), ((4, "1"), {}, "timeout = '1'"), ((None, 1.0), {}, "clock = None"),
    ((4, 1.0), dict(every="2"), "must be ints"), ((4, 1.0), dict(first=0.5), "must be ints"),
])
def test_bad_wait_arguments_raise_at_once(args, kw, match):
    """A NaN timeout made wait() spin forever: it is refused before waiting."""
    async def main():
        hub = SimHub(topology="ring")
        a, b = [GradientRelay(link, 4) for link in hub.add_many(2)]
        b.publish(np.ones(4), clock=1)   # a has someone to wait for (clock 5, not sent)
        await settle(hub, [a, b])
        box = []

        def call():
            try:
                a.wait(*args, **{"every": 4, **kw})
            except Exception as e:
                box.append(e)
        t = threading.Thread(target=call, daemon=True)
        t.start()
        await asyncio.to_thread(t.join, 2.0)
        assert not t.is_alive() and len(box) == 1
        assert isinstance(box[0], ConfigError) and re.search(match, str(box[0]))
        assert a.stats.waited_s == 0 and a.stats.wait_timeouts == 0
    asyncio.run(main())


def test_a_stalled_consumer_keeps_only_max_pending():
    async def main():
        hub = SimHub(topology="ring")
        a, b = [GradientRelay(link, 4, max_pending=5) for link in hub.add_many(2)]
        for i in range(8):
            a.publish(np.full(4, i, np.float32))
        await settle(hub, [a, b])
        got = b.take()
        assert [float(g[0]) for g in got] == [3, 4, 5, 6, 7]    # the newest five
        assert b.stats.overflow == 3
    asyncio.run(main())


def test_wait_takes_turns_by_clock():
    """Peers publish every 4 ticks at phases 0 and 1: before its turn at clock 8, peer 0
    must have peer 1's gradient from clock 5; a peer that never published is not waited for."""
    async def main():
        hub = SimHub(topology="ring")
        a, b, c = [GradientRelay(link, 4) for link in hub.add_many(3)]
        b.publish(np.ones(4), clock=1)
        await settle(hub, [a, b, c])
        # c never published; b's newest is clock 1 and its next turn (5) is before 8
        assert not await asyncio.to_thread(a.wait, 8, 0.2, every=4, rounds=1)
        assert a.stats.wait_timeouts == 1
        assert await asyncio.to_thread(a.wait, 8, 0.2, every=4, rounds=2)   # one round of slack
        assert await asyncio.to_thread(a.wait, 5, 0.2, every=4, rounds=1)   # clock 5: b's turn 1 is in

        waiter = asyncio.create_task(asyncio.to_thread(a.wait, 8, 5.0, every=4, rounds=1))
        await asyncio.sleep(0.1)
        assert not waiter.done()
        b.publish(np.ones(4), clock=5)
        assert await asyncio.wait_for(waiter, 5.0)          # woken by the arrival, not the timeout
        assert a.stats.waited_s < 4.0

        hub.remove(b.link.id)                               # a peer that left is not waited for
        assert await asyncio.to_thread(a.wait, 100, 0.2, every=4, rounds=1)
        with pytest.raises(ConfigError):
            a.wait(8, 0.1, every=0)
    asyncio.run(main())


def test_take_before_a_clock_orders_by_clock_and_keeps_the_rest():
    async def main():
        hub = SimHub(topology="full")
        a, b, c = [GradientRelay(link, 2) for link in hub.add_many(3)]
        gb5 = b.publish(np.full(2, 5.0), clock=5)
        await settle(hub, [a, b, c])
        gc2 = c.publish(np.full(2, 2.0), clock=2)     # arrives after b's clock 5
        gb9 = b.publish(np.full(2, 9.0), clock=9)
        await settle(hub, [a, b, c])
        assert [g.tolist() for g in a.take(before=9)] == [gc2.tolist(), gb5.tolist()]
        assert a.pending == 1
        assert [g.tolist() for g in a.take()] == [gb9.tolist()]
    asyncio.run(main())


def test_wait_with_first_waits_for_peers_that_have_not_published():
    """With first = 8 and every = 4, the peer of rank 1 has a turn at clock 9: a peer at
    clock 10 waits for it even before it has heard from that peer at all."""
    async def main():
        hub = SimHub(topology="ring")
        a, b, c = [GradientRelay(link, 4) for link in hub.add_many(3)]   # ranks 0, 1, 2
        assert await asyncio.to_thread(a.wait, 8, 0.2, every=4, first=8)    # nobody's turn yet
        assert await asyncio.to_thread(a.wait, 10, 0.2, every=4)            # without first: not waited for
        assert not await asyncio.to_thread(a.wait, 10, 0.2, every=4, first=8)
        b.publish(np.ones(4), clock=9)
        await settle(hub, [a, b, c])
        assert await asyncio.to_thread(a.wait, 10, 0.2, every=4, first=8)   # c's first turn is 10
        assert not await asyncio.to_thread(a.wait, 11, 0.2, every=4, first=8)
    asyncio.run(main())


def test_wait_with_span_waits_for_every_update_of_a_turn():
    """span = 2: the peer of rank 1 takes its turn's updates at clocks 2 and 3. The one
    at 3 arriving first does not end the wait; the one at 2 does."""
    async def main():
        hub = SimHub(topology="ring")
        a, b, c = [GradientRelay(link, 4) for link in hub.add_many(3)]   # ranks 0, 1, 2
        b.publish(np.ones(4), clock=3)
        await settle(hub, [a, b, c])
        assert not await asyncio.to_thread(a.wait, 4, 0.2, every=6, first=0, span=2)
        b.publish(np.ones(4), clock=2)
        await settle(hub, [a, b, c])
        assert await asyncio.to_thread(a.wait, 4, 0.2, every=6, first=0, span=2)
        assert a.pending == 2
        with pytest.raises(ConfigError):
            a.wait(4, 0.1, every=6, first=0, span=7)
        with pytest.raises(ConfigError, match="needs first"):
            a.wait(4, 0.1, every=6, span=2)
    asyncio.run(main())


class JitterHub(SimHub):
    """A hub whose every delivery takes a random 0-10 ms, so that gradients overtake
    each other on the way (a fixed latency would keep them in order)."""

    rng = np.random.default_rng(0)

    @property
    def latency_s(self) -> float:
        return float(self.rng.uniform(0.0, 0.01))

    @latency_s.setter
    def latency_s(self, value: float) -> None:
        pass


def test_a_later_turn_overtaking_an_earlier_one_does_not_end_the_wait():
    """every = 4, first = 0: the peer of rank 1 takes turns at clocks 1, 5, 9. Once its
    turn at 1 was waited for, its turn at 9 arriving before the one at 5 does not end a
    wait at clock 10; and a turn that never comes holds up one wait, not every later one."""
    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(2)
        a, b = [GradientRelay(link, 4) for link in links]   # ranks 0, 1
        grad = {"o": links[1].id, "h": 1, "meta": {"codec": "identity", "n": 4}}
        one = np.ones(4, np.float32)

        async def turn(seq, clock):
            await links[1].send(a.link.id, GRAD, dict(grad, s=seq, c=clock), [one])
            await settle(hub, [a, b])
        await turn(1, 1)
        assert await asyncio.to_thread(a.wait, 4, 0.2, every=4, first=0)
        await turn(3, 9)                                                       # overtakes clock 5
        assert not await asyncio.to_thread(a.wait, 10, 0.2, every=4, first=0)
        await turn(2, 5)
        assert await asyncio.to_thread(a.wait, 10, 0.2, every=4, first=0)
        # clock 13 never comes: one wait times out, and the turn at 17 is enough after it
        assert not await asyncio.to_thread(a.wait, 14, 0.2, every=4, first=0)
        await turn(5, 17)
        assert await asyncio.to_thread(a.wait, 18, 0.2, every=4, first=0)
        assert a.stats.wait_timeouts == 2
    asyncio.run(main())


def test_a_peer_more_than_a_round_behind_is_not_waited_for():
    """every = 4, first = 0: the peer of rank 1 takes turns at clocks 1, 5, 9, ... and
    stops after 5 (frozen, say, but still in the view). The wait at 12 times out for its
    turn at 9; from then on it is more than a round behind, and waiting for it would cost
    a whole timeout at every turn (the swarm crawled so after a 6 s SIGSTOP): it is not
    waited for until it is back within a round."""
    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(2)
        a, b = [GradientRelay(link, 4) for link in links]   # ranks 0, 1
        grad = {"o": links[1].id, "h": 1, "meta": {"codec": "identity", "n": 4}}

        async def turn(seq, clock):
            await links[1].send(a.link.id, GRAD, dict(grad, s=seq, c=clock), [np.ones(4, np.float32)])
            await settle(hub, [a, b])
        await turn(1, 1)
        await turn(2, 5)
        assert await asyncio.to_thread(a.wait, 8, 0.2, every=4, first=0)
        assert not await asyncio.to_thread(a.wait, 12, 0.2, every=4, first=0)   # its turn at 9
        assert await asyncio.to_thread(a.wait, 16, 5.0, every=4, first=0)       # newest 5 < 13 - 4
        assert await asyncio.to_thread(a.wait, 20, 5.0, every=4, first=0)
        assert a.stats.wait_timeouts == 1
        await turn(3, 17)                                                    # back within a round
        assert not await asyncio.to_thread(a.wait, 24, 0.2, every=4, first=0)  # its turn at 21
        await turn(4, 21)
        assert await asyncio.to_thread(a.wait, 24, 5.0, every=4, first=0)
        assert a.stats.wait_timeouts == 2
    asyncio.run(main())


def test_a_peer_that_missed_the_others_turns_does_not_wait_for_them():
    """A peer that was frozen, away or restarted (clock 8 here) while the peer of rank 1
    went on without it (its newest turn, 13, is past 8: it gave up on this one) will not
    get that peer's turn at 5: it goes on at once, instead of a timeout at every turn."""
    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(2)
        a, b = [GradientRelay(link, 4) for link in links]   # ranks 0, 1
        grad = {"o": links[1].id, "h": 1, "meta": {"codec": "identity", "n": 4}}
        for seq, clock in ((1, 1), (3, 13)):                # 5 and 9 were sent while `a` was away
            await links[1].send(a.link.id, GRAD, dict(grad, s=seq, c=clock), [np.full(4, clock, np.float32)])
        await settle(hub, [a, b])
        assert await asyncio.to_thread(a.wait, 8, 5.0, every=4, first=0)
        assert a.stats.wait_timeouts == 0
        assert [g.tolist() for g in a.take(before=8)] == [[1.0] * 4] and a.pending == 1   # 13 stays
    asyncio.run(main())


def test_a_peer_restarted_under_its_id_is_not_taken_for_copies():
    """A restarted peer (swarm run's restart_dead: the same id) numbers its gradients
    afresh; numbered from 1 again, its first ones matched those its dead process had
    sent, and every peer dropped them as copies that came round another way."""
    async def main():
        hub = SimHub(topology="ring")
        la, lb = hub.add_many(2)
        a, b = GradientRelay(la, 4), GradientRelay(lb, 4)
        for _ in range(3):
            b.publish(np.ones(4))
        await settle(hub, [a, b])
        assert len(a.take()) == 3
        hub.remove(lb.id)
        b2 = GradientRelay(hub.add(lb.id), 4)
        g = b2.publish(np.full(4, 2.0))
        await settle(hub, [a, b2])
        assert [x.tolist() for x in a.take()] == [g.tolist()] and a.stats.duplicates == 0
    asyncio.run(main())


@pytest.mark.parametrize("span", [1, 2])
def test_turns_in_clock_order_keep_the_copies_the_same(span):
    """Four peers take turns (a turn per clock tick, by rank) and apply the others'
    gradients at each turn with take(before=clock), then their own, with an update whose
    result depends on the order: all four end bit for bit the same, although the
    gradients arrive out of order. With span = 2 a turn is two gradients, at clocks
    2·tick and 2·tick + 1, and the others wait for both."""
    n, d, ticks = 4, 32, 60

    def update(x, g):
        return (0.5 * x + g) * np.float32(1.01)

    def peer(relay, rank):
        rng = np.random.default_rng(rank)
        x = np.zeros(d, np.float32)
        for tick in range(rank, ticks, n):
            clock = tick * span
            assert relay.wait(clock, 5.0, every=n * span, first=0, span=span)
            for g in relay.take(before=clock):
                x = update(x, g)
            for k in range(span):
                x = update(x, relay.publish(rng.standard_normal(d), clock=clock + k))
        return x

    async def main():
        hub = JitterHub(topology="ring")
        relays = [GradientRelay(link, d, codec="ef+topk:0.5", topology="ring") for link in hub.add_many(n)]
        xs = await asyncio.gather(*(asyncio.to_thread(peer, r, i) for i, r in enumerate(relays)))
        for _ in range(100):   # the last turn's gradients are on their way (up to 20 ms over two hops)
            await settle(hub, relays)
            if all(r.stats.received == (ticks - ticks // n) * span for r in relays):
                break
        finals = []
        for r, x in zip(relays, xs):
            for g in r.take(before=ticks * span):
                x = update(x, g)
            finals.append(x)
        assert all(r.stats.received == (ticks - ticks // n) * span for r in relays)
        for x in finals[1:]:
            assert np.array_equal(x, finals[0])
    asyncio.run(main())


def test_a_passed_turn_ends_the_wait_and_applies_nothing():
    """A peer that takes no update at its turn publishes None: the others stop waiting
    for that turn at once (not after the timeout) and take no gradient for it."""
    async def main():
        hub = SimHub(topology="ring")
        a, b, c = [GradientRelay(link, 4) for link in hub.add_many(3)]   # ranks 0, 1, 2
        assert not await asyncio.to_thread(a.wait, 10, 0.2, every=4, first=8)   # b's turn 9 is missing
        assert a.stats.wait_timeouts == 1
        assert b.publish(None, clock=9) is None
        c.publish(np.ones(4), clock=10)
        await settle(hub, [a, b, c])
        assert await asyncio.to_thread(a.wait, 11, 0.2, every=4, first=8)
        assert a.stats.wait_timeouts == 1
        assert [g.tolist() for g in a.take(before=11)] == [[1.0] * 4]   # c's gradient; b's pass is none
        assert b.stats.passed == 1 and a.stats.passes_in == 1 and c.stats.passes_in == 1
        assert a.stats.received == 1
    asyncio.run(main())


def test_malformed_passes_are_refused():
    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(3)
        relays = [GradientRelay(link, 4) for link in links]
        b = relays[1]
        base = {"o": "peer0", "h": 1, "meta": {}, "c": 9}
        await links[0].send(b.link.id, GRAD, dict(base, s=1, p=1), [np.zeros(4, np.float32)])  # arrays
        await links[0].send(b.link.id, GRAD, dict(base, s=2, p=2), [])                          # p != 1
        await links[0].send(b.link.id, GRAD, dict(base, s=3, p=1, c="9"), [])                   # no int clock
        await links[0].send(b.link.id, GRAD, dict(base, s=4, p=1, meta={"codec": "identity"}), [])
        await settle(hub, relays)
        assert b.stats.rejected == 4 and b.stats.passes_in == 0
        assert not await asyncio.to_thread(b.wait, 10, 0.05, every=4, first=8)   # no clock was taken
        assert len(hub.errors) == 4 and all(isinstance(e, WireError) for e in hub.errors)
    asyncio.run(main())


def test_held_updates_go_with_the_next_in_one_message():
    """publish(hold=True) keeps an update (or a pass) until the next publish without
    hold; the others get the whole turn in one message, each update at its clock."""
    async def main():
        hub = SimHub(topology="ring")
        a, b, c = [GradientRelay(link, 6, codec="ef+topk:0.5") for link in hub.add_many(3)]
        rng = np.random.default_rng(0)
        g1 = a.publish(rng.standard_normal(6), clock=9, hold=True)
        assert a.publish(None, clock=10, hold=True) is None
        await settle(hub, [a, b, c])
        assert a.stats.sent == 0 and b.pending == 0 and c.pending == 0   # nothing left yet
        g3 = a.publish(rng.standard_normal(6), clock=11)
        await settle(hub, [a, b, c])
        assert a.stats.sent == 2 and a.stats.published == 2 and a.stats.passed == 1   # one message a neighbour
        for r in (b, c):
            assert r.stats.received == 2 and r.stats.passes_in == 1
            assert [g.tolist() for g in r.take(before=12)] == [g1.tolist(), g3.tolist()]
        # rank 0's turn is clocks 9-11 (every 9, span 3): all of it is here
        assert await asyncio.to_thread(b.wait, 12, 0.2, every=9, first=9, span=3)
    asyncio.run(main())


def test_malformed_turns_are_refused_whole():
    """A message that bundles a turn's updates is checked whole: one bad part and
    none of it is queued or passed on."""
    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(4)
        relays = [GradientRelay(link, 4) for link in links]
        b = relays[1]
        meta = {"codec": "identity", "n": 4}
        one, nan = np.ones(4, np.float32), np.full(4, np.nan, np.float32)
        base = {"o": "peer0", "h": 2, "c": 9, "meta": meta}
        bad = [
            (dict(base, s=1, b="x"), [one, one]),                               # not a list
            (dict(base, s=2, b=[[8, meta]]), [one, one]),                       # not [clock, meta, count]
            (dict(base, s=3, b=[[8, meta, 2]]), [one, one]),                    # frames do not add up
            (dict(base, s=4, b=[[8, None, 1]]), [one, one]),                    # a pass with a frame
            (dict(base, s=5, b=[["8", meta, 1]]), [one, one]),                  # no int clock
            (dict(base, s=6, b=[[8, meta, 1]]), [nan, one]),                    # a non-finite part
            (dict(base, s=7, b=[[8, meta, 1]] * 16), [one] * 17),               # too many parts
        ]
        for body, arrays in bad:
            await links[0].send(b.link.id, GRAD, body, arrays)
        await settle(hub, relays)
        assert b.stats.rejected == len(bad) and b.stats.received == 0 and b.pending == 0
        assert relays[2].stats.received == 0                                   # nothing passed on
        await links[0].send(b.link.id, GRAD, dict(base, s=8, b=[[8, meta, 1], [7, None, 0]]), [one, one])
        await settle(hub, relays)
        assert b.stats.received == 2 and b.stats.passes_in == 1 and relays[2].stats.received == 2
    asyncio.run(main())


class Numbered:
    """A rider that sends its message count (body and array) and keeps what arrives."""

    def __init__(self) -> None:
        self.rides, self.got = 0, []

    def ride(self):
        self.rides += 1
        return {"n": self.rides}, [np.full(3, self.rides, np.int64)]

    def arrive(self, src, body, arrays):
        self.got.append((src, body["n"], [a.tolist() for a in arrays]))


def test_a_rider_goes_to_the_neighbours_only_and_the_gradients_stay_as_they_are():
    """Only the origin's copies carry the rider: a ring of 5 passes peer0's gradients
    two hops each way, and the peers two away get them without it."""
    async def main():
        hub = SimHub(topology="ring")
        riders = [Numbered() for _ in range(5)]
        links = hub.add_many(5)
        relays = [GradientRelay(link, 16, codec="ef+topk:0.5", topology="ring", rider=r)
                  for link, r in zip(links, riders)]
        seen = []   # what reaches peer2: its copies come through peer1

        def spy(msg, handler=links[2]._handlers[GRAD]):
            seen.append(("x" in msg.body, len(msg.arrays)))
            return handler(msg)
        links[2].on(GRAD, spy)
        a = relays[0]
        rng = np.random.default_rng(0)
        g1 = a.publish(rng.standard_normal(16), clock=0, hold=True)   # one message for the turn
        g2 = a.publish(rng.standard_normal(16), clock=1)
        assert a.publish(None, clock=9) is None                       # a pass carries one too
        await settle(hub, relays)
        assert riders[0].rides == 2
        for i in (1, 4):      # peer0's neighbours
            assert riders[i].got == [(links[0].id, 1, [[1, 1, 1]]), (links[0].id, 2, [[2, 2, 2]])]
            assert relays[i].stats.riders_in == 2 and relays[i].stats.rider_bytes_in == 2 * 24
        for i in (2, 3):      # two hops away: the gradients without the rider
            assert riders[i].got == [] and relays[i].stats.rider_bytes_in == 0
        assert seen == [(False, 4), (False, 0)]   # two updates' frames (topk: 2 each), then the pass
        for r in relays[1:]:
            assert [g.tolist() for g in r.take()] == [g1.tolist(), g2.tolist()]
            assert r.stats.rejected == 0 and r.stats.passes_in == 1
        # the gradients' bytes are counted apart from the rider's, which went to two neighbours
        assert a.stats.rider_bytes_out == 2 * 2 * 24
        assert relays[1].stats.bytes_in == relays[2].stats.bytes_in > 0
        assert not hub.errors
    asyncio.run(main())


def test_malformed_riders_are_refused_with_their_gradient_and_a_passed_on_one_is_ignored():
    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(4)
        riders = [Numbered() for _ in range(4)]
        relays = [GradientRelay(link, 4, rider=r) for link, r in zip(links, riders)]
        b = relays[1]
        one = np.ones(4, np.float32)
        base = {"o": links[0].id, "h": 1, "c": 9, "meta": {"codec": "identity", "n": 4}}
        bad = [
            (dict(base, s=1, x="junk"), [one]),                       # not a list
            (dict(base, s=2, x=[{"n": 1}, 2]), [one, one]),           # its 2 arrays leave none for the gradient
            (dict(base, s=3, x=[{"n": 1}, 5]), [one]),                # more arrays than the message holds
            (dict(base, s=4, x=[[1], 1]), [one, one]),                # body not a dict
        ]
        for body, arrays in bad:
            await links[0].send(b.link.id, GRAD, body, arrays)
        await settle(hub, relays)
        assert b.stats.rejected == len(bad) and b.pending == 0 and riders[1].got == []
        assert len(hub.errors) == len(bad) and all(isinstance(e, WireError) for e in hub.errors)
        # a rider on a copy from someone other than its origin is not handed out
        await links[2].send(b.link.id, GRAD, dict(base, s=5, x=[{"n": 7}, 1]), [one, one])
        await links[0].send(b.link.id, GRAD, dict(base, s=6, x=[{"n": 8}, 1]), [one, one])
        await settle(hub, relays)
        assert [g.tolist() for g in b.take()] == [[1, 1, 1, 1]] * 2
        assert riders[1].got == [(links[0].id, 8, [[1.0, 1.0, 1.0, 1.0]])]
    asyncio.run(main())
