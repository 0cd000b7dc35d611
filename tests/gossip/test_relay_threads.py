"""GradientRelay.publish from several threads: the calls take turns, so each thread's
gradient goes out once, in its own message, and the codec's residual stays whole; with
``direct`` a publish from a thread that is not the consumer stays off the consumer's sockets."""

from __future__ import annotations

import asyncio
import collections
import sys
import threading
import time

import numpy as np
import zmq
from swarmtest import wait_for, start_sync_ring

from swarm import transport as tp
from swarm.gossip import GradientRelay
from swarm.gossip.sim import SimHub

D = 200_000      # an encode long enough for the two threads' calls to overlap
CALLS = 60       # per thread


def test_two_threads_publish_at_once_and_nothing_is_lost():
    """Before the fix two threads shared the relay's held updates and the codec's
    buffers: one thread's publish raised a raw ValueError ("not enough values to
    unpack") after its gradient had gone out inside the other's message, so
    stats.published ran ahead of stats.sent, and the error-feedback residual no
    longer made up what the codec dropped (off by ~40 against ~1e-6)."""
    async def main():
        hub = SimHub(topology="ring")
        a, b = [GradientRelay(link, D, codec="ef+topk:0.5", max_pending=4 * CALLS) for link in hub.add_many(2)]
        ins, outs, errors = [], [], []
        record = threading.Lock()

        def publisher(seed: int) -> None:
            rng = np.random.default_rng(seed)
            for i in range(CALLS):
                g = rng.standard_normal(D).astype(np.float32)
                try:
                    out = a.publish(g, clock=i)
                except BaseException as e:   # any exception at all is the defect
                    errors.append(e)
                    return
                with record:
                    ins.append(g)
                    outs.append(out.copy())

        old = sys.getswitchinterval()
        sys.setswitchinterval(1e-5)   # switch threads often, so that their publishes interleave
        try:
            await asyncio.gather(*(asyncio.to_thread(publisher, k) for k in range(2)))
        finally:
            sys.setswitchinterval(old)
        try:
            assert errors == []
            assert a.stats.published == a.stats.sent == len(outs) == 2 * CALLS
            # the codec's stream: what went out plus what it kept is what came in
            np.testing.assert_allclose(np.sum(outs, axis=0, dtype=np.float64) + a._codec.residual,
                                       np.sum(ins, axis=0, dtype=np.float64), rtol=0, atol=1e-3)
            got = []
            for _ in range(500):   # deliveries run on this loop; a deadline of 500 passes
                got += b.take()
                if len(got) >= len(outs):
                    break
                await asyncio.sleep(0.001)
            # the neighbour applies exactly what the origin applied, each once
            assert collections.Counter(g.tobytes() for g in got) == collections.Counter(o.tobytes() for o in outs)
        finally:
            a.close()
            b.close()
            await hub.close()
    asyncio.run(main())


