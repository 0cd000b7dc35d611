"""A direct relay's gradients reach a neighbour again soon after the host of its inbox
vanished (no FIN, no reset) and came back at the same endpoint, while the neighbour
stayed in the view: the relay keeps its PUSH to that inbox, and the PUSH drops the
connection that went silent and dials again (ZMTP heartbeats, as on data links). Without
them it wrote on into the dead connection until TCP gave up (about 15 min): every
gradient sent meanwhile was lost, counted as sent until its queue was full.

The neighbour is advertised on 127.0.0.2, where two loopback forwarders stand for its
host: one to its ROUTER, which stays (the view keeps it), and one to its inbox, which
goes silent and whose port then answers no connection (a listener with a full accept
queue; a kernel that refuses them instead serves as well)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import numpy as np
import pytest
import zmq
from swarmtest import Forwarder, free_port, until

from swarm.coordinator import Coordinator
from swarm.gossip import GradientRelay
from swarm.peer import Peer
from swarm.peer import peer as peer_mod

HOST = "127.0.0.2"   # the neighbour's host as the others see it
D = 8
#: how long the inbox's host stays gone: several heartbeat timeouts (0.3 s)
GONE_S = 1.5


@pytest.fixture
def second_loopback():
    """Skip where 127.0.0.2 is not a loopback address of this machine."""
    with socket.socket() as s:
        try:
            s.bind((HOST, 0))
        except OSError as e:
            pytest.skip(f"cannot bind {HOST}: {e}")


def test_outbox_dials_like_a_data_link(monkeypatch):
    # the PUSH gets a data link's heartbeats and connect timeout, from the config and the
    # constant as they are when it is opened
    monkeypatch.setattr(peer_mod, "LINK_CONNECT_TIMEOUT_S", 4.0)
    monkeypatch.setattr(peer_mod, "OUTBOX_TIMEOUT_S", 0.5)   # below link_timeout_s: that wins

    async def main() -> None:
        caddr = f"tcp://127.0.0.1:{free_port()}"
        coord = Coordinator(bind=caddr, http_bind="")
        a = Peer(id="a", coordinators=[caddr], link_heartbeat_s=0.2, link_timeout_s=0.7)
        try:
            await coord.start()
            await a.start()
            s = a.open_outbox("a", f"tcp://127.0.0.1:{free_port()}")
            assert s is not None
            assert (s.getsockopt(zmq.HEARTBEAT_IVL), s.getsockopt(zmq.HEARTBEAT_TIMEOUT),
                    s.getsockopt(zmq.HEARTBEAT_TTL), s.getsockopt(zmq.CONNECT_TIMEOUT)) == (200, 700, 700, 4000)
            a.close_side(s)
        finally:
            await a.close()
            await coord.close()

    asyncio.run(main())


def test_gradients_reach_a_neighbour_again_after_its_inbox_host_came_back(second_loopback, monkeypatch):
    # the old connection stayed open and silent: nothing published after the inbox's
    # host vanished arrived (none 10 s, nor 15 s, after it was back, measured)
    monkeypatch.setattr(peer_mod, "OUTBOX_TIMEOUT_S", 0.5)   # 10 s in use: the same, sooner
    caddr = f"tcp://127.0.0.1:{free_port()}"
    router_port, inbox_port = free_port(), free_port()
    to_router, to_inbox = Forwarder((HOST, router_port), ("127.0.0.1", router_port)), Forwarder((HOST, inbox_port), ("127.0.0.1", inbox_port))
    phase = {"now": "before"}
    published: dict[int, str] = {}    # gradient number -> the phase it was published in
    arrived: dict[int, float] = {}    # gradient number -> when it came
    stop = threading.Event()
    failed: list[BaseException] = []
    relays: list[GradientRelay] = []

    def consumer() -> None:
        """Both relays' consumer thread: a publishes every 20 ms, b takes in."""
        ra, rb = relays
        try:
            while not stop.is_set():
                k = len(published) + 1
                published[k] = phase["now"]
                ra.publish(np.full(D, k, np.float32))
                for g in rb.take():
                    arrived.setdefault(int(g[0]), time.monotonic())
                time.sleep(0.02)
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            failed.append(e)
        finally:
            ra.close()
            rb.close()

    def came(ph: str) -> list[int]:
        return [k for k in list(arrived) if published[k] == ph]

    async def main() -> None:
        coord = Coordinator(bind=caddr, http_bind="")
        a = Peer(id="a", coordinators=[caddr])
        b = Peer(id="b", coordinators=[caddr], bind=f"tcp://127.0.0.1:{router_port}",
                 advertise=f"tcp://{HOST}:{router_port}", inbox_port=inbox_port)
        peers = [a, b]
        thread: threading.Thread | None = None
        try:
            await coord.start()
            await to_router.up()
            await to_inbox.up()
            for p in peers:
                await p.start()
            await a.wait_view(lambda v: v.member("b") is not None)
            await b.wait_view(lambda v: v.member("a") is not None)
            ra, rb = GradientRelay(a, D, direct=True), GradientRelay(b, D, direct=True)
            relays.extend([ra, rb])
            await until(lambda: ra.ready(0) and rb.ready(0), 10, what="the relays knowing each other's inbox")
            assert ra._endpoints["b"] == f"tcp://{HOST}:{inbox_port}"   # through the forwarder
            thread = threading.Thread(target=consumer, name="relay-consumer")
            thread.start()
            await until(lambda: came("before") or failed, 5, what="a's gradients reaching b")
            outbox = ra._outboxes["b"][1]
            to_inbox.vanish()
            phase["now"] = "gone"
            await asyncio.sleep(GONE_S)
            await to_inbox.up()   # back, at the same endpoint
            phase["now"] = "back"
            # a generous deadline, far above a heartbeat timeout and the next dial
            await until(lambda: came("back") or failed, 8, what="gradients published after the return reaching b")
            # b stayed a neighbour, and the relay kept its PUSH: the PUSH itself dialled again
            assert a.view.member("b") is not None and ra._outboxes["b"][1] is outbox
            stop.set()
            await asyncio.to_thread(thread.join, 10)
            assert not failed and not thread.is_alive(), failed
            # what it had queued, not yet written out, waited for the new connection
            assert came("gone"), "none of the gradients published while b's inbox was gone arrived"
            s = ra.stats
            # each gradient is counted once: sent (queued on the PUSH) or dropped (its queue full)
            assert s.published == s.sent + s.dropped and s.dropped > 0, s
            assert rb.stats.received <= s.sent
        finally:
            stop.set()
            if thread is not None:
                await asyncio.to_thread(thread.join, 10)
            for p in peers:
                await p.close()
            await coord.close()
            to_router.close()
            to_inbox.close()

    try:
        asyncio.run(main())
    finally:
        to_inbox.close()   # where the loop failed before closing them
        to_router.close()
    assert not failed, failed


