"""The coordinator is not on the data path: kill it, peers keep exchanging;
restart it with no saved state, peers re-register and epochs keep increasing."""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio
from swarmtest import free_port, start_ticking_peers, status, tick_neighbours, until, wait_for

from swarm import Coordinator, wire
from swarm.coordinator.server import MAX_LAST_EPOCH
from swarm.peer import Peer


async def _exchange(peers: list[Peer], got: dict[str, int], rounds: int) -> None:
    for _ in range(rounds):
        await tick_neighbours(peers)
        await asyncio.sleep(0.02)


def test_coordinator_restart_keeps_data_path(procs):
    addr = f"tcp://127.0.0.1:{free_port()}"
    coord = procs.coordinator(addr)

    async def main() -> None:
        peers, got = await start_ticking_peers([f"q{i}" for i in range(4)], [addr])
        try:
            epoch_before = max(p.epoch for p in peers)

            coord.kill()
            coord.wait()
            before = dict(got)
            await _exchange(peers, got, 20)
            # every peer kept receiving from its neighbours while the coordinator was down
            assert all(got[k] - before[k] >= 20 for k in got), (before, got)

            coord2 = procs.start("coordinator", "--bind", addr, name="coord2")
            # the fresh coordinator rebuilds the table from re-joins, epochs go on increasing
            await asyncio.gather(*(p.wait_view(lambda v: len(v.members) == 4 and v.epoch > epoch_before,
                                               timeout=15) for p in peers))
            st = await asyncio.to_thread(status, addr)
            assert st["epoch"] > epoch_before
            assert sorted(r["id"] for r in st["members"] if r["state"] == "alive") == [p.id for p in peers]
            # ranks survive the restart: peers re-register with the rank they had
            assert sorted(m[2] for m in st["view"]["members"]) == [0, 1, 2, 3]
            before = dict(got)
            await _exchange(peers, got, 5)
            assert all(got[k] > before[k] for k in got)
            assert coord2.poll() is None
        finally:
            for p in peers:
                await p.close()

    asyncio.run(main())


def test_a_join_with_an_epoch_near_the_wire_limit_changes_nothing():
    # a restarted coordinator continues above the epochs joins report; one at 2**64 - 1
    # made its next view unsendable and the coordinator died of it
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        async with Coordinator(bind="tcp://127.0.0.1:0", http_bind="", rejoin_grace_s=0.0) as coord:
            d = ctx.socket(zmq.DEALER)
            d.setsockopt(zmq.LINGER, 0)
            d.connect(coord.address)
            try:
                for i, last in enumerate((2**64 - 1, MAX_LAST_EPOCH + 1)):
                    await d.send_multipart(wire.encode("join", f"x{i}", body={
                        "addr": "tcp://127.0.0.1:9", "rank": -1, "inc": 1, "last_epoch": last}))
                await until(lambda: coord.malformed == 2, what="both joins refused")
                for _ in range(2):   # and told why
                    refused = wire.decode(await asyncio.wait_for(d.recv_multipart(), 5))
                    assert refused.t == "refuse" and "last_epoch" in refused.body["reason"]
                await asyncio.sleep(0.2)
                assert coord.table.epoch == 0 and not coord.table.members
                # the coordinator still serves: the highest allowed epoch is taken as it is
                await d.send_multipart(wire.encode("join", "ok", body={
                    "addr": "tcp://127.0.0.1:9", "rank": -1, "inc": 1, "last_epoch": MAX_LAST_EPOCH}))
                assert wire.decode(await asyncio.wait_for(d.recv_multipart(), 5)).t == "welcome"
                await until(lambda: coord.table.view.member("ok") is not None, what="ok in the view")
                assert coord.table.epoch == MAX_LAST_EPOCH + 1
            finally:
                d.close(0)
                ctx.term()

    asyncio.run(main())
