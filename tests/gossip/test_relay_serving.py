"""A relay with ``state`` serves copies to peers out of step within bounds (on the in-memory
hub): announcements of many askers, requests and copies nobody asked for, notices
queued for the consumer, and a copy too large for one message."""

import asyncio
import dataclasses
import logging
import threading

import numpy as np

from swarm import wire
from swarm.errors import WireError
from swarm.gossip import GradientRelay
from swarm.gossip.relay import GRAD_LATE, GRAD_STATE, GRAD_SYNC
from swarm.gossip.sim import SimHub, SimLink
from swarm.link import Member

D = 8


async def settle():
    for _ in range(20):
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)


def test_more_than_64_announcements_go_in_several_messages():
    """Each copy served to a peer whose turns had gone past its own added an entry to
    the announcements (j) of this peer's next message, without bound and once per copy,
    and receivers refuse a j of more than 64: after 65 copies served, that message
    (a gradient, which publish said was sent) was refused by every neighbour. Now each
    asker has one entry (its newest), and a message carries at most 64, the rest the
    next."""
    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(67)
        a, b = (GradientRelay(link, D, state=lambda: ({}, [])) for link in links[:2])
        await asyncio.to_thread(a.wait, 9, 0.0, every=3, first=0)
        a.publish(np.ones(D, np.float32), clock=9)   # a's copy is at clock 9
        await settle()
        assert len(b.take()) == 1
        askers = [link.id for link in links[2:]]
        for link in links[2:]:
            link.send_nowait("p000", GRAD_SYNC, {"r": 1, "b": -1})
        await settle()
        a.poll()
        links[2].send_nowait("p000", GRAD_SYNC, {"r": 2, "b": -1})   # one asks again
        await settle()
        a.poll()
        assert a.stats.served == 66
        sent = [a.publish(np.full(D, k, np.float32), clock=12 + 3 * k).tolist() for k in range(2)]
        await settle()
        assert not hub.errors and b.stats.rejected == 0
        assert [g.tolist() for g in b.take()] == sent
        assert set(askers) <= set(b._complete)
        await hub.close()
    asyncio.run(main())


def test_requests_and_copies_nobody_asked_for_are_not_held():
    """Copies (grad_state) that answer no request of this peer were queued whole for the
    consumer until its next poll, and every request (grad_sync) was served on its own,
    each with a state() call and a whole copy: one member's 200 copies of 64 KiB and 200
    requests held 12.5 MiB and made 200 copies. A copy that answers no request is dropped
    where it comes in, and an asker's newer request replaces its older one."""
    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(3)
        calls = []

        def state():
            calls.append(1)
            return {"u": 1}, [np.zeros(D, np.float32)]
        a = GradientRelay(links[0], D, state=state)
        others = [GradientRelay(link, D, state=lambda: ({}, [])) for link in links[1:]]
        answers = []
        links[2].off(GRAD_STATE, others[1]._on_side)
        links[2].on(GRAD_STATE, answers.append)
        a.publish(np.ones(D, np.float32), clock=0)   # a turn boundary at clock 0
        await asyncio.to_thread(a.wait, 3, 0.0, every=3, first=0)
        big = np.zeros((1, 2**14), np.float32)
        for r in range(1, 201):
            links[2].send_nowait("p000", GRAD_STATE, {"r": r, "c": 0, "n": None, "app": {}, "na": 1, "po": [],
                                                      "g": {}}, [big])
            links[2].send_nowait("p000", GRAD_SYNC, {"r": r, "b": -1})
            await asyncio.sleep(0)
        await settle()
        assert not hub.errors
        assert not [m for m in a._side if m.t == GRAD_STATE]
        await asyncio.to_thread(a.poll)
        await settle()
        assert len(calls) == 1 and a.stats.served == 1
        assert [m.body["r"] for m in answers] == [200]   # the newest request
        for r in (a, *others):
            r.close()
        await hub.close()
    asyncio.run(main())


