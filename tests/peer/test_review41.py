"""SyncPeer.close() when the peer's loop thread does not end within the close's deadline,
nor in the time the thread is then given."""

from __future__ import annotations

import threading

import pytest
# a coordinator process for in-process peers (tests/ is on the path)
from peer.test_syncpeer import _peer_threads, coordinator  # noqa: F401 - a fixture

from swarm.errors import PeerTimeout
from swarm.peer import PeerState, SyncPeer

#: seconds the blocked loop may stay blocked at most, should the test fail before it
#: releases it (longer than close()'s 5 s for the thread to end)
BLOCK_S = 30.0


def test_close_of_a_peer_whose_loop_is_blocked_says_its_thread_may_still_run(coordinator):
    """Before this test the branch of close() that finds the peer still not closed after
    the 5 s its thread was given to end was never run: its PeerTimeout, and that close()
    then returns, leaving the thread to whoever holds the SyncPeer, were unchecked."""
    p = SyncPeer(coordinators=[coordinator], id="blocked").start()
    thread = p._thread
    blocking, release = threading.Event(), threading.Event()

    def block() -> None:   # a callback that holds the loop thread (a handler stuck in I/O)
        blocking.set()
        release.wait(BLOCK_S)

    try:
        p.call_soon(block)
        assert blocking.wait(10)
        with pytest.raises(PeerTimeout, match=r"SyncPeer.close\(\): the peer did not close within 0.2 s, "
                                              r"nor in the 5 s its thread was then given to end; "
                                              r"that thread may still run"):
            p.close(timeout=0.2)
        assert thread.is_alive() and p.peer.state is not PeerState.CLOSED
    finally:
        release.set()
        thread.join(10)
    # released, the thread closes the peer as it ends
    assert not thread.is_alive()
    assert p.peer.state is PeerState.CLOSED and not _peer_threads()
    p.close()   # again: nothing
