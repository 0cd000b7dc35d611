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

A SyncPeer belongs to the process that started it: its loop thread does not exist
in a child made by ``os.fork()`` (``multiprocessing``'s "fork" start method), so
there every call, and :attr:`~SyncPeer.id`, :attr:`~SyncPeer.view` and
:attr:`~SyncPeer.address`, raises :class:`SwarmError` at once and
:meth:`SyncPeer.close` does nothing; start a new SyncPeer in the child.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
from typing import Any, Callable, Coroutine, Sequence, TypeVar

import numpy as np

from ..checks import seconds
from ..errors import ConfigError, PeerTimeout, SwarmError
from ..link import View
from .peer import Peer, PeerState, check_handler_type, check_plain

__all__ = ["SyncPeer"]

T = TypeVar("T")
log = logging.getLogger(__name__)

#: seconds between looks at the ``stop`` event of :meth:`SyncPeer.start`, and the longest
#: the caller's thread waits at once in a blocking call (see _wait)
STOP_POLL_S = 0.1
#: seconds :meth:`SyncPeer.call` waits, past its timeout, for the cancelled coroutine
#: to end (its ``finally`` blocks to run) before it raises PeerTimeout
CANCEL_GRACE_S = 2.0
#: the most seconds :meth:`SyncPeer.close` waits for the coordinator to confirm the
#: leave (:meth:`Peer.close`'s own default), less when its own timeout is short
LEAVE_WAIT_S = 1.0


def _wait(fut: concurrent.futures.Future, timeout: float | None) -> bool:
    """Wait for ``fut`` up to ``timeout`` seconds (None: no deadline); whether it is done.

    In waits of at most STOP_POLL_S: a signal that another thread took (the peer's loop
    thread, say) only flags its Python handler, which runs on the main thread when that
    next runs Python code. In one long wait, a Ctrl-C during a join waited out the join
    timeout before its handler ran."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = STOP_POLL_S if deadline is None else min(STOP_POLL_S, deadline - time.monotonic())
        if concurrent.futures.wait([fut], max(0.0, left)).done:
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False


async def _unless(coro: Coroutine[Any, Any, T], stop: threading.Event) -> T:
    """``coro``'s result, unless ``stop`` (set from another thread) is set first: then
    ``coro`` is cancelled and SwarmError raised."""
    task = asyncio.ensure_future(coro)
    try:
        while not task.done():
            if stop.is_set():
                task.cancel()
                await asyncio.wait([task])   # a cancelled Peer.start closes what it made
                if task.cancelled() or task.exception() is None:
                    raise SwarmError("the start was stopped before the peer joined")
                break
            await asyncio.wait([task], timeout=STOP_POLL_S)
    finally:
        task.cancel()   # this call itself cancelled (a timeout, a close): the start with it
    return task.result()


class SyncPeer:
    """Blocking facade over :class:`Peer`; arguments are those of ``Peer``.

    ``loop_factory`` picks the background loop (e.g. ``uvloop.new_event_loop``);
    the library itself never installs one. It must return a new loop, which the
    SyncPeer runs and closes: one already running or closed fails :meth:`start`
    with :class:`ConfigError`. ``start_timeout``: seconds :meth:`start`
    waits for the join (default: the peer's ``join_timeout_s`` twice, plus 5).
    :attr:`peer` is the :class:`Peer` itself, for coroutines given to :meth:`call`.

    After :meth:`close` (or a failed :meth:`start`, or its loop stopped by anything
    else) the loop is gone: calls raise :class:`SwarmError` ("SyncPeer is closed"),
    :meth:`neighbours` is [] and it cannot be started again.

    Threads: any thread may make calls, and :meth:`close` may come from any thread
    but the peer's own; a call that another thread's :meth:`close` cuts short raises
    :class:`SwarmError` (a :meth:`start` too, having closed what it had built).
    Concurrent :meth:`close` calls all return once it is closed.

    ``sys.exit()`` (SystemExit) or KeyboardInterrupt in a handler, a view callback or
    a coroutine given to :meth:`call` closes it: the peer leaves, and calls raise
    :class:`SwarmError` naming that error (a coroutine's caller gets the error itself).

    Processes: it works only in the process that started it. In a child made by
    ``os.fork()`` its loop thread does not exist: every call (:meth:`call`,
    :meth:`send`, :meth:`wait_view`, :meth:`on`, ...) raises :class:`SwarmError` at
    once (so do :attr:`id`, :attr:`view` and :attr:`address`, which would show
    the parent's copies), and :meth:`close` returns at once having touched nothing
    (the sockets are the parent's, and the parent's peer stays in the swarm). Start
    a new SyncPeer in the child.
    """

    def __init__(self, *args: Any, loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
                 start_timeout: float | None = None, **kwargs: Any) -> None:
        # checked here, not at start() (a loop_factory that was not callable hung start())
        if seconds(start_timeout, "start_timeout", none_ok=True) == 0:
            raise ConfigError("start_timeout = 0: must be > 0 seconds, or None (twice the join timeout, plus 5 s)")
        if loop_factory is not None and not callable(loop_factory):
            raise ConfigError(f"loop_factory = {loop_factory!r:.80}: must be a function that returns "
                              f"an event loop, e.g. uvloop.new_event_loop")
        self._args, self._kwargs = args, kwargs
        self._loop_factory = loop_factory   # None: asyncio.new_event_loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.peer: Peer | None = None
        self._start_timeout = start_timeout
        self._closed = False
        self._pid: int | None = None   # the process that started it (see _refuse_forked)
        # A SystemExit or KeyboardInterrupt raised on the peer's thread (in a handler,
        # a view callback or a coroutine given to call()) closes the SyncPeer: every call
        # then raises SwarmError naming it, and close() does too unless a call did.
        self._thread_error: BaseException | None = None
        self._thread_error_told = False
        # _lock orders start, close and the hand-over of coroutines to the loop: nothing
        # is handed over once the loop is told to stop, so none is left never to finish.
        # _close_lock makes a second close() wait for the first.
        self._lock = threading.Lock()
        self._close_lock = threading.Lock()
        # handlers and view callbacks given before start(): registered before the peer joins,
        # so that no message arrives before its handler
        self._early_handlers: list[tuple[str, Callable[..., Any]]] = []
        self._early_view_callbacks: list[Callable[[View], None]] = []
        self._handed = False   # the early ones are the peer's: on() from then goes to it (under _lock)

    # -- lifecycle

    def start(self, stop: threading.Event | None = None) -> "SyncPeer":
        """Start the loop thread, join through the coordinator and wait for the first
        view; returns self. Raises what :meth:`Peer.start` raises (e.g.
        :class:`MembershipError` when no coordinator answers) with the thread ended.

        ``stop``: an event that, set before the join is done (a signal handler sets it,
        say), gives the start up within :data:`STOP_POLL_S`: it closes what it had built
        and raises :class:`SwarmError`, as a :meth:`close` from another thread would.
        """
        if stop is not None and not callable(getattr(stop, "is_set", None)):
            raise ConfigError(f"start(stop={stop!r:.80}): must be an event that a signal handler or "
                              f"another thread sets, e.g. threading.Event(), or None")
        self._refuse_forked()
        with self._lock:
            if self._closed:
                raise SwarmError("SyncPeer is closed and cannot be restarted; make a new SyncPeer")
            if self._thread is not None:
                raise SwarmError("SyncPeer.start() called twice")
            self._pid = os.getpid()
            self._start_thread()

        async def make() -> Peer:
            # Kept at once, on the loop thread: a close() from another thread while the
            # Peer is built stops the loop, and the loop thread's clean-up closes it.
            self.peer = p = Peer(*self._args, **self._kwargs)
            # an on() from another thread while start() runs goes to the lists before this,
            # to the peer after (it was lost between the two, or raised "not running")
            with self._lock:
                self._handed = True
                handlers, callbacks = list(self._early_handlers), list(self._early_view_callbacks)
            for t, handler in handlers:
                p.on(t, handler)
            for callback in callbacks:
                p.on_view(callback)
            return p

        try:
            peer = self.call(make())
            # the join ends by the peer's own deadlines (welcome, then view); this one
            # only guards against a loop that stopped answering
            timeout = self._start_timeout
            if timeout is None:
                timeout = 2 * peer.config.join_timeout_s + 5.0
            try:
                self.call(peer.start() if stop is None else _unless(peer.start(), stop), timeout=timeout)
            except SwarmError:
                # closed meanwhile (the peer's start then says "closed while starting"): say by what
                if self._thread_error is not None:
                    raise self._refusal()
                if self._closed:
                    raise SwarmError("SyncPeer was closed from another thread while start() waited") from None
                raise
            if self._thread_error is not None:   # a view callback's SystemExit closed it meanwhile
                raise self._refusal()
        except BaseException:
            self._closed = True
            self._stop_loop()
            raise
        return self

    def _start_thread(self) -> None:
        """Start the loop thread and wait until its loop exists (with ``_lock`` held)."""
        ready = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            try:
                loop = (self._loop_factory or asyncio.new_event_loop)()
                if not isinstance(loop, asyncio.AbstractEventLoop):
                    raise TypeError(f"it returned {loop!r:.80}, not an asyncio event loop")
                if loop.is_running() or loop.is_closed():
                    # another thread's loop (another SyncPeer's, the caller's own): the
                    # clean-up below would cancel that thread's tasks
                    raise ConfigError(f"it returned an event loop that is already "
                                      f"{'running' if loop.is_running() else 'closed'}; "
                                      f"it must return a new loop on each call, e.g. asyncio.new_event_loop")
            except BaseException as e:   # reported by start() (SystemExit too: start() waits on ready)
                failed.append(e)
                ready.set()
                return
            asyncio.set_event_loop(loop)
            self._loop = loop
            ready.set()
            try:
                loop.run_forever()
            except BaseException as e:   # SystemExit or KeyboardInterrupt in a coroutine given to call()
                self._fail(e)
            finally:
                # Whoever stopped the loop (close(), a failed start, or anything else: a
                # handler that stops it), calls refuse from now on: the loop is closed below.
                with self._lock:
                    self._closed, self._loop = True, None
                # Not when run_forever() refused the loop because another thread ran (or
                # closed) it since the check above: its tasks are not this thread's to end.
                if not (loop.is_running() or loop.is_closed()):
                    self._clean_up(loop)

        self._thread = threading.Thread(target=run, name="swarm-peer", daemon=True)
        self._thread.start()
        ready.wait()
        if failed:
            self._thread.join()
            self._closed = True
            if self._loop_factory is None:
                # asyncio's own new_event_loop failed (a logging handler of the caller's that
                # raises in its "Using selector" record, say): no setting of the user's
                raise failed[0]
            raise ConfigError(f"loop_factory {self._loop_factory!r:.80} failed: {failed[0]}") from failed[0]

    def _clean_up(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the peer's thread, once its loop has stopped: close the peer, end what is
        left on the loop and close it."""
        if self._thread_error is not None and self.peer is not None:
            # Closed while its own task still runs, the peer leaves and closes
            # its sockets (left open, they hung the process at exit, in zmq's
            # context termination).
            _ended(loop, self.peer.close())
        # What is still running (a start or a call that Ctrl-C interrupted)
        # is cancelled and awaited, as asyncio.run does: a Peer.start
        # cancelled so closes its sockets.
        _cancel_all(loop)
        if self.peer is not None and self.peer.state is not PeerState.CLOSED:
            # Closed by nobody: a close() from another thread came while start()
            # built it (its context has an I/O thread), or cut its leave short.
            _ended(loop, self.peer.close())
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    def close(self, timeout: float = 5.0) -> None:
        """Leave the swarm, close the peer and end its thread (idempotent).

        ``timeout``: seconds to wait for the peer to close; the coordinator's
        confirmation of the leave is waited for half of it at most (and at most
        :data:`LEAVE_WAIT_S`), the sockets are closed without it. Past it (0: at once)
        the peer's thread closes the peer as it ends, and :class:`PeerTimeout` is raised
        only if the peer is not closed even then. Re-raises a failure of the peer's
        background loops. From another thread while calls wait, it cuts them short
        (they raise :class:`SwarmError`). In a child made by ``os.fork()``
        it does nothing: the peer, its sockets and its thread are the parent's."""
        seconds(timeout, none_ok=True)
        if self._forked():
            # before any lock: one that a parent's thread held at the fork is held for ever here
            log.debug("SyncPeer.close() in a forked child (pid %d) of its process %d: nothing to close here",
                      os.getpid(), self._pid)
            return
        self._refuse_on_own_thread("close()")
        with self._close_lock:
            with self._lock:
                self._closed = True
                peer = self.peer if self._loop is not None else None
            # The leave's confirmation gets half the deadline at most, the rest is for
            # closing the sockets: with the coordinator gone, Peer.close waits it all out.
            leave = LEAVE_WAIT_S if timeout is None else min(LEAVE_WAIT_S, timeout / 2)
            timed_out = False
            try:
                if peer is not None:
                    # no grace: _stop_loop cancels what is left and waits for it
                    self.call(peer.close(leave), timeout=timeout, cancel_grace=0)
            except PeerTimeout as e:
                if e is peer._failure:   # the peer's own failure, not this call's deadline
                    raise
                # the loop thread closes the peer as it ends: this is no error of a call
                # the user made ("call did not finish within 0 s")
                timed_out = True
            except SwarmError:
                # A start() that failed meanwhile (from another thread) stopped the loop:
                # that close is the one the loop thread makes, and _stop_loop waits for it.
                if self._loop is not None or self._thread_error is not None:
                    raise
            finally:
                self._stop_loop()
            if timed_out and peer.state is not PeerState.CLOSED:
                raise PeerTimeout(f"SyncPeer.close(): the peer did not close within {timeout} s, nor in the "
                                  f"5 s its thread was then given to end; that thread may still run")
            if self._thread_error is not None and not self._thread_error_told:
                raise self._refusal()

    def _stop_loop(self) -> None:
        # Under the lock: no call hands the loop a coroutine after its stop, which
        # would never run and leave that call waiting for ever. Only one caller stops it
        # (a second stop landed in the thread's final clean-up and broke it).
        with self._lock:
            loop, self._loop = self._loop, None
            if loop is not None:
                loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def __enter__(self) -> "SyncPeer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- calls

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = 30.0, *,
             cancel_grace: float = CANCEL_GRACE_S) -> T:
        """Run a coroutine on the peer's loop and wait for its result.

        ``timeout``: seconds (None: no deadline); past it the coroutine is cancelled,
        and once it has ended (run its ``finally`` blocks: a gossip round is then no
        longer running, so the next ``call(gossip.round())`` may start at once)
        :class:`PeerTimeout` is raised. A coroutine that ended by itself before the
        cancellation reached it (its last step still ran at the deadline), or that
        ended otherwise than cancelled, gives its result or its error, as with
        ``asyncio.wait_for``: its work is done. ``cancel_grace``: seconds to wait
        for that end; a coroutine that has not ended by then (it ignores or delays
        the cancellation) goes on running on the peer's loop, and the PeerTimeout
        says so. An exception in the caller's thread while it waits (Ctrl-C) cancels
        the coroutine too, and waits for it the same way before it propagates.
        """
        if not asyncio.iscoroutine(coro):
            raise SwarmError(f"call() takes a coroutine, e.g. peer.call(gossip.round()); "
                             f"got {coro!r:.80}")
        try:
            self._refuse_forked()
            self._refuse_on_own_thread("call()")
            seconds(timeout, none_ok=True)
            seconds(cancel_grace, "cancel_grace")
            with self._lock:
                if self._loop is None:
                    raise self._refusal()
                handed = _Handed(coro, self._loop)
        except SwarmError:
            _discard(coro)
            raise
        fut = handed.result
        # waited apart from the result: a PeerTimeout the coroutine raises is a
        # TimeoutError too, and it is the one to report
        try:
            done = _wait(fut, timeout)
        except BaseException:
            handed.cancel(cancel_grace)
            raise
        if not done:
            ended = handed.cancel(cancel_grace)
            # Ended by itself in the gap (the cancel came after its last step), its work is
            # done: its result stands. Thrown away, a round that had mixed the parameters
            # was reported as not done.
            if not fut.done() or fut.cancelled():
                if ended:
                    raise PeerTimeout(f"call did not finish within {timeout} s; it was cancelled and has ended")
                if cancel_grace == 0:
                    raise PeerTimeout(f"call did not finish within {timeout} s; it was cancelled")
                raise PeerTimeout(f"call did not finish within {timeout} s; it was cancelled but had not ended "
                                  f"{cancel_grace} s later, and may still run on the peer's loop")
        if fut.cancelled():
            if self._thread_error is not None:
                raise self._refusal()
            if self._closed:
                raise SwarmError("SyncPeer was closed from another thread while this call waited; "
                                 "the call was cancelled")
            raise SwarmError("the coroutine was cancelled on the peer's loop (by another task "
                             "there, not by SyncPeer)")
        elif self._thread_error is not None and fut.exception() is self._thread_error:
            self._thread_error_told = True   # this coroutine raised it: its caller gets it
        return fut.result()

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule a plain function on the peer's loop (fire and forget); an async
        one is refused with :class:`ConfigError` (give its coroutine to :meth:`call`)."""
        _check_callable(fn, "call_soon(fn)")
        check_plain(fn, "call_soon(fn)", ", or give the coroutine to call()")
        self._refuse_forked()
        with self._lock:
            if self._loop is None:
                raise self._refusal()
            self._loop.call_soon_threadsafe(fn, *args)

    # In a forked child these refuse too: what they would return is the parent's copy
    # as of the fork, stale from then on, for a peer the child cannot use.

    @property
    def id(self) -> str:
        """This peer's id (the ``id`` option, or host-pid)."""
        self._refuse_forked()
        return self._peer().id

    @property
    def view(self) -> View:
        """The membership view installed last."""
        self._refuse_forked()
        return self._peer().view

    @property
    def address(self) -> str:
        """The address this peer advertises to its neighbours."""
        self._refuse_forked()
        return self._peer().address

    def neighbours(self) -> list[str]:
        """Neighbour ids in the current view ([] once closed)."""
        self._refuse_forked()
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
        Given before :meth:`start`, it is in place before the peer joins; :meth:`off`
        takes it off."""
        _check_callable(handler, f"on({t!r}, handler)")
        self._refuse_forked()
        with self._lock:
            if self._early():
                check_handler_type(t, "SyncPeer")
                self._early_handlers.append((t, _Guarded(handler, self)))
                return
        self._refuse_closed()   # the closed peer would take it and never call it
        # on the peer's thread, as off(): the peer's lists are replaced, not changed in place,
        # and two threads registering at once would each replace the other's
        self._on_loop(lambda: self._peer().on(t, _Guarded(handler, self)))

    def off(self, t: str, handler: Callable[..., Any]) -> bool:
        """Stop calling ``handler`` for messages of type ``t`` (undo one :meth:`on`);
        False if it was not registered for ``t``. After :meth:`close` it still
        answers (though nothing is called any more)."""
        self._refuse_forked()
        with self._lock:
            if not self._handed:
                return _remove(self._early_handlers, (t, _Guarded(handler, self)))
        return self._on_loop(lambda: self._peer().off(t, _Guarded(handler, self)))

    def on_view(self, callback: Callable[[View], None]) -> None:
        """Call ``callback(view)``, a plain function, on the peer's thread each time a new
        view is installed (given before :meth:`start`, from the first view on);
        :meth:`off_view` takes it off."""
        _check_callable(callback, "on_view(callback)")
        check_plain(callback, "on_view(callback)")
        self._refuse_forked()
        with self._lock:
            if self._early():
                self._early_view_callbacks.append(_Guarded(callback, self))
                return
        self._refuse_closed()
        self._on_loop(lambda: self._peer().on_view(_Guarded(callback, self)))   # see on()

    def off_view(self, callback: Callable[[View], None]) -> bool:
        """Stop calling ``callback`` for new views (undo one :meth:`on_view`); False if
        it was not registered."""
        self._refuse_forked()
        with self._lock:
            if not self._handed:
                return _remove(self._early_view_callbacks, _Guarded(callback, self))
        return self._on_loop(lambda: self._peer().off_view(_Guarded(callback, self)))

    def wait_linked(self, timeout: float | None = 5.0) -> None:
        """:meth:`Peer.wait_linked` from the caller's thread."""
        seconds(timeout, none_ok=True)
        self.call(self._peer().wait_linked(timeout), timeout=None if timeout is None else timeout + 5.0)

    def wait_view(self, predicate: Callable[[View], bool], timeout: float | None = 5.0) -> View:
        """:meth:`Peer.wait_view` from the caller's thread: wait until the view satisfies
        ``predicate``, a plain function (e.g. ``lambda view: len(view.members) >= 3``),
        and return it."""
        _check_callable(predicate, "wait_view(predicate)")
        check_plain(predicate, "wait_view(predicate)")
        seconds(timeout, none_ok=True)
        return self.call(self._peer().wait_view(predicate, timeout),
                         timeout=None if timeout is None else timeout + 5.0)

    def _forked(self) -> bool:
        """Whether this is a child, made by ``os.fork()``, of the process that started it."""
        return self._pid is not None and os.getpid() != self._pid

    def _refuse_forked(self) -> None:
        # checked before any lock is taken: one that a thread of the parent held at the
        # fork stays held for ever in the child, where that thread does not exist
        if self._forked():
            raise SwarmError(f"this SyncPeer was started in process {self._pid}; a forked child "
                             f"(process {os.getpid()}) cannot use it, as its loop thread runs only "
                             f"in the parent: start a new SyncPeer in the child")

    def _on_own_thread(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def _refuse_on_own_thread(self, what: str) -> None:
        if self._on_own_thread():
            raise SwarmError(f"SyncPeer.{what} from a handler or view callback, on the peer's own "
                             f"thread, would wait for itself; make the handler async and await "
                             f"the coroutine there (e.g. await peer.peer.wait_linked())")

    def _on_loop(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the peer's thread, where the peer changes its handler lists
        (at once when called there, or when the loop is gone)."""
        if self._on_own_thread() or self._loop is None:
            return fn()

        async def run() -> T:
            return fn()
        return self.call(run())

    def _refuse_closed(self) -> None:
        if self._closed:
            raise self._refusal()

    def _early(self) -> bool:
        """(Under _lock.) Whether a handler given now waits in the early lists: before
        start(), and while start() builds the peer, which takes them in."""
        return not self._handed and not self._closed

    def _peer(self) -> Peer:
        if self.peer is None:
            raise SwarmError(self._not_running())
        return self.peer

    def _not_running(self) -> str:
        if self._thread_error is not None:
            return (f"SyncPeer is closed: {self._thread_error!r} was raised on the peer's thread "
                    f"(in a handler, a view callback or a coroutine given to call())")
        return "SyncPeer is closed" if self._closed else "SyncPeer is not started"

    def _refusal(self) -> SwarmError:
        """The error for a call that finds the loop gone; it reports what ended the
        loop thread, if anything did, so that close() need not again."""
        error = SwarmError(self._not_running())
        if self._thread_error is not None:
            self._thread_error_told = True
            error.__cause__ = self._thread_error
        return error

    def _fail(self, error: BaseException) -> asyncio.AbstractEventLoop | None:
        """On the peer's thread: ``error`` ends the SyncPeer. No call hands the loop
        work from now on; returns the loop if it was still to be stopped."""
        log.error("SyncPeer: %r raised on the peer's thread; closing the peer", error)
        with self._lock:
            if self._thread_error is None:
                self._thread_error = error
            self._closed = True
            loop, self._loop = self._loop, None
        return loop


class _Handed:
    """A coroutine handed, from a caller's thread, to the peer's loop as a task.

    Unlike the future of ``asyncio.run_coroutine_threadsafe``, which says "cancelled"
    as soon as it is asked to cancel while the task still runs its clean-up, this
    lets the caller wait until the task has really ended (:meth:`cancel`).
    """

    def __init__(self, coro: Coroutine[Any, Any, Any], loop: asyncio.AbstractEventLoop) -> None:
        self.result: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.ended = threading.Event()
        self._coro, self._loop = coro, loop
        self._task: asyncio.Task[Any] | None = None
        loop.call_soon_threadsafe(self._begin)

    def _begin(self) -> None:   # on the loop
        self._task = self._loop.create_task(self._coro)
        self._task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:   # on the loop
        try:
            if task.cancelled():
                self.result.cancel()
            # what wakes concurrent.futures.wait() on a cancelled future (cancel() alone does not)
            if not self.result.set_running_or_notify_cancel():
                return
            if task.exception() is not None:
                self.result.set_exception(task.exception())
            else:
                self.result.set_result(task.result())
        finally:
            self.ended.set()   # last: whoever sees it ended finds its result set

    def _cancel(self) -> None:   # on the loop
        # _begin was handed over first, so it has run by now (loop callbacks run in order)
        if self._task is not None:
            self._task.cancel()

    def cancel(self, grace: float) -> bool:
        """From the caller's thread: cancel the task and wait up to ``grace`` seconds
        for it to end; whether it has ended."""
        try:
            self._loop.call_soon_threadsafe(self._cancel)
        except RuntimeError:   # the loop is closed: its thread cancelled and awaited every task
            pass
        return self.ended.wait(grace)


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel every task left on ``loop`` (stopped, not closed) and wait for them,
    also those started meanwhile (by calls handed over before the loop stopped)."""
    tasks = asyncio.all_tasks(loop)
    while tasks:
        for t in tasks:
            t.cancel()
        _ended(loop, asyncio.gather(*tasks, return_exceptions=True))
        left = asyncio.all_tasks(loop)
        if left == tasks:   # they will not end: loop.close() warns of them
            return
        tasks = left


def _ended(loop: asyncio.AbstractEventLoop, aw: Any) -> None:
    """Run ``aw`` to its end on ``loop`` (stopped, not closed), whatever it raises.

    For the clean-up at the end of the loop thread, where nobody is left to catch:
    a task that ended with SystemExit raises it again out of the loop each time it
    is awaited, and that error is in ``SyncPeer._thread_error`` already."""
    try:
        loop.run_until_complete(aw)
    except BaseException:
        pass


class _Guarded:
    """A handler or view callback as SyncPeer registers it with the peer.

    The peer catches what a handler raises, but not SystemExit or KeyboardInterrupt
    (``sys.exit()`` in a handler): those tore the loop down under the peer, left
    every call waiting for ever and the peer's sockets open. Here they close the
    SyncPeer instead. Equal to another wrapping the same function, so that
    :meth:`Peer.off` finds it.
    """

    def __init__(self, fn: Callable[..., Any], owner: SyncPeer) -> None:
        self.fn, self.owner = fn, owner

    def __call__(self, *args: Any) -> Any:
        try:
            r = self.fn(*args)
        except (SystemExit, KeyboardInterrupt) as e:
            self._stop(e)
            return None
        return self._awaited(r) if asyncio.iscoroutine(r) else r

    async def _awaited(self, coro: Coroutine[Any, Any, Any]) -> Any:
        try:
            return await coro
        except (SystemExit, KeyboardInterrupt) as e:
            self._stop(e)
            return None

    def _stop(self, error: BaseException) -> None:
        loop = self.owner._fail(error)
        if loop is not None:
            loop.stop()   # the loop thread then closes the peer (SyncPeer.start's run())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Guarded) and other.fn == self.fn and other.owner is self.owner


def _check_callable(fn: Any, what: str) -> None:
    if not callable(fn):
        raise ConfigError(f"{what}: {fn!r:.80} is not callable; pass a function")


def _remove(items: list[Any], item: Any) -> bool:
    """Take the first ``item`` out of ``items``; False if it is not there."""
    if item not in items:
        return False
    items.remove(item)
    return True


def _discard(coro: Any) -> None:
    """Close a coroutine that will never run (no "was never awaited" warning)."""
    if asyncio.iscoroutine(coro):
        coro.close()
