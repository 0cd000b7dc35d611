"""DQN's per-step costs against the same update written the usual torch way, in the same run.

    .venv/bin/python scripts/bench_dqn.py [--batches 64 128] [--reps 2000]

:class:`swarm.rl.DQNAgent` keeps its gradients in one flat vector and steps a
one-vector Adam on it (:class:`swarm.rl.flat.FlatAdam`), and acts greedily in
numpy. The anchor is the same double-DQN update over the same network and batch
as a CleanRL-style script writes it: ``torch.optim.Adam`` (fused where this build
has it), ``zero_grad(set_to_none=True)``, ``clip_grad_norm_``, and a torch forward
to act. Both run on one torch thread, as every learner in the benchmarks does.

Figures, milliseconds of CPU per call (the fastest of 5 blocks of ``--reps``
calls, the least disturbed by neighbours): ``update`` (one gradient step on a
fixed batch), ``learn`` (sample a prioritized buffer of 20,000 transitions,
update, write priorities back; swarm only: the anchor has no buffer of its own)
and ``act`` (one greedy action). Prints a table, then one JSON line with the
anchor/swarm ratios (above 1: swarm is faster).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from swarm.buffer import ReplayBuffer  # noqa: E402
from swarm.rl import DQNAgent, DQNConfig, dqn_schema  # noqa: E402
from swarm.rl.dqn import QNetwork  # noqa: E402
from swarm.scripting import run_script  # noqa: E402

OBS, ACTIONS = 4, 2   # CartPole-v1's sizes
#: transitions in the buffer that ``learn`` samples: a batch larger than this gets no update
BUFFER = 20_000


class TorchDQN:
    """The anchor: one double-DQN update and greedy act in plain torch idiom."""

    def __init__(self, cfg: DQNConfig, seed: int = 0):
        torch.manual_seed(seed)
        self.cfg = cfg
        self.q = QNetwork(OBS, ACTIONS, cfg.hidden)
        self.target = copy.deepcopy(self.q).requires_grad_(False)
        try:
            self.opt = torch.optim.Adam(self.q.parameters(), lr=cfg.lr, fused=True)
        except (RuntimeError, TypeError, ValueError):
            self.opt = torch.optim.Adam(self.q.parameters(), lr=cfg.lr, foreach=True)

    def update(self, b: dict[str, torch.Tensor], w: torch.Tensor) -> tuple[float, torch.Tensor]:
        with torch.no_grad():
            next_a = self.q(b["next_obs"]).argmax(1, keepdim=True)
            next_q = self.target(b["next_obs"]).gather(1, next_a).squeeze(1)
            target = b["reward"] + self.cfg.gamma * (1.0 - b["done"]) * next_q
        q = self.q(b["obs"]).gather(1, b["action"].unsqueeze(1)).squeeze(1)
        loss = (w * F.huber_loss(q, target, reduction="none")).mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.q.parameters(), self.cfg.max_grad_norm, foreach=True)
        self.opt.step()
        with torch.no_grad():
            for tp, p in zip(self.target.parameters(), self.q.parameters()):
                tp.lerp_(p, self.cfg.tau)
        return loss.item(), (target - q).detach()

    def act(self, obs: np.ndarray) -> int:
        with torch.no_grad():
            return int(self.q(torch.from_numpy(obs).unsqueeze(0)).argmax(1).item())


def cpu_ms(fn: Callable[[], object], reps: int, blocks: int = 5) -> float:
    """CPU milliseconds per call: the fastest of ``blocks`` blocks of ``reps`` calls."""
    for _ in range(min(reps, 200)):
        fn()
    best = float("inf")
    for _ in range(blocks):
        t0 = time.process_time()
        for _ in range(reps):
            fn()
        best = min(best, (time.process_time() - t0) / reps)
    return best * 1e3


def filled_buffer(n: int, seed: int = 0) -> ReplayBuffer:
    buf = ReplayBuffer(dqn_schema((OBS,)), capacity=50_000, alpha=0.6, eps=1e-6, decay=0.0,
                       prioritized=True, seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(0, n, 1000):
        buf.add({"obs": rng.standard_normal((1000, OBS), dtype=np.float32),
                 "action": rng.integers(ACTIONS, size=1000),
                 "reward": np.ones(1000, np.float32),
                 "next_obs": rng.standard_normal((1000, OBS), dtype=np.float32),
                 "done": (rng.random(1000) < 0.05).astype(np.float32)})
    return buf


def run(batch: int, reps: int) -> dict:
    cfg = DQNConfig(batch_size=batch)
    buf = filled_buffer(BUFFER)
    ours = DQNAgent((OBS,), ACTIONS, buf, cfg, seed=0)
    anchor = TorchDQN(cfg, seed=0)
    s = buf.sample(batch, beta=0.4)
    b = {k: torch.as_tensor(v) for k, v in s.batch.items()}
    w = torch.as_tensor(np.asarray(s.weights, dtype=np.float32))
    obs = np.random.default_rng(1).standard_normal(OBS).astype(np.float32)
    row = {"batch": batch,
           "update_ms": cpu_ms(lambda: ours.update(b, w), reps),
           "anchor_update_ms": cpu_ms(lambda: anchor.update(b, w), reps)}
    updates = ours.updates
    row["learn_ms"] = cpu_ms(ours.learn, reps)
    if ours.updates == updates:
        # learn() returned at once (too few items for its batch): its time is no update's cost
        raise RuntimeError(f"batch {batch}: learn() took no update (the buffer holds {len(buf)} transitions)")
    row["act_us"] = cpu_ms(lambda: ours.act(obs), 10 * reps) * 1e3
    row["anchor_act_us"] = cpu_ms(lambda: anchor.act(obs), 10 * reps) * 1e3
    row["update_speedup"] = row["anchor_update_ms"] / row["update_ms"]
    row["act_speedup"] = row["anchor_act_us"] / row["act_us"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--reps", type=int, default=2000)
    args = ap.parse_args()
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    if min(args.batches) < 1:
        ap.error("--batches must be >= 1")
    if max(args.batches) > BUFFER:
        ap.error(f"--batches {max(args.batches)} is above the buffer's {BUFFER} transitions: learn() would "
                 f"take no update; choose batches of at most {BUFFER}")
    torch.set_num_threads(1)
    rows = [run(bs, args.reps) for bs in args.batches]
    print(f"{'batch':>5} {'update ms':>10} {'torch idiom':>12} {'speed-up':>9} {'learn ms':>9} "
          f"{'act us':>7} {'torch act':>10} {'speed-up':>9}")
    for r in rows:
        print(f"{r['batch']:>5} {r['update_ms']:>10.3f} {r['anchor_update_ms']:>12.3f} {r['update_speedup']:>8.2f}x "
              f"{r['learn_ms']:>9.3f} {r['act_us']:>7.1f} {r['anchor_act_us']:>10.1f} {r['act_speedup']:>8.2f}x")
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows}))


if __name__ == "__main__":
    run_script(main, "bench_dqn")
