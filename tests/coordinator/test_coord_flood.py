"""A flood of joins from one raw client: the view stays within what one message holds
(a join past it, or past coordinator.max_members, is refused and says why), a view
that does not encode is logged and not the coordinator's end, ids that share a
connection get one view per change, and a rank out of range is refused."""

from __future__ import annotations

import asyncio
import logging
import random

import msgpack
import pytest
import zmq
import zmq.asyncio
from swarmtest import free_port, until

from swarm import Coordinator, wire
from swarm import transport as tp
from swarm.config import MAX_VIEW_MEMBERS, CoordinatorConfig, from_dict
from swarm.coordinator import DEAD, MemberTable, server
from swarm.coordinator.table import MAX_RANK
from swarm.errors import ConfigError, MembershipError

#: what a small peer accepts in these tests: a view of 16 KiB, about 38 of the long entries below
SMALL = wire.Limits(max_header_bytes=16 * 1024)
BIG = wire.Limits(max_header_bytes=64 * 1024 * 1024)


def long_id(i: int) -> str:
    return f"{i:04d}-" + "x" * 200


def long_addr(i: int) -> str:
    return f"tcp://{'h' * 200}:{1000 + i}"


def small_views(monkeypatch, admission: bool) -> None:
    """Views are encoded under SMALL (as if peers accepted no more); with ``admission``
    the coordinator knows it (VIEW_LIMITS), without it only the encoding fails."""
    real = wire.encode

    def encode(t, src, **kw):
        if t == "view":
            kw["limits"] = SMALL
        return real(t, src, **kw)

    monkeypatch.setattr(wire, "encode", encode)
    if admission:
        monkeypatch.setattr(server, "VIEW_LIMITS", SMALL, raising=False)


class Client:
    """A raw DEALER that speaks for any number of member ids, and keeps what it gets."""

    def __init__(self, ctx: zmq.asyncio.Context, addr: str) -> None:
        self.s = ctx.socket(zmq.DEALER)
        self.s.setsockopt(zmq.LINGER, 0)
        self.s.connect(addr)
        self.plain = zmq.Socket.shadow(self.s.underlying)   # reads without awaiting
        self.got: list[wire.Message] = []

    async def join(self, src: str, addr: str, rank: int = -1, inc: int = 1, last_epoch: int = 0) -> None:
        body = {"addr": addr, "rank": rank, "inc": inc, "last_epoch": last_epoch}
        await self.s.send_multipart(wire.encode("join", src, body=body))

    async def send(self, t: str, src: str, body: dict) -> None:
        await self.s.send_multipart(wire.encode(t, src, body=body))

    def read(self) -> list[wire.Message]:
        while self.plain.poll(0):
            self.got.append(wire.decode(self.plain.recv_multipart(), BIG))
        return self.got

    def of(self, t: str) -> list[wire.Message]:
        return [m for m in self.read() if m.t == t]


async def serve(coord: Coordinator, body) -> None:
    ctx = zmq.asyncio.Context()
    await coord.start()
    client = Client(ctx, coord.address)
    try:
        await body(coord, client)
    finally:
        client.s.close(0)
        ctx.term()
        await coord.close()


def coordinator(**overrides) -> Coordinator:
    """A coordinator for the raw client, which sends no heartbeats: with the default 5 s
    timeout (and 1 s probe), a test stalled that long on a loaded machine saw its members
    declared dead, and the views it waited for never came."""
    return Coordinator(bind=f"tcp://127.0.0.1:{free_port()}", http_bind="", heartbeat_timeout_s=600, **overrides)


def running(coord: Coordinator) -> bool:
    return coord._runner is not None and not coord._runner.done() and coord._failure is None


def test_a_join_past_what_a_view_message_holds_is_refused_and_the_coordinator_goes_on(monkeypatch):
    # one client sent joins with long ids until the view was over 4 MiB: encoding it raised
    # out of the publish, and the coordinator process ended (exit 2)
    small_views(monkeypatch, admission=True)
    n = 80

    async def body(coord: Coordinator, c: Client) -> None:
        for i in range(n):
            await c.join(long_id(i), long_addr(i))
        await until(lambda: len(c.of("welcome")) + len(c.of("refuse")) == n, 10, what="an answer to every join")
        welcomed, refused = len(c.of("welcome")), c.of("refuse")
        assert 10 < welcomed < n and len(refused) == n - welcomed
        for m in refused:
            assert m.body["reason"].startswith("the view is full: with "), m.body
            assert f"over the {coord.table.max_view_bytes} that fit in a view message ({welcomed} members)" \
                in m.body["reason"]
        await until(lambda: len(coord.table.view.members) == welcomed, 5, what="the view of those admitted")
        assert running(coord)
        # the members get that view, whole (at the coordinator's next publish), and it is
        # within what they accept
        await until(lambda: any(len(v.body["members"]) == welcomed for v in c.of("view")), 5,
                    what="the view of those admitted, sent")
        assert len(c.of("view")[-1].body["members"]) == welcomed
        wire.encode("view", coord.name, epoch=2**62, body=coord.table.view.to_wire(), limits=SMALL)
        # the table counted the entries as the view encodes them
        assert coord.table.view_bytes == sum(len(msgpack.packb(e)) for e in coord.table.view.to_wire()["members"])
        # room made by one that leaves is room for one more
        await c.send("leave", long_id(0), {"inc": 1})
        await until(lambda: len(coord.table.view.members) == welcomed - 1, 5, what="the view without the leaver")
        await c.join(long_id(n), long_addr(n))
        await until(lambda: len(c.of("welcome")) == welcomed + 1, 5, what="the next join admitted")

    asyncio.run(serve(coordinator(), body))


