"""A newcomer's bootstrap over a slow link asks each donor for its slice once, and
waits for it while the replies say it may still be on the way (review 43, rv2 #3).

It asked the next donor for the same slice after half the time left, then a quarter,
down to every 0.2 s, while the first donor's reply was still arriving: over a 5 Mbit/s
link a 4.24 MB model failed after 5 s ("no neighbour sent values"), and 26 MB of
duplicate slices reached that host over the next 50 s. Here the newcomer's inbound
link is a proxy that carries a few hundred kB a second; the bytes it carried are
counted."""

from __future__ import annotations

import asyncio
import contextlib
import time

import numpy as np
import pytest
import zmq.asyncio
from swarmtest import Forwarder, free_port, until

from swarm.coordinator import Coordinator
from swarm.errors import GossipError
from swarm.gossip import Gossip
from swarm.gossip.sim import SimHub
from swarm.peer import Peer

pytestmark = pytest.mark.timeout(120)

#: the newcomer's inbound link, bytes a second
RATE = 500_000
#: the model: 2.25 MB, 4.5 s at RATE, more than half of TIMEOUT (when the
#: engine asked the next donors for the same slices) and well within it
D = 562_500
TIMEOUT = 8.0


class Throttle(Forwarder):
    """Forwards ``listen`` to ``target``, carrying at most ``rate`` bytes a second towards
    ``target`` over all its connections together, and counting them; the other way is
    not limited."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int], rate: float) -> None:
        super().__init__(listen, target)
        self.rate = rate
        self.carried = 0                       # bytes passed on towards target
        self._free = 0.0                       # when the link is free for the next chunk

    def _carry(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, towards_target: bool) -> list[asyncio.Task]:
        return [asyncio.create_task(self._limited(r, w) if towards_target else self._pump(r, w))]

    async def _limited(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await r.read(16384):
                now = time.monotonic()
                self._free = max(self._free, now) + len(data) / self.rate   # one link, shared
                await asyncio.sleep(self._free - now)
                self.carried += len(data)
                w.write(data)
                await w.drain()
            w.close()

    async def settle(self, most: int) -> None:
        """Return once ``most`` bytes have gone towards target, or under 10 kB in a second
        (ZMTP heartbeats, no slices)."""
        while self.carried <= most:
            before = self.carried
            await asyncio.sleep(1.0)
            if self.carried - before < 10_000:
                return


def test_a_bootstrap_over_a_slow_link_asks_each_slice_once():
    port, proxy_port = free_port(), free_port()
    throttle = Throttle(("127.0.0.1", proxy_port), ("127.0.0.1", port), RATE)

    async def main() -> tuple[object, int, int, np.ndarray, list[np.ndarray]]:
        ctx = zmq.asyncio.Context(io_threads=1)
        peers: list[Peer] = []
        try:
            await throttle.up()
            async with Coordinator(bind="tcp://127.0.0.1:*", http_bind="", context=ctx) as coord:
                # ZMTP heartbeats wait behind the slices on the slow link: raised as
                # docs/wire.md advises for large messages
                kw = dict(coordinators=[coord.address], topology="ring", link_timeout_s=10.0, context=ctx)
                donors = [Peer(id=f"d{i}", rank=i, **kw) for i in range(3)]
                # donors reach the newcomer through the proxy only
                newcomer = Peer(id="n", rank=3, bind=f"tcp://127.0.0.1:{port}",
                                advertise=f"tcp://127.0.0.1:{proxy_port}", **kw)
                peers += [*donors, newcomer]
                xs = [np.full(D, i + 1, np.float32) for i in range(3)]
                engines = [Gossip(p, x, topology="ring", codec="identity") for p, x in zip(donors, xs)]
                x = np.zeros(D, np.float32)
                g = Gossip(newcomer, x, topology="ring", codec="identity")
                for p in peers:
                    await p.start()
                for p in peers:
                    await p.wait_view(lambda v: len(v.members) == 4, timeout=20)
                    await p.wait_linked(timeout=20)
                try:
                    outcome: object = await g.bootstrap(donors=3, timeout=TIMEOUT)
                except GossipError as e:
                    outcome = e
                await throttle.settle(2 * 4 * D)   # what the donors were asked for still arrives
                served = sum(e.stats.boot_served for e in engines)
                return outcome, served, throttle.carried, x, xs
        finally:
            for p in peers:
                await p.close()
            throttle.close()
            ctx.term()

    try:
        outcome, served, carried, x, xs = asyncio.run(main())
    finally:
        throttle.close()   # where the loop failed before closing it (closing twice is fine)
    model = 4 * D
    assert carried < 1.25 * model, (f"the slow link carried {carried / 1e6:.2f} MB for a {model / 1e6:.2f} MB "
                                    f"model; {served} slices served; bootstrap: {outcome!r}")
    assert served == 3, served
    assert isinstance(outcome, list) and sorted(outcome) == ["d0", "d1", "d2"], outcome
    # each slice holds its donor's values, none of a late duplicate
    bounds = np.linspace(0, D, 4).astype(int)
    for i, donor in enumerate(outcome):
        assert (x[bounds[i]:bounds[i + 1]] == xs[int(donor[1:])][0]).all(), (i, donor)


def _asker_and_donors() -> tuple[SimHub, dict, np.ndarray, Gossip, str, str, Gossip]:
    """A ring a, b, c on a SimHub: a's engine (x zeros) about to bootstrap one slice, the
    donor it asks first (with no engine: its requests go where the test says), and the
    other, whose engine holds fives. Call it inside the loop."""
    hub = SimHub(topology="ring")
    links = dict(zip(["a", "b", "c"], hub.add_many(["a", "b", "c"])))
    x = np.zeros(100, np.float32)
    g = Gossip(links["a"], x, topology="ring", codec="identity")
    first = g._positions(0)[1][0]                  # the donor the one slice is asked of first
    other = next(i for i in ("b", "c") if i != first)
    donor = Gossip(links[other], np.full(100, 5, np.float32), topology="ring", codec="identity")
    return hub, links, x, g, first, other, donor


def test_a_donor_that_leaves_the_view_is_replaced_at_once():
    # A donor that took the request is now waited for while nothing says its slice is
    # lost; one that leaves the view meanwhile is not waited for (the slice is asked of
    # the next donor at once), whatever time is left.
    async def main():
        hub, links, x, g, first, other, _ = _asker_and_donors()
        asked = []
        links[first].on("gsp_boot_req", asked.append)   # never answers
        task = asyncio.ensure_future(g.bootstrap(donors=1, timeout=600.0))
        try:
            await until(lambda: asked, what=f"{first} asked")
            hub.remove(first)
            donors = await asyncio.wait_for(task, 60)   # it waited for half the 600 s
        finally:
            task.cancel()
            await hub.close()
        return donors, other, x
    donors, other, x = asyncio.run(main())
    assert donors == [other] and (x == 5).all()


def test_donors_that_drop_the_request_are_replaced_after_the_ack_wait():
    # A donor drops a request silently while its view does not list the asker yet (a
    # short, normal window after a view change). With no slice arrived, each slice
    # waited for its first donor up to the deadline: bootstrap(donors=2, timeout=5)
    # whose two first donors both had not seen the asker yet failed at 5 s. Donors that
    # take a request say so (gsp_boot_ok); one that does not is asked no longer.
    async def main():
        loop = asyncio.get_running_loop()
        hub = SimHub(topology="ring")
        ids = ["b", "c"]
        links = hub.add_many(ids)
        xs = {i: np.full(100, v, np.float32) for i, v in zip(ids, (1, 2))}
        engines = {i: Gossip(link, xs[i], topology="ring", codec="identity") for i, link in zip(ids, links)}
        held = []   # the donors see the view that adds the asker 0.5 s late
        for link, eng in zip(links, engines.values()):
            link.off_view(eng._on_view)
            link.on_view(lambda v, eng=eng: held.append(loop.call_later(0.5, eng._on_view, v)))
        x = np.zeros(100, np.float32)
        g = Gossip(hub.add("a"), x, topology="ring", codec="identity")
        start = time.monotonic()
        try:
            outcome: object = await g.bootstrap(donors=2, timeout=5.0)
        except GossipError as e:
            outcome = e
        finally:
            took = time.monotonic() - start
            for h in held:
                h.cancel()
            g.close()
            for eng in engines.values():
                eng.close()
            await hub.close()
        return outcome, took, x, xs, engines
    outcome, took, x, xs, engines = asyncio.run(main())
    assert isinstance(outcome, list) and sorted(outcome) == ["b", "c"], outcome
    for eng in engines.values():   # each first donor dropped its request, then served the other slice
        assert eng.stats.ignored_strangers >= 1 and eng.stats.boot_served == 1, eng.stats
    assert (x[:50] == xs[outcome[0]][0]).all() and (x[50:] == xs[outcome[1]][0]).all(), x
    assert took < 5.0, took   # sanity only: it did not wait for the deadline


def test_a_donor_that_runs_no_engine_is_replaced_after_the_ack_wait():
    # A donor that crashed or runs no engine but stays in the view never answers: the
    # slice is asked of the next donor once it has not taken the request.
    async def main():
        hub, links, x, g, first, other, donor = _asker_and_donors()
        asked = []
        links[first].on("gsp_boot_req", asked.append)   # never answers
        try:
            outcome: object = await g.bootstrap(donors=1, timeout=5.0)
        except GossipError as e:
            outcome = e
        finally:
            g.close()
            donor.close()
            await hub.close()
        return outcome, asked, first, other, x
    outcome, asked, first, other, x = asyncio.run(main())
    assert outcome == [other] and (x == 5).all(), outcome
    assert [m.src for m in asked] == ["a"], asked   # the silent donor was asked once


def test_an_ack_from_another_peer_than_the_donor_asked_is_refused():
    # Nonces count up, so anyone could acknowledge a request sent to another: taken for
    # the silent donor's, it would make the slice wait for that donor to the deadline.
    async def main():
        hub, links, x, g, first, other, donor = _asker_and_donors()
        forged = []

        def forge(msg) -> None:   # the first donor stays silent; the other acks in its name
            forged.append(asyncio.ensure_future(links[other].send("a", "gsp_boot_ok", {"nonce": msg.body["nonce"]})))
        links[first].on("gsp_boot_req", forge)
        try:
            outcome: object = await g.bootstrap(donors=1, timeout=5.0)
        except GossipError as e:
            outcome = e
        finally:
            await asyncio.gather(*forged)
            g.close()
            donor.close()
            await hub.close()
        return outcome, other, x, g.stats.rejected_malformed, len(forged)
    outcome, other, x, rejected, forged = asyncio.run(main())
    assert outcome == [other] and (x == 5).all(), outcome
    assert forged == 1 and rejected == 1, (forged, rejected)
