"""A plain single-process training loop over a Gymnasium env.

This is the isolated learner: no peer, no gossip. The peer-side runner drives
an agent the same way (perceive → deliberate → step → reflect) and gossips
between steps; comparing the two is what the experiments measure.

    >>> from swarm.buffer import ReplayBuffer
    >>> from swarm.rl import DQNAgent, DQNConfig, dqn_schema
    >>> agent = DQNAgent((4,), 2, ReplayBuffer(dqn_schema((4,)), capacity=10_000, seed=0), DQNConfig())
    >>> result = run_agent("CartPole-v1", agent, steps=2_000, seed=0)
    >>> result.steps, len(result.returns) == len(result.episode_ends)
    (2000, True)
    >>> scores = evaluate("CartPole-v1", agent, episodes=5)   # greedy returns, no learning
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..checks import is_int
from ..errors import ConfigError
from ..peer.agent import BaseAgent

__all__ = ["StepInfo", "RunResult", "run_agent", "evaluate", "make_env"]


@dataclass
class StepInfo:
    """What the ``on_step`` callback sees after each env step."""

    step: int                       # env steps done so far (1-based)
    reward: float
    terminal: bool
    truncated: bool
    episode_return: float | None    # set on the step that ends an episode
    agent: BaseAgent


@dataclass
class RunResult:
    """Episode returns of a run and where in the run each episode ended."""

    steps: int = 0
    seconds: float = 0.0
    returns: list[float] = field(default_factory=list)
    episode_ends: list[int] = field(default_factory=list)   # env step at which each episode ended

    def mean_return(self, last: int = 10) -> float:
        """Mean return of the last ``last`` (an integer >= 1) finished episodes (NaN if none)."""
        if not (is_int(last) and last >= 1):   # returns[-0:] is every episode, [1:] for -1
            raise ConfigError(f"last = {last!r}: must be an integer >= 1")
        tail = self.returns[-int(last):]
        return float(np.mean(tail)) if tail else float("nan")


def make_env(env_id: str, **kwargs: Any) -> Any:
    """``gymnasium.make`` with a ConfigError naming the env when it cannot be made: an
    unknown id, or any failure of the env's module or constructor (a missing package)."""
    import gymnasium as gym

    try:
        return gym.make(env_id, **kwargs)
    except gym.error.Error as e:
        raise ConfigError(f"env = {env_id!r}: gymnasium cannot make it ({e})") from None
    except Exception as e:  # the env's own code runs: it can fail any way (ModuleNotFoundError: jax)
        raise ConfigError(f"env = {env_id!r}: gymnasium cannot make it ({type(e).__name__}: {e})") from None


def run_agent(env_id: str, agent: BaseAgent, steps: int, seed: int = 0,
              on_step: Callable[[StepInfo], bool | None] | None = None) -> RunResult:
    """Train ``agent`` on a fresh ``env_id`` for ``steps`` env steps.

    ``on_step`` is called after every step; returning True stops the run early
    (e.g. once an evaluation says the task is solved). Episodes that a time limit
    cuts off are reported to the agent as truncated with their final observation,
    so it can still bootstrap from it. ``seed`` (an integer >= 0) seeds the env's first
    reset and its action space.
    """
    _check_agent(agent, "perceive", "deliberate", "reflect")
    if not (is_int(steps) and steps >= 0):
        raise ConfigError(f"steps = {steps!r}: must be an integer >= 0")
    steps, seed = int(steps), _seed(seed)
    env = make_env(env_id)
    result = RunResult()
    start = time.perf_counter()
    try:
        env.action_space.seed(seed)
        obs, _ = env.reset(seed=seed)
        agent.perceive(obs)
        ep_return = 0.0
        for t in range(1, steps + 1):
            action = agent.deliberate()
            obs, reward, terminated, truncated, _ = env.step(action)
            ep_return += float(reward)
            done = terminated or truncated
            agent.reflect(float(reward), bool(terminated), truncated=bool(truncated),
                          next_observations=obs if done else None)
            finished = ep_return if done else None
            if done:
                result.returns.append(ep_return)
                result.episode_ends.append(t)
                ep_return = 0.0
                obs, _ = env.reset()
            agent.perceive(obs)
            result.steps = t
            if on_step is not None and on_step(StepInfo(t, float(reward), bool(terminated),
                                                        bool(truncated), finished, agent)):
                break
    finally:
        env.close()
        result.seconds = time.perf_counter() - start
    return result


def _check_agent(agent: Any, *methods: str) -> None:
    """Refuse, before the env is made, an agent without the ``methods`` the loop calls (an
    AttributeError at its first step otherwise). Any object with them will do: a BaseAgent,
    or for :func:`evaluate` anything with ``act``."""
    missing = [m for m in methods if not callable(getattr(agent, m, None))]
    if missing:
        raise ConfigError(f"agent must be a BaseAgent (swarm.peer.agent), or have {', '.join(methods)}; "
                          f"got {type(agent).__name__} {agent!r:.60}, which has no {missing[0]}()")


def _seed(seed: Any) -> int:
    """``seed`` as the plain int >= 0 that gymnasium takes (it refuses a numpy integer).

    Not :func:`swarm.checks.rng_seed`'s 32 bits: a swarm peer's seed is the spec's plus
    its rank, and on resume plus the env steps done, and those may pass 2**32."""
    if not (is_int(seed) and seed >= 0):
        raise ConfigError(f"seed = {seed!r}: must be an integer >= 0")
    return int(seed)


#: The most steps of a greedy episode in :func:`evaluate` when the env has no time limit
#: of its own: a policy that never ends an episode must not stall a peer for ever.
EVAL_MAX_STEPS = 10_000


def evaluate(env_id: str, agent: BaseAgent, episodes: int = 5, seed: int = 10_000,
             max_steps: int | None = None) -> list[float]:
    """Returns of ``episodes`` greedy episodes (``agent.act``), no learning; episode ``i``
    resets the env with seed ``seed + i`` (``seed`` an integer >= 0).

    An episode ends, as truncated, after ``max_steps`` steps: by default the env's own
    ``max_episode_steps``, or :data:`EVAL_MAX_STEPS` when it has none. A ``max_steps``
    given replaces the env's own limit, above it as well as below.
    """
    _check_agent(agent, "act")
    if not (is_int(episodes) and episodes >= 1):
        raise ConfigError(f"episodes = {episodes!r}: must be an integer >= 1")
    if max_steps is not None and not (is_int(max_steps) and max_steps >= 1):
        raise ConfigError(f"max_steps = {max_steps!r}: must be an integer >= 1")
    seed = _seed(seed)
    # the env's TimeLimit would otherwise end an episode before a larger max_steps
    env = make_env(env_id) if max_steps is None else make_env(env_id, max_episode_steps=int(max_steps))
    returns = []
    try:
        if max_steps is None:
            limit = getattr(env.spec, "max_episode_steps", None)
            max_steps = limit if isinstance(limit, int) and limit > 0 else EVAL_MAX_STEPS
        for i in range(episodes):
            obs, _ = env.reset(seed=seed + i)
            total = 0.0
            for _ in range(max_steps):
                obs, reward, terminated, truncated, _ = env.step(agent.act(obs))
                total += float(reward)
                if terminated or truncated:
                    break
            returns.append(total)
    finally:
        env.close()
    return returns
