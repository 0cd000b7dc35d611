"""Dead members' records age on elapsed time, not on the wall clock (review 42): a step of
the coordinator host's clock (NTP, a resume from suspend) dropped every one of them at
once, and `swarm peer --replace ID` of a member dead for seconds was refused."""

from __future__ import annotations

import time

from swarmtest import free_port, status, wait_for
# the stepped wall clock of the `swarm run` clock tests (tests/ is on the path)
from experiment.test_review42_clock import SteppedWallClock

from swarm.coordinator import DEAD, MemberTable
from swarm.peer import SyncPeer


def test_a_wall_clock_step_keeps_the_dead_records(monkeypatch):
    t = MemberTable()
    t.join("pa", "tcp://h:1", 0, 1, b"ra")
    t.join("pb", "tcp://h:2", 1, 1, b"rb")
    t.mark_dead("pb", "disconnected")
    stepped = time.time() + 3600.0
    monkeypatch.setattr(time, "time", lambda: stepped)   # the host's clock, an hour on
    t.forget_dead()
    assert t.get("pb") is not None and t.get("pb").state == DEAD
    assert t.join("pb", "tcp://h:3", -1, 2, b"rb2", replace=True).rank == 1


def test_a_member_dead_for_seconds_is_taken_over_after_a_wall_clock_step(procs, tmp_path):
    """The coordinator forgets dead records once a second; with their age on the wall
    clock, a step of an hour forgot them all at the next look. The take-over of pb
    (its id, with --replace) then failed: "no such member to take over"."""
    clock = SteppedWallClock(tmp_path)
    addr = f"tcp://127.0.0.1:{free_port()}"
    coord = procs.start("coordinator", "--bind", addr, name="coord", env=clock.env)
    wait_for(lambda: coord.poll() is None and status(addr, 0.5), 30, what="the coordinator")
    peers = []
    try:
        for pid in ("pa", "pb"):
            peers.append(SyncPeer(coordinators=[addr], id=pid, join_timeout_s=20).start())
        rows = {m["id"]: m for m in status(addr)["members"]}
        assert rows["pb"]["rank"] == 1, rows
        peers.pop().close()   # pb leaves: dead, and its record kept
        wait_for(lambda: {m["id"]: m["state"] for m in status(addr)["members"]}.get("pb") == "dead", 10,
                 what="pb dead")
        clock.step(3600)
        time.sleep(2.5)   # the coordinator's look for old dead records, twice
        assert {m["id"]: m["state"] for m in status(addr)["members"]}.get("pb") == "dead", status(addr)
        peers.append(SyncPeer(coordinators=[addr], id="pb", replace=True, join_timeout_s=20).start())
        rows = {m["id"]: m for m in status(addr)["members"]}
        assert rows["pb"]["state"] == "alive" and rows["pb"]["rank"] == 1, rows
    finally:
        for p in peers:
            p.close()

