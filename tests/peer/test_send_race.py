"""A reply to a member that just joined, and the types user code may send.

The coordinator tells a joiner of the new view before (some of) the older
members, so a joiner's message can reach a peer whose view does not list it yet.
A reply sent from the receiver's handler is held until the view that lists the
joiner arrives (Peer.send), without blocking the receive loop that brings it.
Here the older member's view install is held back by the test, so the race
happens every run. A coordinator and two real peers on loopback, in one loop.
"""

from __future__ import annotations

import asyncio

import pytest
import zmq.asyncio
from swarmtest import hold_views, linked_pair, until

from swarm.coordinator import Coordinator
from swarm.errors import WireError
from swarm.link import View
from swarm.peer import Peer


def lagging(test):
    """Run ``await test(a, b, views, release)``: b joined first, then a, while b reads
    the coordinator's views but installs none (they collect in ``views``) until
    ``release(view)`` installs one and lets later views through. Everything is
    closed by its handle, also when the test fails."""
    async def main():
        ctx = zmq.asyncio.Context(io_threads=1)
        coord = Coordinator(bind="tcp://127.0.0.1:*", context=ctx)
        peers: list[Peer] = []
        try:
            await coord.start()
            b = Peer(coordinators=[coord.address], id="b", rank=0, context=ctx)
            peers.append(b)
            await b.start()
            views, release = hold_views(b)

            a = Peer(coordinators=[coord.address], id="a", rank=1, context=ctx)
            peers.append(a)
            await a.start()
            await a.wait_view(lambda v: v.member("b") is not None, 10.0)
            assert b.view.member("a") is None and a.epoch > b.epoch   # the race, every time
            await test(a, b, views, release)
        finally:
            for p in reversed(peers):
                await p.close()
            await coord.close()
            ctx.term()
    asyncio.run(main())


def replier(b: Peer, results: list, n: int = 1, timeout: float = 5.0):
    """A handler on b that answers each ``race.q`` with ``n`` ``race.a`` from the handler
    itself, and records what each send returned."""
    async def on_q(msg) -> None:
        for i in range(n):
            results.append(await b.send(msg.src, "race.a", {"i": i}, timeout=timeout))
    b.on("race.q", on_q)


def counting_acks(b: Peer) -> list[str]:
    """The answers (hello_ack, pong) b gives; while b lags, those to a fail as unknown_dst."""
    acks: list[str] = []
    answer = b._answer

    def counted(msg, t, body):
        acks.append(t)
        return answer(msg, t, body)
    b._answer = counted
    return acks


def test_a_reply_from_a_handler_goes_once_the_view_lists_the_sender():
    async def test(a: Peer, b: Peer, views: list[View], release) -> None:
        results: list[bool] = []
        got: list[dict] = []
        replier(b, results)
        a.on("race.a", lambda m: got.append(m.body))
        assert await a.send("b", "race.q", timeout=5.0)
        await until(lambda: results, 5.0, "b's reply")
        assert results == [True] and b.counters.held == 1    # was False at once (unknown_dst)
        await until(lambda: any(v.member("a") for v in views), 5.0, "the view that lists a")
        release(views[-1])
        await until(lambda: got, 5.0, "the reply at a")
        assert got == [{"i": 0}]
        # a sender that left: a send to it fails at once, as to any id outside the view
        await a.close()
        await until(lambda: b.view.member("a") is None, 5.0, "a's leave")
        assert await b.send("a", "race.a", {"i": 1}, timeout=5.0) is False
        assert await b.send("nobody", "race.a", {"i": 1}, timeout=5.0) is False
        assert b.counters.held == 1
    lagging(test)


def test_a_held_reply_is_dropped_and_counted_after_its_timeout():
    async def test(a: Peer, b: Peer, views: list[View], release) -> None:
        results: list[bool] = []
        got: list[dict] = []
        replier(b, results, timeout=0.3)
        a.on("race.a", lambda m: got.append(m.body))
        marks: list[int] = []
        a.on("race.mark", lambda m: marks.append(1))
        acks = counting_acks(b)
        unknown = b.counters.unknown_dst
        assert await a.send("b", "race.q", timeout=5.0)
        await until(lambda: results, 5.0, "b's reply")
        assert results == [True]
        await until(lambda: not b._held, 5.0, "the held reply to expire")
        assert b.counters.unknown_dst - unknown == len(acks) + 1   # the failed acks, and the reply
        assert b._held_bytes == 0
        await until(lambda: any(v.member("a") for v in views), 5.0, "the view that lists a")
        release(views[-1])
        # one link, in order: had the expired reply gone out, it would be in before the mark
        assert await b.send("a", "race.mark", timeout=5.0)
        await until(lambda: marks, 5.0, "the mark")
        assert got == []
    lagging(test)


