"""Links follow the view: after each change a peer is linked to exactly the
neighbours its topology gives it, and closes the links it no longer needs."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest
from swarmtest import linked_pair, until

from swarm.coordinator import Coordinator
from swarm.gossip import topology as topo
from swarm.peer import Peer


async def _start(addr: str, ids: list[str], topology: str) -> list[Peer]:
    peers = [Peer(id=i, rank=int(i[1:]), coordinators=[addr], topology=topology, join_timeout_s=20) for i in ids]
    await asyncio.gather(*(p.start() for p in peers))
    return peers


async def _linked_as_topology(peers: list[Peer], topology: str, timeout: float = 20.0) -> None:
    """Wait until every peer holds the same view of len(peers) members, has computed
    its neighbours from it, and has open links to those neighbours and no others."""

    def ok() -> bool:
        view = peers[0].view
        if len(view.members) != len(peers) or any(p.view.epoch != view.epoch for p in peers):
            return False
        for p in peers:
            want = {view.members[j].id for j in topo.neighbours(topology, len(peers), view.index(p.id))}
            if set(p.neighbours()) != want or set(p._links) != want:
                return False
        return True

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not ok():
        if loop.time() > deadline:
            got = {p.id: (sorted(p.neighbours()), sorted(p._links)) for p in peers}
            raise AssertionError(f"links did not follow the {topology} view within {timeout} s: "
                                 f"(neighbours, links) = {got}")
        await asyncio.sleep(0.05)
    await asyncio.gather(*(p.wait_linked(timeout) for p in peers))


@pytest.mark.parametrize("topology, sizes", [("ring", [4, 5, 3]), ("grid", [4, 5, 3])])
def test_links_follow_the_view_as_peers_join_and_leave(topology, sizes):
    # A late joiner takes the highest rank: on a ring it comes between the last and
    # the first peer; a grid of 4 has 2 columns, one of 5 has 3 and one of 3 has 2
    # again. So peers that stay lose neighbours they are still in the view with.
    async def main() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*") as coord:
            peers: list[Peer] = []
            try:
                for n in sizes:
                    if n > len(peers):
                        peers += await _start(coord.address, [f"p{i}" for i in range(len(peers), n)], topology)
                    while len(peers) > n:
                        await peers.pop().close()
                    await _linked_as_topology(peers, topology)
            finally:
                for p in peers:
                    with contextlib.suppress(Exception):
                        await p.close()

    asyncio.run(main())


def test_a_link_opened_to_a_non_neighbour_carries_its_message_then_closes():
    async def main() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*") as coord:
            peers = await _start(coord.address, ["p0", "p1", "p2", "p3"], "ring")
            try:
                await _linked_as_topology(peers, "ring")
                got: list[dict] = []
                peers[2].on("note", lambda m: got.append(m.body))
                assert "p2" not in peers[0].neighbours()
                assert await peers[0].send("p2", "note", {"x": 1}, timeout=5)
                arrived = asyncio.Event()
                peers[2].on("note", lambda m: arrived.set())
                await asyncio.wait_for(arrived.wait(), 10)
                assert got == [{"x": 1}]
                await _linked_as_topology(peers, "ring")   # the spare link goes once idle
            finally:
                for p in peers:
                    with contextlib.suppress(Exception):
                        await p.close()

    asyncio.run(main())


def test_each_side_counts_out_what_the_other_counts_in():
    # hello went out uncounted (msgs_out, bytes_out) while the receiver counted it in
    # msgs_in: a quiet pair of peers never agreed on how many messages had passed
    async def main():
        async with linked_pair() as (a, b):
            b.on("x", lambda msg: None)
            await a.send("b", "x", {"n": 1}, timeout=5)

            def agreed() -> bool:
                ca, cb = a.counters, b.counters
                return (ca.msgs_out, ca.bytes_out, cb.msgs_out, cb.bytes_out) == \
                    (cb.msgs_in, cb.bytes_in, ca.msgs_in, ca.bytes_in)
            await until(agreed, what="both sides' counts agreeing")
            assert a.counters.msgs_out >= 2   # a hello and the message

    asyncio.run(main())


def test_a_message_of_more_frames_than_drain_keeps_by_default_arrives_within_larger_limits():
    # drain keeps KEEP_FRAMES (1,024) frames of a message by default (a flood of empty
    # frames cost a Python object each); a peer whose own limits allow more arrays has
    # the frames they allow kept, and its message of 1,100 arrays arrives whole
    from swarm.wire import Limits

    async def main():
        got: list[int] = []
        async with linked_pair(limits=Limits(max_frames=2000)) as (a, b):
            b.on("many", lambda msg: got.append(len(msg.arrays)))
            assert await a.send("b", "many", {}, [np.full(2, i, np.float32) for i in range(1100)], timeout=5)
            await until(lambda: got, what="the message")
            assert got == [1100] and b.counters.malformed == 0

    asyncio.run(main())
