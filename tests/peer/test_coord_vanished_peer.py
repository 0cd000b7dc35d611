"""A peer whose coordinator's host vanished without a TCP reset (powered off, a cable
pulled, a firewall that drops) reaches the coordinator soon after it is back there:
its dial is not left to the OS, which sends an unanswered SYN again ever further apart
(16 s, then 32 s, then it gives up, about 127 s in).

The vanished host is a loopback listener whose accept queue is full: the kernel drops
further SYNs unanswered, as for a host that is gone (no root needed)."""

from __future__ import annotations

import asyncio
import socket

from swarmtest import answered, free_port, until, vanish

from swarm.coordinator import Coordinator, server
from swarm.peer import Peer
from swarm.peer import peer as peer_mod


#: how long the host stays gone: past the OS's SYN at about 15 s (19 s where its first
#: retries are 1 s apart), and at least 8 s before its next one (31 s, or 35 s)
GONE_S = 21.0


def test_the_peer_dials_the_coordinator_as_the_coordinator_dials_the_others():
    # the same timeout for the same wait; the peer does not import the coordinator's module
    assert peer_mod.COORD_CONNECT_TIMEOUT_S == server.CONNECT_TIMEOUT_S


def test_a_peer_reaches_its_coordinator_soon_after_it_is_back_on_a_host_that_vanished(syns_dropped_when_full):
    # the peer's dial waited for the OS's next SYN, which came 10 to 64 s after the
    # coordinator was back (about 127 s after the host vanished, the OS gave up at last)
    port = free_port()
    addr = f"tcp://127.0.0.1:{port}"
    held: list[socket.socket] = []

    async def main() -> None:
        live = [Coordinator(bind=addr, http_bind="", rejoin_grace_s=0.2)]
        peer = Peer(id="p", coordinators=[addr])
        try:
            await live[0].start()
            await peer.start()
            e0 = peer.epoch
            await live.pop().close()
            held.extend(vanish(("127.0.0.1", port)))
            assert not answered(("127.0.0.1", port), 0.5), "a connection to the vanished host was answered"
            await asyncio.sleep(GONE_S - 0.5)
            # back: the coordinator restarts there
            while held:
                held.pop().close()
            live.append(Coordinator(bind=addr, http_bind="", rejoin_grace_s=0.2))
            await live[0].start()
            # a generous deadline, far above the time to the peer's next dial (4 s at most)
            await until(lambda: live[0].table.get("p") is not None, 8, what="the peer rejoining the coordinator")
            await peer.wait_view(lambda v: v.epoch > e0 and v.member("p") is not None, timeout=8)
            assert peer.state.value == "running"
        finally:
            await peer.close()
            for c in live:
                await c.close()

    try:
        asyncio.run(main())
    finally:
        for s in held:
            s.close()
