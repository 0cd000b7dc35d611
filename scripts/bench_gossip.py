"""Gossip engine benchmark: rounds/s, bytes to consensus per codec, slow-link wall time.

Runs 16 peers in one process on the in-memory hub (swarm.gossip.sim), every
message through swarm.wire encode/decode. Anchors measured in the same run:
a bare numpy exact-gossip step (X ← W X on the 16×d matrix) for rounds/s, and
exact gossip (identity codec) for bytes and slow-link time.

Gamma is swept per codec and the best reported (see SIGN_GAMMAS, TOPK_GAMMAS);
"ef+X" runs as X because CHOCO's public copy already carries the residual.

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
    """(wall, cpu) rounds/s: cpu divides by this process's CPU time, which other
    jobs on the shared cores disturb far less than the wall clock."""
    hub, xs, engines = swarm_of(d)
    await run_rounds(engines, 2)  # warm-up: first rounds send full state
    t, c = time.perf_counter(), time.process_time()
    await run_rounds(engines, rounds)
    return rounds / (time.perf_counter() - t), rounds / (time.process_time() - c)


def numpy_anchor(d, rounds):
    w = mixing_matrix("ring", N).astype(np.float32)
    x = np.random.default_rng(0).standard_normal((N, d)).astype(np.float32)
    t, c = time.perf_counter(), time.process_time()
    for _ in range(rounds):
        x = w @ x
    return rounds / (time.perf_counter() - t), rounds / (time.process_time() - c)


async def to_epsilon(d, codec, gamma, max_rounds, eps=1e-3, byte_budget=None, **hub_kw):
    """Run until relative consensus error < eps, max_rounds, or (if given) the
    bytes sent pass byte_budget, past which the codec has missed its target anyway."""
    hub, xs, engines = swarm_of(d, codec, gamma, **hub_kw)
    e0 = consensus_error(xs)
    t = time.perf_counter()
    loose = {}  # wall time when the error first fell below 5e-3 (a looser, secondary mark)

    def stop():
        e = consensus_error(xs, e0)
        if e < 5e-3 and "t" not in loose:
            loose["t"] = time.perf_counter() - t
        return e < eps or (byte_budget is not None and hub.bytes_sent > byte_budget)

    res = await run_rounds(engines, max_rounds, until=stop)
    wall = time.perf_counter() - t
    err = consensus_error(xs, e0)
    return {"codec": codec, "gamma": gamma, "rounds": len(res), "bytes": hub.bytes_sent,
            "wall_s": wall, "error": err, "reached": err < eps, "wall_5e-3_s": loose.get("t")}


def best(runs):
    """The run that reached eps with the fewest bytes, else the one closest to eps."""
    ok = [r for r in runs if r["reached"]]
    return min(ok, key=lambda r: r["bytes"]) if ok else min(runs, key=lambda r: r["error"])


# gamma grids: CHOCO's step has to shrink with the codec's quality. Measured on
# this 16-ring: sign stalls near 2e-3 for gamma <= 0.8 and reaches 1e-3 at 0.9-1;
# top-1% diverges above ~0.025 and is slow below it.
SIGN_GAMMAS = (0.7, 0.8, 0.9, 1.0)
TOPK_GAMMAS = (0.01, 0.015, 0.02, 0.025)


async def main(quick: bool) -> dict:
    t_start = time.perf_counter()
    r5 = await rounds_per_s(100_000, 10 if quick else 40)
    a5 = numpy_anchor(100_000, 40)
    r6 = await rounds_per_s(1_000_000, 3 if quick else 8)
    a6 = numpy_anchor(1_000_000, 5)
    print(f"{N} peers, ring, identity codec, lockstep")
    print(f"{'d':>9} {'swarm rounds/s':>15} {'(per CPU s)':>12} {'numpy W@X rounds/s':>19} {'(per CPU s)':>12}")
    print(f"{100_000:>9} {r5[0]:>15.1f} {r5[1]:>12.1f} {a5[0]:>19.1f} {a5[1]:>12.1f}")
    print(f"{1_000_000:>9} {r6[0]:>15.1f} {r6[1]:>12.1f} {a6[0]:>19.1f} {a6[1]:>12.1f}")

    d = 10_000
    dense = await to_epsilon(d, "identity", 1.0, 400)
    sign_cap, topk_cap = (300, 1500) if quick else (600, 3000)
    # each codec stops once it has spent the bytes its target allows
    signs = [await to_epsilon(d, "ef+sign", g, sign_cap, byte_budget=dense["bytes"] / 12)
             for g in (SIGN_GAMMAS[-2:] if quick else SIGN_GAMMAS)]
    topks = [await to_epsilon(d, "ef+topk:0.01", g, topk_cap, byte_budget=dense["bytes"] / 2)
             for g in (TOPK_GAMMAS[1:3] if quick else TOPK_GAMMAS)]
    print(f"\nbytes to 1e-3 on a {N}-ring, d={d} (gamma sweep; a run stops when it has spent "
          "the bytes its target allows: dense/12 for sign, dense/2 for top-1%)")
    print(f"{'codec':>13} {'gamma':>6} {'rounds':>7} {'MB':>9} {'saving':>7} {'error':>9}")
    for r in [dense, *signs, *topks]:
        print(f"{r['codec']:>13} {r['gamma']:>6} {r['rounds']:>7} {r['bytes'] / 1e6:>9.2f} "
              f"{dense['bytes'] / r['bytes']:>6.1f}x {r['error']:>9.2e}{'' if r['reached'] else '  (not reached)'}")
    bs, bt = best(signs), best(topks)
    sign_saving = dense["bytes"] / bs["bytes"] if bs["reached"] else 0.0
    topk_saving = dense["bytes"] / bt["bytes"] if bt["reached"] else 0.0
    tk = "reached" if bt["reached"] else "best error %.2e" % bt["error"]
    print(f"best gamma: ef+sign {bs['gamma']} ({'reached' if bs['reached'] else 'not reached'}), "
          f"ef+topk:0.01 {bt['gamma']} ({tk})")

    d = 100_000
    slow = dict(bandwidth_bps=100e6, latency_s=0.0005)
    sd = await to_epsilon(d, "identity", 1.0, 400, **slow)
    sc = await to_epsilon(d, "ef+sign", bs["gamma"], 200 if quick else 400, **slow)
    speedup = sd["wall_s"] / sc["wall_s"] if sc["reached"] and sd["reached"] else 0.0
    loose = (sd["wall_5e-3_s"] / sc["wall_5e-3_s"]) if sc["wall_5e-3_s"] and sd["wall_5e-3_s"] else 0.0
    print(f"\nwall time to 1e-3, d={d}, emulated 100 Mbit/s + 0.5 ms per directed link "
          f"(all {N} peers' compute shares this process, so it counts too)")
    for r in (sd, sc):
        print(f"{r['codec']:>10} gamma {r['gamma']:<4} rounds {r['rounds']:>5}  wall {r['wall_s']:>7.2f} s  "
              f"error {r['error']:.2e}")
        if r["wall_5e-3_s"] is not None:
            print(f"{'':>10} reached 5e-3 after {r['wall_5e-3_s']:.2f} s")
    print(f"speed-up to 1e-3 {speedup:.1f}x, to 5e-3 {loose:.1f}x   "
          f"(bench took {time.perf_counter() - t_start:.0f} s)")
    return {"rounds_per_s_1e5": round(r5[0], 1), "rounds_per_cpu_s_1e5": round(r5[1], 1),
            "rounds_per_s_1e6": round(r6[0], 2),
            "numpy_anchor_rounds_per_s_1e5": round(a5[0], 1),
            "sign_bytes_saving": round(sign_saving, 2), "sign_gamma": bs["gamma"],
            "topk_bytes_saving": round(topk_saving, 2), "topk_gamma": bt["gamma"],
            "topk_best_error": float(f"{bt['error']:.3g}"),
            "slow_link_speedup": round(speedup, 2), "slow_link_speedup_5e-3": round(loose, 2),
            "slow_link_dense_s": round(sd["wall_s"], 2), "slow_link_sign_s": round(sc["wall_s"], 2),
            "real_link_shaping": "not run", "quick": quick}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds and gammas (smoke test)")
    out = asyncio.run(main(ap.parse_args().quick))
    print(json.dumps(out))
