"""Review 45: a member whose connection to the coordinator dropped and came back (a
heartbeat timeout of the ZMTP link on a loaded host, a NAT that forgot the flow).

The coordinator reads the close, probes the member on the route that is gone, and
declares it dead at once. The member's socket connects again within milliseconds, but
it said nothing on the new connection until its next heartbeat: a whole `heartbeat_s`
(here a minute) out of the view, and a peer that had been welcomed but not yet listed
failed its start with "welcomed, but no view that lists it". It now joins again as soon
as the new connection's handshake succeeds.

The coordinator's address is a relay in front of it that the test cuts."""

from __future__ import annotations

import asyncio

from swarmtest import Forwarder, free_port, until

from swarm.coordinator import Coordinator
from swarm.coordinator.table import ALIVE
from swarm.peer import Peer


def test_a_member_whose_coordinator_connection_dropped_is_back_in_the_view_at_once():
    port, relay_port = free_port(), free_port()
    relay = Forwarder(("127.0.0.1", relay_port), ("127.0.0.1", port))

    async def main() -> None:
        # heartbeats a minute apart on both sides: only what the peer does on its
        # reconnection brings it back within the test's wait
        coord = Coordinator(bind=f"tcp://127.0.0.1:{port}", http_bind="", heartbeat_timeout_s=60.0)
        a = Peer(id="a", coordinators=[f"tcp://127.0.0.1:{relay_port}"], heartbeat_s=60.0)
        try:
            await coord.start()
            await relay.up()
            await a.start()
            route = coord.table.get("a").route
            relay.cut()
            # the coordinator read the close: the member is declared dead
            await until(lambda: any(e[1] != "join" for e in coord.table.log if e[2] == "a"), 10,
                        what="the coordinator to read the close")
            await until(lambda: coord.table.get("a").state == ALIVE and coord.table.get("a").route != route
                        and a.view.member("a") is not None, 5, what="the member back in the view")
            m = coord.table.get("a")
            assert (m.state, m.incarnation) == (ALIVE, a.incarnation)
            assert [e[1] for e in coord.table.log if e[2] == "a"] == ["join", "disconnected", "join"]
        finally:
            await a.close()
            await coord.close()
            relay.close()

    asyncio.run(main())
