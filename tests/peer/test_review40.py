"""Peer and SyncPeer at their edges (review 40): a call whose coroutine finished as its
deadline passed, async functions given where the peer calls plain ones, a context with
no socket left, a failing stats callback, arguments of the wrong type, and a SyncPeer
closed with no time to wait."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
import threading

import numpy as np
import pytest
import zmq
import zmq.asyncio
# a coordinator process for in-process peers (tests/ is on the path)
from peer.test_syncpeer import _peer_threads, coordinator  # noqa: F401 - a fixture
from swarmtest import free_port, until, wait_for

from swarm import wire
from swarm.coordinator import Coordinator
from swarm.errors import ConfigError, TransportError
from swarm.peer import Peer, PeerState, SyncPeer
from swarm.peer import peer as peer_module
from swarm.peer.peer import _Outbox
from swarm.peer.sync import _Handed
from swarm.transport import generate_keys


def _nowhere() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


def _terminate(ctx: zmq.Context) -> None:
    """``ctx.term()``, which waits for every socket of the context to be closed: one
    left open fails the test, not hang it."""
    ended = threading.Thread(target=ctx.term, daemon=True)
    ended.start()
    ended.join(20)
    assert not ended.is_alive(), "a socket of the context was left open"


def _in_frame(thread: threading.Thread, code) -> bool:
    """Whether ``thread`` is running ``code`` now (somewhere on its stack)."""
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


# -- 1. SyncPeer.call past its deadline


def test_a_call_whose_coroutine_finished_as_its_deadline_passed_returns_its_result(coordinator):
    """Before the fix call() raised PeerTimeout ("it was cancelled and has ended") for a
    coroutine that had finished, its work done, between the deadline and the cancellation
    (its last step still held the loop), and threw its result away."""
    p = SyncPeer(coordinators=[coordinator], id="r1").start()
    try:
        caller = threading.current_thread()
        effects = []

        async def last_step_outlives_the_deadline() -> str:
            # the loop is held (the mixing of a large model, say) until the caller has
            # given up waiting and asks for the cancellation
            wait_for(lambda: _in_frame(caller, _Handed.cancel.__code__), 30, interval=0.01,
                     what="the caller's cancellation")
            effects.append("parameters written")
            return "round result"

        assert p.call(last_step_outlives_the_deadline(), timeout=0.5) == "round result"
        assert effects == ["parameters written"]
        assert p.call(asyncio.sleep(0, "next")) == "next"   # the peer goes on
    finally:
        p.close()
    assert not _peer_threads()


# -- 2. async functions where the peer calls a plain one


async def _async_view_callback(view) -> bool:
    return True


class _AsyncCallable:
    async def __call__(self, view) -> bool:
        return True


@pytest.mark.parametrize("fn", [_async_view_callback, _AsyncCallable()])
def test_async_functions_where_the_peer_calls_plain_ones_are_refused(fn):
    """Before the fix on_view(async fn) and peer.stats = async fn made a coroutine that
    nobody awaited (it never ran; a RuntimeWarning at each view or heartbeat), and
    wait_view(async predicate) returned at once: a coroutine is truthy."""
    p = Peer(id="a", coordinators=[_nowhere()])

    async def main() -> None:
        try:
            with pytest.raises(ConfigError, match=r"peer a: on_view\(.*\): .*async"):
                p.on_view(fn)
            assert p.off_view(fn) is False   # nothing was registered
            with pytest.raises(ConfigError, match=r"peer a: stats = .*async"):
                p.stats = fn
            assert p.stats is None
            with pytest.raises(ConfigError, match=r"peer a: wait_view\(.*\): .*async"):
                await p.wait_view(fn, timeout=1.0)
            p.stats = lambda: {"x": 1}    # plain functions, and None, are taken
            p.stats = None
        finally:
            await p.close()

    asyncio.run(main())


@pytest.mark.parametrize("fn", [_async_view_callback, _AsyncCallable()])
def test_a_syncpeer_refuses_async_functions_where_it_calls_plain_ones(coordinator, fn):
    """Before the fix SyncPeer.call_soon(async fn) and on_view(async fn) made coroutines
    that never ran, and wait_view(async predicate) returned at once."""
    early = SyncPeer(coordinators=[coordinator], id="s0")
    with pytest.raises(ConfigError, match=r"on_view\(callback\): .*async"):
        early.on_view(fn)               # before start(): it would have waited in the early list
    p = SyncPeer(coordinators=[coordinator], id="s1").start()
    try:
        with pytest.raises(ConfigError, match=r"call_soon\(fn\): .*async.*call\(\)"):
            p.call_soon(fn, None)
        with pytest.raises(ConfigError, match=r"on_view\(callback\): .*async"):
            p.on_view(fn)
        assert p.off_view(fn) is False
        with pytest.raises(ConfigError, match=r"wait_view\(predicate\): .*async"):
            p.wait_view(fn, timeout=1.0)
        ran = threading.Event()
        p.call_soon(ran.set)            # a plain function still runs
        assert ran.wait(10)
    finally:
        p.close()


# -- 3. no socket left in the context


def test_a_start_that_finds_no_socket_left_raises_a_transport_error_and_closes():
    """Before the fix a raw zmq.ZMQError ("Too many open files") came out of start()."""
    ctx = zmq.asyncio.Context(io_threads=1)
    ctx.set(zmq.MAX_SOCKETS, 2)   # a ROUTER and a DEALER, no room for the DEALER's monitor
    p = Peer(id="a", coordinators=[_nowhere()], context=ctx, join_timeout_s=2.0)
    try:
        with pytest.raises(TransportError, match=r"peer a: cannot open .*: Too many open files "
                                                 r"\(this context allows 2 sockets"):
            asyncio.run(p.start())
        assert p.state is PeerState.CLOSED
    finally:
        asyncio.run(p.close())
        _terminate(ctx)


@contextlib.contextmanager
def _filled(ctx: zmq.Context):
    """Take every socket ``ctx`` has left; they are closed at the end."""
    taken = []
    try:
        while True:
            try:
                taken.append(ctx.socket(zmq.PAIR))
            except zmq.ZMQError:
                break
        yield
    finally:
        for s in taken:
            s.close(0)


def test_side_channels_that_find_no_socket_left_raise_a_transport_error():
    """Before the fix open_inbox() and open_outbox() raised a raw zmq.ZMQError when the
    context had no socket left."""
    async def main() -> None:
        ctx = zmq.asyncio.Context(io_threads=1)
        ctx.set(zmq.MAX_SOCKETS, 16)
        async with Coordinator(bind="tcp://127.0.0.1:*") as coord:
            p = Peer(id="a", coordinators=[coord.address], context=ctx)
            try:
                await p.start()
                with _filled(zmq.Context.shadow(ctx.underlying)):
                    with pytest.raises(TransportError, match=r"peer a: cannot open an inbox: .*"
                                                             r"this context allows 16 sockets"):
                        p.open_inbox()
                    with pytest.raises(TransportError, match=r"peer a: cannot open an outbox to a: .*"
                                                             r"this context allows 16 sockets"):
                        p.open_outbox("a", _nowhere())
                    assert p._side == []
                assert p.state is PeerState.RUNNING
            finally:
                await p.close()
        _terminate(ctx)

    asyncio.run(main())


def test_an_outbox_whose_monitor_finds_no_socket_left_is_closed(tmp_path):
    """Before the fix, with keys, a PUSH made just before the context ran out (its monitor
    found no socket) was left open, unknown to the peer: a raw zmq.ZMQError reached the
    caller, and the context's term() (inside Peer.close with the peer's own) waited for
    that socket for ever. Contexts of ever fewer sockets have the outbox fail at each of
    its steps, until one has no room for the peer itself. (Not fewer still: a keyed
    start that runs out in its key check, zmq's ThreadAuthenticator, hangs.)"""
    kd = str(tmp_path / "keys")
    generate_keys(kd, ["coordinator", "peer"])

    async def attempt(coord: Coordinator, limit: int) -> str:
        ctx = zmq.asyncio.Context(io_threads=1)
        ctx.set(zmq.MAX_SOCKETS, limit)
        p = Peer(id=f"p{limit}", coordinators=[coord.address], keys_dir=kd, key_name="peer", context=ctx,
                 join_timeout_s=5.0)
        left = []
        try:
            try:
                await p.start()
            except TransportError:
                return "start"
            try:
                out = p.open_outbox(p.id, _nowhere())
            except (TransportError, zmq.ZMQError) as e:
                # while the error is held, so is whatever its frames made
                left = [o for o in gc.get_objects() if type(o) is _Outbox and not o.closed
                        and o.context.underlying == ctx.underlying]
                assert isinstance(e, TransportError) and "Too many open files" in str(e), repr(e)
                return "outbox"
            assert out is not None
            p.close_side(out)
            return "ok"
        finally:
            await p.close()
            for o in left:
                o.close(0)   # else term() waits for it
            _terminate(ctx)
            assert not left, f"MAX_SOCKETS {limit}: the failed outbox left {left} open"

    async def main() -> list[str]:
        async with Coordinator(bind="tcp://127.0.0.1:*", keys_dir=kd, http_bind="") as coord:
            outcomes = []
            for limit in range(24, 1, -1):
                outcomes.append(await attempt(coord, limit))
                if outcomes[-1] == "start":
                    return outcomes
        raise AssertionError(f"every context had room for the peer: {outcomes}")

    outcomes = asyncio.run(main())
    # the PUSH, its monitor's two ends: three steps that can each fail
    assert outcomes[0] == "ok" and outcomes[-4:] == ["outbox"] * 3 + ["start"], outcomes


# -- 4. a stats callback that fails


@pytest.mark.parametrize("stats, error", [(lambda: 1 / 0, "ZeroDivisionError"),
                                          (lambda: {"loss": np.float32(0.5)}, "cannot go on the wire")])
def test_a_failing_stats_callback_is_counted_and_its_traceback_not_logged_each_time(
        monkeypatch, caplog, stats, error):
    """Before the fix a stats callback that raised (or returned what cannot go on the wire)
    logged a traceback (an error) at every heartbeat that carries figures, for ever, not
    limited by FAILURE_LOG_S, and handler_errors did not count it."""
    monkeypatch.setattr(peer_module, "HEARTBEAT_STATS_S", 0.02)   # figures on every beat

    async def main() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*") as coord:
            async with Peer(id="a", coordinators=[coord.address], heartbeat_s=0.02) as a:
                a.stats = stats
                await until(lambda: a.counters.handler_errors >= 5, 10, what="five failed stats callbacks")
                assert a.state is PeerState.RUNNING

    with caplog.at_level(logging.INFO, logger="swarm.peer"):
        asyncio.run(main())
    failures = [r for r in caplog.records if "stats callback" in r.getMessage()]
    assert len(failures) == 1, caplog.text             # within FAILURE_LOG_S, once
    assert failures[0].exc_info is not None and error in caplog.text


# -- 5. arguments of the wrong type


@pytest.mark.parametrize("args, kwargs, what", [
    (({"coordinators": ["tcp://127.0.0.1:9"]},), {}, r"Peer\(config=.*\): .*PeerConfig"),
    (("tcp://127.0.0.1:9",), {}, r"Peer\(config=.*\): .*PeerConfig.*coordinators="),
    ((), {"coordinators": ["tcp://127.0.0.1:9"], "limits": "x"}, r"Peer\(limits='x'\): .*swarm.wire.Limits"),
    ((), {"coordinators": ["tcp://127.0.0.1:9"], "context": "x"}, r"Peer\(context='x'\): .*zmq.asyncio.Context"),
])
def test_a_peer_refuses_options_of_the_wrong_type(args, kwargs, what):
    """Before the fix a dict or an address in the place of the config said "unknown Peer
    option: replace() should be called on dataclass instances", limits="x" raised a raw
    AttributeError, and context= was not checked (the peer failed later)."""
    with pytest.raises(ConfigError, match=what):
        Peer(*args, **kwargs)


def test_a_peer_refuses_a_plain_zmq_context():
    """Before the fix a blocking zmq.Context was taken, and its sockets could not be awaited."""
    ctx = zmq.Context()
    try:
        with pytest.raises(ConfigError, match=r"Peer\(context=.*\): .*zmq.asyncio.Context"):
            Peer(coordinators=["tcp://127.0.0.1:9"], context=ctx)
    finally:
        ctx.term()


def test_sends_and_outboxes_to_a_dst_that_is_no_id_are_refused():
    """Before the fix send(["b"], ...), send_nowait and open_outbox(["b"], ...) raised a raw
    TypeError (unhashable type: 'list')."""
    p = Peer(id="a", coordinators=[_nowhere()])

    async def main() -> None:
        try:
            before = p.counters.unknown_dst
            with pytest.raises(ConfigError, match=r"peer a: send\(dst=\['b'\]\): .*peer id"):
                await p.send(["b"], "x", {})
            with pytest.raises(ConfigError, match=r"peer a: send_nowait\(dst=\['b'\]\): .*peer id"):
                p.send_nowait(["b"], "x", {})
            with pytest.raises(ConfigError, match=r"peer a: open_outbox\(pid=\['b'\]\): .*peer id"):
                p.open_outbox(["b"], "tcp://127.0.0.1:9")
            assert p.counters.unknown_dst == before
        finally:
            await p.close()

    asyncio.run(main())


def test_syncpeer_start_refuses_a_stop_that_is_no_event():
    """Before the fix start(stop=True) raised a raw AttributeError ('bool' object has no
    attribute 'is_set') from the peer's loop, having started its thread."""
    p = SyncPeer(coordinators=[_nowhere()])
    with pytest.raises(ConfigError, match=r"start\(stop=True\): .*threading.Event"):
        p.start(stop=True)
    assert not _peer_threads()
    p.close()


def test_a_handler_that_is_not_callable_registers_no_type():
    """Before the fix on("t", None) added "t" to the process's wire types, then refused
    the handler: a refused call changed state."""
    p = Peer(id="a", coordinators=[_nowhere()])
    try:
        assert "review40_never" not in wire.known_types()
        with pytest.raises(ConfigError, match="the handler must be callable"):
            p.on("review40_never", None)
        assert "review40_never" not in wire.known_types()
    finally:
        asyncio.run(p.close())


# -- 6. SyncPeer.close with no time to wait


def test_syncpeer_close_with_no_time_to_wait_closes_quietly(coordinator):
    """Before the fix close(timeout=0) raised PeerTimeout ("call did not finish within
    0 s"), an error about a call the user never made, though the peer ended closed."""
    p = SyncPeer(coordinators=[coordinator], id="c0").start()
    p.close(timeout=0)
    assert p.peer.state is PeerState.CLOSED
    assert not _peer_threads()
    p.close()   # again: nothing
