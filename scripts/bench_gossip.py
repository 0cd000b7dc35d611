"""Gossip engine benchmark: rounds/s, bytes to consensus per codec, slow-link wall time.

Runs 16 peers in one process on the in-memory hub (swarm.gossip.sim), every
message through swarm.wire encode/decode. Anchors measured in the same run:
a bare numpy exact-gossip step (X ← W X on the 16×d matrix) for rounds/s, and
exact gossip (identity codec) for bytes and slow-link time.

Targets (issue 4): ≥ 50 rounds/s at d = 1e5; sign ≥ 12× and top-1% ≥ 2× fewer
bytes than exact gossip to reach 1e-3 on a 16-ring; ≥ 5× faster to 1e-3 than
dense under an emulated 100 Mbit/s link. Real-link shaping (tc on veth pairs)
is not attempted here. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import numpy as np

from swarm.gossip import Gossip, mixing_matrix
from swarm.gossip.sim import SimHub, consensus_error, run_rounds

N = 16


def swarm_of(d, codec="identity", gamma=1.0, topology="ring", seed=0, **hub_kw):
    hub = SimHub(topology=topology, **hub_kw)
    links = hub.add_many(N)
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(d).astype(np.float32) + i for i in range(N)]
    engines = [Gossip(l, x, topology=topology, codec=codec, gamma=gamma, round_timeout=30.0)
               for l, x in zip(links, xs)]
    return hub, xs, engines


async def rounds_per_s(d, rounds):
    hub, xs, engines = swarm_of(d)
    await run_rounds(engines, 2)  # warm-up: first rounds send full state
    t = time.perf_counter()
    await run_rounds(engines, rounds)
    return rounds / (time.perf_counter() - t)


def numpy_anchor(d, rounds):
    w = mixing_matrix("ring", N).astype(np.float32)
    x = np.random.default_rng(0).standard_normal((N, d)).astype(np.float32)
    t = time.perf_counter()
    for _ in range(rounds):
        x = w @ x
    return rounds / (time.perf_counter() - t)


async def to_epsilon(d, codec, gamma, max_rounds, eps=1e-3, **hub_kw):
    hub, xs, engines = swarm_of(d, codec, gamma, **hub_kw)
    e0 = consensus_error(xs)
    t = time.perf_counter()
    res = await run_rounds(engines, max_rounds, until=lambda: consensus_error(xs, e0) < eps)
    wall = time.perf_counter() - t
    err = consensus_error(xs, e0)
    return {"codec": codec, "gamma": gamma, "rounds": len(res), "bytes": hub.bytes_sent,
            "wall_s": wall, "error": err, "reached": err < eps}


async def main(quick: bool) -> dict:
    r5 = await rounds_per_s(100_000, 10 if quick else 40)
    a5 = numpy_anchor(100_000, 40)
    r6 = await rounds_per_s(1_000_000, 3 if quick else 8)
    a6 = numpy_anchor(1_000_000, 5)
    print(f"{'d':>9} {'swarm rounds/s':>15} {'numpy W@X rounds/s':>19}")
    print(f"{100_000:>9} {r5:>15.1f} {a5:>19.1f}")
    print(f"{1_000_000:>9} {r6:>15.1f} {a6:>19.1f}")

    d = 10_000
    cap = 1500 if quick else 4000
    runs = [await to_epsilon(d, "identity", 1.0, cap),
            await to_epsilon(d, "sign", 0.4, cap),
            await to_epsilon(d, "topk:0.01", 0.06, cap)]
    dense = runs[0]["bytes"]
    print(f"\nbytes to 1e-3 on a {N}-ring, d={d}")
    print(f"{'codec':>10} {'gamma':>6} {'rounds':>7} {'MB':>9} {'saving':>7} {'error':>9}")
    for r in runs:
        print(f"{r['codec']:>10} {r['gamma']:>6} {r['rounds']:>7} {r['bytes'] / 1e6:>9.2f} "
              f"{dense / r['bytes']:>6.1f}x {r['error']:>9.2e}{'' if r['reached'] else '  (not reached)'}")
    sign_saving = dense / runs[1]["bytes"] if runs[1]["reached"] else 0.0
    topk_saving = dense / runs[2]["bytes"] if runs[2]["reached"] else 0.0

    d = 100_000
    slow = dict(bandwidth_bps=100e6, latency_s=0.0005)
    sd = await to_epsilon(d, "identity", 1.0, 400, **slow)
    sc = await to_epsilon(d, "sign", 0.4, 1500, **slow)
    speedup = sd["wall_s"] / sc["wall_s"] if sc["reached"] and sd["reached"] else 0.0
    print(f"\nwall time to 1e-3, d={d}, emulated 100 Mbit/s + 0.5 ms per link")
    for r in (sd, sc):
        print(f"{r['codec']:>10} rounds {r['rounds']:>5}  wall {r['wall_s']:>7.2f} s  error {r['error']:.2e}")
    print(f"speed-up {speedup:.1f}x")
    return {"rounds_per_s_1e5": round(r5, 1), "rounds_per_s_1e6": round(r6, 2),
            "numpy_anchor_rounds_per_s_1e5": round(a5, 1),
            "sign_bytes_saving": round(sign_saving, 2), "topk_bytes_saving": round(topk_saving, 2),
            "slow_link_speedup": round(speedup, 2),
            "slow_link_dense_s": round(sd["wall_s"], 2), "slow_link_sign_s": round(sc["wall_s"], 2),
            "real_link_shaping": "not run"}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds (smoke test)")
    out = asyncio.run(main(ap.parse_args().quick))
    print(json.dumps(out))
