"""The engine's blockwise passes (mixing, NaN checks) on vectors longer than a block."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from swarm.gossip import Gossip, mixing_matrix
from swarm.gossip.engine import _BLOCK, T_DELTA, _finite
from swarm.gossip.sim import SimHub, run_rounds

D = 2 * _BLOCK + 123     # two full blocks and a ragged tail


@pytest.mark.parametrize("topology,n", [("ring", 5), ("full", 4)])
def test_blockwise_mixing_is_w_times_x(topology, n):
    async def main():
        hub = SimHub(topology=topology)
        rng = np.random.default_rng(1)
        xs = [rng.standard_normal(D).astype(np.float32) + i for i in range(n)]
        engines = [Gossip(l, x, topology=topology) for l, x in zip(hub.add_many(n), xs)]
        before = np.stack(xs).astype(np.float64)
        for rnd in range(2):
            await run_rounds(engines, 1)
            before = mixing_matrix(topology, n) @ before
            np.testing.assert_allclose(np.stack(xs), before, rtol=1e-5, atol=1e-5, err_msg=f"round {rnd}")
        await hub.close()
    asyncio.run(main())


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("size", [D, 300])
@pytest.mark.parametrize("where", [0, _BLOCK - 1, _BLOCK, D - 1])
def test_finite_finds_nan_in_any_block(where, size, dtype):
    where = min(where, size - 1)
    a = np.ones(size, dtype)
    a[1] = np.finfo(dtype).max       # the largest finite value and the smallest subnormal pass
    a[2] = -np.finfo(dtype).smallest_subnormal
    assert _finite(a)
    for bad in (np.nan, np.inf, -np.inf):
        a[where] = bad
        assert not _finite(a)
    assert _finite(np.ones(D, np.int8))


def test_nan_in_last_block_of_delta_is_rejected():
    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(3)
        xs = [np.full(D, float(i), np.float32) for i in range(3)]
        engines = [Gossip(l, x, topology="ring") for l, x in zip(links, xs)]
        await run_rounds(engines, 1)
        target = engines[0]
        hat = target._in["p001"].hat.copy()
        bad = np.zeros(D, np.float32)
        bad[-1] = np.nan
        await links[1].send("p000", T_DELTA, {"r": 1, "ver": 2, "meta": {"codec": "identity", "n": D}}, [bad])
        await asyncio.sleep(0)
        target._apply_pending("p001", target._in["p001"], None)
        assert target.stats.rejected_nonfinite == 1
        np.testing.assert_array_equal(target._in["p001"].hat, hat)
        await hub.close()
    asyncio.run(main())
