"""Benchmark swarm.buffer.ReplayBuffer against cpprb.PrioritizedReplayBuffer in the same run.

Capacity 1,000,000, obs float32[8]. Measures batched add (256), one-by-one add,
prioritized sample 256, update 256, and a learner step (sample + update), for
both buffers, plus our learner step with age decay on vs off. Each figure is
the median of several timed repeats, interleaving the two libraries so that
noise from other processes hits both alike.

The last line is one JSON object: ``learner_step_vs_cpprb`` and
``add_vs_cpprb`` (cpprb time / ours: > 1 means we are faster) and
``decay_overhead`` (decay time / no-decay time − 1).

    python scripts/bench_buffer.py [--capacity N] [--repeats R]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from swarm.buffer import ReplayBuffer

try:
    from cpprb import PrioritizedReplayBuffer
except ImportError:  # pragma: no cover - the anchor is required
    raise SystemExit("cpprb is needed for the anchor: pip install -e '.[bench]'")

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
    env = {"obs": {"shape": OBS}, "action": {"shape": 1, "dtype": np.int64}, "reward": {},
           "next_obs": {"shape": OBS}, "done": {}}
    return PrioritizedReplayBuffer(capacity, env, alpha=0.6, eps=1e-6)


def timeit(fn, iters: int) -> float:
    """Seconds per call of fn, over iters calls."""
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t) / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iters", type=int, default=300)
    args = ap.parse_args()
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
        "add_one": (lambda: a.add_one(**one), lambda: b.add(**one), 1),
        "sample_256": (o_sample, c_sample, 1),
        "update_256": (lambda: a.update_priorities(state["o"].indices, td),
                       lambda: b.update_priorities(state["c"]["indexes"], td), 1),
        "learner_step": (lambda: a.update_priorities(a.sample(B, 0.4).indices, td),
                         lambda: b.update_priorities(b.sample(B, 0.4)["indexes"], td), 1),
    }

    def d_step():
        d.update_priorities(d.sample(B, 0.4).indices, td)

    res: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in cases}
    dec: tuple[list[float], list[float]] = ([], [])
    for _ in range(args.repeats):
        for name, (fo, fc, _) in cases.items():
            it = args.iters * (10 if name == "add_one" else 1)
            res[name][0].append(timeit(fo, it))
            res[name][1].append(timeit(fc, it))
        dec[0].append(timeit(lambda: a.update_priorities(a.sample(B, 0.4).indices, td), args.iters))
        dec[1].append(timeit(d_step, args.iters))

    print(f"capacity {cap:,}, obs float32[{OBS}], batch {B}, median of {args.repeats} repeats")
    print(f"{'operation':<14}{'swarm µs':>11}{'cpprb µs':>11}{'cpprb/swarm':>13}")
    out = {}
    for name, (o, c) in res.items():
        mo, mc = statistics.median(o), statistics.median(c)
        out[name] = {"swarm_us": round(mo * 1e6, 2), "cpprb_us": round(mc * 1e6, 2), "ratio": round(mc / mo, 3)}
        print(f"{name:<14}{mo * 1e6:>11.1f}{mc * 1e6:>11.1f}{mc / mo:>12.2f}×")
    no_decay, with_decay = statistics.median(dec[0]), statistics.median(dec[1])
    overhead = with_decay / no_decay - 1
    print(f"learner step with decay: {with_decay * 1e6:.1f} µs vs {no_decay * 1e6:.1f} µs without "
          f"({overhead * 100:+.1f}%)")
    print(json.dumps({
        "learner_step_vs_cpprb": out["learner_step"]["ratio"],
        "add_vs_cpprb": out["add_256"]["ratio"],
        "add_one_vs_cpprb": out["add_one"]["ratio"],
        "sample_vs_cpprb": out["sample_256"]["ratio"],
        "update_vs_cpprb": out["update_256"]["ratio"],
        "decay_overhead": round(overhead, 3),
        "capacity": cap,
        "detail": out,
    }))


if __name__ == "__main__":
    main()
