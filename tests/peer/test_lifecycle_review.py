"""A peer's close() in normal operation: a leaving peer is not taken back, a second close
waits for the first, and wait_stopped() is not cancelled by a close cut short. In-process
coordinators on loopback."""

from __future__ import annotations

import asyncio
import time

from swarm import Coordinator
from swarm.peer import Peer


def test_a_leaving_peer_is_not_taken_back_into_the_view():
    # heartbeats went on after the leave; the coordinator answered one with "rejoin", and
    # the peer joined again (two view changes; neighbours linked to a peer about to go):
    # 17 of 30 closes with 1 ms heartbeats
    async def main():
        async with Coordinator(bind="tcp://127.0.0.1:0", http_bind="") as coord:
            joins: list[tuple[str, float]] = []
            join = coord.table.join

            def counted(src, *a, **kw):
                joins.append((src, time.monotonic()))
                return join(src, *a, **kw)

            coord.table.join = counted
            after_close = 0
            for k in range(10):
                p = Peer(coordinators=[coord.address], id=f"a{k}", heartbeat_s=0.001)
                await p.start()
                await asyncio.sleep(0.1)
                t = time.monotonic()
                await p.close()
                await asyncio.sleep(0.05)
                after_close += any(src == p.id and at > t for src, at in joins)
            causes = {m.cause for m in coord.table.members.values()}
            return after_close, causes

    after_close, causes = asyncio.run(main())
    assert after_close == 0 and causes == {"left"}, (after_close, causes)


def test_a_second_close_waits_for_the_first_and_both_return():
    # the second closed the sockets at once: the first waited for a bye that never came
    async def main():
        async with Coordinator(bind="tcp://127.0.0.1:0", http_bind="") as coord:
            p = Peer(coordinators=[coord.address], id="a")
            await p.start()
            first = asyncio.ensure_future(p.close(timeout=None))
            await asyncio.sleep(0)    # it sent the leave and waits for the bye
            await asyncio.wait_for(p.close(), 5)
            done, _ = await asyncio.wait([first], timeout=5)
            first.cancel()
            return bool(done), coord.table.get("a").cause

    done, cause = asyncio.run(main())
    assert done and cause == "left"


def test_wait_stopped_returns_when_a_close_is_cut_short():
    # the close's clean-up cancels the loops, and wait_stopped() (shielding them) raised
    # CancelledError in tasks that nobody had cancelled
    async def main():
        coord = Coordinator(bind="tcp://127.0.0.1:0", http_bind="")
        await coord.start()
        p = Peer(coordinators=[coord.address], id="a")
        try:
            await p.start()
            waiting = asyncio.ensure_future(p.wait_stopped())
            await coord.close()      # nobody will confirm the leave
            try:
                await asyncio.wait_for(p.close(timeout=5.0), 0.3)
            except TimeoutError:
                pass                 # cut short, as the caller asked
            await asyncio.wait([waiting], timeout=5)
            return waiting.done() and not waiting.cancelled() and waiting.exception() is None
        finally:
            await p.close()
            await coord.close()

    assert asyncio.run(main())


def test_every_counter_goes_out_on_heartbeats():
    # PeerCounters says so; handler_errors, unhandled, suspicions and rejoins never went
    async def main():
        async with Coordinator(bind="tcp://127.0.0.1:0", http_bind="") as coord:
            p = Peer(coordinators=[coord.address], id="a", heartbeat_s=0.05)
            await p.start()
            try:
                p.counters.handler_errors, p.counters.rejoins = 3, 2
                loop = asyncio.get_running_loop()
                end = loop.time() + 5
                while (coord.table.get("a").stats or {}).get("handler_errors") != 3:
                    assert loop.time() < end, coord.table.get("a").stats
                    await asyncio.sleep(0.05)
                return coord.table.get("a").stats
            finally:
                await p.close()

    stats = asyncio.run(main())
    assert {"handler_errors", "unhandled", "suspicions", "rejoins"} <= set(stats) and stats["rejoins"] == 2
