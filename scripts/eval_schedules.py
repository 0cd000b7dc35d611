"""How the evaluation schedule moves the learning benchmark's step counts.

``scripts/bench_learning.py`` counts each side at its first greedy evaluation
that reaches 475, every ``--eval-every`` env steps of a learner (1,000: for a
swarm peer that is every 4,000 steps of the swarm in total). The greedy policy
of DQN on CartPole swings around 475, so how often it is looked at moves the
count. This script evaluates often (every ``--every`` steps) and reads off, from
the same runs, the counts that coarser schedules would give (every multiple of
``--every``: 250, 500, 1,000 by default):

* isolated: the benchmark's isolated learner (``ISOLATED``) on the plain loop.
  Its training does not depend on the evaluations (they use their own
  environment and the greedy policy), so a schedule's count is the first solving
  evaluation among its steps; the run goes on until every schedule has one.
* swarm: one ``swarm run`` of the benchmark's settings (``SWARM``) per seed for a
  fixed ``--swarm-steps`` per peer, counted at peer 0's evaluations, as the
  benchmark counts it. A schedule with no solving evaluation by then counts at
  ``--swarm-steps`` (so its mean is a lower bound) and is listed. Unlike the
  isolated learner's, a swarm's training can depend on its evaluations: they
  pause every peer while shared transitions keep arriving. With epsilon over 250
  steps and replay shared every 50 (thirteenth session), runs evaluated every 250
  steps read 2,083 steps per peer at the every-1,000 schedule on seeds 0-11,
  where runs evaluated every 1,000 steps took 3,083 (docs/rl.md). Check a
  reading against runs on the coarser schedule itself.

It prints, per schedule pair, steps per peer and total steps against the
isolated learner's, over the seeds the isolated learner solved on every
schedule. The last line is one JSON object.

    python scripts/eval_schedules.py                        # seeds 0-23: about 15 min on 2 cores
    python scripts/eval_schedules.py --seeds 0 1 2 3 --swarm-steps 6000
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from bench_learning import ENV, ISOLATED, SOLVE, SWARM, _sigterm_exits
from swarm.buffer import ReplayBuffer
from swarm.errors import ConfigError
from swarm.experiment import load_spec, run_experiment
from swarm.rl import DQNAgent, dqn_schema
from swarm.rl.train import StepInfo, evaluate, make_env, run_agent
from swarm.scripting import check_seeds, run_script


def first_solves(evals: list[tuple[int, float]], schedules: list[int]) -> dict[int, int | None]:
    """Per schedule (evaluations every s steps), the steps of its first evaluation that reached SOLVE."""
    return {s: next((step for step, r in evals if step % s == 0 and r >= SOLVE), None) for s in schedules}


def until_every_schedule_solves(every: int, schedules: list[int], greedy_return: Callable[[int], float],
                                evals: list[tuple[int, float]]) -> Callable[[StepInfo], bool]:
    """A ``run_agent`` ``on_step`` that evaluates every ``every`` steps (``greedy_return(step)``),
    adds (steps, return) to ``evals``, and stops the run once each schedule has had a
    solving evaluation (a schedule that does not divide the coarsest may solve later than it)."""
    unsolved = set(schedules)

    def on_step(info: StepInfo) -> bool:
        if info.step % every:
            return False
        r = greedy_return(info.step)
        evals.append((info.step, r))
        if r >= SOLVE:
            unsolved.difference_update(s for s in schedules if info.step % s == 0)
        return not unsolved

    return on_step


def isolated_evals(seed: int, every: int, schedules: list[int], max_steps: int,
                   episodes: int) -> list[tuple[int, float]]:
    """(steps, greedy return) every ``every`` steps until each schedule has had a solving
    one (:func:`until_every_schedule_solves`)."""
    env = make_env(ENV)
    buf = ReplayBuffer(dqn_schema(env.observation_space.shape), capacity=50_000, alpha=0.6, eps=1e-6,
                       decay=0.0, prioritized=True, seed=seed)
    agent = DQNAgent.for_env(env, buf, ISOLATED, seed=seed)
    env.close()
    evals: list[tuple[int, float]] = []
    on_step = until_every_schedule_solves(
        every, schedules, lambda _step: float(np.mean(evaluate(ENV, agent, episodes=episodes, seed=10_000))), evals)
    run_agent(ENV, agent, max_steps, seed=seed, on_step=on_step)
    return evals


def swarm_sets(seed: int, every: int, steps: int, episodes: int) -> list[str]:
    """The spec overrides of one seed's ``swarm run``."""
    return SWARM + [f"seed={seed}", f"budget.env_steps={steps}", "budget.stop_when_solved=false",
                    f"eval.every={every}", f"eval.episodes={episodes}", f"eval.solve_return={SOLVE}"]


