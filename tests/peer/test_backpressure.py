"""A frozen neighbour must not make its peers' memory grow: sends to it are
dropped (and counted) once its small queue is full."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time

import numpy as np
from swarmtest import free_port, freeze, status, wait_for

from swarm.peer import Peer


def rss_kb() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def start_coordinator_and_b(procs) -> tuple[str, subprocess.Popen]:
    """A coordinator and peer process B, both with 60 s failure timeouts: B stays in
    the view while it is stopped (SIGSTOP) and leaves it only when it dies."""
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs.start("coordinator", "--bind", addr, "--set", "coordinator.heartbeat_timeout_s=60",
                "--set", "coordinator.zmtp_timeout_s=60", "--set", "coordinator.probe_timeout_s=60",
                name="coord")
    wait_for(lambda: status(addr), 10, what="coordinator up")
    b = procs.start("peer", "--coordinator", addr, "--id", "B", "--set", "peer.link_timeout_s=60", name="B")
    return addr, b


@contextlib.asynccontextmanager
async def a_linked_to_stopped(addr: str, b: subprocess.Popen):
    """Peer A (link heartbeats off, so a ZMTP timeout cannot close the link and hide
    the queue; a queue of 8) linked to B, and B stopped (SIGSTOP) until the end."""
    a = Peer(id="A", coordinators=[addr], link_heartbeat_s=30, link_timeout_s=60, data_hwm=8)
    async with a:
        await a.wait_view(lambda v: v.member("B") is not None, timeout=20)
        await a.wait_linked()
        freeze(b.pid)
        try:
            yield a
        finally:
            with contextlib.suppress(ProcessLookupError):   # a test may have killed B
                os.kill(b.pid, signal.SIGCONT)


def test_frozen_neighbour_does_not_grow_memory(procs):
    # long timeouts, so that the frozen peer stays in the view for the whole test
    # and A really keeps sending to it (the worst case for memory)
    addr, frozen = start_coordinator_and_b(procs)

    async def main() -> None:
        async with a_linked_to_stopped(addr, frozen) as a:
            delta = np.ones(1 << 18, np.float32)      # 1 MiB
            rss0 = rss_kb()
            sent = tries = 0
            # 1000 sends of 1 MiB, not as many as 10 s allow: a queue that kept them all
            # would hold a GiB, far past the high-water mark and the kernel's buffers
            while tries < 1000:
                tries += 1
                if await a.send("B", "data", arrays=[delta]):
                    sent += 1
                await asyncio.sleep(0.002)
            grown_mb = (rss_kb() - rss0) / 1024
            print(f"frozen neighbour: {tries} tries, {sent} sent, {a.counters.dropped_out} dropped, RSS +{grown_mb:.1f} MiB")
            assert a.view.member("B") is not None      # B was never dropped from the view
            # what got queued is bounded by the high-water mark plus the kernel's socket
            # buffers; everything else was dropped and counted
            # (counted against the attempts made)
            assert tries > 200, tries
            assert a.counters.dropped_out == tries - sent, (tries, sent, a.counters)
            assert a.counters.dropped_out > 2 * sent, (tries, sent, a.counters)
            assert sent < 200, sent
            assert grown_mb < 64, f"memory grew {grown_mb:.0f} MiB"

    asyncio.run(main())


def test_send_waiting_on_a_full_queue_returns_false_when_the_neighbour_leaves(procs):
    """A send blocked on a full queue must end with False, not CancelledError, when
    the destination leaves the view and its link is closed under the wait (this used
    to crash a swarm peer whose neighbour finished its budget first)."""
    # B stays in the view while it is stopped (long timeouts) and leaves it when killed:
    # its connection to the coordinator closes
    addr, b = start_coordinator_and_b(procs)

    async def main() -> None:
        async with a_linked_to_stopped(addr, b) as a:
            delta = np.ones(1 << 18, np.float32)
            refused = 0      # fill the queue and the kernel's socket buffers behind it
            for _ in range(2000):
                refused = 0 if await a.send("B", "data", arrays=[delta]) else refused + 1
                if refused == 20:
                    break
                await asyncio.sleep(0.01)
            assert refused == 20, "the queue to a stopped peer never filled"
            dropped = a.counters.dropped_out
            waiting = asyncio.create_task(a.send("B", "data", arrays=[delta], timeout=30.0))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            os.kill(b.pid, signal.SIGKILL)
            t0 = time.monotonic()
            assert await asyncio.wait_for(waiting, 20.0) is False
            assert time.monotonic() - t0 < 15.0        # ended by the view change, not the 30 s timeout
            assert a.view.member("B") is None
            assert a.counters.dropped_out == dropped + 1

    asyncio.run(main())
