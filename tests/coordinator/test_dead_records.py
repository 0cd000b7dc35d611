"""Dead members' records are kept for a while (a member that comes back under its id
takes its rank again), but not without bound: a restarted process joins under a new
id, so churn alone would grow the table, and with it every status reply."""

from __future__ import annotations

import asyncio
import time

import zmq.asyncio

from swarm.cli import query_status
from swarm.coordinator import DEAD, Coordinator, MemberTable
from swarm.coordinator.table import MAX_DEAD


def _churn(table: MemberTable, n: int, first: int = 0) -> None:
    """``n`` members join under new ids, report their figures and die, as restarted
    processes do (each joins as hostname-pid)."""
    for i in range(first, first + n):
        pid = f"host-{i}"
        rec = table.join(pid, f"tcp://10.0.{i // 250 % 250}.{i % 250}:7000", -1, time.time_ns(), b"route")
        rec.stats = {"msgs_in": 123456, "msgs_out": 123456, "bytes_in": 12345678, "nbrs": ["host-1", "host-2"]}
        table.mark_dead(pid, "disconnected")


def test_the_newest_dead_records_are_kept_and_the_live_ones_all():
    t = MemberTable()
    for i in range(3):
        t.join(f"live{i}", f"tcp://h:{i + 1}", i, 1, b"r")
    _churn(t, MAX_DEAD + 1000)
    t.forget_dead()
    dead = [p for p, m in t.members.items() if m.state == DEAD]
    assert len(dead) == MAX_DEAD
    assert "host-999" not in t.members and "host-1000" in dead   # the oldest went first
    assert {"live0", "live1", "live2"} <= set(t.members)
    # one that comes back under a kept id gets its rank again
    rank = t.get(f"host-{MAX_DEAD + 999}").rank
    assert t.join(f"host-{MAX_DEAD + 999}", "tcp://h:9", -1, 2, b"r", replace=True).rank == rank


def test_status_is_answered_after_a_churn_of_many_new_ids():
    # 15,000 deaths within the records' 300 s made a status reply of over 4 MiB,
    # which the coordinator refused to send: `swarm status` got no answer.
    async def main() -> None:
        # (a long heartbeat timeout: the member "live" has no connection to beat on)
        async with Coordinator(bind="tcp://127.0.0.1:*", heartbeat_timeout_s=600) as coord:
            coord.table.join("live", "tcp://127.0.0.1:7001", 0, 1, b"r")
            _churn(coord.table, 15_000)
            async with asyncio.timeout(10):   # the coordinator forgets once a second
                while sum(m.state == DEAD for m in coord.table.members.values()) > MAX_DEAD:
                    await asyncio.sleep(0.05)
            st = await query_status(coord.address, timeout=10.0)
            states = [r["state"] for r in st["members"]]
            assert states.count("dead") == MAX_DEAD and states.count("alive") == 1
            assert coord.malformed == 0

    asyncio.run(main())


def test_dead_records_do_not_make_a_small_swarm_pay_the_batching_pause():
    # The 10 ms pause per wake-up is for swarms of more than 64 members. Counted over
    # the whole table, the dead records after churn made 3 live peers pay it on every
    # join and leave (median join latency 10.8 ms).
    ctx = zmq.asyncio.Context()
    try:
        coord = Coordinator(context=ctx)
        for i in range(3):
            coord.table.join(f"live{i}", f"tcp://h:{i + 1}", i, 1, b"r")
        _churn(coord.table, 1000)
        coord.table.publish()
        assert len(coord.table.members) == 1003
        assert coord._batch_pause(5) == 0.0
        for i in range(3, 100):                   # a swarm of 100 live members does pause
            coord.table.join(f"live{i}", f"tcp://h:{i + 1}", i, 1, b"r")
        coord.table.publish()
        assert coord._batch_pause(5) > 0 and coord._batch_pause(0) == 0.0
    finally:
        ctx.term()
