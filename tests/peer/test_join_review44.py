"""The join as the coordinator's connection comes up, and messages from a member that
just left, with keys (review 44).

* The coordinator DEALER drops what no connection takes (``IMMEDIATE``), and the first
  join goes out before the connection is up: every start waited for the join loop's
  resend, 250 ms later. The join now goes out as the handshake succeeds.
* With keys, a message from a member that had just left (its last messages, sent from
  the view it still held) was counted as malformed and logged as a forgery ("does not
  match the sender's CURVE key"): the view no longer holds its key, so it cannot be
  checked, but nothing was forged. It is dropped as from a sender outside the view, and
  counted in ``unlisted``; a member of the view that speaks from another key is still
  refused as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace

import zmq
import zmq.asyncio
from swarmtest import free_port, keyed_trio, until

from swarm import wire
from swarm.coordinator import Coordinator
from swarm.peer import Peer
from swarm.peer import peer as peer_module
from swarm.transport import Curve, generate_keys

MISMATCH = "does not match the sender's CURVE key"


def test_the_join_goes_out_as_the_handshake_with_the_coordinator_succeeds(monkeypatch):
    # The peer's clock stands still, so its timer never resends the join: only a join
    # sent as the handshake succeeds can reach the coordinator. The first join goes out
    # before any coordinator listens, and is dropped.
    stopped = time.monotonic()
    monkeypatch.setattr(peer_module, "time", SimpleNamespace(monotonic=lambda: stopped, time_ns=time.time_ns))
    addr = f"tcp://127.0.0.1:{free_port()}"

    async def main() -> None:
        peer = Peer(id="j", coordinators=[addr], join_timeout_s=10)
        coord = Coordinator(bind=addr, http_bind="")
        starting = asyncio.create_task(peer.start())
        try:
            await until(lambda: peer._join_sent or starting.done(), 10.0, "the peer's first join")
            assert not starting.done()
            await coord.start()
            await starting    # before: MembershipError, no coordinator took the join
            assert peer.view.member("j") is not None
            assert coord.table.get("j").incarnation == peer.incarnation
        finally:
            if not starting.done():
                starting.cancel()
                await asyncio.wait([starting])
            await peer.close()
            await coord.close()
    asyncio.run(main())


def test_a_message_from_a_member_that_left_is_no_forgery(tmp_path, caplog):
    kd = str(tmp_path / "keys")
    generate_keys(kd, ["coordinator", "peer", "leaver"])

    async def main() -> None:
        ctx = zmq.asyncio.Context()
        s = ctx.socket(zmq.DEALER)
        s.linger = 0
        try:
            async with keyed_trio(kd) as (b, c, a):
                got: list[str] = []
                b.on("x", lambda m: got.append(m.src))
                # a's last messages, sent from the view it held as it left, with its own key
                spoke_from = a.view.epoch
                await a.close()
                await b.wait_view(lambda v: v.member("a") is None, 10.0)
                assert b.view.epoch > spoke_from
                Curve(kd, "leaver").client(s, b.view.member("b").key)
                s.connect(b.address)
                for t in ("x", "hello", "ping"):
                    await s.send_multipart(wire.encode(t, "a", epoch=spoke_from, body={"e": spoke_from}))
                # then a forgery on the same connection: in c's name, which the view lists
                # with another key. Refused as before, and once it is, the others were read.
                await s.send_multipart(wire.encode("x", "c", epoch=b.view.epoch))
                await until(lambda: b.counters.malformed, 10.0, "the forgery refused at b")
                assert b.counters.malformed == 1 and b.counters.held_in == 0 and got == []
                # counted apart, so that they still show (with any a sent itself as it left)
                assert b.counters.unlisted >= 3
                lines = [r.getMessage() for r in caplog.records if MISMATCH in r.getMessage()]
                assert len(lines) == 1 and "src 'c'" in lines[0], lines   # before: also for 'a'
        finally:
            s.close(0)
            ctx.term()

    with caplog.at_level(logging.WARNING, logger="swarm.transport"):
        asyncio.run(main())
