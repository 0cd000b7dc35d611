"""Benchmark swarm.buffer.ReplayBuffer against cpprb.PrioritizedReplayBuffer in the same run.

Capacity 1,000,000, obs float32[8]. Measures batched add (256), one-by-one add,
prioritized sample 256, update 256, and a learner step (sample + update), for
both buffers, plus our learner step with age decay on vs off.

These machines are shared, so the two sides are interleaved finely: each round
times a short burst of ours and a short burst of theirs back to back (in
alternating order), and every figure is the median over many rounds. Ratios
are the median of the per-round ratios, so a noisy moment hits both sides of
the pair it lands in; the median per-side times are printed too.

The last line is one JSON object: ``learner_step_vs_cpprb`` and
``add_vs_cpprb`` (cpprb time / ours: > 1 means we are faster),
``decay_overhead`` (decay time / no-decay time − 1), the targets, and whether
each was met in this run.

    python scripts/bench_buffer.py [--capacity N] [--rounds R] [--burst K]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import TYPE_CHECKING

import numpy as np

from swarm.buffer import ReplayBuffer
from swarm.scripting import run_script

if TYPE_CHECKING:
    from cpprb import PrioritizedReplayBuffer

B = 256
OBS = 8


def batch(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {"obs": rng.random((n, OBS), dtype=np.float32), "action": rng.integers(0, 4, n),
            "reward": rng.random(n, dtype=np.float32), "next_obs": rng.random((n, OBS), dtype=np.float32),
            "done": np.zeros(n, np.float32)}


def ours(capacity: int, decay: float = 0.0) -> ReplayBuffer:
    schema = {"obs": ("float32", (OBS,)), "action": ("int64", ()), "reward": ("float32", ()),
              "next_obs": ("float32", (OBS,)), "done": ("float32", ())}
    return ReplayBuffer(schema, capacity, alpha=0.6, eps=1e-6, decay=decay, seed=0)


def theirs(capacity: int) -> PrioritizedReplayBuffer:
    from cpprb import PrioritizedReplayBuffer

    env = {"obs": {"shape": OBS}, "action": {"shape": 1, "dtype": np.int64}, "reward": {},
           "next_obs": {"shape": OBS}, "done": {}}
    return PrioritizedReplayBuffer(capacity, env, alpha=0.6, eps=1e-6)


def paired(fa, fb, rounds: int, burst: int) -> tuple[list[float], list[float], list[float]]:
    """Per-call seconds of fa and fb over `rounds` interleaved bursts, and the per-round ratios b/a."""
    ta, tb, ratio = [], [], []
    clock = time.perf_counter
    for r in range(rounds):
        order = ((fa, ta), (fb, tb)) if r % 2 == 0 else ((fb, tb), (fa, ta))
        for fn, out in order:
            t = clock()
            for _ in range(burst):
                fn()
            out.append((clock() - t) / burst)
        ratio.append(tb[-1] / ta[-1])
    return ta, tb, ratio


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=300, help="interleaved rounds per operation")
    ap.add_argument("--burst", type=int, default=4, help="calls per timed burst")
    args = ap.parse_args()
    if args.capacity < B:
        ap.error(f"--capacity must be >= {B} (the batch)")
    for name in ("rounds", "burst"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")
    try:   # checked here, not at import, so that --help works without it
        import cpprb  # noqa: F401
    except ImportError:
        raise SystemExit("cpprb is needed for the anchor: pip install -e '.[bench]'") from None
    rng = np.random.default_rng(0)
    cap = args.capacity
    data = batch(rng, B)
    one = {k: v[0] for k, v in data.items()}
    td = rng.random(B)

    a, b, d = ours(cap), theirs(cap), ours(cap, decay=1e-3)
    # Fill both to capacity so that sampling descends a full tree.
    big = batch(rng, 65536)
    for _ in range((cap + 65535) // 65536):
        a.add(big)
        d.add(big)
        b.add(**big)

    state = {}

    def o_sample():
        state["o"] = a.sample(B, beta=0.4)

    def c_sample():
        state["c"] = b.sample(B, beta=0.4)

    o_sample(), c_sample()
    cases = {
        "add_256": (lambda: a.add(data), lambda: b.add(**data), 1),
        "add_one": (lambda: a.add_one(**one), lambda: b.add(**one), 8),
        "sample_256": (o_sample, c_sample, 1),
        # fresh indices each call, as in training (re-updating one batch would stay in cache)
        "update_256": (lambda: a.update_priorities(a.sample(B, 0.4).indices, td) and None,
                       lambda: b.update_priorities(b.sample(B, 0.4)["indexes"], td), 1),
        "learner_step": (lambda: a.update_priorities(a.sample(B, 0.4).indices, td),
                         lambda: b.update_priorities(b.sample(B, 0.4)["indexes"], td), 1),
    }
    del cases["update_256"]   # measured below, net of its sample

    res = {}
    for name, (fo, fc, mult) in cases.items():
        for f in (fo, fc):   # warm up
            f()
        res[name] = paired(fo, fc, args.rounds, args.burst * mult)

    # update alone: time only the update, on indices sampled (untimed) just before
    def timed_update(buf, get, store):
        def fn():
            idx = get(buf)
            t = time.perf_counter()
            buf.update_priorities(idx, td)
            store.append(time.perf_counter() - t)
        return fn
    uo, uc = [], []
    fo = timed_update(a, lambda x: x.sample(B, 0.4).indices, uo)
    fc = timed_update(b, lambda x: x.sample(B, 0.4)["indexes"], uc)
    for r in range(args.rounds * args.burst):
        (fo, fc)[r % 2]()
        (fc, fo)[r % 2]()
    res["update_256"] = (uo, uc, [c / o for o, c in zip(uo, uc)])

    def step(buf):
        return lambda: buf.update_priorities(buf.sample(B, 0.4).indices, td)
    dec = paired(step(a), step(d), args.rounds, args.burst)

    print(f"capacity {cap:,}, obs float32[{OBS}], batch {B}; {args.rounds} interleaved rounds "
          f"of {args.burst}-call bursts, medians")
    print(f"{'operation':<14}{'swarm µs':>11}{'cpprb µs':>11}{'cpprb/swarm':>13}")
    out = {}
    for name in ("add_256", "add_one", "sample_256", "update_256", "learner_step"):
        o, c, ratio = res[name]
        mo, mc, mr = statistics.median(o), statistics.median(c), statistics.median(ratio)
        out[name] = {"swarm_us": round(mo * 1e6, 2), "cpprb_us": round(mc * 1e6, 2), "ratio": round(mr, 3)}
        print(f"{name:<14}{mo * 1e6:>11.1f}{mc * 1e6:>11.1f}{mr:>12.2f}×")
    no_decay, with_decay = statistics.median(dec[0]), statistics.median(dec[1])
    overhead = statistics.median(dec[2]) - 1
    print(f"learner step with decay: {with_decay * 1e6:.1f} µs vs {no_decay * 1e6:.1f} µs without "
          f"({overhead * 100:+.1f}%, median of paired rounds)")
    targets = {"learner_step_vs_cpprb": 1.25, "add_vs_cpprb": 1.25, "decay_overhead": 0.25}
    got = {"learner_step_vs_cpprb": out["learner_step"]["ratio"], "add_vs_cpprb": out["add_256"]["ratio"],
           "decay_overhead": round(overhead, 3)}
    met = {"learner_step_vs_cpprb": got["learner_step_vs_cpprb"] >= 1.25,
           "add_vs_cpprb": got["add_vs_cpprb"] >= 1.25, "decay_overhead": got["decay_overhead"] <= 0.25}
    for k in targets:
        print(f"target {k}: {got[k]} ({'>=' if k != 'decay_overhead' else '<='} {targets[k]}) "
              f"{'met' if met[k] else 'NOT met'}")
    print(json.dumps({
        **got,
        "add_one_vs_cpprb": out["add_one"]["ratio"],
        "sample_vs_cpprb": out["sample_256"]["ratio"],
        "update_vs_cpprb": out["update_256"]["ratio"],
        "targets": targets,
        "met": met,
        "capacity": cap,
        "rounds": args.rounds,
        "burst": args.burst,
        "detail": out,
    }))


if __name__ == "__main__":
    run_script(main, "bench_buffer")
