"""A peer's bookkeeping stays bounded in a long run: neighbours that come and go
under new ids (a restarted process gets one) and senders of varied junk leave no
entry per id or per message behind."""

from __future__ import annotations

import asyncio
import contextlib

import msgpack
import numpy as np
import zmq
import zmq.asyncio

from swarm import transport as tp
from swarm import wire
from swarm.coordinator import Coordinator
from swarm.gossip import Gossip
from swarm.peer import Peer


def test_neighbours_that_come_and_go_under_new_ids_leave_no_entries_behind():
    # Each cycle a neighbour joins under a new id, gossips, stalls (the others' round
    # waits for it in vain, so the engine stops waiting for it) and crashes (its links
    # break, so the peers suspect it). Per-id bookkeeping of the stable peers must
    # follow the view, not grow by one entry per id ever seen.
    cycles, d = 6, 64

    async def main() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*") as coord:
            stable = [Peer(id=f"s{i}", rank=i, coordinators=[coord.address]) for i in range(2)]
            churner = None
            try:
                await asyncio.gather(*(p.start() for p in stable))
                gs = [Gossip(p, np.full(d, i, np.float32), topology="ring", round_timeout=0.2)
                      for i, p in enumerate(stable)]
                stalled = 0
                for k in range(cycles):
                    churner = Peer(id=f"churn-{k}", rank=2, coordinators=[coord.address])
                    await churner.start()
                    await stable[0].wait_view(lambda v: len(v.members) == 3, 10)
                    gc = Gossip(churner, np.zeros(d, np.float32), topology="ring", round_timeout=0.2)
                    for _ in range(2):
                        await asyncio.gather(*(g.round() for g in gs + [gc]))
                    await asyncio.gather(*(g.round() for g in gs))   # it stalls
                    stalled += all(churner.id in g._late for g in gs)
                    await churner._abort()                           # a crash: no leave
                    churner = None
                    await stable[0].wait_view(lambda v: len(v.members) == 2, 10)
                    await stable[1].wait_view(lambda v: len(v.members) == 2, 10)
                # the scenario did what it should, in most cycles
                assert stalled >= cycles // 2
                assert sum(p.counters.suspicions for p in stable) >= cycles // 2
                for p, g in zip(stable, gs):
                    members = set(p.view.ids)
                    assert set(p._last_suspect) <= members, p._last_suspect
                    assert g._late <= members, g._late
            finally:
                if churner is not None:
                    await churner._abort()
                for p in stable:
                    with contextlib.suppress(Exception):
                        await p.close()

    asyncio.run(main())


def _junk(i: int) -> list[bytes]:
    """A well-formed header of a type nobody registered, a new one each time."""
    return [msgpack.packb({"v": wire.VERSION, "t": f"no-such-type-{i}", "src": "evil", "epoch": 0, "seq": 0,
                           "body": {}, "arrays": []})]


def test_junk_that_varies_is_counted_in_bounded_space():
    # The error message of each of these names its type: counted by reason, each
    # would be an entry of its own in the peer's and the coordinator's counts.
    n = 3 * tp.MAX_REASONS

    async def main() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*") as coord:
            async with Peer(id="a", coordinators=[coord.address]) as a:
                ctx = zmq.asyncio.Context()
                socks = []
                try:
                    for addr in (coord.address, a.address):
                        s = ctx.socket(zmq.DEALER)
                        s.setsockopt(zmq.LINGER, 0)
                        s.connect(addr)
                        socks.append(s)
                    for i in range(n):
                        for s in socks:
                            await s.send_multipart(_junk(i))
                    async with asyncio.timeout(10):
                        while coord.malformed < n or a.counters.malformed < n:
                            await asyncio.sleep(0.01)
                finally:
                    for s in socks:
                        s.close(0)
                    ctx.term()
                for bad in (coord._bad, a._bad):
                    assert bad.count == n
                    assert len(bad.by_reason) <= tp.MAX_REASONS
                    assert sum(bad.by_reason.values()) == n        # every one counted
                    assert bad.by_reason[tp.OTHER_REASONS] == n - (tp.MAX_REASONS - 1)
                    assert bad.by_reason["unknown message type 'no-such-type-0'"] == 1

    asyncio.run(main())
