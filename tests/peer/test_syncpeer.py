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
from swarm.errors import ConfigError, MembershipError, SwarmError
from swarm.peer import PeerState, SyncPeer

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


@pytest.mark.timeout(60)
def test_start_gives_up_once_its_stop_event_is_set():
    """start(stop=event): an event a signal handler sets, set while the join waits for a
    coordinator that is not up, ends the start (SwarmError) with what it built closed,
    not join_timeout_s later (`swarm peer --spec` sat out its join timeout after Ctrl-C)."""
    p = SyncPeer(config=PeerConfig(coordinators=[f"tcp://127.0.0.1:{free_port()}"], join_timeout_s=60))
    stop = threading.Event()
    errors: list[BaseException] = []

    def start() -> None:
        try:
            p.start(stop=stop)
        except BaseException as e:   # checked below
            errors.append(e)

    starter = threading.Thread(target=start)
    starter.start()
    try:
        wait_for(lambda: errors or (p.peer is not None and p.peer.state is PeerState.JOINING), 30,
                 what="the join")
        assert not errors, errors
        stop.set()
        starter.join(30)    # well under the join's 60 s
        assert not starter.is_alive()
    finally:
        stop.set()
        if starter.is_alive():
            p.close()
            starter.join(30)
    assert len(errors) == 1 and type(errors[0]) is SwarmError, errors
    assert "stopped before the peer joined" in str(errors[0])
    assert p.peer.state is PeerState.CLOSED and p.peer._ctx.closed
    assert _peer_threads() == []


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
        # the refusal comes on b's thread after its send: the reply may reach a first
        wait_for(lambda: replies and refused, 3, what="the reply and the refusal")
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


# -- misuse: each is refused with an error that names it, and leaves nothing running


@pytest.mark.timeout(20)   # a loop_factory that failed hung start() for ever
def test_bad_constructor_arguments_are_refused_and_leave_no_thread():
    addr = f"tcp://127.0.0.1:{free_port()}"
    # checked when it is made (they were taken, and failed or hung only in start())
    with pytest.raises(ConfigError, match="start_timeout = 'soon'"):
        SyncPeer(coordinators=[addr], start_timeout="soon")
    with pytest.raises(ConfigError, match="start_timeout = -1"):
        SyncPeer(coordinators=[addr], start_timeout=-1)
    with pytest.raises(ConfigError, match="start_timeout = 0: must be > 0"):   # it meant the default once
        SyncPeer(coordinators=[addr], start_timeout=0)
    with pytest.raises(ConfigError, match="loop_factory = 'uvloop': must be a function"):
        SyncPeer(coordinators=[addr], loop_factory="uvloop")

    # a factory that fails, or returns what is not a loop, fails start() and ends the thread
    def broken():
        raise OSError("no loop for you")
    p = SyncPeer(coordinators=[addr], loop_factory=broken)
    with pytest.raises(ConfigError, match="loop_factory .* failed: no loop for you"):
        p.start()
    with pytest.raises(SwarmError, match="SyncPeer is closed and cannot be restarted"):
        p.start()
    with pytest.raises(ConfigError, match="failed: it returned 42, not an asyncio event loop"):
        SyncPeer(coordinators=[addr], loop_factory=lambda: 42).start()

    def exits():
        sys.exit(2)
    with pytest.raises(ConfigError, match="loop_factory .* failed"):   # start() waited for ever
        SyncPeer(coordinators=[addr], loop_factory=exits).start()
    assert not _peer_threads()


def test_callbacks_that_cannot_be_called_are_refused_and_a_closed_peer_takes_none(coordinator):
    before = SyncPeer(coordinators=[coordinator], id="early")
    with pytest.raises(ConfigError, match=r"on\('hi', handler\): 5 is not callable"):
        before.on("hi", 5)
    with pytest.raises(ConfigError, match=r"on_view\(callback\): None is not callable"):
        before.on_view(None)
    p = SyncPeer(coordinators=[coordinator], id="a").start()
    try:
        # taken, they failed only at the first message or view, on the peer's thread
        with pytest.raises(ConfigError, match=r"on\('hi', handler\): 'print' is not callable"):
            p.on("hi", "print")
        with pytest.raises(ConfigError, match=r"on_view\(callback\): \[\] is not callable"):
            p.on_view([])
        with pytest.raises(ConfigError, match=r"wait_view\(predicate\): 2 is not callable"):
            p.wait_view(2)
        with pytest.raises(ConfigError, match=r"call_soon\(fn\)"):
            p.call_soon(None)
        assert p.call(asyncio.sleep(0, "still fine")) == "still fine"
    finally:
        p.close()
    # after close they were registered on the closed peer, never to be called
    with pytest.raises(SwarmError, match="SyncPeer is closed"):
        p.on("hi", print)
    with pytest.raises(SwarmError, match="SyncPeer is closed"):
        p.on_view(print)
    p.close()                                  # twice: nothing more happens
    assert not _peer_threads()


