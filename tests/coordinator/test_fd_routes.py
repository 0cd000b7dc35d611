"""Which members a closed connection makes the coordinator probe. The ROUTER's monitor
names the connection's fd; the coordinator maps each fd to the ids that speak on it,
and a close probes those that still do. Raw DEALERs speak the wire protocol to an
in-process coordinator; the heartbeat timeout is long, so that a member a close should
have caught, and did not, is still alive when the test looks."""

from __future__ import annotations

import asyncio
import os
import socket
import time

import zmq
import zmq.asyncio
from swarmtest import until

from swarm import Coordinator, wire
from swarm.coordinator.table import ALIVE, DEAD

ADDR = "tcp://127.0.0.1:9"


def _link(fd: int) -> str:
    """What fd ``fd`` of this process is ("" if it is closed)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except FileNotFoundError:
        return ""


def _accepted_by(fd: int, port: int) -> bool:
    """Whether fd ``fd`` is a connection accepted on ``port`` (the coordinator's side)."""
    try:
        s = socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM)   # a duplicate, closed below
    except OSError:
        return False
    with s:
        try:
            return s.getsockname()[1] == port
        except OSError:
            return False


def _fill_below(fd: int, deadline: float) -> list[int]:
    """Open every free fd below ``fd`` but one, so that of the next two this process
    opens (a connection's two ends: the DEALER's, then the coordinator's) the second is
    ``fd``, as in a process whose lowest free fd is the one a connection just gave back.
    Tried again until ``fd`` and one below it are free (the DEALER's end of the closed
    connection may close after the coordinator's). Returns the fds opened, to close."""
    while True:
        fillers = []
        while (d := os.open(os.devnull, os.O_RDONLY)) < fd:
            fillers.append(d)
        os.close(d)
        if (d == fd and fillers) or time.monotonic() > deadline:
            break
        for f in fillers:
            os.close(f)
        time.sleep(0.01)
    if fillers:
        os.close(fillers.pop())
    return fillers


class Clients:
    """Raw DEALERs by name, on a context of their own; all closed at the end."""

    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord
        self.ctx = zmq.asyncio.Context()
        self.socks: dict[str, zmq.asyncio.Socket] = {}

    async def __aenter__(self) -> "Clients":
        return self

    async def __aexit__(self, *exc: object) -> None:
        for s in self.socks.values():
            s.close(0)
        self.ctx.term()

    def open(self, name: str, connect: bool = True) -> zmq.asyncio.Socket:
        s = self.socks[name] = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        if connect:
            s.connect(self.coord.address)
        return s

    def close(self, name: str) -> None:
        self.socks.pop(name).close(0)

    def send(self, name: str, t: str, pid: str, **body: object) -> None:
        """Send without waiting (also from code that holds the coordinator's loop)."""
        zmq.Socket.shadow(self.socks[name].underlying).send_multipart(wire.encode(t, pid, body=body))

    async def ask(self, name: str, t: str, pid: str, want: str, **body: object) -> wire.Message:
        """Send, and return the first reply of type ``want``."""
        self.send(name, t, pid, **body)
        return await self.expect(name, want)

    async def expect(self, name: str, want: str) -> wire.Message:
        """The first message of type ``want`` that comes to ``name`` (others are skipped)."""
        while True:
            msg = wire.decode(await asyncio.wait_for(self.socks[name].recv_multipart(), 5))
            if msg.t == want:
                return msg

    async def join(self, name: str, pid: str, inc: int = 1) -> int:
        """Join ``pid`` over connection ``name``; return the coordinator's fd of it."""
        before = set(self.coord._fds)
        msg = await self.ask(name, "join", pid, "welcome", addr=ADDR, rank=-1, inc=inc)
        assert msg.t == "welcome"
        new = set(self.coord._fds) - before
        return new.pop() if new else -1

    async def read_by_coordinator(self, fd: int, link: str) -> None:
        """Wait until the coordinator has read the close of its connection ``fd`` (which
        was ``link``): libzmq reports a disconnect before it closes the fd, and a status
        answered after that comes from a wake-up that read the report first."""
        await until(lambda: _link(fd) != link, 5, what=f"the coordinator closing fd {fd}")
        self.open("status")
        await self.ask("status", "status", "tester", "status_reply")
        self.close("status")


def _state(coord: Coordinator, pid: str) -> tuple[str, str]:
    m = coord.table.get(pid)
    return m.state, m.cause


def _coordinator() -> Coordinator:
    return Coordinator(bind="tcp://127.0.0.1:0", http_bind="", rejoin_grace_s=0.0, heartbeat_timeout_s=60.0)