def test_a_view_that_does_not_encode_is_logged_and_the_coordinator_goes_on(monkeypatch, caplog):
    # here admission allows more than the encoding does (VIEW_LIMITS not lowered): the
    # WireError raised out of _publish in the tick or receive loop ended the coordinator
    caplog.set_level(logging.ERROR, logger="swarm.coordinator")
    small_views(monkeypatch, admission=False)
    n = 60

    async def body(coord: Coordinator, c: Client) -> None:
        for i in range(n):
            await c.join(long_id(i), long_addr(i))
        await until(lambda: len(c.of("welcome")) == n, 10, what="every join admitted")
        await until(lambda: "cannot be encoded, so it is not sent" in caplog.text, 5, what="the encoding error")
        assert f"the view of {n} members cannot be encoded" in caplog.text
        assert running(coord) and not c.of("view")
        # it still answers, and once members leave and the view fits again it is sent
        await c.send("status", "asker", {})
        await until(lambda: c.of("status_reply"), 5, what="a status reply")
        for i in range(25):
            await c.send("leave", long_id(i), {"inc": 1})
        await until(lambda: c.of("view"), 5, what="the view of 35, which fits")
        for i in range(25, n - 10):
            await c.send("leave", long_id(i), {"inc": 1})
        # then a delta (the test waited for a full view of 10, which came only when no tick
        # fell between the leaves: a fresh clone's run on a loaded machine timed out)
        await until(lambda: len(coord.table.view.members) == 10
                    and any(v.body.get("epoch") == coord.table.view.epoch for v in c.of("view")), 5,
                    what="the view of the 10 left")
        assert running(coord)

    asyncio.run(serve(coordinator(), body))


def test_ids_that_share_a_connection_get_one_view_per_change():
    # each of them got the whole view: one client's 2,000 joins of long ids (1.2 MB) made
    # the coordinator send it 2 GiB, copying each message (1.9 GB resident)
    n = 30

    async def body(coord: Coordinator, c: Client) -> None:
        for i in range(n):   # all within rejoin_grace_s: the first view lists them all
            await c.join(f"p{i}", f"tcp://127.0.0.1:{2000 + i}")
        await until(lambda: coord.table.view.epoch >= 1, 5, what="the first view")
        await asyncio.sleep(0.5)   # what more would come
        views = c.of("view")
        assert [len(v.body["members"]) for v in views] == [n]

    asyncio.run(serve(coordinator(), body))


def test_a_join_past_max_members_is_refused():
    async def body(coord: Coordinator, c: Client) -> None:
        for i in range(5):
            await c.join(f"p{i}", f"tcp://127.0.0.1:{2000 + i}")
        await until(lambda: len(c.of("welcome")) + len(c.of("refuse")) == 5, 5, what="an answer to every join")
        assert len(c.of("welcome")) == 3
        assert [m.body["reason"] for m in c.of("refuse")] == [
            f"the swarm is full: 3 members, the coordinator's max_members = 3; 'p{i}' is not admitted" for i in (3, 4)]
        assert sorted(coord.table.members) == ["p0", "p1", "p2"]

    asyncio.run(serve(coordinator(max_members=3), body))


@pytest.mark.parametrize("value", [0, MAX_VIEW_MEMBERS + 1])
def test_max_members_out_of_range_is_a_config_error(value):
    with pytest.raises(ConfigError, match=rf"coordinator\.max_members = {value}: must be in 1\.\.100000"):
        from_dict(CoordinatorConfig, {"max_members": value}, prefix="coordinator")
    # a peer decodes no longer member list than this
    assert MAX_VIEW_MEMBERS == wire.DEFAULT_LIMITS.max_array_len