def test_direct_publish_from_another_thread_takes_turns_with_polls_forwarding(procs, monkeypatch):
    """Before the fix a direct relay's publish from a thread other than the consumer sent
    on the PUSH sockets (and looked them up in the dict) that the consumer's poll()
    forwards on, at the same time: zmq sockets are not thread-safe. Here the publisher
    stays inside its send while the consumer forwards, and the two sends must not overlap."""
    inside, most, entered, release = [0], [0], threading.Event(), threading.Event()
    count = threading.Lock()
    publisher_id: list[int] = []
    real_send = tp.try_send

    consumer = threading.get_ident()

    def try_send(s, frames):
        me = threading.get_ident()
        if me != consumer and me not in publisher_id:   # the peers' loops send too
            return real_send(s, frames)
        with count:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            if me in publisher_id:
                entered.set()
                release.wait(2.0)   # the consumer's forward lets it go on; a deadline either way
            else:
                release.set()
            return real_send(s, frames)
        finally:
            with count:
                inside[0] -= 1

    peers, relays = [], []
    try:
        start_sync_ring(procs, peers, 3, "t")

        async def make() -> GradientRelay:   # hops 2 both ways: t1 passes t0's gradients on to t2
            return GradientRelay(sp.peer, 50, codec="topk:0.5", direct=True)
        for sp in peers:
            relays.append(sp.call(make()))
        assert all(r.ready(timeout=10) for r in relays)   # this thread is every relay's consumer
        a, b = relays[0], relays[1]
        g = np.arange(50, dtype=np.float32)
        b.publish(g, clock=0)                 # b's PUSH sockets exist from here on
        a.publish(g, clock=0)
        inbox = b._inbox_sock
        assert wait_for(lambda: inbox.getsockopt(zmq.EVENTS) & zmq.POLLIN, timeout=10, what="a's gradient at b")
        monkeypatch.setattr(tp, "try_send", try_send)
        t = threading.Thread(target=lambda: (publisher_id.append(threading.get_ident()), b.publish(g, clock=1)))
        t.start()
        assert entered.wait(10)
        assert b.poll() == 1                  # forwards a's gradient to t2 while b's publish sends
        t.join(10)
        assert not t.is_alive()
        assert most[0] == 1
    finally:
        monkeypatch.undo()
        for r in relays:
            r.close()
        for sp in peers:
            sp.close()


def test_a_publish_waiting_while_a_direct_relay_closes_opens_no_socket_on_it(procs):
    """Before the fix a publish on another thread that waited for the sockets' lock while
    close() closed the outboxes took it next, found no outbox and opened a new PUSH socket
    in the closed relay, which nothing closed again. close_side is slowed here while
    close() holds the lock, so the publish surely waits for it."""
    peers, relays = [], []
    try:
        start_sync_ring(procs, peers, 2, "c")

        async def make() -> GradientRelay:
            return GradientRelay(sp.peer, 8, direct=True)
        for sp in peers:
            relays.append(sp.call(make()))
        assert all(r.ready(timeout=10) for r in relays)
        a = relays[0]
        g = np.ones(8, np.float32)
        a.publish(g, clock=0)                      # a's outbox to c1 exists from here on
        old = [s for _, s in a._outboxes.values()]
        assert old
        real_close_side = a.link.close_side
        closing = threading.Event()
        publisher: list[int] = []
        waited: list[bool] = []

        class Watched:
            """The sockets' lock, noting who asks for it."""
            def __init__(self, lock) -> None:
                self.lock, self.asked = lock, []

            def __enter__(self):
                self.asked.append(threading.get_ident())
                return self.lock.__enter__()

            def __exit__(self, *exc):
                return self.lock.__exit__(*exc)
        a._sockets = Watched(a._sockets)

        def slow_close_side(s):
            if s in old:
                closing.set()
                # the publish below asks for the lock meanwhile: else the race went untried
                deadline = time.monotonic() + 5.0
                while not (publisher and publisher[0] in a._sockets.asked) and time.monotonic() < deadline:
                    time.sleep(0.01)
                waited.append(bool(publisher) and publisher[0] in a._sockets.asked)
                time.sleep(0.1)
            real_close_side(s)
        a.link.close_side = slow_close_side
        errors: list[BaseException] = []

        def publish() -> None:
            publisher.append(threading.get_ident())
            closing.wait(5.0)
            try:
                a.publish(2 * g, clock=1)
            except BaseException as e:   # noqa: BLE001 (a GossipError is fine; any is recorded)
                errors.append(e)
        t = threading.Thread(target=publish)
        t.start()
        a.close()
        t.join(10)
        assert not t.is_alive()
        assert waited and all(waited), "the publish did not ask for the lock while close() held it"
        assert all(type(e).__name__ == "GossipError" for e in errors), errors
        assert not a._outboxes, a._outboxes        # no socket opened on the closed relay
    finally:
        for r in relays:
            r.close()
        for sp in peers:
            sp.close()
