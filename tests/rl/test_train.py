import numpy as np
import pytest

from swarm.errors import ConfigError
from swarm.peer.agent import BaseAgent
from swarm.rl import DQNAgent, DQNConfig, dqn_schema
from swarm.rl.train import evaluate, make_env, run_agent


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
