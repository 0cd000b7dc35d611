"""Who is blamed for what a handler raises, and how much of it is logged.

A WireError that a handler's own outgoing call raised (a send, or an on(), that this
peer refused) was counted as a malformed message from the sender, who sent nothing
wrong; it is the handler's error. A WireError the handler raises about what the sender
sent stays malformed. And a handler that fails on every message of a hostile sender
logged a full traceback per message; now the first, then at most one per
FAILURE_LOG_S for the same handler and type of error, which says how many were not
logged, while ``handler_errors`` counts every one."""

from __future__ import annotations

import asyncio
import logging

import pytest
# a coordinator and two linked peers a and b (tests/ is on the path)
from peer.test_handler_errors import pair, until

import swarm.peer.peer as peer_mod
from swarm.errors import WireError
from swarm.peer import Peer, PeerState


def _failed(caplog, t: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "swarm.peer" and f"handler for {t!r} failed" in r.message]


def test_a_handler_failing_on_every_message_logs_its_traceback_once_then_counts(caplog, monkeypatch):
    # no second traceback while the test runs (raising=False: the old code had no such setting)
    monkeypatch.setattr(peer_mod, "FAILURE_LOG_S", 3600.0, raising=False)

    async def main() -> None:
        async with pair() as (_, a, b):
            def buggy(msg):
                if msg.body["kind"] == "key":
                    raise KeyError("w")
                raise ValueError(f"shapes do not broadcast ({msg.body['i']})")

            b.on("bug", buggy)
            b.on("bug2", buggy)
            with caplog.at_level(logging.ERROR, logger="swarm.peer"):
                for i in range(5):
                    assert await a.send("b", "bug", {"kind": "value", "i": i}, timeout=1.0)
                await until(lambda: b.counters.handler_errors == 5, "five handler errors")
                # before the fix: five tracebacks
                first = _failed(caplog, "bug")
                assert len(first) == 1 and isinstance(first[0].exc_info[1], ValueError)
                assert "(0)" in str(first[0].exc_info[1]) and "more times" not in first[0].message
                # another type of error from the same handler, and another handler: their own
                assert await a.send("b", "bug", {"kind": "key", "i": 5}, timeout=1.0)
                assert await a.send("b", "bug2", {"kind": "value", "i": 6}, timeout=1.0)
                await until(lambda: b.counters.handler_errors == 7, "seven handler errors")
                assert [type(r.exc_info[1]) for r in _failed(caplog, "bug")] == [ValueError, KeyError]
                assert len(_failed(caplog, "bug2")) == 1
                # past the interval, the next traceback says how many were not logged
                monkeypatch.setattr(peer_mod, "FAILURE_LOG_S", 0.0)
                assert await a.send("b", "bug", {"kind": "value", "i": 7}, timeout=1.0)
                await until(lambda: b.counters.handler_errors == 8, "eight handler errors")
            last = _failed(caplog, "bug")[-1]
            assert isinstance(last.exc_info[1], ValueError) and "(7)" in str(last.exc_info[1])
            assert "4 more times with ValueError since the last traceback" in last.message
            assert len(_failed(caplog, "bug")) == 3
            assert b.counters.malformed == 0 and b.state is PeerState.RUNNING

    asyncio.run(main())


async def _send_unsendable(b: Peer, msg) -> None:
    await b.send(msg.src, "join", {}, timeout=1.0)


async def _send_unpackable(b: Peer, msg) -> None:
    await b.send(msg.src, "x", {"s": {1, 2}}, timeout=1.0)


def _send_nowait_over_limits(b: Peer, msg) -> None:
    b.send_nowait(msg.src, "x", {"s": "x" * (b.limits.max_str_len + 1)})


def _on_reserved(b: Peer, msg) -> None:
    b.on("hello", print)


OWN_CALLS = {"send of an unsendable type": _send_unsendable, "send of a body msgpack refuses": _send_unpackable,
             "send_nowait over the wire's limits": _send_nowait_over_limits,
             "on() for a reserved type": _on_reserved}


@pytest.mark.parametrize("case", sorted(OWN_CALLS))
def test_a_wire_error_of_the_handlers_own_call_is_a_handler_error(case, caplog):
    async def main() -> None:
        async with pair() as (_, a, b):
            own_call = OWN_CALLS[case]

            def handler(msg):
                return own_call(b, msg)

            b.on("reply", handler)
            with caplog.at_level(logging.ERROR, logger="swarm.peer"):
                assert await a.send("b", "reply", {}, timeout=1.0)
                await until(lambda: b.counters.handler_errors + b.counters.malformed == 1, "the error counted")
            # before the fix: malformed == 1, blamed on a, and no traceback
            assert b.counters.malformed == 0 and b._bad.by_reason == {}
            logged = _failed(caplog, "reply")
            assert len(logged) == 1 and isinstance(logged[0].exc_info[1], WireError)
            assert b.state is PeerState.RUNNING

    asyncio.run(main())


def test_a_wire_error_about_the_senders_content_stays_malformed_after_an_own_send():
    # what swarm's handlers do: answer, then refuse what the sender sent
    async def main() -> None:
        async with pair() as (_, a, b):
            async def handler(msg):
                assert await b.send(msg.src, "ack", {}, timeout=1.0)
                raise WireError("n must be an int")

            got: list[str] = []
            a.on("ack", lambda m: got.append(m.src))
            b.on("req", handler)
            assert await a.send("b", "req", {}, timeout=1.0)
            await until(lambda: b.counters.malformed == 1 and got == ["b"], "the refused message and the ack")
            assert b.counters.handler_errors == 0
            assert b._bad.by_reason == {"n must be an int": 1}

    asyncio.run(main())
