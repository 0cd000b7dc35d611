import numpy as np
import pytest

from swarm.errors import ConfigError
from swarm.peer.agent import BaseAgent
from swarm.rl import DQNAgent, DQNConfig, dqn_schema
from swarm.rl.train import RunResult, evaluate, make_env, run_agent


class Constant(BaseAgent):
    """Always pushes right: CartPole falls within a few dozen steps."""

    def __init__(self):
        self.seen, self.reflected = 0, []

    def perceive(self, observations):
        self.seen += 1

    def deliberate(self):
        return 1

    def reflect(self, reward, terminal, *, truncated=False, next_observations=None):
        self.reflected.append((reward, terminal, truncated, next_observations is not None))

    def act(self, observations):
        return 1


def test_loop_records_episodes_and_drives_the_agent():
    agent = Constant()
    res = run_agent("CartPole-v1", agent, steps=300, seed=0)
    assert res.steps == 300 and len(agent.reflected) == 300
    assert agent.seen == 301  # one perceive after each step, plus the first
    assert len(res.returns) >= 3 and len(res.returns) == len(res.episode_ends)
    # CartPole pays 1 per step, so returns are the gaps between episode ends.
    np.testing.assert_array_equal(res.returns, np.diff([0] + res.episode_ends))
    ends = [t for t, (_, term, trunc, has_next) in enumerate(agent.reflected, 1) if term]
    assert ends == res.episode_ends
    assert all(has_next == (term or trunc) for _, term, trunc, has_next in agent.reflected)


def test_on_step_can_stop_the_run():
    seen = []
    res = run_agent("CartPole-v1", Constant(), steps=1000, seed=0,
                    on_step=lambda info: seen.append(info.step) or info.episode_return is not None)
    assert res.steps == seen[-1] == res.episode_ends[0] and len(res.returns) == 1


def test_bad_arguments():
    with pytest.raises(ConfigError, match="NoSuchEnv"):
        make_env("NoSuchEnv-v0")
    with pytest.raises(ConfigError, match="steps"):
        run_agent("CartPole-v1", Constant(), steps=-1)
    with pytest.raises(ConfigError, match="episodes"):
        evaluate("CartPole-v1", Constant(), episodes=0)


def test_dqn_smoke_run_on_the_real_buffer():
    from swarm.buffer import ReplayBuffer

    buf = ReplayBuffer(dqn_schema((4,)), capacity=2_000, alpha=0.6, eps=1e-6, decay=0.0,
                       prioritized=True, seed=0)
    cfg = DQNConfig(learning_starts=200, batch_size=32, target_every=50, eps_steps=500)
    env = make_env("CartPole-v1")
    agent = DQNAgent.for_env(env, buf, cfg, seed=0)
    env.close()
    res = run_agent("CartPole-v1", agent, steps=600, seed=0)
    assert res.steps == 600 and len(buf) == 600  # every step stored exactly once
    m = agent.metrics()
    assert agent.updates == 400 and np.isfinite(m["loss"]) and m["epsilon"] == pytest.approx(0.05)
    returns = evaluate("CartPole-v1", agent, episodes=2)
    assert len(returns) == 2 and all(r >= 1 for r in returns)
    # TD errors were fed back: priorities differ, so importance weights (normalised by
    # the buffer-wide maximum weight, as in PER) are in (0, 1] and not all equal.
    s = buf.sample(32, beta=1.0)
    assert np.isfinite(s.weights).all() and 0 < s.weights.min() and s.weights.max() <= 1.0 + 1e-6
    assert s.weights.min() < s.weights.max()


class Balancer(BaseAgent):
    """Keeps CartPole's pole up from these seeds: only a time limit ends its episodes."""

    def perceive(self, observations):
        pass

    def deliberate(self):
        return 0

    def reflect(self, reward, terminal, *, truncated=False, next_observations=None):
        pass

    def act(self, observations):
        return int(observations[2] + 0.5 * observations[3] > 0)


@pytest.mark.parametrize("call, match", [
    (lambda env: run_agent(env, Constant(), steps=1e3), "steps = 1000.0: must be an integer >= 0"),
    (lambda env: run_agent(env, Constant(), steps=float("nan")), "steps = nan"),
    (lambda env: run_agent(env, Constant(), steps=True), "steps = True"),
    (lambda env: run_agent(env, Constant(), steps=10, seed=-1), "seed = -1"),
    (lambda env: run_agent(env, Constant(), steps=10, seed=None), "seed = None"),
    (lambda env: evaluate(env, Constant(), episodes=2.0), "episodes = 2.0: must be an integer >= 1"),
    (lambda env: evaluate(env, Constant(), seed=None), "seed = None"),
    (lambda env: evaluate(env, Constant(), seed=1.5), "seed = 1.5"),
])
def test_bad_counts_and_seeds_are_config_errors_before_the_env_is_made(call, match):
    # steps=1e3 or nan and episodes=2.0 were TypeErrors, steps=True ran one step, and a
    # seed of -1 or np.int64(1) a gymnasium.error.Error, each after the env was made.
    # An env that cannot be made shows the order: the argument's error comes first.
    with pytest.raises(ConfigError, match=match):
        call("NoSuchEnv-v0")


def test_numpy_counts_and_seeds_are_taken():
    """A numpy integer seed was a gymnasium.error.Error ("Seed must be a python integer")."""
    res = run_agent("CartPole-v1", Constant(), steps=np.int64(20), seed=np.int64(1))
    assert res.steps == 20 and res.returns == run_agent("CartPole-v1", Constant(), steps=20, seed=1).returns
    assert len(evaluate("CartPole-v1", Constant(), episodes=np.int32(2), seed=np.uint16(5))) == 2
    # a peer's seed is the spec's (up to 2**32 - 1) plus its rank and the steps done: past 32 bits
    assert run_agent("CartPole-v1", Constant(), steps=5, seed=2**32 + 7).steps == 5


def test_evaluate_max_steps_above_the_envs_time_limit_is_kept():
    # max_steps only cut episodes short: above CartPole's own limit of 500, the env's
    # TimeLimit still ended them at 500.
    assert evaluate("CartPole-v1", Balancer(), episodes=2, max_steps=600) == [600.0, 600.0]
    assert evaluate("CartPole-v1", Balancer(), episodes=1, max_steps=30) == [30.0]
    assert evaluate("CartPole-v1", Balancer(), episodes=1) == [500.0]


@pytest.mark.parametrize("last", [0, -1, 1.5, True, None])
def test_mean_return_needs_a_positive_count(last):
    # last=0 averaged every episode (returns[-0:]) and last=-1 all but the first.
    with pytest.raises(ConfigError, match=f"last = {last!r}: must be an integer >= 1"):
        RunResult(returns=[0.0, 0.0, 100.0]).mean_return(last)
    assert RunResult(returns=[0.0, 0.0, 100.0]).mean_return(np.int64(1)) == 100.0