def test_close_from_another_thread_cuts_waiting_calls_short_with_a_swarm_error(coordinator):
    # The call (or start) waiting in the user's thread got a bare CancelledError.
    p = SyncPeer(coordinators=[coordinator], id="a").start()
    began = threading.Event()

    async def long_job():
        began.set()
        await asyncio.sleep(60)

    closer = threading.Thread(target=lambda: (began.wait(10), p.close()))
    closer.start()
    try:
        with pytest.raises(SwarmError, match="closed from another thread while this call waited"):
            p.call(long_job(), timeout=None)
    finally:
        closer.join()
    # start() too, while it waits for a coordinator that does not answer
    q = SyncPeer(coordinators=[f"tcp://127.0.0.1:{free_port()}"], id="b", join_timeout_s=30)
    closer = threading.Thread(target=lambda: (wait_for(lambda: q.peer is not None, 10), q.close()))
    closer.start()
    try:
        # (or, closed between the two steps of start(), "is closed")
        with pytest.raises(SwarmError, match="SyncPeer (was closed from another thread|is closed)"):
            q.start()
    finally:
        closer.join()
    assert not _peer_threads()


def test_close_from_several_threads_at_once_closes_once_quietly(coordinator):
    # Each close() stopped the loop: a second stop broke the thread's final clean-up
    # ("Event loop stopped before Future completed", "Task was destroyed but it is
    # pending"), and the other closers got CancelledError or PeerTimeout.
    failures: list[str] = []
    hook = threading.excepthook
    threading.excepthook = lambda a: failures.append(f"{a.thread.name}: {a.exc_value!r}")
    try:
        for i in range(4):
            p = SyncPeer(coordinators=[coordinator], id=f"p{i}").start()
            together = threading.Barrier(3)

            def close() -> None:
                together.wait()
                try:
                    p.close()
                except BaseException as e:
                    failures.append(repr(e))

            closers = [threading.Thread(target=close) for _ in range(3)]
            for t in closers:
                t.start()
            for t in closers:
                t.join()
            assert not failures
            assert not _peer_threads()
    finally:
        threading.excepthook = hook


def test_off_and_off_view_undo_on_and_on_view(coordinator):
    # SyncPeer had on/on_view but not their undo: a handler stayed for the peer's life.
    b = SyncPeer(coordinators=[coordinator], id="b")
    got: dict[str, list] = {"gone": [], "early": [], "late": [], "kept": []}
    views: dict[str, list] = {"gone": [], "kept": [], "late": []}

    def handler(name):
        return lambda msg: got[name].append(msg.body)

    def on_view(name):
        return lambda view: views[name].append(view.ids)

    gone, early, kept = handler("gone"), handler("early"), handler("kept")
    view_gone, view_kept, view_late = on_view("gone"), on_view("kept"), on_view("late")
    b.on("hi", gone)
    b.on("hi", early)
    b.on("hi", kept)
    b.on_view(view_gone)
    b.on_view(view_kept)
    assert b.off("hi", gone) and not b.off("hi", gone)      # before start: never registered
    assert b.off_view(view_gone) and not b.off_view(view_gone)
    with SyncPeer(coordinators=[coordinator], id="a") as a, b:
        a.wait_view(lambda v: len(v.members) == 2, timeout=10)
        a.wait_linked()
        late = handler("late")
        b.on("hi", late)
        assert b.off("hi", early) and b.off("hi", late) and not b.off("hi", late)
        assert not b.off("other", kept)
        assert a.send("b", "hi", {"x": 1}, timeout=2.0)
        wait_for(lambda: got["kept"], 5, what="the message at the handler left on")
        assert got == {"gone": [], "early": [], "late": [], "kept": [{"x": 1}]}
        assert views["kept"] and not views["gone"]
        b.on_view(view_late)
        assert b.off_view(view_kept)
        seen = len(views["kept"])
        a.close()
        wait_for(lambda: ["b"] in views["late"], 10, what="the view without a")
        assert len(views["kept"]) == seen
    assert b.off("hi", kept) and not b.off("hi", kept)      # after close it still answers
    assert not _peer_threads()


@pytest.mark.timeout(60)   # the calls waited for ever
def test_sys_exit_in_a_view_callback_during_start_fails_start(coordinator):
    """start() returned normally on a SyncPeer that a view callback's SystemExit had
    closed meanwhile; the first call then said so."""
    p = SyncPeer(coordinators=[coordinator], id="v")
    p.on_view(lambda view: sys.exit(5))
    with pytest.raises(SwarmError, match=r"SystemExit\(5\) was raised"):
        p.start()
    p.close()   # quiet: start() said it
    assert not _peer_threads()


