"""What a peer makes of handlers that cannot work: one that is not callable, and a
type that cannot be registered."""

from __future__ import annotations

import pytest

from swarm import wire
from swarm.errors import ConfigError, WireError
from swarm.peer import Peer


def test_a_handler_that_is_not_callable_is_refused_when_registered():
    """It was taken, and failed on every message of its type, on the peer's loop."""
    p = Peer(coordinators=["tcp://127.0.0.1:1"], id="p")
    with pytest.raises(ConfigError, match="must be callable"):
        p.on("hm.x", 5)
    assert "hm.x" not in p._handlers


def test_a_type_that_cannot_be_registered_is_a_wire_error():
    with pytest.raises(WireError, match="message type"):
        wire.register_type(5)
    with pytest.raises(WireError, match="message type"):
        wire.register_type("")



def test_a_peer_closed_without_starting_ends_its_context():
    """Peer.close() on a peer never started left the zmq context it made (and its I/O
    thread) open: SyncPeer closed from another thread during start() leaked one so. (A
    peer now makes its context in start(): one never started has none to leave.)"""
    import asyncio

    p = Peer(coordinators=["tcp://127.0.0.1:1"], id="p")
    asyncio.run(p.close())
    assert p._ctx is None   # nothing was made, so nothing is left open
    asyncio.run(p.close())   # twice: nothing more


def test_a_join_that_only_standbys_answer_says_so():
    """A peer whose coordinators all answered "standby" (none active: e.g. two that cannot
    talk to each other stay standbys) failed with "no coordinator answered ... is `swarm
    coordinator` running there?"; it names the standbys instead."""
    import asyncio

    from swarm.coordinator import Coordinator
    from swarm.errors import MembershipError

    async def main() -> None:
        # a standby that watches an address where nothing runs, and cannot take over in time
        async with Coordinator(bind="tcp://127.0.0.1:*", others=["tcp://127.0.0.1:1"], takeover_s=60) as c:
            p = Peer(coordinators=[c.address], id="p", join_timeout_s=1.5)
            with pytest.raises(MembershipError, match="answered as standby and none is active"):
                await p.start()
    asyncio.run(main())
