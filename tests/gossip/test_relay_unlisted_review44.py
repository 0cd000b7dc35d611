"""With keys, a gradient on a relay inbox from a member that just left (review 44).

The peer's ROUTER drops a message whose src its view no longer lists, at an epoch no
newer than the view's: nothing is left to check its key against, and most often it is
a member that has just left, whose last messages come from the view it held
(tests/peer/test_join_review44.py). The relay's inbox checked senders by a rule of its
own, and refused such a gradient as a forgery ("does not match the sender's CURVE
key"), counted in ``rejected`` and logged at WARNING. Both use the peer's one key
check now: the gradient is dropped and counted in ``unlisted``; a listed src from
another key is still refused as a forgery.
"""

from __future__ import annotations

import asyncio
import logging

import zmq
import zmq.asyncio
from swarmtest import keyed_trio, until

from swarm import wire
from swarm.gossip import GradientRelay
from swarm.gossip.relay import GRAD
from swarm.transport import Curve, generate_keys

MISMATCH = "does not match the sender's CURVE key"


def test_a_gradient_on_the_inbox_from_a_member_that_left_is_no_forgery(tmp_path, caplog):
    kd = str(tmp_path / "keys")
    generate_keys(kd, ["coordinator", "peer", "leaver"])

    def forgeries() -> list[str]:
        return [r.getMessage() for r in caplog.records if MISMATCH in r.getMessage()]

    async def main() -> None:
        ctx = zmq.asyncio.Context()
        s = ctx.socket(zmq.PUSH)
        s.linger = 0
        try:
            async with keyed_trio(kd) as (b, c, a):
                relay = GradientRelay(b, 4, direct=True)   # this thread reads its inbox
                try:
                    spoke_from = a.view.epoch
                    await a.close()
                    await b.wait_view(lambda v: v.member("a") is None, 10.0)
                    assert b.view.epoch > spoke_from
                    # a's last gradient (a pass), sent from the view it held, with its own key
                    Curve(kd, "leaver").client(s, b.view.member("b").key)
                    s.connect(relay._endpoint)
                    grad = {"s": 1, "h": 1, "t": 0.0, "c": 0, "meta": {}, "p": 1}
                    await s.send_multipart(wire.encode(GRAD, "a", epoch=spoke_from, body={"o": "a", **grad}))
                    # then a forgery on the same connection, in c's name, which the view lists
                    # with another key: refused as before, and once it is, a's was read
                    await s.send_multipart(wire.encode(GRAD, "c", epoch=b.view.epoch, body={"o": "c", **grad}))
                    await until(lambda: relay.poll() >= 0 and any("src 'c'" in m for m in forgeries()), 10.0,
                                "the forgery refused on b's inbox")
                    st = relay.stats
                    assert st.rejected == 1 and st.passes_in == 0 and st.held_in == 0, st   # before: rejected == 2
                    assert st.unlisted == 1, st
                    assert len(forgeries()) == 1, forgeries()
                finally:
                    relay.close()
        finally:
            s.close(0)
            ctx.term()

    with caplog.at_level(logging.WARNING, logger="swarm.transport"):
        asyncio.run(main())
