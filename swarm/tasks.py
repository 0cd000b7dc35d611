"""Structured concurrency for the long-lived loops of peers and coordinators."""

from __future__ import annotations

import asyncio
from typing import Any, Coroutine

__all__ = ["supervise"]


class _Stopping(Exception):
    """Raised inside the task group to end it when asked to stop."""


async def supervise(loops: list[Coroutine[Any, Any, Any]], stop: asyncio.Event) -> BaseException | None:
    """Run ``loops`` in one TaskGroup until ``stop`` is set or one of them fails.

    Returns None after a requested stop, or the first failure; either way every
    loop has been cancelled and awaited. The owner re-raises the failure to its
    caller (see ``Peer.close`` and ``Coordinator.closed``).
    """
    failure: BaseException | None = None
    try:
        async with asyncio.TaskGroup() as tg:
            for c in loops:
                tg.create_task(c)
            await stop.wait()
            raise _Stopping()
    except* _Stopping:
        pass
    except* Exception as eg:
        failure = eg.exceptions[0]
    return failure
