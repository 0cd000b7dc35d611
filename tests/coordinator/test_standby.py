"""A standby coordinator takes over within 2 s of the primary's death, with a
higher epoch, while gossip between peers never stops; no split brain."""

from __future__ import annotations

import asyncio
import time

from swarmtest import free_port, start_ticking_peers, status, tick_neighbours, wait_for



def test_standby_takes_over(procs):
    a = f"tcp://127.0.0.1:{free_port()}"
    b = f"tcp://127.0.0.1:{free_port()}"
    # the lower address is the one that is active first
    primary, standby = sorted([a, b])
    cp = procs.start("coordinator", "--bind", primary, "--others", standby, name="primary")
    cs = procs.start("coordinator", "--bind", standby, "--others", primary, name="standby")
    wait_for(lambda: status(primary)["mode"] == "active" and status(standby)["mode"] == "standby", 15,
             what="primary active, standby standing by")

    async def main() -> None:
        peers, got = await start_ticking_peers([f"s{i}" for i in range(4)], [primary, standby])
        try:
            e0 = max(p.epoch for p in peers)

            cp.kill()
            cp.wait()
            t0 = time.monotonic()
            stop = asyncio.Event()

            async def gossip() -> None:   # neighbours keep exchanging through the failover
                while not stop.is_set():
                    await tick_neighbours(peers)
                    await asyncio.sleep(0.02)

            task = asyncio.create_task(gossip())
            before = dict(got)
            await asyncio.gather(*(p.wait_view(lambda v: v.epoch > e0 and len(v.members) == 4, timeout=10)
                                   for p in peers))
            took = time.monotonic() - t0
            stop.set()
            await task
            assert took < 2.5, f"takeover and new view took {took:.2f} s"
            assert all(got[k] > before[k] for k in got), (before, got)
            st = await asyncio.to_thread(status, standby)
            assert st["mode"] == "active" and st["epoch"] > e0
            assert sorted(m[0] for m in st["view"]["members"]) == [p.id for p in peers]

            # the old primary comes back (fresh, empty): it must not hand out views
            cp2 = procs.start("coordinator", "--bind", primary, "--others", standby, name="primary2")
            await asyncio.sleep(2.5)
            st2 = await asyncio.to_thread(status, primary)
            assert st2["mode"] == "standby", st2["mode"]
            assert max(p.epoch for p in peers) == (await asyncio.to_thread(status, standby))["epoch"]
            assert cp2.poll() is None and cs.poll() is None
        finally:
            for p in peers:
                await p.close()

    asyncio.run(main())


def test_a_bad_address_of_another_coordinator_ends_the_process(procs):
    # it used to log the failure and then hang, up but deaf, until a signal came
    c = procs.start("coordinator", "--bind", f"tcp://127.0.0.1:{free_port()}", "--others", "foo", name="bad")
    assert c.wait(15) == 2
    log = procs.log(c)
    assert "swarm: error: cannot connect to foo" in log
    assert "swarm coordinator on" not in log and "Traceback" not in log
