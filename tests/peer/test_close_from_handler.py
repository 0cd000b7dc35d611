"""close() awaited from a handler: the handler runs on the peer's receive loop, the
only reader of the coordinator's confirmation of the leave. close() waited out its
whole timeout for a confirmation its own caller kept from being read, then cancelled
that caller (CancelledError into the handler); with ``timeout=None`` it never
returned. Now it starts the leave and returns at once; the peer closes as soon as
the handler returns."""

from __future__ import annotations

import asyncio
import time

from swarmtest import linked_pair

from swarm.peer import PeerState


async def _close_from_handler(timeout: float | None) -> None:
    async with linked_pair() as (a, b):
        seen: dict[str, object] = {}

        async def stop(msg) -> None:
            t0 = time.monotonic()
            await b.close(timeout=timeout)
            seen["close_s"] = time.monotonic() - t0
            seen["state"] = b.state
            await asyncio.sleep(0.05)   # not cancelled: the handler runs to its end
            seen["ended"] = True

        b.on("stop", stop)
        assert await a.send("b", "stop", {}, timeout=5)
        async with asyncio.timeout(5):   # wait_stopped: the leave went through, b closed
            await b.wait_stopped()
        assert seen.get("ended") is True, seen
        assert seen["close_s"] < 0.5, seen
        assert seen["state"] is PeerState.LEAVING
        assert b.state is PeerState.CLOSED
        # the coordinator took the leave (not a heartbeat timeout): a's view drops b at once
        await a.wait_view(lambda v: "b" not in v.ids, timeout=2)
        await b.close()   # again: nothing more


def test_close_from_a_handler_returns_at_once_and_the_peer_leaves():
    asyncio.run(_close_from_handler(timeout=3.0))


def test_close_from_a_handler_without_a_deadline_returns():
    asyncio.run(asyncio.wait_for(_close_from_handler(timeout=None), 20))
