"""Review 48, cancellation: a ``Coordinator.start()`` cut short while its status page
started left its sockets and context open (9 fds a try; the next gc hung the process in
the context's ``__del__``), and on Python 3.11 ``asyncio.wait_for`` returns its result
when a cancel lands in the pass its awaitable ends in, so a caller's cancel of
``Peer.wait_linked`` (a deadline, a TaskGroup, Ctrl-C) was lost. Real sockets on loopback."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest
from swarmtest import ROOT

from swarm import Coordinator, Peer


def test_a_coordinator_start_cut_short_closes_what_it_made():
    # in a child: a hang in gc is the failure, and a timeout ends it. The status page's
    # start is held 10 s there, so that every deadline falls at a known point: before the
    # page listens (0) or while it listens (0.3 s), where the fds were left
    script = textwrap.dedent("""
        import asyncio, gc, os
        from swarm import Coordinator
        from swarm.coordinator import http
        start = http.StatusServer.start
        async def slow(self):
            await start(self)
            await asyncio.sleep(10)
        http.StatusServer.start = slow
        def fds(): return len(os.listdir("/proc/self/fd"))
        async def main():
            before = fds()
            for delay in (0, 0.3, 0, 0.3):
                c = Coordinator(bind="tcp://127.0.0.1:*", http_bind="127.0.0.1:0")
                try:
                    async with asyncio.timeout(delay):
                        await c.start()
                except TimeoutError:
                    assert c._ctx.closed, "context left open"
                else:
                    raise AssertionError("the start was not cut")
                del c
                gc.collect()
                assert fds() == before, (delay, fds(), before)
            print("ok")
        asyncio.run(main())
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=90,
                         cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0 and res.stdout.split() == ["ok"], res.stdout + res.stderr[-3000:]


def test_a_cancel_that_lands_as_wait_linked_is_woken_is_not_lost():
    async def main() -> None:
        coord = Coordinator(bind="tcp://127.0.0.1:*", http_bind="")
        await coord.start()
        peer = Peer(coordinators=[coord.address], id="w")
        try:
            await peer.start()
            await peer.wait_linked(timeout=10)
            for _ in range(20):
                peer._linked.clear()
                waiter = asyncio.create_task(peer.wait_linked(timeout=10))
                await asyncio.sleep(0.01)      # waiting on the event now

                def both() -> None:            # woken and cancelled in one pass
                    peer._linked.set()
                    waiter.cancel()
                asyncio.get_running_loop().call_soon(both)
                with pytest.raises(asyncio.CancelledError):
                    await waiter
        finally:
            await peer.close()
            await coord.close()

    asyncio.run(asyncio.wait_for(main(), 60))
