"""SyncPeer from a user's blocking program: Ctrl-C in the middle of a call or of
start() ends everything it started, quietly; start() waits as long as the peer's
own join deadlines; calls refuse what is not a coroutine; wait_view blocks."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from swarmtest import ROOT, free_port, status, wait_for

from swarm.config import PeerConfig
from swarm.errors import MembershipError, SwarmError
from swarm.peer import SyncPeer

# What asyncio and the interpreter print when a loop is torn down under running tasks.
NOISE = ("Task was destroyed", "Event loop is closed", "never awaited", "Exception ignored")


def _peer_threads() -> list[str]:
    """SyncPeer's threads still running (other threads of this process may be pyzmq's
    own, such as the one that frees zero-copy frames, started by earlier tests)."""
    return [t.name for t in threading.enumerate() if t.name == "swarm-peer"]


@pytest.fixture
def coordinator(procs) -> str:
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs.start("coordinator", "--bind", addr, name="coord")
    wait_for(lambda: status(addr), 10, what="coordinator up")
    return addr


def _interrupt(script: str, *args: str) -> tuple[str, float]:
    """Run ``script`` in a fresh interpreter, Ctrl-C it once it prints "ready";
    returns its output and how long it took to exit after the signal."""
    # a process started in the background may inherit SIGINT ignored: take it back
    code = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n" + textwrap.dedent(script)
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, cwd=ROOT)
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.5)   # inside the blocking call by now
        p.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        out = p.communicate(timeout=10)[0]
        return out, time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_ctrl_c_during_start_closes_the_half_started_peer():
    out, took = _interrupt("""
        import sys, threading
        from swarm.peer import SyncPeer
        p = SyncPeer(coordinators=[sys.argv[1]], join_timeout_s=30)
        print("ready", flush=True)
        try:
            p.start()
        finally:
            print("threads", sorted(t.name for t in threading.enumerate()), flush=True)
    """, f"tcp://127.0.0.1:{free_port()}")   # no coordinator there: start() waits
    assert took < 5, out
    assert "KeyboardInterrupt" in out and "threads ['MainThread']" in out, out
    assert not [n for n in NOISE if n in out], out


def test_ctrl_c_during_a_call_cancels_it_and_leaves(coordinator):
    out, took = _interrupt("""
        import asyncio, sys, threading
        from swarm.peer import SyncPeer

        async def long_job():
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                print("job cancelled", flush=True)
                raise

        try:
            with SyncPeer(coordinators=[sys.argv[1]], id="u") as peer:
                print("ready", flush=True)
                peer.call(long_job(), timeout=None)
        finally:
            print("threads", sorted(t.name for t in threading.enumerate()), flush=True)
    """, coordinator)
    assert took < 5, out
    assert "job cancelled" in out and "threads ['MainThread']" in out, out
    assert not [n for n in NOISE if n in out], out
    # it left: the coordinator dropped it from the view
    wait_for(lambda: not status(coordinator)["view"]["members"], 5, what="the peer gone from the view")


def test_start_waits_as_long_as_the_peers_join_deadline():
    # join_timeout_s given in a PeerConfig, not as a keyword: the join's own error
    # comes, not a PeerTimeout from a shorter deadline of SyncPeer's
    cfg = PeerConfig(coordinators=[f"tcp://127.0.0.1:{free_port()}"], join_timeout_s=10.5)
    p = SyncPeer(config=cfg)
    with pytest.raises(MembershipError, match="no coordinator answered"):
        p.start()
    assert not _peer_threads()


def test_call_takes_coroutines_and_wait_view_blocks(coordinator):
    with SyncPeer(coordinators=[coordinator], id="a") as a, SyncPeer(coordinators=[coordinator], id="b") as b:
        view = a.wait_view(lambda v: len(v.members) == 2, timeout=10)
        assert view.ids == ["a", "b"] and a.view == view
        with pytest.raises(SwarmError, match=r"call\(\) takes a coroutine, e.g. peer.call\(gossip.round\(\)\)"):
            a.call(asyncio.sleep)                   # the function, not a call of it
        assert a.call(asyncio.sleep(0, "ok")) == "ok"
        b.close()
        assert a.wait_view(lambda v: v.ids == ["a"], timeout=10).ids == ["a"]
    assert not _peer_threads()


def test_a_handler_replies_with_send_and_is_refused_a_blocking_call(coordinator):
    # Handlers run on the peer's thread: a blocking call there would wait for itself
    # (the reply went out only after the call's 10 s deadline, and the loop was stuck).
    with SyncPeer(coordinators=[coordinator], id="a") as a, SyncPeer(coordinators=[coordinator], id="b") as b:
        replies: list[dict] = []
        refused: list[str] = []

        def on_ask(msg):
            assert b.send(msg.src, "answer", {"n": msg.body["n"]})
            try:
                b.wait_linked()
            except SwarmError as e:
                refused.append(str(e))

        b.on("ask", on_ask)
        a.on("answer", lambda msg: replies.append(msg.body))
        a.wait_view(lambda v: len(v.members) == 2, timeout=10)
        a.wait_linked()
        b.wait_linked()
        t0 = time.monotonic()
        assert a.send("b", "ask", {"n": 1}, timeout=1)
        wait_for(lambda: replies, 3, what="the reply")
        assert replies == [{"n": 1}] and time.monotonic() - t0 < 3
        assert len(refused) == 1 and "on the peer's own thread, would wait for itself" in refused[0]
        assert b.peer.counters.malformed == 0


def test_handlers_given_before_start_are_in_place_when_it_joins(coordinator):
    # SyncPeer.on() before start() raised "not started"; after start() a message that
    # a neighbour sent at once could arrive before the handler and be dropped
    from swarm.errors import WireError

    b = SyncPeer(coordinators=[coordinator], id="b")
    got: list[dict] = []
    views: list[int] = []
    b.on("hi", lambda msg: got.append(msg.body))
    b.on_view(lambda view: views.append(len(view.members)))
    with pytest.raises(WireError, match="'hello' is a swarm protocol type"):
        b.on("hello", print)                   # checked at once, as Peer.on does
    with SyncPeer(coordinators=[coordinator], id="a") as a, b:
        assert views and views[0] >= 1         # called from the first view on
        a.wait_view(lambda v: len(v.members) == 2, timeout=10)
        a.wait_linked()
        assert a.send("b", "hi", {"x": 1}, timeout=2.0)
        wait_for(lambda: got, 5, what="the message at b's early handler")
        assert got == [{"x": 1}]
    assert not _peer_threads()
