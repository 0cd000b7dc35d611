"""SyncPeer.call past its timeout raises PeerTimeout only once the cancelled
coroutine has ended (so the usual retry, the next gossip round at once, may start);
and a SyncPeer in a child made by os.fork() refuses every call at once, with an
error that says why, while close() there touches nothing of the parent's."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import numpy as np
import pytest
# a coordinator process for in-process peers (tests/ is on the path)
from peer.test_syncpeer import coordinator  # noqa: F401 - a fixture
from swarmtest import wait_for

from swarm.errors import PeerTimeout, SwarmError
from swarm.gossip import Gossip, RoundResult
from swarm.peer import PeerState, SyncPeer

#: seconds a forked child has to try every call and exit
CHILD_DEADLINE_S = 60


def test_a_timed_out_call_has_run_its_clean_up_when_peertimeout_comes(coordinator):
    cleaned = threading.Event()

    async def slow_to_cancel() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.5)   # clean-up that awaits, as a gossip round's does
            cleaned.set()

    with SyncPeer(coordinators=[coordinator], id="a") as a:
        with pytest.raises(PeerTimeout, match="it was cancelled and has ended"):
            a.call(slow_to_cancel(), timeout=0.2)
        # at once: before the fix the task had not even been told to stop yet
        assert cleaned.is_set()


def test_a_call_that_does_not_end_within_the_grace_says_so(coordinator):
    release = asyncio.Event()
    ended = threading.Event()

    async def ignores_cancel() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await release.wait()   # holds on until the test lets it go
        ended.set()

    with SyncPeer(coordinators=[coordinator], id="a") as a:
        with pytest.raises(PeerTimeout, match="had not ended 0.2 s later, and may still run"):
            a.call(ignores_cancel(), timeout=0.2, cancel_grace=0.2)
        assert not ended.is_set()
        a.call_soon(release.set)
        wait_for(ended.is_set, 10, what="the coroutine ended once released")
        with pytest.raises(SwarmError, match="cancel_grace"):
            a.call(asyncio.sleep(0), cancel_grace=-1)


def test_the_next_gossip_round_may_start_right_after_a_timed_out_one(coordinator):
    with SyncPeer(coordinators=[coordinator], id="a", heartbeat_s=0.2) as a, \
            SyncPeer(coordinators=[coordinator], id="b", heartbeat_s=0.2):
        a.wait_view(lambda v: len(v.members) == 2, timeout=10)

        async def build() -> Gossip:
            return Gossip(a.peer, np.ones(100, np.float32), topology="ring", sync="lockstep",
                          round_timeout=2.0)
        g = a.call(build())
        try:
            with pytest.raises(PeerTimeout):
                a.call(g.round(), timeout=0.2)   # b runs no round: a waits for it
            # before the fix: GossipError "a round is already running on this gossip engine"
            assert isinstance(a.call(g.round(), timeout=30), RoundResult)
        finally:
            a.call_soon(g.close)   # on the peer's thread, where its handlers are


def _child(a: SyncPeer, w: int) -> None:
    """In the forked child: try what needs the loop; report each outcome through ``w``."""
    out = []

    def attempt(what: str, fn) -> None:
        try:
            fn()
            out.append(f"{what}: returned")
        except BaseException as e:   # noqa: BLE001 - reported to the parent
            out.append(f"{what}: {type(e).__name__}: {e}")

    attempt("send", lambda: a.send("b", "x", {"from": "child"}, timeout=0.5))
    attempt("call", lambda: a.call(asyncio.sleep(0), timeout=1))
    attempt("wait_view", lambda: a.wait_view(lambda v: True, timeout=0.5))
    attempt("call_soon", lambda: a.call_soon(print))
    attempt("on", lambda: a.on("y", print))
    attempt("close", a.close)
    os.write(w, "\n".join(out).encode())


def in_child(child) -> str:
    """Fork; in the child run ``child(w)``, which writes its report to the pipe ``w``, and
    exit; return that report. The child is reaped (killed by its pid if it overstays)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            child(w)
        finally:
            os._exit(0)
    os.close(w)
    try:
        deadline = time.monotonic() + CHILD_DEADLINE_S
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                pytest.fail(f"the forked child did not exit within {CHILD_DEADLINE_S} s")
            time.sleep(0.05)
        pid = 0   # reaped
        return os.read(r, 1 << 16).decode()
    finally:
        os.close(r)
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def test_a_forked_child_is_refused_at_once_and_its_close_leaves_the_parent_be(coordinator):
    got = []
    with SyncPeer(coordinators=[coordinator], id="a", heartbeat_s=0.2) as a, \
            SyncPeer(coordinators=[coordinator], id="b", heartbeat_s=0.2) as b:
        a.wait_view(lambda v: len(v.members) == 2, timeout=10)
        b.on("x", lambda msg: got.append(msg.body["from"]))
        report = in_child(lambda w: _child(a, w))
        refusal = f"SwarmError: this SyncPeer was started in process {os.getpid()}; a forked child"
        for what in ("send", "call", "wait_view", "call_soon", "on"):
            # before the fix: PeerTimeout after the call's own timeout (10.5 s for a send)
            assert f"{what}: {refusal}" in report, report
        assert "close: returned" in report, report
        # the parent's peer is still in the swarm and still sends
        assert a.peer.state is PeerState.RUNNING
        assert a.send("b", "x", {"from": "parent"}, timeout=5)
        wait_for(lambda: got == ["parent"], 10, what="b got the parent's message")


def test_a_signal_that_another_thread_takes_still_stops_a_start_in_the_main_thread():
    """`swarm peer` waits for its join in SyncPeer.start on the main thread. A SIGINT that
    another thread took (the peer's loop thread, under load) only flags the Python handler,
    which runs when the main thread next runs Python code: in one long wait, that was
    after the join timeout, and the start ended on it, not on the stop (seen in a full run:
    'still joining 30 s after Ctrl-C')."""
    import socket

    from swarm.experiment.runner import stop_on_signals

    assert threading.current_thread() is threading.main_thread()
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    silent = socket.create_server(("127.0.0.1", 0))   # takes the connection, never answers
    try:
        stop = stop_on_signals()
        sp = SyncPeer(coordinators=[f"tcp://127.0.0.1:{silent.getsockname()[1]}"], join_timeout_s=20.0)

        def signal_on_this_thread() -> None:
            time.sleep(0.5)
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)

        t = threading.Thread(target=signal_on_this_thread)
        t.start()
        try:
            with pytest.raises(SwarmError, match="the start was stopped before the peer joined"):
                sp.start(stop=stop)   # without the stop: a MembershipError after 2 x 20 + 5 s
            assert stop.is_set()
        finally:
            t.join()
            sp.close()
    finally:
        silent.close()
        for s, h in before.items():
            signal.signal(s, h)