def test_a_rank_out_of_range_is_refused():
    # 2**64 - 1 was stored as the member's rank; -5 meant "any rank"
    async def body(coord: Coordinator, c: Client) -> None:
        for i, rank in enumerate([2**64 - 1, MAX_RANK + 1, -2, -5]):
            await c.join(f"bad{i}", f"tcp://127.0.0.1:{3000 + i}", rank=rank)
        await c.join("any", "tcp://127.0.0.1:3010", rank=-1)
        await c.join("top", "tcp://127.0.0.1:3011", rank=MAX_RANK)
        await until(lambda: len(c.of("welcome")) + len(c.of("refuse")) == 6, 5, what="an answer to every join")
        assert [m.body["reason"] for m in c.of("refuse")] == [
            f"rank {r} is out of range: -1 (any free rank) or 0 to {MAX_RANK}" for r in (2**64 - 1, MAX_RANK + 1, -2, -5)]
        assert [m.body["rank"] for m in c.of("welcome")] == [0, MAX_RANK]
        assert sorted(coord.table.members) == ["any", "top"]

    asyncio.run(serve(coordinator(), body))


def test_the_table_keeps_ranks_and_view_bytes_as_a_full_scan_would():
    # ranks and the view's size are kept as members join and die (a join scanned the table)
    rng = random.Random(7)
    t = MemberTable()
    incs: dict[str, int] = {}
    for step in range(3000):
        pid = f"p{rng.randrange(300)}"
        m = t.get(pid)
        if m is not None and m.state != DEAD and rng.random() < 0.5:
            t.mark_dead(pid, "crash")
        else:
            taken = {x.rank for x in t.members.values() if x.state != DEAD}
            want = rng.choice([-1, -1, -1, rng.randrange(400)])
            incs[pid] = incs.get(pid, 0) + (0 if m is not None and m.state != DEAD else 1)
            try:
                rec = t.join(pid, f"tcp://h{rng.randrange(1000)}:1", want, incs[pid], b"r")
            except MembershipError:
                assert want in taken or (m is not None and m.state != DEAD)
                continue
            if m is None or m.state == DEAD:
                if want >= 0:
                    assert rec.rank == want
                elif m is not None and m.rank not in taken:
                    assert rec.rank == m.rank          # a returning id gets its rank back
                else:
                    assert rec.rank == min(set(range(len(taken) + 1)) - taken)   # the lowest free one
        if step % 100 == 0:
            t.forget_dead(keep=50)
        live = [x for x in t.members.values() if x.state != DEAD]
        assert t.live() == len(live) == len({x.rank for x in live})
        assert t.view_bytes == sum(t.entry_bytes(x.id, x.addr, x.rank, x.key) for x in live)
    t.clear()
    assert (t.live(), t.view_bytes, t.join("q", "tcp://h:1", -1, 1, b"r").rank) == (0, 0, 0)


def test_the_table_refuses_what_would_not_fit_and_changes_nothing():
    t = MemberTable(max_members=2, max_view_bytes=100)
    t.join("a", "tcp://h:1", -1, 1, b"r")
    before = (t.view_bytes, t.live(), dict(t.members))
    with pytest.raises(MembershipError, match="the view is full: with 'b' its member list would be"):
        t.join("b", "tcp://" + "h" * 100 + ":1", -1, 1, b"r")
    with pytest.raises(MembershipError, match="the view is full"):   # a retry that grows its address
        t.join("a", "tcp://" + "h" * 100 + ":1", -1, 1, b"r2")
    assert (t.view_bytes, t.live(), dict(t.members)) == before and t.get("a").route == b"r"
    t.join("b", "tcp://h:2", -1, 1, b"r")
    with pytest.raises(MembershipError, match="the swarm is full: 2 members"):
        t.join("c", "tcp://h:3", -1, 1, b"r")
    t.mark_dead("a", "left")
    assert t.join("c", "tcp://h:3", -1, 1, b"r").rank == 0


def test_a_message_of_very_many_frames_is_cut_short_before_it_is_decoded():
    # The coordinator's receive loop made a Frame object of every frame of a message
    # before decode refused it for its count: 4 million empty frames (8 MB on the wire)
    # took ~1 GiB and stalled its loop ~6 s, past heartbeat_timeout_s. It keeps the first
    # KEEP_FRAMES + 1 now, and the rest are read and dropped.
    async def main():
        seen: list[int] = []
        async with Coordinator(bind="tcp://127.0.0.1:*", http_bind="") as coord:
            real = coord._on_message
            coord._on_message = lambda route, frames, now: (seen.append(len(frames)), real(route, frames, now))
            ctx = zmq.asyncio.Context()
            d = ctx.socket(zmq.DEALER)
            try:
                d.connect(coord.address)
                await d.send_multipart([b""] * 20_000)
                async with asyncio.timeout(10):
                    while not seen:
                        await asyncio.sleep(0.01)
            finally:
                d.close(0)
                ctx.term()
        assert seen == [tp.KEEP_FRAMES + 1]

    asyncio.run(main())
