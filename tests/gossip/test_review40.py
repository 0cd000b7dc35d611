"""Defects found in review 40 of the gossip engine and the gradient relay.

* pseudo_gradient mode: the mix was guarded against float32 overflow, the outer
  Nesterov step after it was not.
* relay.publish checked the gradient against MAX_GRAD, not the vector it encodes, sends
  and returns (``ef+`` adds the residual; QSGD's levels can pass a block's largest entry).
* relay: one message with a wild clock left its origin out of step at every peer for
  the rest of the run (the largest clock ever seen was kept).
"""

import asyncio

import numpy as np
import pytest

from swarm.checks import MAX_GRAD, largest_abs
from swarm.errors import ConfigError
from swarm.gossip import Gossip, GradientRelay
from swarm.gossip.sim import SimHub, run_rounds


async def settle():
    """Let every queued delivery and forward run (the hub delivers on the next loop turns)."""
    for _ in range(20):
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)


# ------------------------------------------------------------ engine: pseudo_gradient


def test_an_outer_step_that_overflows_is_skipped_like_a_mix_overflow():
    """Before the fix: the mix of -1e38 and 3e38 is finite (1e38), but the outer step's
    ``g + μm`` (-3.8e38) is not: x, the anchor and the momentum held -Inf, the round said
    ok with no overflow counted, and the next round raised GossipError (x not finite)."""
    async def main():
        hub = SimHub(topology="ring")
        xs = [np.full(4, -1e38, np.float32), np.full(4, 3e38, np.float32)]
        engines = [Gossip(link, x, topology="ring", codec="identity", gamma=1.0, sync="lockstep",
                          round_timeout=5.0, mode="pseudo_gradient") for link, x in zip(hub.add_many(2), xs)]
        e0 = engines[0]
        try:
            x0, anchor0, momentum0 = xs[0].copy(), e0._anchor.copy(), e0._momentum.copy()
            (r0, _), = await run_rounds(engines, 1)
            assert not r0.ok and r0.participants == [] and r0.missing == [engines[1].link.id], r0
            assert "overflow" in r0.reason and "x unchanged" in r0.reason, r0.reason
            assert e0.stats.mix_overflows == 1 and e0.stats.rounds_alone == 1
            assert np.array_equal(xs[0], x0), xs[0]
            assert np.array_equal(e0._anchor, anchor0) and np.array_equal(e0._momentum, momentum0)
            await run_rounds(engines, 1)   # raised GossipError ("params hold NaN or Inf")
            assert all(np.isfinite(x).all() for x in xs)
        finally:
            for e in engines:
                e.close()
            await hub.close()
    asyncio.run(main())


# ------------------------------------------------------------ relay: what publish encodes


@pytest.mark.parametrize("codec, d, scale, ok_first", [("ef+topk:0.01", 100, 0.9, True),
                                                       ("qsgd:4", 512, 0.5, False)])
def test_publish_refuses_what_decodes_past_max_grad_and_sends_nothing(codec, d, scale, ok_first):
    """Before the fix: each gradient was within MAX_GRAD, so publish took it, but what it
    encoded (gradient + residual with ef+; QSGD's norm · level / s) decoded past it: every
    receiver refused the message (the copies differed), the residual counted it as sent,
    and the origin got the oversized vector back (FlatAdam refuses it)."""
    async def main():
        hub = SimHub(topology="ring")
        a, b = [GradientRelay(link, d, codec=codec) for link in hub.add_many(2)]
        try:
            g = np.full(d, scale * MAX_GRAD, np.float32)
            sent = []
            if ok_first:   # the residual then holds 0.9 MAX_GRAD in 99 coordinates
                sent.append(a.publish(g, clock=0))
                assert largest_abs(sent[0]) <= MAX_GRAD
            residual = getattr(a._codec, "residual", None)   # a copy (None: no ef+)
            messages, published = hub.messages_sent, a.stats.published
            with pytest.raises(ConfigError, match="above .*not published"):
                a.publish(g, clock=1)
            await settle()
            assert hub.messages_sent == messages and a.stats.published == published
            if residual is not None:
                np.testing.assert_array_equal(a._codec.residual, residual)
            assert b.stats.rejected == 0 and not hub.errors
            assert [x.tolist() for x in b.take()] == [x.tolist() for x in sent]
            # a small gradient still goes, and arrives as the origin applies it
            out = a.publish(np.ones(d, np.float32), clock=2)
            await settle()
            assert [x.tolist() for x in b.take()] == [out.tolist()] and b.stats.rejected == 0
        finally:
            a.close()
            b.close()
            await hub.close()
    asyncio.run(main())


# ------------------------------------------------------------ relay: clocks


def test_one_wild_clock_leaves_its_origin_out_of_step_for_one_message_only():
    """Before the fix: the relay kept each origin's largest clock ever seen, so after one
    message at clock 2**62 that origin was "at or past" every later wait's clock, out of
    step for good: no wait waited for its turns again, though they came on schedule."""
    async def main():
        hub = SimHub(topology="ring")
        r0, r1, r2 = relays = [GradientRelay(link, 8) for link in hub.add_many(3)]
        try:
            g = np.ones(8, np.float32)
            every = 3   # p000 at 0, 3, 6, ...; p001 at 1, 4, 7, ...; p002 at 2, 5, 8, ...
            r1.publish(g, clock=1)
            r2.publish(g, clock=2)
            await settle()
            r1.publish(g, clock=2**62)   # once (a bug, or a forgery for another origin)
            await settle()
            for c in (4, 7, 10):
                r1.publish(g, clock=c)
                r2.publish(g, clock=c + 1)
            r2.publish(g, clock=14)
            await settle()
            # p001's turn at 13 is not here: the wait waits for it (until its deadline)
            assert r0.wait(16, timeout=0.2, every=every, first=0) is False
            assert "p001" not in r0._astray and r0.stats.wait_timeouts == 1
        finally:
            for r in relays:
                r.close()
            await hub.close()
    asyncio.run(main())
