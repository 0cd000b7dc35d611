"""Two active coordinators (a thawed primary, a healed partition between the coordinators):
the one that holds the swarm's live members stays, and the other stands by without
touching them (review rH)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from swarmtest import Forwarder, free_port, freeze, run_frozen, start_ticking_peers, status, until, wait_for

from swarm import Coordinator

from coordinator.test_standby import decide_both, two_active


def test_of_two_active_coordinators_the_one_with_members_stays_whatever_the_epochs():
    # the standby that took over during a partition between the coordinators alone published an
    # empty view one epoch up; on heal the primary, serving every peer, stood by for it
    now = time.monotonic()
    with two_active() as (lower, higher):
        for i in range(3):
            lower.table.join(f"p{i}", f"tcp://127.0.0.1:{40000 + i}", -1, 1, b"r%d" % i, now=now)
        lower.table.publish()   # epoch 1, three members
        higher.table.epoch = 2   # took over above it, nobody joined
        decide_both(lower, higher, now)
        assert (lower.mode, higher.mode) == ("active", "standby")
        assert higher.table.epoch == 2 and higher.table.members == {}


def primary_and_standby(procs, timeout: float = 20.0):
    """Two `swarm coordinator` processes that know each other, the lower address active
    first and the other standing by: ``(primary, standby, its process, its process)``."""
    primary, standby = sorted(f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    ca = procs.start("coordinator", "--bind", primary, "--others", standby, name="primary")
    wait_for(lambda: status(primary)["mode"] == "active", timeout, what="the primary active")
    cb = procs.start("coordinator", "--bind", standby, "--others", primary, name="standby")
    wait_for(lambda: status(standby)["mode"] == "standby", timeout, what="the standby standing by")
    return primary, standby, ca, cb

def test_a_thawed_primary_stands_by_for_the_standby_that_holds_its_peers(procs):
    # the thawed primary declared every (moved) peer dead, published an empty view that tied
    # the standby's epoch, won on its lower address, and the peers failed over a second time
    primary, standby, ca, cb = primary_and_standby(procs)

    async def main() -> None:
        peers, _ = await start_ticking_peers([f"p{i}" for i in range(3)], [primary, standby])
        try:
            e0 = max(p.epoch for p in peers)
            await asyncio.to_thread(freeze, ca.pid)
            try:
                await asyncio.gather(*(p.wait_view(lambda v: v.epoch > e0 and len(v.members) == 3, timeout=15)
                                       for p in peers))
                await asyncio.sleep(1.0)   # frozen well past takeover_s and the peers' ZMTP timeout
            finally:
                os.kill(ca.pid, signal.SIGCONT)
            e1 = max(p.epoch for p in peers)
            deadline = time.monotonic() + 10
            while (await asyncio.to_thread(status, primary))["mode"] != "standby":
                assert time.monotonic() < deadline, "the thawed primary did not stand by:\n" + procs.log(ca)
                await asyncio.sleep(0.1)
            for _ in range(10):
                assert (await asyncio.to_thread(status, standby))["mode"] == "active", procs.log(cb)
                await asyncio.sleep(0.1)
            assert all(p.epoch == e1 and len(p.view.members) == 3 for p in peers)
            st = await asyncio.to_thread(status, primary)
            assert st["members"] == [] and st["view"]["members"] == [], st   # no stale table
        finally:
            for p in peers:
                await p.close()

    run_frozen(main(), ca.pid)
    # the standby does not probe nor log the deaths of members it does not serve
    wait_for(lambda: all(m["state"] == "dead" for m in status(standby)["members"]), 10,
             what="the active one seeing the peers leave")
    time.sleep(0.5)
    assert "declared dead" not in procs.log(ca), procs.log(ca)
    # its own freeze is said as such, not as the other's silence (review 45: "coordinator
    # <standby> stopped answering (its last answer 6.2 s ago)", logged as it thawed)
    assert "its loops did not run for" in procs.log(ca) and "stopped answering" not in procs.log(ca), procs.log(ca)


def test_after_a_partition_of_the_coordinators_alone_the_one_serving_the_peers_stays(caplog):
    # the watch DEALERs had no ZMTP heartbeat: a connection whose state a partition lost was
    # kept open for good, both stayed active and neither logged it; and once they met, the
    # primary with every peer stood by for the standby's empty view one epoch up
    caplog.set_level("INFO", logger="swarm.coordinator")

    async def main() -> None:
        # the primary has the lower address: of two standbys it is the one that takes over
        (pa, pb), fa, fb = sorted((free_port(), free_port()), key=str), free_port(), free_port()
        a = Coordinator(bind=f"tcp://127.0.0.1:{pa}", others=[f"tcp://127.0.0.1:{fb}"], http_bind="")
        b = Coordinator(bind=f"tcp://127.0.0.1:{pb}", others=[f"tcp://127.0.0.1:{fa}"], http_bind="")
        to_a, to_b = Forwarder(("127.0.0.1", fa), ("127.0.0.1", pa)), Forwarder(("127.0.0.1", fb), ("127.0.0.1", pb))
        peers: list = []
        try:
            await to_a.up()
            await to_b.up()
            await a.start()
            await b.start()
            await until(lambda: a.mode == "active" and [o["state"] for o in b.status()["others"]] == ["active"], 15,
                        what="the primary active, and the standby hearing it")
            peers, _ = await start_ticking_peers(["p0", "p1"], [a.address])
            e0 = max(p.epoch for p in peers)
            to_a.vanish()
            to_b.vanish()
            await until(lambda: b.mode == "active", 10, what="the standby taking over")
            await asyncio.sleep(0.5)
            await to_a.up()
            await to_b.up()
            await until(lambda: b.mode == "standby", 20, what="the standby standing by once they meet again")
            for _ in range(10):
                assert a.mode == "active" and b.mode == "standby"
                await asyncio.sleep(0.1)
            assert all(p.epoch == e0 and len(p.view.members) == 2 for p in peers)
            assert f"coordinator {a.address}: coordinator tcp://127.0.0.1:{fb} stopped answering" in caplog.text
        finally:
            for p in peers:
                await p.close()
            await b.close()
            await a.close()
            to_a.close()
            to_b.close()

    asyncio.run(main())
