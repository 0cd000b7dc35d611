"""A neighbour that stays in the view while its address drops our SYNs for a while (a
firewall or a route between two hosts, a host that vanished and came back before the
view showed it) has our sends again soon after it answers: the link's redial is not
left to the OS, which sends an unanswered SYN again ever further apart (16 s, then
32 s) until it gives up, a minute or two in.

The vanished address is a relay in front of the neighbour's ROUTER: its connections go
silent (no FIN, no reset), and its port becomes a loopback listener whose accept queue
is full, where the kernel drops further SYNs unanswered (no root needed)."""

from __future__ import annotations

import asyncio
import time

from swarmtest import Forwarder, answered, free_port, until

from swarm.coordinator import Coordinator
from swarm.peer import Peer
from swarm.peer import peer as peer_mod


#: how long the address stays gone after the link broke: past the OS's SYN at about 15 s
#: (19 s where its first retries are 1 s apart), and at least 8 s before its next one
#: (31 s, or 35 s)
GONE_S = 21.0


def test_sends_reach_a_neighbour_soon_after_its_address_answers_again(syns_dropped_when_full, monkeypatch):
    # the link's redial waited for the OS's next SYN, 10 to 14 s after the address was back
    # here (up to a minute in general); the peer's sends to it returned False until then
    monkeypatch.setattr(peer_mod, "LINK_CONNECT_TIMEOUT_S", 2.0)   # 10 s in use: the same, sooner
    caddr = f"tcp://127.0.0.1:{free_port()}"
    b_port, relay_port = free_port(), free_port()
    relay = Forwarder(("127.0.0.1", relay_port), ("127.0.0.1", b_port))
    got: list[float] = []

    async def main() -> None:
        coord = Coordinator(bind=caddr, http_bind="")
        a = Peer(id="a", coordinators=[caddr])
        b = Peer(id="b", coordinators=[caddr], bind=f"tcp://127.0.0.1:{b_port}",
                 advertise=f"tcp://127.0.0.1:{relay_port}")
        peers = [a, b]
        sending: asyncio.Task | None = None
        try:
            await coord.start()
            await relay.up()
            for p in peers:
                await p.start()
            await a.wait_view(lambda v: v.member("b") is not None)
            await a.wait_linked()
            b.on("x", lambda m: got.append(time.monotonic()))

            async def send_forever() -> None:
                while True:
                    a.send_nowait("b", "x")
                    await asyncio.sleep(0.05)

            sending = asyncio.create_task(send_forever())
            await until(lambda: got, 5, what="a's sends reaching b")
            link = a._links["b"]
            relay.vanish()
            assert not answered(("127.0.0.1", relay_port), 0.5), "a connection to the vanished address was answered"
            # the link broke (ZMTP timeout): a suspects b, which answers the coordinator's probe
            await until(lambda: a.counters.suspicions, 5, what="a's link to b breaking")
            await asyncio.sleep(GONE_S)
            assert a.view.member("b") is not None and a._links.get("b") is link   # the same link redials
            assert a.counters.dropped_out, "a's sends to b were not refused while b's address was gone"
            got.clear()
            await relay.up()   # back
            # a generous deadline, far above the time to the link's next SYN (2 s at most)
            await until(lambda: got, 8, what="a's sends reaching b again")
        finally:
            if sending is not None:
                sending.cancel()
            for p in peers:
                await p.close()
            await coord.close()
            relay.close()

    try:
        asyncio.run(main())
    finally:
        relay.close()   # where the loop failed before closing it (closing twice is fine)
