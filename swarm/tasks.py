"""Structured concurrency for the long-lived loops of peers and coordinators."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Coroutine

from .errors import SwarmError

__all__ = ["supervise"]


class _Stopping(Exception):
    """Raised inside the task group to end it when asked to stop."""


async def supervise(loops: list[Coroutine[Any, Any, Any]], stop: asyncio.Event,
                    on_cancel: Callable[[], None] | None = None) -> BaseException | None:
    """Run ``loops`` in one TaskGroup until ``stop`` is set or one of them fails.

    Returns None after a requested stop, or the first failure; either way every
    loop has been cancelled and awaited. The owner re-raises the failure to its
    caller (see ``Peer.close`` and ``Coordinator.closed``).

    A loop that ends by itself while no stop was asked (it returned, or code it ran
    cancelled its task) is a failure too (SwarmError): a TaskGroup ignores a child
    that ends cancelled, and its owner went on without that loop.

    ``on_cancel`` is called when this is cancelled while no stop was asked: the clean-up
    of ``asyncio.run`` cancelling an owner its program never closed. The owner closes
    its sockets there; left open, a later gc's ``Context.__del__`` waited in ``term()``
    for ever for sockets it no longer listed, and the program hung.
    """
    owner = asyncio.current_task()
    failed: list[BaseException] = []   # a loop's failure, which cancels the others
    failure: BaseException | None = None
    try:
        try:
            async with asyncio.TaskGroup() as tg:
                for c in loops:
                    tg.create_task(_watched(c, stop, owner, failed))
                await stop.wait()
                raise _Stopping()
        except* _Stopping:
            pass
        except* Exception as eg:
            failure = eg.exceptions[0]
    except asyncio.CancelledError:
        if on_cancel is not None and not stop.is_set():
            on_cancel()
        raise
    finally:
        for c in loops:
            # one whose task was cancelled before it began never ran: closed, it is not
            # reported as "never awaited" (an ended one is closed already)
            c.close()
    return failure


async def _watched(loop: Coroutine[Any, Any, Any], stop: asyncio.Event, owner: asyncio.Task[Any] | None,
                   failed: list[BaseException]) -> None:
    """Run ``loop``; raise SwarmError if it ends while neither a stop, a cancellation of the
    owner nor a failure of another loop (listed in ``failed``) asked it to. The owner's
    cancellation alone does not tell the last: the TaskGroup takes it back once the
    group has ended, while a loop it cancelled may still be cleaning up."""
    name = getattr(loop, "__qualname__", repr(loop))
    try:
        await loop
    except asyncio.CancelledError:
        if stop.is_set() or failed or owner is None or owner.cancelling():
            raise
        why = ("was cancelled although nothing asked it to stop (code it ran, a handler or a "
               "callback, cancelled its task)")
    except BaseException as e:
        failed.append(e)
        raise
    else:
        if stop.is_set():
            return
        why = "returned although nothing asked it to stop"
    error = SwarmError(f"{name} {why}")
    failed.append(error)
    raise error from None