def test_a_join_on_the_fd_of_a_connection_closed_in_the_same_batch_probes_the_one_that_closed():
    # A's connection closed and B's join came on the fd A's had, both while the coordinator
    # handled one batch (its monitor read before): the join overwrote fd -> "a" with "b",
    # and the disconnect read next was taken for B's. B, alive and just joined, was probed
    # and died; A, gone, stayed alive until its heartbeat timeout
    async def main() -> bool:
        """Whether the race was set up (then checked): another thread of a loaded test
        process may take the fd first."""
        async with _coordinator() as coord, Clients(coord) as cl:
            cl.open("A")
            fd = await cl.join("A", "a")
            cl.open("C")
            await cl.join("C", "c")
            link = _link(fd)
            port = int(coord.address.rsplit(":", 1)[1])
            cl.open("B", connect=False)   # its own fds now, so that its connection's may be A's
            drain = coord._drain_router
            reused: list[bool] = []

            def one_long_batch() -> int:
                # what one batch of a busy coordinator can span: A closes, B connects on the fd
                # A's had and joins; drained until B's join is read, with no monitor read between
                coord._drain_router = drain   # the next batches are as usual
                n = drain()
                cl.close("A")
                deadline = time.monotonic() + 5
                while _link(fd) == link and time.monotonic() < deadline:
                    time.sleep(0.01)
                fillers = _fill_below(fd, deadline)
                try:
                    cl.socks["B"].connect(coord.address)
                    cl.send("B", "join", "b", addr=ADDR, rank=-1, inc=1)
                    while coord.table.get("b") is None and time.monotonic() < deadline:
                        time.sleep(0.01)
                        n += drain()
                    reused.append(_accepted_by(fd, port))
                finally:
                    for f in fillers:
                        os.close(f)
                return n

            coord._drain_router = one_long_batch
            cl.send("C", "heartbeat", "c", inc=1)   # something to drain: the batch
            await until(lambda: reused, 10, what="the batch")
            if reused != [True]:
                return False
            await until(lambda: _state(coord, "a") == (DEAD, "disconnected"), 5, what="a probed and dead")
            assert _state(coord, "b") == (ALIVE, "")
            return True

    assert any(asyncio.run(main()) for _ in range(3)), \
        "B's connection did not get the fd of A's in 3 tries: the race was not set up"


def test_the_close_of_a_connection_an_id_left_for_a_new_incarnation_probes_nobody():
    # 'a' left on A1 and its next incarnation joined on A2; when A1 closed, its fd still
    # mapped to 'a', whose record the probe then found on A2: the live member was suspected
    async def main() -> None:
        async with _coordinator() as coord, Clients(coord) as cl:
            cl.open("A1")
            fd = await cl.join("A1", "a", inc=1)
            await cl.ask("A1", "leave", "a", "bye", inc=1)
            cl.open("A2")
            await cl.join("A2", "a", inc=2)
            link = _link(fd)
            cl.close("A1")
            await cl.read_by_coordinator(fd, link)
            assert _state(coord, "a") == (ALIVE, "")
            assert coord.table.get("a").incarnation == 2

    asyncio.run(main())


def test_the_close_of_a_connection_an_id_heartbeats_no_longer_on_probes_nobody():
    # 'm' joined on M1 and then heartbeated on M2 (the peer reconnected): M2's fd was mapped
    # too, M1's was not forgotten, and M1's close had the member, alive on M2, suspected
    async def main() -> None:
        async with _coordinator() as coord, Clients(coord) as cl:
            cl.open("M1")
            fd = await cl.join("M1", "m")
            cl.open("M2")
            cl.send("M2", "heartbeat", "m", inc=1)
            await cl.ask("M2", "status", "m", "status_reply")   # the heartbeat is read
            link = _link(fd)
            cl.close("M1")
            await cl.read_by_coordinator(fd, link)
            assert _state(coord, "m") == (ALIVE, "")

    asyncio.run(main())


def test_the_close_of_the_connection_a_probe_was_answered_on_probes_the_member():
    # a probe_ack from another connection moved the member's route there without mapping
    # that connection's fd: its close probed nobody, and the member, gone, stayed alive
    # until its heartbeat timeout
    async def main() -> None:
        async with _coordinator() as coord, Clients(coord) as cl:
            cl.open("M1")
            await cl.join("M1", "m")
            cl.open("S")
            await cl.join("S", "s")
            cl.send("S", "suspect", "s", id="m")
            probe = await cl.expect("M1", "probe")
            cl.open("M2")
            cl.send("M2", "probe_ack", "m", nonce=probe.body["nonce"], inc=1)
            await cl.ask("M2", "status", "m", "status_reply")   # the probe_ack is read
            assert _state(coord, "m") == (ALIVE, "")
            cl.close("M2")
            await until(lambda: _state(coord, "m") == (DEAD, "disconnected"), 5, what="m probed and dead")

    asyncio.run(main())


def test_the_close_of_a_connection_many_ids_joined_on_probes_them_all():
    # one connection joined x1, x2 and x3 (ids that share a connection are supported): fd
    # mapped to the last only, and its close probed x3; x1 and x2 stayed alive until their
    # heartbeat timeout
    async def main() -> None:
        async with _coordinator() as coord, Clients(coord) as cl:
            cl.open("X")
            for pid in ("x1", "x2", "x3"):
                await cl.join("X", pid)
            cl.close("X")
            for pid in ("x1", "x2", "x3"):
                await until(lambda: _state(coord, pid) == (DEAD, "disconnected"), 5, what=f"{pid} probed and dead")

    asyncio.run(main())


def test_a_connection_that_joins_and_leaves_id_after_id_keeps_no_entry_for_those_gone():
    # with every id of a connection kept for its close, one that stays open and joins and
    # leaves id after id would grow its entry without end: ids that are dead are dropped
    async def main() -> None:
        async with _coordinator() as coord, Clients(coord) as cl:
            cl.open("Y")
            for pid in ("y1", "y2", "y3"):
                await cl.join("Y", pid)
                await cl.ask("Y", "leave", pid, "bye", inc=1)
            await until(lambda: not coord._fds, 5, what="the entries of the ids that left dropped")

    asyncio.run(main())