def test_a_held_reply_to_a_sender_gone_by_the_view_it_spoke_from_is_dropped():
    async def test(a: Peer, b: Peer, views: list[View], release) -> None:
        results: list[bool] = []
        replier(b, results)
        acks = counting_acks(b)
        unknown = b.counters.unknown_dst
        spoke_from = a.epoch
        assert await a.send("b", "race.q", timeout=5.0)
        await until(lambda: results, 5.0, "b's reply")
        assert results == [True] and b._held
        await a.close()    # a leaves before b has seen it join
        await until(lambda: any(v.epoch > spoke_from and v.member("a") is None for v in views), 10.0,
                    "a view without a")
        n_acks = len(acks)
        release(views[-1])
        assert not b._held and b._held_bytes == 0     # at once, not after the 5 s timeout
        assert b.counters.unknown_dst - unknown == n_acks + 1
    lagging(test)


def test_held_replies_are_bounded_and_keep_their_order():
    async def test(a: Peer, b: Peer, views: list[View], release) -> None:
        results: list[bool] = []
        got: list[int] = []
        hwm = b.config.data_hwm
        replier(b, results, n=hwm + 2)
        a.on("race.a", lambda m: got.append(m.body["i"]))
        assert await a.send("b", "race.q", timeout=5.0)
        await until(lambda: len(results) == hwm + 2, 5.0, "b's replies")
        assert results == [True] * hwm + [False, False]
        assert b.counters.held == hwm
        await until(lambda: any(v.member("a") for v in views), 5.0, "the view that lists a")
        release(views[-1])
        await until(lambda: len(got) == hwm, 5.0, "the held replies at a")
        assert got == list(range(hwm)) and b.counters.dropped_out == 0
    lagging(test)


def test_close_drops_what_is_held():
    async def test(a: Peer, b: Peer, views: list[View], release) -> None:
        results: list[bool] = []
        replier(b, results)
        assert await a.send("b", "race.q", timeout=5.0)
        await until(lambda: results, 5.0, "b's reply")
        assert results == [True] and b._held
        acks = counting_acks(b)
        unknown = b.counters.unknown_dst
        await b.close()
        assert not b._held and b._held_bytes == 0
        assert b.counters.unknown_dst - unknown == len(acks) + 1
    lagging(test)


@pytest.mark.parametrize("t", ["hello", "hello_ack", "view", "join", "welcome", "bye"])
def test_swarm_protocol_types_cannot_be_sent(t):
    async def test(a: Peer, b: Peer, views: list[View], release) -> None:
        await until(lambda: any(v.member("a") for v in views), 5.0, "the view that lists a")
        release(views[-1])
        await asyncio.gather(a.wait_linked(10.0), b.wait_linked(10.0))
        out, unknown, drops = a.counters.msgs_out, a.counters.unknown_dst, a.counters.dropped_out
        with pytest.raises(WireError, match=rf"'{t}' is a swarm protocol type .*'ping' may be sent"):
            await a.send("b", t, {"e": b.epoch}, timeout=1.0)
        with pytest.raises(WireError, match=rf"'{t}' is a swarm protocol type"):
            a.send_nowait("b", t, {"e": b.epoch})
        assert (a.counters.msgs_out, a.counters.unknown_dst, a.counters.dropped_out) == (out, unknown, drops)
        # a ping may be sent (b answers pong itself), and b still answers hellos
        pongs: list[dict] = []
        a.on("pong", lambda m: pongs.append(m.body))
        assert await a.send("b", "ping", {"k": 1}, timeout=1.0)
        await until(lambda: pongs, 5.0, "the pong")
        assert pongs == [{"k": 1}]
    lagging(test)


def test_a_send_resumed_after_its_link_was_closed_does_not_touch_the_closed_socket():
    # send() waited for room on dst's link, was woken, and a view installed before it
    # resumed closed that link: it then sent through the link's plain shadow, which holds
    # only libzmq's pointer; once freed, the next socket made often gets the same address,
    # and the message went to another neighbour (or read freed memory)
    from swarm import transport as tp
    from swarm.peer import peer as peer_mod

    async def main():
        async with linked_pair() as (a, b):
            b.on("x", lambda msg: None)
            link = a._links["b"]
            closed_plains: list[object] = []
            real_try_send = tp.try_send

            def try_send(sock, frames):
                if sock is link.plain and not link.sock.closed:
                    return False   # a full queue: send() waits for room
                if sock is link.plain:
                    closed_plains.append(sock)
                return real_try_send(sock, frames)

            async def poll(timeout=None, flags=zmq.POLLOUT):
                a._close_link(link)   # a view closed the link while this task was waking up
                return zmq.POLLOUT

            peer_mod.tp.try_send = try_send
            link.sock.poll = poll
            try:
                dropped = a.counters.dropped_out
                assert await a.send("b", "x", {}, timeout=2) is False
            finally:
                peer_mod.tp.try_send = real_try_send
            assert closed_plains == []
            assert a.counters.dropped_out == dropped + 1

    asyncio.run(main())
