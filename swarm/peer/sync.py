"""SyncPeer: a Peer on a background thread, with blocking calls.

For simulators and training loops that are not async. The peer's sockets and
event loop live on their own thread, so a long training step on the caller's
thread (torch releases the GIL in its kernels) does not delay heartbeats or
replies.

>>> with SyncPeer(coordinators=["tcp://127.0.0.1:5555"]) as peer:
...     peer.send(peer.neighbours()[0], "hi", {"x": 1})
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Awaitable, Callable, Coroutine, Sequence, TypeVar

import numpy as np

from ..checks import seconds
from ..errors import ConfigError, PeerTimeout, SwarmError
from ..link import View
from .peer import Peer

__all__ = ["SyncPeer"]

T = TypeVar("T")


class SyncPeer:
    """Blocking facade over :class:`Peer`; arguments are those of ``Peer``.

    ``loop_factory`` picks the background loop (e.g. ``uvloop.new_event_loop``);
    the library itself never installs one.

    After :meth:`close` (or a failed :meth:`start`) the loop is gone: calls raise
    :class:`SwarmError` ("SyncPeer is closed"), :meth:`neighbours` is [] and it
    cannot be started again.
    """

    def __init__(self, *args: Any, loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
                 start_timeout: float | None = None, **kwargs: Any) -> None:
        self._args, self._kwargs = args, kwargs
        self._loop_factory = loop_factory or asyncio.new_event_loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.peer: Peer | None = None
        self._start_timeout = start_timeout
        self._closed = False

    # -- lifecycle

    def start(self) -> "SyncPeer":
        if self._closed:
            raise SwarmError("SyncPeer is closed and cannot be restarted; make a new SyncPeer")
        if self._thread is not None:
            raise SwarmError("SyncPeer.start() called twice")
        ready = threading.Event()

        def run() -> None:
            loop = self._loop_factory()
            asyncio.set_event_loop(loop)
            self._loop = loop
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name="swarm-peer", daemon=True)
        self._thread.start()
        ready.wait()

        async def make() -> Peer:
            p = Peer(*self._args, **self._kwargs)
            self.peer = p
            await p.start()
            return p

        timeout = self._start_timeout or (self._kwargs.get("join_timeout_s") or 5.0) + 5.0
        try:
            self.call(make(), timeout=timeout)
        except BaseException:
            self._closed = True
            self._stop_loop()
            raise
        return self

    def close(self, timeout: float = 5.0) -> None:
        seconds(timeout, none_ok=True)
        self._closed = True
        if self._loop is None:
            return
        try:
            if self.peer is not None:
                self.call(self.peer.close(), timeout=timeout)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5.0)
        self._loop = None

    def __enter__(self) -> "SyncPeer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- calls

    def call(self, coro: Coroutine[Any, Any, T] | Awaitable[T], timeout: float | None = 30.0) -> T:
        """Run a coroutine on the peer's loop and wait for its result."""
        if self._loop is None:
            _discard(coro)
            raise SwarmError(self._not_running())
        try:
            seconds(timeout, none_ok=True)
        except ConfigError:
            _discard(coro)
            raise
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        # waited apart from the result: a PeerTimeout the coroutine raises is a
        # TimeoutError too, and it is the one to report
        if not concurrent.futures.wait([fut], timeout).done:
            fut.cancel()
            raise PeerTimeout(f"call did not finish within {timeout} s")
        return fut.result()

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule a plain function on the peer's loop (fire and forget)."""
        if self._loop is None:
            raise SwarmError(self._not_running())
        self._loop.call_soon_threadsafe(fn, *args)

    @property
    def id(self) -> str:
        return self._peer().id

    @property
    def view(self) -> View:
        return self._peer().view

    @property
    def address(self) -> str:
        return self._peer().address

    def neighbours(self) -> list[str]:
        """Neighbour ids in the current view ([] once closed)."""
        if self._closed:
            return []
        return self._peer().neighbours()

    def send(self, dst: str, t: str, body: dict[str, Any] | None = None,
             arrays: Sequence[np.ndarray] = (), *, timeout: float | None = None) -> bool:
        """:meth:`Peer.send` from the caller's thread."""
        seconds(timeout, none_ok=True)
        return self.call(self._peer().send(dst, t, body, arrays, timeout=timeout),
                         timeout=(timeout or 0) + 10.0)

    def on(self, t: str, handler: Callable[..., Any]) -> None:
        """Register a handler; it runs on the peer's thread."""
        self._peer().on(t, handler)

    def on_view(self, callback: Callable[[View], None]) -> None:
        self._peer().on_view(callback)

    def wait_linked(self, timeout: float | None = 5.0) -> None:
        seconds(timeout, none_ok=True)
        self.call(self._peer().wait_linked(timeout), timeout=None if timeout is None else timeout + 5.0)

    def _peer(self) -> Peer:
        if self.peer is None:
            raise SwarmError(self._not_running())
        return self.peer

    def _not_running(self) -> str:
        return "SyncPeer is closed" if self._closed else "SyncPeer is not started"


def _discard(coro: Any) -> None:
    """Close a coroutine that will never run (no "was never awaited" warning)."""
    if asyncio.iscoroutine(coro):
        coro.close()
