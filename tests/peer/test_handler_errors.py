"""What user code on the peer's loop raises is that code's error, not the sender's,
and never ends the peer's loops in silence.

A handler's ValueError or SwarmError was counted as a malformed message from the
sender (rate-limited, no traceback). A CancelledError from a handler, a view
callback or the stats callback (a future that another component cancelled) ended
the receive loop or the timer loop: asyncio.TaskGroup ignores a child that ends
cancelled, so the peer stayed RUNNING and heartbeating but read no other message
or view (or sent no other heartbeat)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import AsyncIterator

import pytest

from swarm.coordinator import Coordinator
from swarm.errors import ReplayError, SwarmError, WireError
from swarm.peer import Peer, PeerState
from swarm.tasks import supervise


@contextlib.asynccontextmanager
async def pair() -> AsyncIterator[tuple[Coordinator, Peer, Peer]]:
    """A coordinator and two linked peers, a and b; all closed on the way out."""
    async with Coordinator(bind="tcp://127.0.0.1:*") as coord:
        a = Peer(id="a", coordinators=[coord.address], heartbeat_s=0.2)
        b = Peer(id="b", coordinators=[coord.address], heartbeat_s=0.2)
        try:
            await a.start()
            await b.start()
            for p in (a, b):
                await p.wait_view(lambda v: len(v.members) == 2, timeout=10)
                await p.wait_linked(timeout=10)
            yield coord, a, b
        finally:
            for p in (a, b):
                with contextlib.suppress(SwarmError):
                    await p.close()


async def until(pred, what: str, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not pred():
            await asyncio.sleep(0.01)


def _cancelled_future() -> asyncio.Future:
    f = asyncio.get_running_loop().create_future()
    f.cancel()
    return f


@pytest.mark.parametrize("error", [ValueError("shapes (3,) (4,) do not broadcast"),
                                   ReplayError("a bug in the handler"), SwarmError("a refused call")],
                         ids=lambda e: type(e).__name__)
def test_a_handlers_own_error_is_a_handler_error_with_its_traceback(error, caplog):
    async def main() -> None:
        async with pair() as (_, a, b):
            def buggy(msg):
                raise error

            b.on("bug", buggy)
            with caplog.at_level(logging.ERROR, logger="swarm.peer"):
                for _ in range(3):
                    assert await a.send("b", "bug", {}, timeout=1.0)
                await until(lambda: b.counters.handler_errors == 3, "three handler errors")
            assert b.counters.malformed == 0
            logged = [r for r in caplog.records if r.name == "swarm.peer" and "handler for 'bug' failed" in r.message]
            # the same failure again within FAILURE_LOG_S is counted, not logged again
            assert len(logged) == 1 and logged[0].exc_info and logged[0].exc_info[1] is error
            assert b.state is PeerState.RUNNING

    asyncio.run(main())


def test_a_handler_that_refuses_a_message_with_a_wire_error_counts_it_malformed():
    # what swarm's own handlers do (the gradient relay's): bad content from the sender
    async def main() -> None:
        async with pair() as (_, a, b):
            def refuses(msg):
                raise WireError("x must be an int")

            b.on("refused", refuses)
            assert await a.send("b", "refused", {}, timeout=1.0)
            await until(lambda: b.counters.malformed == 1, "the refused message counted")
            assert b.counters.handler_errors == 0
            assert b._bad.by_reason == {"x must be an int": 1}

    asyncio.run(main())


async def _awaits_cancelled(msg) -> None:
    await _cancelled_future()   # e.g. a future that another component cancelled


def _raises_cancelled(msg) -> None:
    raise asyncio.CancelledError()


HANDLERS = {"async handler awaits a cancelled future": _awaits_cancelled,
            "sync handler raises CancelledError": _raises_cancelled}


@pytest.mark.parametrize("case", sorted(HANDLERS))
def test_a_cancelled_error_from_a_handler_leaves_the_receive_loop_running(case, caplog):
    async def main() -> None:
        async with pair() as (coord, a, b):
            got: list[int] = []
            b.on("boom", HANDLERS[case])
            b.on("x", lambda m: got.append(m.body["i"]))
            with caplog.at_level(logging.ERROR, logger="swarm.peer"):
                assert await a.send("b", "boom", {}, timeout=1.0)
                await until(lambda: b.counters.handler_errors == 1, "the handler error")
            assert any("handler for 'boom' failed" in r.message and r.exc_info for r in caplog.records)
            # b still reads messages, and views: a third member joins
            for i in range(3):
                assert await a.send("b", "x", {"i": i}, timeout=1.0)
            await until(lambda: got == [0, 1, 2], "the messages after it")
            c = Peer(id="c", coordinators=[coord.address], heartbeat_s=0.2)
            await c.start()
            try:
                await b.wait_view(lambda v: len(v.members) == 3, timeout=10)
            finally:
                await c.close()
            assert b.state is PeerState.RUNNING and not b._runner.done()

    asyncio.run(main())


def test_a_cancelled_error_from_a_view_callback_leaves_the_receive_loop_running():
    async def main() -> None:
        async with pair() as (coord, a, b):
            views: list[int] = []

            def callback(view):
                views.append(len(view.members))
                if len(views) == 1:
                    raise asyncio.CancelledError()

            b.on_view(callback)
            c = Peer(id="c", coordinators=[coord.address], heartbeat_s=0.2)
            await c.start()
            await until(lambda: views, "the first view")
            await c.close()   # a second view: b still installs views
            await b.wait_view(lambda v: len(v.members) == 2 and v.member("c") is None, timeout=10)
            await until(lambda: len(views) >= 2, "the callback again")
            assert b.counters.handler_errors == 1
            got: list[dict] = []
            b.on("x", lambda m: got.append(m.body))
            assert await a.send("b", "x", {"ok": 1}, timeout=1.0)
            await until(lambda: got == [{"ok": 1}], "a message after it")

    asyncio.run(main())


def test_a_cancelled_error_from_the_stats_callback_leaves_the_timer_loop_running():
    # the timer loop sends heartbeats and calls stats once a second
    async def main() -> None:
        async with pair() as (_, a, b):
            calls = [0]

            def stats():
                calls[0] += 1
                if calls[0] == 1:
                    raise asyncio.CancelledError()
                return {"k": calls[0]}

            a.stats = stats
            await until(lambda: calls[0] >= 3, "stats called again after it", timeout=20)
            assert a.state is PeerState.RUNNING and not a._runner.done()

    asyncio.run(main())


def test_a_handler_that_cancels_the_receive_loop_fails_the_peer_loudly():
    # not an error of the handler: the loop's own task was cancelled from within. The
    # peer fails (wait_stopped and close raise) rather than run on without it.
    async def main() -> None:
        async with pair() as (_, a, b):
            b.on("stop", lambda m: asyncio.current_task().cancel())
            assert await a.send("b", "stop", {}, timeout=1.0)
            async with asyncio.timeout(10):
                with pytest.raises(SwarmError, match="_recv_loop was cancelled although nothing asked it to stop"):
                    await b.wait_stopped()
            with pytest.raises(SwarmError, match="_recv_loop was cancelled"):
                await b.close()
            assert b.state is PeerState.CLOSED

    asyncio.run(main())


def test_supervise_reports_a_loop_that_ends_by_itself_and_not_one_that_is_stopped():
    async def main() -> None:
        stop = asyncio.Event()

        async def forever() -> None:
            await asyncio.Event().wait()

        async def returns() -> None:
            await asyncio.sleep(0)

        async def cancels_itself() -> None:
            await asyncio.sleep(0)
            raise asyncio.CancelledError()

        async with asyncio.timeout(10):
            failure = await supervise([forever(), returns()], stop)
            assert isinstance(failure, SwarmError) and "returns returned" in str(failure)
            failure = await supervise([forever(), cancels_itself()], stop)
            assert isinstance(failure, SwarmError) and "cancels_itself was cancelled" in str(failure)
            asyncio.get_running_loop().call_later(0.05, stop.set)
            assert await supervise([forever(), forever()], stop) is None
            # a cancellation of the supervisor itself still goes on up
            task = asyncio.ensure_future(supervise([forever()], asyncio.Event()))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())


def test_supervise_reports_only_the_failure_when_another_loop_cleans_up_slowly():
    # the TaskGroup takes back the owner's cancellation once it has ended; a loop whose
    # clean-up awaited past that was reported as cancelled unasked, a second failure
    seen: list[BaseException] = []

    async def fails():
        await asyncio.sleep(0.01)
        raise RuntimeError("boom")

    async def slow_clean_up():
        try:
            await asyncio.Event().wait()
        except BaseException as e:
            seen.append(e)
            raise
        finally:
            await asyncio.sleep(0.05)

    async def main():
        failure = await supervise([fails(), slow_clean_up()], asyncio.Event())
        assert isinstance(failure, RuntimeError) and str(failure) == "boom"

    import swarm.tasks as tasks_mod
    watched, ended = tasks_mod._watched, []

    async def spy(*args):
        try:
            await watched(*args)
        except BaseException as e:
            ended.append(type(e).__name__)
            raise

    tasks_mod._watched = spy
    try:
        asyncio.run(main())
    finally:
        tasks_mod._watched = watched
    assert sorted(ended) == ["CancelledError", "RuntimeError"], ended
