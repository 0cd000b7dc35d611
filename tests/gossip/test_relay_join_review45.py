"""Review 45: on a ring, a member that joined while a gradient was on its way made an old
member miss it, silently and for good. p001's copy going left (p001 → p000 → p004) was
passed by p000 to its new left neighbour p005 with the hops left of the old ring, which
ran out there: p004 never had it (nothing counted the loss), and its copy differed from
the others' from then on. A view that a member joined now sends the last turn again along
the new routes, as one that a member left does; the peers that have it drop the copy by
its number."""

from __future__ import annotations

import asyncio

import numpy as np

from swarm.gossip import GradientRelay
from swarm.gossip.sim import SimHub

D = 8


def test_a_gradient_on_its_way_when_a_member_joins_reaches_every_old_member():
    async def main() -> None:
        hub = SimHub(topology="ring")
        links = hub.add_many(5)
        relays = [GradientRelay(link, D, topology="ring") for link in links]
        g = np.zeros(D, np.float32)
        g[1] = 1.0
        relays[1].publish(g, clock=1)   # its copies go right (p002, p003) and left (p000, p004)
        (new,) = hub.add_many(1)        # p005 joins between p000 and p004 before they are delivered
        relays.append(GradientRelay(new, D, topology="ring"))
        for _ in range(20):
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        took = {i: [int(np.argmax(x)) for x in r.take()] for i, r in enumerate(relays) if i != 1}
        assert took == {0: [1], 2: [1], 3: [1], 4: [1], 5: [1]}, took   # p004 took [] before
        assert relays[1].stats.resent == 1
        assert all(r.stats.duplicates <= 1 for r in relays)
        await hub.close()

    asyncio.run(main())


def test_a_join_between_a_death_and_its_view_leaves_the_leaves_resend_whole():
    # 6-ring; p003 has died but is still in the view (it drops what it gets). p001's copy
    # going right dies in it; p006 joins, and the join's resend dies there too; then the
    # view drops p003. The leave's resend reached p002, which had passed on the join's
    # resend (its first copy sent again) and so dropped this one as a copy: p004 never
    # had the gradient, and nothing counted it. Each resend's first copy is passed on now.
    async def main() -> None:
        hub = SimHub(topology="ring")
        links = hub.add_many(6)
        relays = {link.id: GradientRelay(link, D, topology="ring") for link in links}
        hub.links["p003"]._handlers.clear()
        g = np.zeros(D, np.float32)
        g[1] = 1.0
        relays["p001"].publish(g, clock=1)
        await asyncio.sleep(0.05)
        (new,) = hub.add_many(1)
        relays[new.id] = GradientRelay(new, D, topology="ring")
        await asyncio.sleep(0.05)
        hub.remove("p003")
        await asyncio.sleep(0.1)
        took = {pid: len(r.take()) for pid, r in relays.items() if pid not in ("p001", "p003")}
        # p006 joined after the turn: it passes the copies on without applying them
        assert took == {"p000": 1, "p002": 1, "p004": 1, "p005": 1, "p006": 0}, took
        assert relays["p001"].stats.resent == 2
        await hub.close()

    asyncio.run(main())
