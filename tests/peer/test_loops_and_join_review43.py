"""A Peer awaited on another event loop, SyncPeer's default loop failing, and the
join's error across a slow link (review 43).

* A peer started on a background loop (a notebook's, a GUI's) and then awaited from
  ``asyncio.run`` on the main thread was accepted silently: ``send`` used its zmq
  sockets from a second thread, and ``close`` waited out the whole leave wait, as the
  coordinator's confirmation set a future of the caller's loop from the peer's.
* An error inside asyncio's own ``new_event_loop`` (a caller's logging handler that
  raises in asyncio's "Using selector" record) was reported as the ``loop_factory``
  the user never gave failing.
* Across a link whose round trip is longer than the ZMTP heartbeat timeout, the
  coordinator admitted the peer and its connection dropped, again and again, and the
  peer gave up asking whether a coordinator ran there at all.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading

import pytest
import zmq
from swarmtest import SlowLink, free_port

from swarm import Coordinator, Peer, SyncPeer
from swarm.errors import ConfigError, MembershipError, SwarmError
from swarm.peer import PeerState


class LoopThread:
    """An event loop that runs on a thread of its own, as a notebook's or a GUI's does."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def test_a_peers_coroutines_awaited_on_another_loop_raise_and_change_nothing():
    lt = LoopThread()
    coord = a = b = None
    try:
        coord = Coordinator(bind="tcp://127.0.0.1:*", http_bind="")
        lt.run(coord.start())
        a, b = (Peer(id=i, coordinators=[coord.address], join_timeout_s=20) for i in "ab")
        for p in (a, b):
            lt.run(p.start())
        for p in (a, b):
            lt.run(p.wait_view(lambda v: len(v.members) == 2, timeout=20))
            lt.run(p.wait_linked(timeout=20))
        before = a.counters.msgs_out
        for call in (lambda: a.send("b", "tick", {}), lambda: a.wait_view(lambda v: True),
                     a.wait_linked, a.wait_stopped, a.close):
            coro = call()
            with pytest.raises(SwarmError) as e:
                asyncio.run(coro)   # on the main thread: another loop than the peer's
            msg = str(e.value)
            assert "another event loop" in msg and "run_coroutine_threadsafe" in msg and "SyncPeer" in msg, msg
        assert a.state is PeerState.RUNNING and a.counters.msgs_out == before
        # on its own loop all goes on as before
        assert lt.run(a.send("b", "tick", {}, timeout=5))
        lt.run(a.close())
        assert a.state is PeerState.CLOSED
        asyncio.run(a.close())   # a closed peer's close() returns at once from any loop
    finally:
        for p in (b, a):
            if p is not None:
                lt.run(p.close())
        if coord is not None:
            lt.run(coord.close())
        lt.close()


def test_a_peer_whose_loop_was_closed_under_it_closes_from_another_loop():
    # a shutdown path: the peer's loop closed with the peer still running on it (its tasks
    # never run again); closing from the next loop closes its sockets, without the leave
    lt = LoopThread()
    coord = None
    peer_loop = asyncio.new_event_loop()
    peer = None
    try:
        coord = Coordinator(bind="tcp://127.0.0.1:*", http_bind="")
        lt.run(coord.start())
        peer = Peer(id="p", coordinators=[coord.address], join_timeout_s=20)
        peer_loop.run_until_complete(peer.start())
        peer_loop.close()
        asyncio.run(peer.close())
        assert peer.state is PeerState.CLOSED
        assert peer._router is None and not peer._coords
    finally:
        if peer is not None and peer.state is not PeerState.CLOSED and not peer_loop.is_closed():
            peer_loop.run_until_complete(peer.close())
        peer_loop.close()
        if coord is not None:
            lt.run(coord.close())
        lt.close()


class _Raises(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        raise RuntimeError("log shipper down")


# the loop that asyncio left half built says so as it is collected ("no attribute '_ssock'")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_failure_inside_asyncios_own_new_event_loop_is_not_blamed_on_loop_factory():
    asyncio_log = logging.getLogger("asyncio")
    handler, level = _Raises(), asyncio_log.level
    asyncio_log.addHandler(handler)
    asyncio_log.setLevel(logging.DEBUG)   # asyncio logs "Using selector: ..." in new_event_loop
    sp = SyncPeer(coordinators=[f"tcp://127.0.0.1:{free_port()}"])
    try:
        with pytest.raises(RuntimeError, match="log shipper down") as e:
            sp.start()
        assert not isinstance(e.value, ConfigError)
    finally:
        asyncio_log.removeHandler(handler)
        asyncio_log.setLevel(level)
        sp.close()
    assert not sp._thread.is_alive()
    del e
    gc.collect()   # that loop, here rather than in another test
    # a loop_factory the user gave is still named when it fails
    def factory():
        raise RuntimeError("no loop here")

    sp = SyncPeer(coordinators=[f"tcp://127.0.0.1:{free_port()}"], loop_factory=factory)
    try:
        with pytest.raises(ConfigError, match="loop_factory .* failed: no loop here"):
            sp.start()
    finally:
        sp.close()


def test_a_join_across_a_link_longer_than_the_heartbeat_timeout_says_the_connection_dropped():
    # 0.4 s each way: a 0.8 s round trip, past the 0.3 s ZMTP heartbeat timeouts (the
    # peer's link_timeout_s, the coordinator's zmtp_timeout_s), which close each
    # connection before the welcome can come back
    async def main() -> None:
        coord = Coordinator(bind="tcp://127.0.0.1:*", http_bind="")
        await coord.start()
        link = SlowLink(coord.address, delay_s=0.4)
        peer = None
        try:
            via = await link.start()
            peer = Peer(id="far", coordinators=[via])
            with pytest.raises(MembershipError) as e:
                await peer.start()
            msg = str(e.value)
            assert f"{via} was reached (" in msg and "but the connection dropped" in msg, msg
            assert "peer.link_timeout_s = 0.3 s" in msg and "Long round trips" in msg, msg
            assert "running there" not in msg, msg
            # and what it says to do lets the peer in
            await coord.close()
            coord = Coordinator(bind=coord.address, http_bind="", zmtp_timeout_s=3.0)
            await coord.start()
            peer = Peer(id="far", coordinators=[via], link_timeout_s=3.0, join_timeout_s=20)
            await peer.start()
            assert peer.state is PeerState.RUNNING
        finally:
            if peer is not None:
                await peer.close()
            link.close()
            await coord.close()

    asyncio.run(main())


def test_a_join_to_a_coordinator_reached_that_never_answers_says_so():
    # a ROUTER that nobody reads: libzmq makes the handshake and answers the heartbeats
    async def main() -> None:
        ctx = zmq.Context()
        silent = ctx.socket(zmq.ROUTER)
        silent.setsockopt(zmq.LINGER, 0)
        peer = None
        try:
            port = silent.bind_to_random_port("tcp://127.0.0.1")
            addr = f"tcp://127.0.0.1:{port}"
            peer = Peer(id="p", coordinators=[addr], join_timeout_s=1.0)
            with pytest.raises(MembershipError) as e:
                await peer.start()
            msg = str(e.value)
            assert f"{addr} was reached but did not answer in time" in msg and "dropped" not in msg, msg
        finally:
            if peer is not None:
                await peer.close()
            silent.close(0)
            ctx.term()

    asyncio.run(main())
