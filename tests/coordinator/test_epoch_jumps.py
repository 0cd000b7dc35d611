"""Epochs that come from outside the table: a live member's repeated join that names a
later epoch, another coordinator's epoch, and the view a standby held before it took
over. Raw DEALERs and a raw ROUTER speak the wire protocol to in-process coordinators."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio
from swarmtest import free_port, until

from swarm import Coordinator, wire
from swarm.coordinator.server import MAX_LAST_EPOCH


def _join(src: str, inc: int, port: int, last_epoch: int = 0) -> list[bytes]:
    return wire.encode("join", src, body={"addr": f"tcp://127.0.0.1:{port}", "rank": -1, "inc": inc,
                                          "last_epoch": last_epoch})


def _hb(src: str, inc: int, epoch: int) -> list[bytes]:
    return wire.encode("heartbeat", src, epoch=epoch, body={"inc": inc, "linked": 1})


async def _read(d: zmq.asyncio.Socket, seconds: float) -> list[wire.Message]:
    """Every message ``d`` gets within ``seconds``."""
    got = []
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while (left := end - loop.time()) > 0:
        try:
            got.append(wire.decode(await asyncio.wait_for(d.recv_multipart(), left)))
        except TimeoutError:
            break
    return got


class _Other:
    """A raw ROUTER at another coordinator's address: it answers each status request with
    ``body`` while that is not None, and is silent otherwise."""

    def __init__(self, ctx: zmq.asyncio.Context) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.sock.bind(self.address)
        self.body: dict | None = None
        self.answers = 0
        self._task = asyncio.create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            frames = await self.sock.recv_multipart()
            if self.body is not None:
                await self.sock.send_multipart([frames[0]] + wire.encode("status_reply", "other", body=self.body))
                self.answers += 1

    def close(self) -> None:
        self._task.cancel()
        self.sock.close()


def _dealer(ctx: zmq.asyncio.Context, addr: str) -> zmq.asyncio.Socket:
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(addr)
    return d


def test_a_repeated_join_that_names_a_later_epoch_publishes_a_view_above_it():
    # the refresh raised the table's epoch (1,000) past the view's (2) without a new view:
    # the joiner got view 2 again, which it ignores as older than what it holds, and every
    # heartbeat of an up-to-date member then read as lagging and got the whole view, up to
    # four times a second each, until the next change of membership
    async def main():
        ctx = zmq.asyncio.Context()
        async with Coordinator(bind="tcp://127.0.0.1:0", http_bind="", rejoin_grace_s=0.0) as coord:
            a, b = _dealer(ctx, coord.address), _dealer(ctx, coord.address)
            try:
                await a.send_multipart(_join("a", 7, 9))
                await b.send_multipart(_join("b", 8, 10))
                await until(lambda: sorted(coord.table.view.ids) == ["a", "b"])
                await _read(a, 0.3)
                await _read(b, 0.3)

                await a.send_multipart(_join("a", 7, 9, last_epoch=1000))   # the same process again
                got = {"a": await _read(a, 1.0), "b": await _read(b, 1.0)}
                assert got["a"][0].t == "welcome", got["a"]
                for who, msgs in got.items():
                    views = [m.epoch for m in msgs if m.t == "view"]
                    assert views and max(views) > 1000, (who, [(m.t, m.epoch) for m in msgs])
                newest = coord.table.view.epoch
                assert newest > 1000 and coord.table.epoch == newest
                assert sorted(coord.table.view.ids) == ["a", "b"]

                # members that hold the newest view are not sent it again
                for _ in range(4):
                    await a.send_multipart(_hb("a", 7, newest))
                    await b.send_multipart(_hb("b", 8, newest))
                    await asyncio.sleep(0.3)
                later = await _read(a, 0.3) + await _read(b, 0.3)
                assert not [m for m in later if m.t == "view"], [(m.t, m.epoch) for m in later]
            finally:
                a.close()
                b.close()
        ctx.term()

    asyncio.run(main())


def test_an_epoch_from_another_coordinator_past_the_cap_is_refused_and_a_takeover_still_serves():
    # a standby took any epoch the other's status reply named; at 2**64 - 1 its first view
    # after the takeover could not go on the wire, and the probe in its tick loop raised,
    # ending the coordinator
    async def main():
        ctx = zmq.asyncio.Context()
        other = _Other(ctx)     # a standby that names an epoch no view can follow
        other.body = {"mode": "standby", "epoch": 2**64 - 1, "coordinator": other.address, "token": "z",
                      "watches": 1}
        d = None
        try:
            async with Coordinator(bind="tcp://127.0.0.1:0", http_bind="", others=[other.address],
                                   takeover_s=0.5, rejoin_grace_s=0.0) as coord:
                await until(lambda: other.answers >= 3)
                assert coord.table.epoch <= MAX_LAST_EPOCH
                assert any("epoch" in r for r in coord._bad.by_reason), coord._bad.by_reason
                other.close()
                await until(lambda: coord.mode == "active", 10)
                d = _dealer(ctx, coord.address)
                await d.send_multipart(_join("a", 1, 9))
                msgs = await _read(d, 1.5)
                assert [m.t for m in msgs][:1] == ["welcome"], [(m.t, m.epoch) for m in msgs]
                assert any(m.t == "view" for m in msgs)
                assert [m.id for m in coord.table.view.members] == ["a"]
                await d.send_multipart(_hb("a", 1, coord.table.view.epoch))
                await until(lambda: coord.heartbeats >= 1)
        finally:
            other.close()
            if d is not None:
                d.close()
        ctx.term()

    asyncio.run(main())


def test_a_takeover_serves_no_view_it_held_before_it_stood_by():
    # the table was cleared at a takeover but not its view: a member that joined again was
    # found "listed" in the view this coordinator had before it stood by (epoch 1, where
    # the swarm had gone on to 40 meanwhile) and was sent that, which it ignores as old
    async def main():
        ctx = zmq.asyncio.Context()
        other = _Other(ctx)     # silent at first
        a = None
        try:
            async with Coordinator(bind="tcp://127.0.0.1:0", http_bind="", others=[other.address],
                                   takeover_s=0.5, rejoin_grace_s=1.0) as coord:
                await until(lambda: coord.mode == "active", 10)
                a = _dealer(ctx, coord.address)
                await a.send_multipart(_join("a", 1, 9))
                await until(lambda: [m.id for m in coord.table.view.members] == ["a"])
                assert coord.table.view.epoch < 40
                await _read(a, 0.3)
                # the other is active at a later epoch: this one stands by
                other.body = {"mode": "active", "epoch": 40, "coordinator": other.address, "token": "z",
                              "watches": 1}
                await until(lambda: coord.mode == "standby", 10)
                other.close()                   # and goes: this one takes over
                await until(lambda: coord.mode == "active", 10)
                # within its grace for re-joins (no view goes out before it ends)
                await a.send_multipart(_join("a", 1, 9, last_epoch=40))   # a held view 40 from the other
                msgs = await _read(a, 2.0)
                views = [m for m in msgs if m.t == "view"]
                assert [m.t for m in msgs][:1] == ["welcome"] and views, [(m.t, m.epoch) for m in msgs]
                assert views[0].epoch > 40, [(m.t, m.epoch) for m in msgs]
                assert [m.id for m in coord.table.view.members] == ["a"] and coord.table.view.epoch > 40
        finally:
            other.close()
            if a is not None:
                a.close()
        ctx.term()

    asyncio.run(main())


@pytest.mark.parametrize("body, word", [
    ({"inc": "7"}, "inc must be an integer"), ({"inc": None}, "inc must be an integer"),
    ({"rank": True}, "rank must be an integer"), ({"last_epoch": MAX_LAST_EPOCH + 1}, "last_epoch"),
])
def test_a_malformed_join_is_refused_with_the_reason_and_counted(body, word):
    # it was dropped as malformed without an answer: the joiner waited out its join timeout
    async def main():
        ctx = zmq.asyncio.Context()
        async with Coordinator(bind="tcp://127.0.0.1:0", http_bind="", rejoin_grace_s=0.0) as coord:
            d = _dealer(ctx, coord.address)
            try:
                full = {"addr": "tcp://127.0.0.1:9", "rank": -1, "inc": 7, "last_epoch": 0, **body}
                await d.send_multipart(wire.encode("join", "a", body=full))
                got = await _read(d, 1.0)
                assert [m.t for m in got] == ["refuse"] and word in got[0].body["reason"], got
                assert coord.malformed == 1 and coord.table.get("a") is None
            finally:
                d.close()
                ctx.term()

    asyncio.run(main())