def test_a_receiver_that_stops_reading_for_a_while_loses_nothing_it_was_sent():
    """The outbox's heartbeat timeout is not the data links' 300 ms: a receiver whose
    inbox queue is full reads nothing and answers no ping, and a cut connection lost the
    gradients already written into it (counted sent). A 2 s stall now loses none."""
    async def main() -> None:
        caddr = f"tcp://127.0.0.1:{free_port()}"
        coord = Coordinator(bind=caddr, http_bind="")
        a = Peer(id="a", coordinators=[caddr])
        ctx = zmq.Context()
        inbox = ctx.socket(zmq.PULL)   # a busy receiver's inbox: a small queue, filled at once
        inbox.setsockopt(zmq.LINGER, 0)
        inbox.setsockopt(zmq.RCVHWM, 20)
        port = inbox.bind_to_random_port("tcp://127.0.0.1")
        s = None
        try:
            await coord.start()
            await a.start()
            s = a.open_outbox("a", f"tcp://127.0.0.1:{port}")
            assert s is not None
            await asyncio.sleep(0.3)   # connected
            mon = s.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            payload = b"x" * 4096
            accepted = 0
            t0 = time.monotonic()
            while time.monotonic() - t0 < 2.0:   # the receiver reads nothing for 2 s
                try:
                    s.send_multipart([str(accepted).encode(), payload], zmq.NOBLOCK)
                    accepted += 1
                except zmq.Again:
                    pass   # the queue is full: not accepted, as the relay counts a drop
                await asyncio.sleep(0.002)
            got = set()
            deadline = time.monotonic() + 10
            while len(got) < accepted and time.monotonic() < deadline:
                if inbox.poll(100):
                    got.add(int(inbox.recv_multipart()[0]))
            cuts = 0
            while mon.poll(0):
                mon.recv_multipart()
                cuts += 1
            s.disable_monitor()
            mon.close(0)
            assert accepted > 20 and len(got) == accepted, (accepted, len(got), cuts)
            assert cuts == 0
        finally:
            if s is not None:
                a.close_side(s)
            inbox.close(0)
            ctx.term()
            await a.close()
            await coord.close()

    asyncio.run(main())
