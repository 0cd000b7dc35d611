"""The coordinator is not on the data path: kill it, peers keep exchanging;
restart it with no saved state, peers re-register and epochs keep increasing."""

from __future__ import annotations

import asyncio
import time

from swarmtest import free_port, start_ticking_peers, status, tick_neighbours, wait_for

from swarm.peer import Peer


async def _exchange(peers: list[Peer], got: dict[str, int], rounds: int) -> None:
    for _ in range(rounds):
        await tick_neighbours(peers)
        await asyncio.sleep(0.02)


def test_coordinator_restart_keeps_data_path(procs):
    addr = f"tcp://127.0.0.1:{free_port()}"
    coord = procs.start("coordinator", "--bind", addr, name="coord")

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
