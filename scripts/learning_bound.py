"""One DQN learner fed by K actors: the most a K-peer swarm's gossip could reach.

A swarm of K peers on a task, with perfect gossip (every peer always holds the
average) and perfect sharing (every peer gets every transition), is one learner
whose buffer K actors fill. This script runs that learner in one process, on
CartPole-v1 by default, and counts env steps per actor and updates until the
greedy evaluation (``--eval-episodes`` episodes every ``--eval-every`` steps of an
actor) reaches the env's solve threshold: its gymnasium ``reward_threshold`` (475 on
CartPole-v1, 195 on CartPole-v0), or ``--solve-at`` (needed for an env without one). With ``--actors 1`` it is the isolated learner on the same
loop, so the two can be compared under the same rule.

Each step, every actor takes one env step (epsilon-greedy on the shared network),
then the learner takes ``updates_per_train`` updates every ``train_every`` steps,
as :class:`~swarm.rl.DQNAgent` does. ``--n-step N`` stores N-step returns: the
learner bootstraps from the state N steps on, discounted by gamma^N; an episode's
last windows end at its terminal state, and windows that the time limit cuts
short are dropped. CPU time counts training only, not the evaluations.

``--trace N`` also evaluates every N steps of an actor and prints each greedy
return, without counting those evaluations towards the solve (it is still counted
on the ``--eval-every`` grid; an evaluation does not touch the learner's random
streams, so the run is the same). It shows what the count samples: with the
benchmark's settings the greedy return swings between 500 and about 100 every few
hundred steps long after it first reaches 500 (docs/rl.md, "What the count
samples").

    python scripts/learning_bound.py --actors 4 --seeds 0 1 2 3 \\
        --set learning_starts=250 --set eps_steps=1250 --set tau=0.12 --set lr=0.004 --set batch_size=128
    python scripts/learning_bound.py --actors 1 --seeds 0 1 2 3 --set tau=0.12 --set lr=0.004

It ends with one JSON line.
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from dataclasses import replace

import numpy as np
import torch

from swarm.buffer import ReplayBuffer
from swarm.checks import finite_arg
from swarm.config import apply_overrides, from_dict, to_dict
from swarm.errors import ConfigError
from swarm.experiment import load_spec
from swarm.rl import DQNAgent, DQNConfig, dqn_schema
from swarm.rl.train import evaluate, make_env
from swarm.scripting import check_seeds, run_script


def solve_threshold(env_id: str, solve_at: float | None = None) -> float:
    """The greedy return that counts as solved: ``solve_at`` if given, else the env's
    gymnasium ``reward_threshold`` (CartPole-v1: 475).

        >>> solve_threshold("CartPole-v1"), solve_threshold("CartPole-v0"), solve_threshold("CartPole-v0", 150)
        (475.0, 195.0, 150)
    """
    if solve_at is not None:
        return solve_at
    import gymnasium as gym

    threshold = gym.spec(env_id).reward_threshold
    if threshold is None:
        raise ConfigError(f"env {env_id!r} has no reward_threshold in its gymnasium spec: give --solve-at RETURN")
    return float(threshold)


def store(buf: ReplayBuffer, obs: np.ndarray, action: int, ret: float, next_obs: np.ndarray,
          done: bool) -> None:
    buf.add({"obs": obs[None], "action": np.array([action], np.int64), "reward": np.array([ret], np.float32),
             "next_obs": np.asarray(next_obs, np.float32)[None], "done": np.array([float(done)], np.float32)})


def run(env_id: str, actors: int, seed: int, cfg: DQNConfig, n_step: int, max_steps: int, eval_every: int,
        eval_episodes: int, trace: int = 0, solve: float = 475.0) -> dict:
    """Steps per actor until the greedy return reaches ``solve`` (``max_steps`` and not
    solved if it does not within them), updates, training CPU."""
    gamma = cfg.gamma
    envs = [make_env(env_id) for _ in range(actors)]
    buf = ReplayBuffer(dqn_schema(envs[0].observation_space.shape), capacity=50_000, alpha=0.6, eps=1e-6,
                       decay=0.0, prioritized=True, seed=seed)
    # DQNAgent bootstraps with cfg.gamma: an N-step transition needs gamma^N there.
    agent = DQNAgent.for_env(envs[0], buf, replace(cfg, gamma=gamma ** n_step), seed=seed)
    rng = np.random.default_rng(seed)
    obs = [np.asarray(e.reset(seed=seed * 1000 + i)[0], np.float32) for i, e in enumerate(envs)]
    windows: list[collections.deque] = [collections.deque() for _ in envs]   # (obs, action, reward)
    discounts = gamma ** np.arange(n_step)
    cpu0, eval_cpu = time.process_time(), 0.0
    solved_at = None
    returns: list[tuple[int, float]] = []   # (steps per actor, greedy return) with --trace
    try:
        for t in range(1, max_steps + 1):
            agent.steps = t - 1            # the epsilon and beta schedules read it
            if t - 1 >= cfg.learning_starts and (t - 1) % cfg.train_every == 0:
                for _ in range(cfg.updates_per_train):
                    agent.learn()
            for i, env in enumerate(envs):
                a = int(rng.integers(agent.n_actions)) if rng.random() < agent.epsilon else agent.act(obs[i])
                nxt, r, term, trunc, _ = env.step(a)
                nxt = np.asarray(nxt, np.float32)
                w = windows[i]
                w.append((obs[i], a, float(r)))
                if len(w) == n_step:
                    o, act, _ = w[0]
                    store(buf, o, act, float(discounts @ [x[2] for x in w]), nxt, bool(term))
                    w.popleft()
                if term:   # every shorter window ends at the terminal state too
                    while w:
                        o, act, _ = w[0]
                        store(buf, o, act, float(discounts[:len(w)] @ [x[2] for x in w]), nxt, True)
                        w.popleft()
                if term or trunc:
                    w.clear()
                    nxt = np.asarray(env.reset()[0], np.float32)
                obs[i] = nxt
            if t % eval_every == 0 or (trace and t % trace == 0):
                c = time.process_time()
                ret = float(np.mean(evaluate(env_id, agent, episodes=eval_episodes, seed=10_000)))
                eval_cpu += time.process_time() - c
                if trace:
                    returns.append((t, ret))
                if t % eval_every == 0 and ret >= solve:
                    solved_at = t
                    break
    finally:
        for e in envs:
            e.close()
    return {"seed": seed, "solved": solved_at is not None, "steps_per_actor": solved_at or max_steps,
            "updates": agent.updates, "train_cpu_s": time.process_time() - cpu0 - eval_cpu,
            **({"trace": returns} if trace else {})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--actors", type=int, default=4)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--n-step", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=25_000, help="env steps per actor before giving up")
    ap.add_argument("--eval-every", type=int, default=1000, help="env steps per actor between evaluations")
    ap.add_argument("--eval-episodes", type=int, default=5)
    ap.add_argument("--trace", type=int, default=0, metavar="N",
                    help="also evaluate every N steps per actor and print the returns (not counted)")
    ap.add_argument("--solve-at", type=finite_arg, default=None, metavar="RETURN",
                    help="greedy return that counts as solved (default: the env's gymnasium reward_threshold, "
                         "475 on CartPole-v1; required for an env without one)")
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    help="DQN hyperparameter override, e.g. --set lr=0.004")
    args = ap.parse_args()
    for name in ("actors", "n_step", "max_steps", "eval_every", "eval_episodes"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.trace < 0:
        ap.error("--trace must be >= 0 (0: no trace)")
    check_seeds(ap, args.seeds)
    try:
        spec = load_spec(None, [f"env={args.env}"])   # a registered env with discrete actions
        # module:EnvId too: the spec check imported the module and read the threshold
        solve = args.solve_at if args.solve_at is not None else solve_threshold(spec.env.rpartition(":")[2])
        cfg = from_dict(DQNConfig, apply_overrides(to_dict(DQNConfig()), args.overrides))
    except ConfigError as e:
        ap.error(str(e))
    if args.max_steps <= cfg.learning_starts:
        ap.error(f"--max-steps {args.max_steps} is not above learning_starts = {cfg.learning_starts}: "
                 "the learner would take no update")
    if args.max_steps < args.eval_every:
        ap.error(f"--max-steps {args.max_steps} is below --eval-every {args.eval_every}: nothing would be evaluated")
    torch.set_num_threads(1)
    print(f"{args.env}: solved at a greedy return of {solve:g}; {args.actors} actor(s), n-step {args.n_step}, "
          f"evaluation every {args.eval_every} steps; DQN: {to_dict(cfg)}", flush=True)
    rows = []
    for seed in args.seeds:
        r = run(args.env, args.actors, seed, cfg, args.n_step, args.max_steps, args.eval_every, args.eval_episodes,
                args.trace, solve)
        if args.trace:
            print(f"seed {seed}, greedy return every {args.trace} steps: "
                  + " ".join(f"{t}:{ret:.0f}" for t, ret in r["trace"]), flush=True)
        print(f"seed {seed}: {'solved' if r['solved'] else 'not solved'} at {r['steps_per_actor']} steps per "
              f"actor, {r['updates']} updates, {r['train_cpu_s']:.1f} s CPU", flush=True)
        rows.append(r)
    print(json.dumps({
        "env": args.env, "solve_at": solve, "actors": args.actors, "n_step": args.n_step,
        "eval_every": args.eval_every, "solved_fraction": sum(r["solved"] for r in rows) / len(rows),
        "mean_steps_per_actor": float(np.mean([r["steps_per_actor"] for r in rows])),
        "mean_updates": float(np.mean([r["updates"] for r in rows])),
        "mean_train_cpu_s": float(np.mean([r["train_cpu_s"] for r in rows])),
        "runs": rows, "config": to_dict(cfg)}))


if __name__ == "__main__":
    run_script(main, "learning_bound")
