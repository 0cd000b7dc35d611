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

