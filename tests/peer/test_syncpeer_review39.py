"""SyncPeer at its edges: a loop_factory whose loop is not SyncPeer's to run, a loop
that something else stops, close() while a start fails, a coroutine cancelled on the
peer's loop, a close() deadline shorter than the leave's, off() in a forked child."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import threading

import pytest
# a coordinator process for in-process peers (tests/ is on the path)
from peer.test_syncpeer import _peer_threads, coordinator  # noqa: F401 - a fixture
from peer.test_syncpeer_cancel_fork import in_child
from swarmtest import free_port, wait_for

from swarm.errors import ConfigError, SwarmError
from swarm.peer import PeerState, SyncPeer

#: seconds a forked child may take before SIGALRM ends it (a call there that hangs)
CHILD_ALARM_S = 10


@pytest.fixture
def thread_errors(monkeypatch) -> list[BaseException]:
    """What any thread let escape (printed as a traceback, lost to the caller)."""
    seen: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    return seen


@pytest.fixture
def foreign_loop():
    """An event loop running on a thread of its own (another SyncPeer's, an app's), with a
    task of its own on it; stopped and closed by handle at the end."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="foreign-loop", daemon=True)
    thread.start()
    running = threading.Event()

    async def victim_task() -> None:
        running.set()
        await asyncio.sleep(3600)
    victim = asyncio.run_coroutine_threadsafe(victim_task(), loop)
    try:
        assert running.wait(10)
        yield loop, victim
    finally:
        victim.cancel()
        concurrent.futures.wait([victim], 10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_a_loop_factory_that_returns_a_running_loop_is_refused_and_that_loop_left_alone(
        foreign_loop, thread_errors):
    """Before the fix the type was all that was checked: run_forever() refused the loop on
    the peer's thread, whose clean-up then cancelled every task of that loop from the wrong
    thread and died with a traceback; start() blamed "a handler, a view callback or a
    coroutine"."""
    loop, victim = foreign_loop
    p = SyncPeer(coordinators=[f"tcp://127.0.0.1:{free_port()}"], loop_factory=lambda: loop, start_timeout=5)
    with pytest.raises(ConfigError, match="loop_factory .* failed: .*already running"):
        p.start()
    assert not victim.cancelled() and not victim.done()   # the other loop's own task runs on
    assert loop.is_running()
    assert not thread_errors and not _peer_threads()
    with pytest.raises(SwarmError, match="SyncPeer is closed"):
        p.call(asyncio.sleep(0))


def test_a_loop_factory_that_returns_a_closed_loop_is_refused(thread_errors):
    """Before the fix run_forever() raised on the peer's thread, whose clean-up died on
    the closed loop with a traceback; start() raised no ConfigError."""
    loop = asyncio.new_event_loop()
    loop.close()
    p = SyncPeer(coordinators=[f"tcp://127.0.0.1:{free_port()}"], loop_factory=lambda: loop, start_timeout=5)
    with pytest.raises(ConfigError, match="loop_factory .* failed: .*closed"):
        p.start()
    assert not thread_errors and not _peer_threads()


def test_a_loop_stopped_by_something_else_leaves_a_closed_syncpeer(coordinator):
    """Before the fix the loop thread closed the peer and the loop but left SyncPeer
    pointing at that closed loop: call() and close() raised a raw RuntimeError("Event loop
    is closed"), and close() (so a with block's exit) never succeeded."""
    p = SyncPeer(coordinators=[coordinator], id="a").start()
    try:
        p.call_soon(lambda: asyncio.get_running_loop().stop())
        wait_for(lambda: not p._thread.is_alive(), 10, what="the peer's thread ended")
        assert p.peer.state is PeerState.CLOSED
        with pytest.raises(SwarmError, match="SyncPeer is closed"):
            p.call(asyncio.sleep(0))
        with pytest.raises(SwarmError, match="SyncPeer is closed"):
            p.call_soon(print)
        assert p.neighbours() == []
    finally:
        p.close()
    p.close()   # idempotent
    assert not _peer_threads()


def test_close_while_a_start_fails_returns(coordinator):
    """Before the fix close() let go of the lock between reading the peer and handing its
    close over; a start() that failed in that gap stopped the loop, and close() raised
    SwarmError("SyncPeer is closed") instead of returning. The gap is widened here by
    holding this instance's close() back until the start has failed."""
    stop = threading.Event()
    p = SyncPeer(coordinators=[f"tcp://127.0.0.1:{free_port()}"], join_timeout_s=30, start_timeout=60)
    real_call = p.call

    def held_call(coro, *args, **kwargs):
        if getattr(coro, "__qualname__", "") == "Peer.close":
            stop.set()   # the start gives up (a signal handler set its event) ...
            # ... and stops the loop, while close() is between its two holds of the lock
            wait_for(lambda: p._loop is None, 10, what="the failed start stopped the loop")
        return real_call(coro, *args, **kwargs)
    p.call = held_call

    started: list[BaseException] = []

    def start() -> None:
        try:
            p.start(stop=stop)
        except BaseException as e:
            started.append(e)
    t = threading.Thread(target=start)
    t.start()
    try:
        wait_for(lambda: p.peer is not None and p.peer.state is PeerState.JOINING, 10,
                 what="start() waiting for the join")
        p.close()
    finally:
        stop.set()
        t.join(30)
    assert not t.is_alive()
    assert len(started) == 1 and isinstance(started[0], SwarmError)
    assert p.peer.state is PeerState.CLOSED and not _peer_threads()


async def _cancelled_inside() -> None:
    # another task cancels what this coroutine awaits
    fut = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(fut.cancel)
    await fut


def test_a_coroutine_cancelled_on_the_peers_loop_is_a_swarm_error(coordinator):
    """Before the fix the caller got concurrent.futures.CancelledError, no SwarmError."""
    with SyncPeer(coordinators=[coordinator], id="a") as p:
        with pytest.raises(SwarmError, match="the coroutine was cancelled on the peer's loop"):
            p.call(_cancelled_inside(), timeout=30)
        assert p.call(asyncio.sleep(0, "ok")) == "ok"   # the peer goes on


def test_close_with_a_short_timeout_and_the_coordinator_gone_returns(procs):
    """Before the fix the timeout was not passed on to Peer.close, which waited its own 1 s
    for the leave's confirmation: close(timeout=0.5) raised PeerTimeout, although the peer
    ended closed all the same."""
    addr = f"tcp://127.0.0.1:{free_port()}"
    coord = procs.coordinator(addr)
    p = SyncPeer(coordinators=[addr], id="a").start()
    try:
        coord.terminate()
        coord.wait(10)
        p.close(timeout=0.5)
    finally:
        p.close()
    assert p.peer.state is PeerState.CLOSED and not _peer_threads()


def _off_with_the_lock_held(p: SyncPeer, w: int) -> None:
    """In the forked child: off() and off_view(); report each outcome through ``w``."""
    signal.alarm(CHILD_ALARM_S)   # a call that hangs ends the child, its report unwritten
    out = []
    for what, fn in (("off", lambda: p.off("x", print)), ("off_view", lambda: p.off_view(print))):
        try:
            out.append(f"{what}: returned {fn()}")
        except SwarmError as e:
            out.append(f"{what}: SwarmError: {e}")
    os.write(w, "\n".join(out).encode())


def test_off_in_a_forked_child_is_refused_at_once_with_the_lock_held_at_the_fork(coordinator):
    """Before the fix off() and off_view() took the SyncPeer's lock before the fork check:
    one that a parent's thread held at the fork stays held in the child, and they hung."""
    with SyncPeer(coordinators=[coordinator], id="a") as p:
        p.on("x", print)
        held, release = threading.Event(), threading.Event()

        def holder() -> None:   # a parent's thread inside a call's hand-over at the fork
            with p._lock:
                held.set()
                release.wait(30)
        t = threading.Thread(target=holder)
        t.start()
        try:
            held.wait(10)
            report = in_child(lambda w: _off_with_the_lock_held(p, w))
        finally:
            release.set()
            t.join(30)
        for what in ("off", "off_view"):
            assert f"{what}: SwarmError: this SyncPeer was started in process {os.getpid()}" in report, report
        assert p.off("x", print)   # the parent's own still works