def swarm_evals(seed: int, every: int, steps: int, episodes: int) -> list[tuple[int, float]]:
    """Peer 0's (steps, greedy return) every ``every`` of its steps in one ``swarm run`` of SWARM."""
    with tempfile.TemporaryDirectory(prefix="eval_schedules-") as tmp:
        sets = swarm_sets(seed, every, steps, episodes)
        log = io.StringIO()
        with _sigterm_exits():   # a SIGTERM ends the script as one, not as the launcher's KeyboardInterrupt
            result = run_experiment(None, sets, runs_root=Path(tmp), stream=log)
        if result.exit_code != 0:
            raise SystemExit(f"swarm run failed:\n{log.getvalue()}")
        run_dir = result.run_dir
        with open(run_dir / "peer0" / "evals.csv") as f:
            return [(int(r["env_steps"]), float(r["eval_return"])) for r in csv.DictReader(f)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(24)))
    ap.add_argument("--every", type=int, default=250, help="evaluate every this many steps of a learner")
    ap.add_argument("--schedules", type=int, nargs="+", default=[250, 500, 1000],
                    help="the schedules to read off (multiples of --every)")
    ap.add_argument("--episodes", type=int, default=5)
    ap.add_argument("--isolated-steps", type=int, default=25_000, help="the isolated learner's step cap")
    ap.add_argument("--swarm-steps", type=int, default=5_000,
                    help="steps per peer of each swarm run (at least the coarsest schedule)")
    args = ap.parse_args()
    for name in ("every", "episodes", "isolated_steps", "swarm_steps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if min(args.schedules) < 1:
        ap.error("--schedules must be >= 1")
    if any(s % args.every for s in args.schedules):
        ap.error(f"--schedules {args.schedules} must be multiples of --every {args.every}")
    if args.isolated_steps < max(args.schedules):
        ap.error(f"--isolated-steps {args.isolated_steps} is below the coarsest schedule, {max(args.schedules)}")
    if args.swarm_steps < max(args.schedules):   # the swarm would never be evaluated on it
        ap.error(f"--swarm-steps {args.swarm_steps} is below the coarsest schedule, {max(args.schedules)}")
    check_seeds(ap, args.seeds)
    try:   # the swarm runs' settings, checked before the isolated runs take their time
        peers = load_spec(None, swarm_sets(max(args.seeds), args.every, args.swarm_steps, args.episodes)).peers
    except ConfigError as e:
        ap.error(f"the swarm runs' settings: {e}")
    torch.set_num_threads(1)
    scheds = sorted(args.schedules)
    iso, sw = {}, {}
    for seed in args.seeds:
        iso[seed] = first_solves(isolated_evals(seed, args.every, scheds, args.isolated_steps, args.episodes),
                                 scheds)
        sw[seed] = first_solves(swarm_evals(seed, args.every, args.swarm_steps, args.episodes), scheds)
        print(f"seed {seed}: isolated {iso[seed]}  swarm peer 0 {sw[seed]}", flush=True)

    fair = [s for s in args.seeds if all(iso[s][k] is not None for k in scheds)]
    if len(fair) < len(args.seeds):
        print(f"the isolated learner did not solve seeds {sorted(set(args.seeds) - set(fair))} on every "
              f"schedule; they are left out", flush=True)
    capped = {k: [s for s in fair if sw[s][k] is None] for k in scheds}
    rows = []
    print(f"\n{'isolated every':>15} {'swarm every (per peer)':>23} {'iso steps':>10} {'swarm steps/peer':>17} "
          f"{'per peer':>9} {'total':>7}")
    for ki in scheds:
        for ks in scheds:
            if not fair:   # no seed to compare on: no figures (null in the JSON line)
                rows.append({"isolated_every": ki, "swarm_every": ks, "isolated_steps": None,
                             "swarm_steps_per_peer": None, "steps_per_peer_ratio": None, "total_steps_ratio": None})
                print(f"{ki:>15} {ks:>23} {'-':>10} {'-':>17} {'-':>9} {'-':>7}")
                continue
            iso_mean = float(np.mean([iso[s][ki] for s in fair]))
            sw_mean = float(np.mean([args.swarm_steps if sw[s][ks] is None else sw[s][ks] for s in fair]))
            rows.append({"isolated_every": ki, "swarm_every": ks, "isolated_steps": iso_mean,
                         "swarm_steps_per_peer": sw_mean, "steps_per_peer_ratio": sw_mean / iso_mean,
                         "total_steps_ratio": peers * sw_mean / iso_mean})
            print(f"{ki:>15} {ks:>23} {iso_mean:>10.0f} {sw_mean:>17.0f} {sw_mean / iso_mean:>9.2f} "
                  f"{peers * sw_mean / iso_mean:>7.2f}")
    for k, c in capped.items():
        if c:
            print(f"swarm every {k}: seeds {c} not solved in {args.swarm_steps} steps, counted at that")
    print(json.dumps({"seeds": fair, "rows": rows, "swarm_capped": capped,
                      "isolated": {str(s): iso[s] for s in args.seeds}, "swarm": {str(s): sw[s] for s in args.seeds}}))


if __name__ == "__main__":
    run_script(main, "eval_schedules")
