"""SyncPeer: a Peer on a background thread, with blocking calls.

For simulators and training loops that are not async. The peer's sockets and
event loop live on their own thread, so a long training step on the caller's
thread (torch releases the GIL in its kernels) does not delay heartbeats or
replies. With a coordinator running (``swarm coordinator``)::

    with SyncPeer(coordinators=["tcp://127.0.0.1:5555"]) as peer:
        peer.on("hi", lambda msg: print(msg.src, msg.body))   # runs on the peer's thread
        peer.wait_view(lambda view: len(view.members) >= 2, timeout=30)
        for n in peer.neighbours():
            peer.send(n, "hi", {"x": 1})
        result = peer.call(gossip.round())   # any coroutine, on the peer's loop

Ctrl-C (or any exception) in the caller's thread, inside a blocking call or not,
leaves the ``with`` block through :meth:`close`: the coroutine in flight is
cancelled, the peer leaves the swarm and the thread ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Callable, Coroutine, Sequence, TypeVar

import numpy as np

from ..checks import seconds
from ..errors import ConfigError, PeerTimeout, SwarmError
from ..link import View
from .peer import Peer, check_handler_type

__all__ = ["SyncPeer"]

T = TypeVar("T")


class SyncPeer:
    """Blocking facade over :class:`Peer`; arguments are those of ``Peer``.

    ``loop_factory`` picks the background loop (e.g. ``uvloop.new_event_loop``);
    the library itself never installs one. ``start_timeout``: seconds :meth:`start`
    waits for the join (default: the peer's ``join_timeout_s`` twice, plus 5).
    :attr:`peer` is the :class:`Peer` itself, for coroutines given to :meth:`call`.

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
        # handlers and view callbacks given before start(): registered before the peer joins,
        # so that no message arrives before its handler
        self._early_handlers: list[tuple[str, Callable[..., Any]]] = []
        self._early_view_callbacks: list[Callable[[View], None]] = []

    # -- lifecycle

    def start(self) -> "SyncPeer":
        """Start the loop thread, join through the coordinator and wait for the first
        view; returns self. Raises what :meth:`Peer.start` raises (e.g.
        :class:`MembershipError` when no coordinator answers) with the thread ended."""
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
                # What is still running (a start or a call that Ctrl-C interrupted)
                # is cancelled and awaited, as asyncio.run does: a Peer.start
                # cancelled so closes its sockets.
                _cancel_all(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name="swarm-peer", daemon=True)
        self._thread.start()
        ready.wait()

        async def make() -> Peer:
            p = Peer(*self._args, **self._kwargs)
            for t, handler in self._early_handlers:
                p.on(t, handler)
            for callback in self._early_view_callbacks:
                p.on_view(callback)
            return p

        try:
            self.peer = self.call(make())
            # the join ends by the peer's own deadlines (welcome, then view); this one
            # only guards against a loop that stopped answering
            timeout = self._start_timeout or 2 * self.peer.config.join_timeout_s + 5.0
            self.call(self.peer.start(), timeout=timeout)
        except BaseException:
            self._closed = True
            self._stop_loop()
            raise
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Leave the swarm, close the peer and end its thread (idempotent).

        ``timeout``: seconds to wait for the peer to close. Re-raises a failure of
        the peer's background loops."""
        seconds(timeout, none_ok=True)
        self._refuse_on_own_thread("close()")
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

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = 30.0) -> T:
        """Run a coroutine on the peer's loop and wait for its result.

        ``timeout``: seconds (None: no deadline); past it the coroutine is cancelled
        and :class:`PeerTimeout` raised. An exception in the caller's thread while it
        waits (Ctrl-C) cancels the coroutine too.
        """
        if not asyncio.iscoroutine(coro):
            raise SwarmError(f"call() takes a coroutine, e.g. peer.call(gossip.round()); "
                             f"got {coro!r:.80}")
        try:
            self._refuse_on_own_thread("call()")
        except SwarmError:
            _discard(coro)
            raise
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
        try:
            done = concurrent.futures.wait([fut], timeout).done
        except BaseException:
            fut.cancel()
            raise
        if not done:
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
        """This peer's id (the ``id`` option, or host-pid)."""
        return self._peer().id

    @property
    def view(self) -> View:
        """The membership view installed last."""
        return self._peer().view

    @property
    def address(self) -> str:
        """The address this peer advertises to its neighbours."""
        return self._peer().address

    def neighbours(self) -> list[str]:
        """Neighbour ids in the current view ([] once closed)."""
        if self._closed:
            return []
        return self._peer().neighbours()

    def send(self, dst: str, t: str, body: dict[str, Any] | None = None,
             arrays: Sequence[np.ndarray] = (), *, timeout: float | None = None) -> bool:
        """:meth:`Peer.send` from the caller's thread.

        From a handler (on the peer's own thread, which cannot wait for itself) it
        does not wait: it is :meth:`Peer.send_nowait`, False when the queue is full.
        """
        seconds(timeout, none_ok=True)
        if self._on_own_thread():
            return self._peer().send_nowait(dst, t, body, arrays)
        return self.call(self._peer().send(dst, t, body, arrays, timeout=timeout),
                         timeout=(timeout or 0) + 10.0)

    def on(self, t: str, handler: Callable[..., Any]) -> None:
        """Register a handler, ``handler(msg)``, sync or async; it runs on the peer's
        thread, where :meth:`send` does not wait and the other blocking calls are refused.
        Given before :meth:`start`, it is in place before the peer joins."""
        if self._unstarted():
            check_handler_type(t, "SyncPeer")
            self._early_handlers.append((t, handler))
            return
        self._peer().on(t, handler)

    def on_view(self, callback: Callable[[View], None]) -> None:
        """Call ``callback(view)`` on the peer's thread each time a new view is installed
        (given before :meth:`start`, from the first view on)."""
        if self._unstarted():
            self._early_view_callbacks.append(callback)
            return
        self._peer().on_view(callback)

    def wait_linked(self, timeout: float | None = 5.0) -> None:
        """:meth:`Peer.wait_linked` from the caller's thread."""
        seconds(timeout, none_ok=True)
        self.call(self._peer().wait_linked(timeout), timeout=None if timeout is None else timeout + 5.0)

    def wait_view(self, predicate: Callable[[View], bool], timeout: float | None = 5.0) -> View:
        """:meth:`Peer.wait_view` from the caller's thread: wait until the view satisfies
        ``predicate`` (e.g. ``lambda view: len(view.members) >= 3``) and return it."""
        seconds(timeout, none_ok=True)
        return self.call(self._peer().wait_view(predicate, timeout),
                         timeout=None if timeout is None else timeout + 5.0)

    def _on_own_thread(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def _refuse_on_own_thread(self, what: str) -> None:
        if self._on_own_thread():
            raise SwarmError(f"SyncPeer.{what} from a handler or view callback, on the peer's own "
                             f"thread, would wait for itself; make the handler async and await "
                             f"the coroutine there (e.g. await peer.peer.wait_linked())")

    def _unstarted(self) -> bool:
        return self._thread is None and not self._closed

    def _peer(self) -> Peer:
        if self.peer is None:
            raise SwarmError(self._not_running())
        return self.peer

    def _not_running(self) -> str:
        return "SyncPeer is closed" if self._closed else "SyncPeer is not started"


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel every task left on ``loop`` (stopped, not closed) and wait for them."""
    tasks = asyncio.all_tasks(loop)
    if not tasks:
        return
    for t in tasks:
        t.cancel()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


def _discard(coro: Any) -> None:
    """Close a coroutine that will never run (no "was never awaited" warning)."""
    if asyncio.iscoroutine(coro):
        coro.close()
