"""The receive loop polls without a timeout: a link opened outside it must wake it."""

from __future__ import annotations

import asyncio

from swarmtest import free_port, status, wait_for

from swarm.peer import Peer


def test_link_opened_by_send_wakes_the_receive_loop(procs):
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs.start("coordinator", "--bind", addr, name="coord")
    wait_for(lambda: status(addr), 10, what="coordinator up")

    async def main() -> None:
        # a ring of 4: each peer has one member that is not its neighbour
        peers = [Peer(id=f"p{i}", coordinators=[addr], topology="ring", join_timeout_s=10) for i in range(4)]
        got: list[str] = []
        for p in peers:
            p.on("note", lambda m: got.append(m.src))
        await asyncio.gather(*(p.start() for p in peers))
        try:
            await asyncio.gather(*(p.wait_view(lambda v: len(v.members) == 4, timeout=10) for p in peers))
            await asyncio.gather(*(p.wait_linked() for p in peers))
            # links outlive the views that made them, so take a pair without one
            # (the last peer to join has links to its two neighbours only)
            a, far = next((a, b) for a in peers for b in peers if b is not a and b.id not in a._links)
            await asyncio.sleep(0.2)        # every loop is idle, waiting in its poll
            assert await a.send(far.id, "note", timeout=1.0)
            # the new link's monitor is polled at once, not at the next message
            async with asyncio.timeout(1.0):
                while a._poll_dirty:
                    await asyncio.sleep(0.01)
            async with asyncio.timeout(2.0):
                while got != [a.id]:
                    await asyncio.sleep(0.01)
        finally:
            await asyncio.gather(*(p.close() for p in peers))

    asyncio.run(main())
