"""A mix whose float32 sum overflows leaves ``x`` as it was.

Before the fix, two neighbours holding finite values near float32's largest (3e38) made
this peer's parameters Inf after one round (their copies were summed, and the sum
overflowed), and its next round raised ``GossipError("params hold NaN or Inf")``, which
ended a `swarm run` peer with reason "error" and a non-finite final checkpoint.
"""

import asyncio

import numpy as np
import pytest

from swarm.gossip import Gossip
from swarm.gossip.engine import _BLOCK
from swarm.gossip.sim import SimHub, run_rounds


async def _ring(xs, **kw):
    hub = SimHub(topology="ring")
    links = hub.add_many(len(xs))
    engines = [Gossip(link, x, topology="ring", codec="identity", gamma=1.0, sync="lockstep",
                      round_timeout=5.0, **kw) for link, x in zip(links, xs)]
    return hub, engines


async def _close(hub, engines):
    for e in engines:
        e.close()
    await hub.close()


@pytest.mark.parametrize("mode", ["params", "pseudo_gradient"])
def test_a_mix_that_overflows_is_skipped_and_counted_and_x_stays_as_it_was(mode):
    """Before the fix: x0 became Inf after round 1, and round 2 raised GossipError."""
    async def main():
        xs = [np.zeros(4, np.float32), np.full(4, 3e38, np.float32), np.full(4, 3e38, np.float32)]
        hub, engines = await _ring(xs, mode=mode)
        try:
            before = xs[0].copy()
            (r0, _, _), = await run_rounds(engines, 1)
            assert np.array_equal(xs[0], before), xs[0]
            assert not r0.ok and r0.participants == [] and sorted(r0.missing) == sorted(
                e.link.id for e in engines[1:]), r0
            assert "overflow" in r0.reason and "x unchanged" in r0.reason, r0.reason
            assert engines[0].stats.mix_overflows == 1
            # the next round runs (it raised GossipError: x held Inf); plain averaging left
            # the neighbours at 2e38, whose sum overflows again
            (r0, _, _), = await run_rounds(engines, 1)
            assert np.isfinite(xs[0]).all(), xs[0]
            if mode == "params":
                assert np.array_equal(xs[0], before) and engines[0].stats.mix_overflows == 2, r0
            # the neighbours' own mixes stayed finite and were taken
            assert all(np.isfinite(x).all() for x in xs[1:])
            assert [e.stats.mix_overflows for e in engines[1:]] == [0, 0]
        finally:
            await _close(hub, engines)
    asyncio.run(main())


def test_an_overflow_in_a_late_block_leaves_the_blocks_before_it_untouched():
    """The mix runs a block at a time: a block past the first that overflows must not
    leave the earlier blocks mixed (x half averaged, half not)."""
    async def main():
        d = 3 * _BLOCK + 5
        rng = np.random.default_rng(0)
        xs = [rng.standard_normal(d).astype(np.float32) for _ in range(3)]
        xs[1][-1] = xs[2][-1] = 3e38   # only the last block's sum overflows
        hub, engines = await _ring(xs)
        try:
            before = xs[0].copy()
            (r0, _, _), = await run_rounds(engines, 1)
            assert not r0.ok and "overflow" in r0.reason, r0
            assert np.array_equal(xs[0], before)
            assert engines[0].stats.mix_overflows == 1
        finally:
            await _close(hub, engines)
    asyncio.run(main())


def test_a_mix_that_stays_finite_is_taken_as_before():
    """The check changes nothing for a finite mix: exact gossip keeps the swarm's sum."""
    async def main():
        xs = [np.arange(8, dtype=np.float32) * (i + 1) for i in range(3)]
        total = sum(float(x.sum()) for x in xs)
        hub, engines = await _ring(xs)
        try:
            rounds = await run_rounds(engines, 3)
            assert all(r.ok and r.reason == "" for rnd in rounds for r in rnd)
            assert sum(float(x.sum()) for x in xs) == pytest.approx(total, rel=1e-6)
            assert [e.stats.mix_overflows for e in engines] == [0, 0, 0]
        finally:
            await _close(hub, engines)
    asyncio.run(main())