def test_notices_waiting_for_the_consumer_are_bounded():
    """Notices, requests and copies wait on the loop for the consumer's next poll: a
    member that sends them faster than the consumer polls grew that queue without
    bound. Past a bound they are refused (counted and logged by the peer as malformed)."""
    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(2)
        a = GradientRelay(links[0], D, state=lambda: ({}, []))
        for k in range(3000):
            links[1].send_nowait("p000", GRAD_LATE, {"c": k, "at": k + 1, "f": 1})
            if k % 100 == 0:
                await asyncio.sleep(0)
        await settle()
        assert 0 < len(a._side) < 3000
        assert hub.errors and all(isinstance(e, WireError) and "wait for this peer's poll()" in str(e)
                                  for e in hub.errors)
        held = len(a._side)
        assert len(hub.errors) == 3000 - held
        await asyncio.to_thread(a.poll)
        assert not a._side
        a.close()
        await hub.close()
    asyncio.run(main())


LIMITS = dataclasses.replace(wire.DEFAULT_LIMITS, max_message_bytes=1 << 20)   # a Peer's max_message_mb = 1


class Limited(SimLink):
    """A hub link that refuses what a Peer with these limits refuses (WireError on send)."""

    limits = LIMITS

    def send_nowait(self, dst, t, body=None, arrays=()):
        wire.encode(t, self.id, body=body, arrays=arrays, limits=LIMITS)
        return super().send_nowait(dst, t, body, arrays)


def test_a_copy_over_the_message_limit_is_refused_at_once_and_changes_nothing(caplog):
    """A copy larger than a message may carry (the relay checks only that one encoded
    gradient fits; a copy is the whole state) was counted as served and changed what the
    server keeps of the asker (its clocks, turns, an announcement for the next message)
    before its send failed on the wire, which was only logged: the asker waited out its
    resync_timeout, at each request. The server now refuses it before anything changes,
    with an answer that says why, and the asker gives up at once."""
    caplog.set_level(logging.INFO, logger="swarm.gossip.relay")
    d = 100_000

    async def main():
        hub = SimHub(topology="ring")
        for pid in ("a", "b"):
            hub.links[pid] = Limited(hub, pid)
        hub._install([Member("a", "inproc://a", 0), Member("b", "inproc://b", 1)])
        hub._next_rank = 2

        def state():   # parameters, Adam's two moments: 1.2 MB
            return {}, [np.zeros(d, np.float32) for _ in range(3)]
        a, b = (GradientRelay(hub.links[p], d, codec="topk:0.01", state=state, resync_timeout=10.0)
                for p in ("a", "b"))
        g = np.random.default_rng(0).standard_normal(d).astype(np.float32)
        for k in range(4):   # a's turns at 0, 2, 4, 6 (b's at 1, 3, 5: it takes none)
            await asyncio.to_thread(a.wait, 2 * k, 0.0, every=2, first=0)
            a.publish(g, clock=2 * k)
        kept = (a._clocks.get("b"), a._complete.get("b"))
        # a's message at b's turn came late to a: b is out of step, and asks a for its copy
        hub.links["a"].send_nowait("b", GRAD_LATE, {"c": 1, "at": 6, "f": 1})
        await settle()
        stop = threading.Event()

        def serve():
            while not stop.wait(0.005):
                a.poll()

        server = asyncio.create_task(asyncio.to_thread(serve))
        try:
            got = await asyncio.to_thread(b.wait, 7, 5.0, every=2, first=0)
        finally:
            stop.set()
            await server
        assert got and b.stats.resync_failed == 1 and not b.resyncing
        assert a.stats.served == 0 and not a._announce and (a._clocks.get("b"), a._complete.get("b")) == kept
        assert not hub.errors
        a.close()
        b.close()
        await hub.close()
    asyncio.run(main())
    assert "'a' sent no copy: \"its copy does not go in one message: message of" in caplog.text, caplog.text
