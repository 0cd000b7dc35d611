"""Closing a coordinator closes its sockets and its context whatever its loops ended
with: left open, the context's __del__ blocks the process at the next gc."""

from __future__ import annotations

import asyncio

from swarmtest import free_port

from swarm import Coordinator


def test_close_after_the_loops_were_cancelled_still_closes_everything():
    # close() awaited the runner, which raised its CancelledError out of close():
    # the sockets and the context stayed open
    async def main():
        coord = Coordinator(bind=f"tcp://127.0.0.1:{free_port()}", http_bind="")
        await coord.start()
        ctx = coord._ctx
        coord._runner.cancel()
        await asyncio.wait([coord._runner])
        await coord.close()
        assert coord._router is None and coord._monitor is None
        assert ctx.closed

    asyncio.run(main())


def test_a_close_cancelled_while_it_waits_for_the_loops_still_closes_everything():
    async def main():
        coord = Coordinator(bind=f"tcp://127.0.0.1:{free_port()}", http_bind="")
        await coord.start()
        ctx, runner = coord._ctx, coord._runner
        slow = coord._runner = asyncio.ensure_future(asyncio.sleep(60))   # loops slow to stop
        try:
            closing = asyncio.ensure_future(coord.close())
            await asyncio.sleep(0.05)
            closing.cancel()   # a caller's deadline, or Ctrl-C, while close() waits
            await asyncio.wait([closing])
            assert closing.cancelled()
            assert coord._router is None and ctx.closed
        finally:
            slow.cancel()
            runner.cancel()
            await asyncio.wait([slow, runner])

    asyncio.run(main())
