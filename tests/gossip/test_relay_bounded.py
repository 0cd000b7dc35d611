"""What a relay keeps per origin and per peer id stays bounded in a long run with
churn (on the in-memory hub): the message numbers it remembers to recognise copies,
and the clocks, turns, digests and notices of ids that left the view."""

import asyncio
import sys

import numpy as np

from swarm import wire
from swarm.gossip import GradientRelay
from swarm.gossip.relay import _GONE, _SEQ_WINDOW, GRAD, GRAD_HELLO
from swarm.gossip.sim import SimHub
from swarm.transport import KeyCheck

D = 4
META = {"codec": "identity", "n": D}


async def settle():
    for _ in range(20):
        await asyncio.sleep(0)
    await asyncio.sleep(0.005)


def deep_size(x, _seen=None):
    """Bytes held by ``x`` and what it refers to (containers, slotted objects)."""
    _seen = set() if _seen is None else _seen
    if id(x) in _seen:
        return 0
    _seen.add(id(x))
    n = sys.getsizeof(x)
    if isinstance(x, dict):
        n += sum(deep_size(k, _seen) + deep_size(v, _seen) for k, v in x.items())
    elif isinstance(x, (list, tuple, set, frozenset)):
        n += sum(deep_size(v, _seen) for v in x)
    else:
        n += sum(deep_size(getattr(x, s), _seen) for s in getattr(type(x), "__slots__", ()))
    return n


def origins(d):
    """The ids a container is keyed by (keys, or the first part of tuple keys)."""
    return {k[0] if isinstance(k, tuple) else k for k in d}


async def grads(link, dst, origin, seqs, clock=0, **extra):
    """Messages of ``origin`` numbered ``seqs`` at ``clock`` sent from ``link`` to ``dst``, one hop
    (every gradient has a clock: receivers refuse one without)."""
    for s in seqs:
        body = dict({"o": origin, "s": s, "h": 1, "c": clock, "meta": META}, **extra)
        await link.send(dst, GRAD, body, [np.full(D, s % 7, np.float32)])
    await settle()


def test_a_copy_that_comes_after_many_later_messages_is_dropped():
    """A copy of an origin's message that comes round after many of its later messages
    (a slow path) is recognised, however many other messages came meanwhile; numbers
    below the newest that never came are taken; one far older than the window counts
    as seen. The old relay forgot the oldest of its last 64 · max_pending numbers
    and applied such a copy twice."""
    async def main():
        hub = SimHub(topology="full")
        la, lb, lc = hub.add_many(3)
        a = GradientRelay(la, D, max_pending=2)
        await grads(lb, la.id, lb.id, range(100, 400))              # 300 of b's
        await grads(lc, la.id, lb.id, [100, 250, 399])              # copies of three of them, via c
        assert a.stats.received == 300 and a.stats.duplicates == 3
        await grads(lb, la.id, lb.id, [5000, 4990, 4995])           # out of order, none seen before
        assert a.stats.received == 303 and a.stats.duplicates == 3
        await grads(lc, la.id, lb.id, [4995, 5000 - _SEQ_WINDOW])  # a copy; one older than the window
        assert a.stats.received == 303 and a.stats.duplicates == 5
        restart = 5000 + 10 ** 9                                    # a restarted process: numbers jump
        await grads(lb, la.id, lb.id, [restart, restart + 1])
        await grads(lc, la.id, lb.id, [restart + 1])
        assert a.stats.received == 305 and a.stats.duplicates == 6
        assert not hub.errors
    asyncio.run(main())


def test_numbers_remembered_do_not_grow_with_the_messages():
    """Three origins, 3,000 messages each: what the relay keeps to recognise copies is
    the same after 1,000 of each as after 3,000 (the old relay kept an entry per
    message, ~227 B each, up to 65,536 of them: 14 MB per peer)."""
    async def main():
        hub = SimHub(topology="full")
        links = hub.add_many(4)
        a = GradientRelay(links[0], D)
        sizes = []
        for part in range(3):
            for lk in links[1:]:
                await grads(lk, links[0].id, lk.id, range(1000 * part, 1000 * part + 1000))
                a.take()
            sizes.append(deep_size(a._seen))
        assert a.stats.received == 9000 and not hub.errors
        return sizes
    sizes = asyncio.run(main())
    assert sizes[2] == sizes[1], sizes
    assert sizes[2] < 3 * (_SEQ_WINDOW + 1000), sizes


def test_ids_that_left_the_view_are_forgotten():
    """100 peers join, send a few turns (with a digest, late, and a hello) and crash,
    each under a new id, as restarted processes do: the relay keeps entries for the
    members and the last few ids that left, not one per id ever seen. A member's
    entries stay."""
    crashes = 100

    async def main():
        hub = SimHub(topology="full")
        la, lb = hub.add_many(2)
        a = GradientRelay(la, D, state=lambda: ({}, []))
        await grads(lb, la.id, lb.id, [1], clock=1, d=[10, "ab"])
        assert await asyncio.to_thread(a.wait, 3, 1.0, every=3, first=0)
        a.take(before=3)
        for k in range(crashes):
            (lx,) = hub.add_many(1)
            # its turn at clock 2 comes after a's went past it (3): late, and noticed
            await grads(lx, la.id, lx.id, range(10), clock=2, d=[10, "cd"])
            a.wait(6, 0.0, every=3, first=0)
            a._on_hello(wire.Message(GRAD_HELLO, lx.id, body={"ep": "tcp://127.0.0.1:5555", "r": True}))
            hub.remove(lx.id)
        await settle()
        assert a.stats.late == 10 * crashes and not hub.errors
        return a, lb.id
    a, b = asyncio.run(main())
    kept = {name: origins(getattr(a, name)) for name in
            ("_seen", "_clocks", "_got", "_complete", "_digests_in", "_noticed", "_endpoints")}
    assert all(len(ids) <= 1 + _GONE for ids in kept.values()), {n: len(ids) for n, ids in kept.items()}
    for name in ("_seen", "_clocks", "_got", "_digests_in"):   # the member stays
        assert b in kept[name], name
    assert len(kept["_noticed"]) == _GONE   # the last ones that left are kept


def test_neighbours_greeted_that_left_are_forgotten():
    """With ``direct``, a relay greets each new neighbour (once per address: it keeps the
    address it greeted): 100 neighbours that join and crash, each under a new id, leave
    entries for the members and the last few ids that left, not one per id greeted."""
    async def main():
        hub = SimHub(topology="full")
        la, lb = hub.add_many(2)
        # the side channels direct mode needs from a Peer; greeting sends through the hub
        la.open_inbox = lambda: (object(), "tcp://127.0.0.1:5555")
        la.open_outbox = lambda dst, ep: None
        la.close_side = lambda sock: None
        la.key_check = lambda msg, key: KeyCheck.OK
        a = GradientRelay(la, D, direct=True)
        for _ in range(100):
            (lx,) = hub.add_many(1)
            assert lx.id in a._greeted   # greeted at the view it joined in
            hub.remove(lx.id)
        await settle()
        a.close()
        assert not hub.errors
        return a, lb.id
    a, b = asyncio.run(main())
    assert b in a._greeted and len(a._greeted) <= 1 + _GONE, len(a._greeted)
