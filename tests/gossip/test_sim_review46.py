"""A SimLink takes handlers as a Peer does (found by the forty-sixth session's review of docstring examples)."""

import asyncio

import pytest

from swarm.errors import WireError
from swarm.gossip.sim import SimHub


def test_a_sim_link_registers_a_new_message_type_as_a_peer_does():
    # Peer.on("hi", h) registers "hi"; SimLink.on refused it unless some Peer had
    # registered it first in the same process, while a send of it returned True and the
    # message was dropped.
    async def main():
        hub = SimHub(topology="ring")
        a, b = hub.add_many(2)
        got = []
        b.on("hi_review46_sim", got.append)
        assert await a.send(b.id, "hi_review46_sim", {"n": 1})
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return got

    got = asyncio.run(main())
    assert [m.body for m in got] == [{"n": 1}]


def test_a_sim_link_refuses_the_protocol_types_a_peer_handles_itself():
    hub = SimHub(topology="ring")
    (a,) = hub.add_many(1)
    with pytest.raises(WireError, match="swarm protocol type"):
        a.on("hello", lambda m: None)
    assert "hello" not in a._handlers