def test_sys_exit_on_the_peers_thread_closes_the_peer_and_every_call_says_so(coordinator, caplog):
    # The peer catches what a handler raises, but not SystemExit or KeyboardInterrupt:
    # they ended the loop thread without a word, every call (and close) then waited
    # for ever (or to its timeout), and the peer's sockets stayed open, so that the
    # process hung at exit in zmq's context termination.
    b = SyncPeer(coordinators=[coordinator], id="b")
    b.on("stop", lambda msg: sys.exit(3))
    with SyncPeer(coordinators=[coordinator], id="a") as a, b:
        a.wait_view(lambda v: len(v.members) == 2, timeout=10)
        a.wait_linked()
        began = threading.Event()

        async def wait_long():
            began.set()
            await asyncio.sleep(60)

        sender = threading.Thread(target=lambda: (began.wait(10), a.send("b", "stop", {}, timeout=2.0)))
        sender.start()
        try:
            with pytest.raises(SwarmError, match=r"closed: SystemExit\(3\) was raised on the peer's thread") as e:
                b.call(wait_long(), timeout=None)           # waiting when it happened
        finally:
            sender.join()
        assert isinstance(e.value.__cause__, SystemExit)
        with pytest.raises(SwarmError, match=r"SystemExit\(3\) was raised"):
            b.wait_view(lambda v: False, timeout=None)       # and after
        with pytest.raises(SwarmError, match=r"SystemExit\(3\) was raised"):
            b.on("hi", print)
        b.close()                                            # quiet: the calls said it
        assert b.peer.state is PeerState.CLOSED              # its sockets too
        a.wait_view(lambda v: v.ids == ["a"], timeout=10)    # it left the swarm
        # a coroutine given to call() that exits: its caller gets the SystemExit
        c = SyncPeer(coordinators=[coordinator], id="c").start()

        async def exits():
            sys.exit(4)

        with pytest.raises(SystemExit):
            c.call(exits())
        with pytest.raises(SwarmError, match=r"SystemExit\(4\) was raised"):
            c.call(asyncio.sleep(0))
        c.close()
        assert c.peer.state is PeerState.CLOSED
        # their threads are gone; a's is the one left, and works
        assert len(_peer_threads()) == 1 and a.call(asyncio.sleep(0, "ok")) == "ok"
    assert not _peer_threads()
    assert "never retrieved" not in caplog.text


def test_off_and_off_view_are_in_the_link_protocol_as_its_links_have_them():
    # Link declared on/on_view only; their undo was found with getattr
    import inspect

    from swarm.gossip.sim import SimLink
    from swarm.link import Link
    from swarm.peer import Peer

    for name in ("on", "off", "on_view", "off_view"):
        spec = list(inspect.signature(getattr(Link, name)).parameters)
        for cls in (Peer, SimLink, SyncPeer):
            assert list(inspect.signature(getattr(cls, name)).parameters) == spec, (cls, name)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("when", ["while the peer is built", "once it is built"])
def test_close_from_another_thread_during_start_closes_the_peer_start_built(monkeypatch, when):
    """close() from another thread while start() was building the Peer (in its constructor)
    stopped the loop, and the Peer that start() then got was never closed: its zmq context,
    with its I/O thread, stayed open. The constructor is held on an Event here, so that the
    close lands in that window every time (or, the other case, just after it)."""
    from swarm.peer import peer as peer_mod

    built: list[peer_mod.Peer] = []
    entered, release = threading.Event(), threading.Event()
    real_init = peer_mod.Peer.__init__

    def slow_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        built.append(self)
        if when == "while the peer is built":
            entered.set()
            release.wait(30)

    monkeypatch.setattr(peer_mod.Peer, "__init__", slow_init)
    p = SyncPeer(coordinators=[f"tcp://127.0.0.1:{free_port()}"], join_timeout_s=30)
    errors: list[BaseException] = []

    def start() -> None:
        try:
            p.start()
        except BaseException as e:   # checked below
            errors.append(e)

    starter = threading.Thread(target=start)
    closer = threading.Thread(target=p.close)
    try:
        starter.start()
        if when == "while the peer is built":
            assert entered.wait(30)
        else:   # start() is in Peer.start, joining (no coordinator answers there)
            wait_for(lambda: built and built[0].state is PeerState.JOINING, 30, what="the join")
        closer.start()
        wait_for(lambda: p._loop is None, 30, what="close() to stop the loop")
        with p._lock:   # taken by close() until it has told the loop to stop
            pass
        release.set()
        closer.join(30)
        starter.join(30)
        assert not closer.is_alive() and not starter.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], SwarmError), errors
        assert len(built) == 1 and (built[0]._ctx is None or built[0]._ctx.closed)   # None: never started
        assert _peer_threads() == []
    finally:
        release.set()
        if closer.is_alive() or starter.is_alive():
            closer.join(30)
            starter.join(30)
        for peer in built:
            if peer._ctx is not None and not peer._ctx.closed:
                peer._ctx.destroy(linger=0)
