"""Learning curve of one isolated DQN learner on CartPole-v1 (no peers, no gossip).

Runs the plain loop (:func:`swarm.rl.train.run_agent`) with the real prioritized
replay buffer, against a uniformly random policy measured in the same run, and
reports the mean return of the last episodes, a greedy evaluation, and the CPU
time used. It ends with one JSON line.

    python scripts/dqn_isolated.py --steps 15000 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import torch

from swarm.buffer import ReplayBuffer
from swarm.config import apply_overrides, from_dict, to_dict
from swarm.errors import ConfigError
from swarm.experiment import load_spec
from swarm.rl import DQNAgent, DQNConfig, dqn_schema
from swarm.rl.train import EVAL_MAX_STEPS, evaluate, make_env, run_agent
from swarm.scripting import check_seeds, run_script


def random_returns(env_id: str, episodes: int, seed: int) -> list[float]:
    env = make_env(env_id)
    env.action_space.seed(seed)
    out = []
    for i in range(episodes):
        env.reset(seed=seed + i)
        total = 0.0
        for _ in range(EVAL_MAX_STEPS):   # as evaluate caps an env with no time limit
            _, r, term, trunc, _ = env.step(env.action_space.sample())
            total += float(r)
            if term or trunc:
                break
        out.append(total)
    env.close()
    return out


def mean_or_none(values: list[float | None]) -> float | None:
    """The mean, or None (null in the JSON line) when a value is missing: a run that finished no episode."""
    if not values or any(v is None or math.isnan(v) for v in values):
        return None
    return float(np.mean(values))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--steps", type=int, default=15_000, help="env steps per seed")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    help="DQN hyperparameter override, e.g. --set lr=5e-4")
    ap.add_argument("--every", type=int, default=2_000, help="env steps between curve points")
    args = ap.parse_args()
    for name in ("steps", "every"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")
    check_seeds(ap, args.seeds)
    try:
        load_spec(None, [f"env={args.env}"])   # a registered env with discrete actions
        cfg = from_dict(DQNConfig, apply_overrides({}, args.overrides))
    except ConfigError as e:
        ap.error(str(e))
    if args.steps <= cfg.learning_starts:
        ap.error(f"--steps {args.steps} is not above learning_starts = {cfg.learning_starts}: "
                 "the learner would take no update")
    if args.every > args.steps:
        ap.error(f"--every {args.every} is above --steps {args.steps}: the curve would have no point")
    torch.set_num_threads(1)

    rand = random_returns(args.env, 50, seed=123)
    print(f"random policy: mean return {np.mean(rand):.1f} over 50 episodes")
    print(f"DQN: {to_dict(cfg)}")
    runs = []
    for seed in args.seeds:
        env = make_env(args.env)
        buf = ReplayBuffer(dqn_schema(env.observation_space.shape), capacity=50_000, alpha=0.6,
                           eps=1e-6, decay=0.0, prioritized=True, seed=seed)
        agent = DQNAgent.for_env(env, buf, cfg, seed=seed)
        env.close()
        cpu0 = time.process_time()
        curve: list[tuple[int, float]] = []
        returns: list[float] = []

        def on_step(info) -> None:
            if info.episode_return is not None:
                returns.append(info.episode_return)
            if info.step % args.every == 0:
                curve.append((info.step, float(np.mean(returns[-10:])) if returns else None))

        res = run_agent(args.env, agent, args.steps, seed=seed, on_step=on_step)
        cpu = time.process_time() - cpu0
        greedy = float(np.mean(evaluate(args.env, agent, episodes=10)))
        print(f"\nseed {seed}: {res.steps} steps in {res.seconds:.1f} s wall, {cpu:.1f} s CPU, "
              f"{len(res.returns)} episodes")
        print("  step    mean return (last 10 episodes)")
        for step, m in curve:
            shown = "-" if m is None else f"{m:.1f}"
            print(f"  {step:6d}  {shown:>7}")
        print(f"  greedy evaluation (10 episodes): {greedy:.1f}")
        runs.append({"seed": seed, "cpu_s": cpu, "wall_s": res.seconds,
                     "final_mean_return": res.mean_return(10) if res.returns else None,
                     "greedy_return": greedy, "curve": curve})

    summary = {
        "env": args.env, "steps": args.steps, "random_mean_return": float(np.mean(rand)),
        "final_mean_return": mean_or_none([r["final_mean_return"] for r in runs]),
        "greedy_return": float(np.mean([r["greedy_return"] for r in runs])),
        "cpu_s_max": max(r["cpu_s"] for r in runs),
        "runs": runs, "config": to_dict(cfg),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    run_script(main, "dqn_isolated")
