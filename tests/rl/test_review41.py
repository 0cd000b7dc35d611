"""DQN's step-loop order, checkpoint RNG states, seeds and update batches
(found by read-only reviews, fixed in the forty-first session)."""

import numpy as np
import pytest
import torch

from swarm.errors import ConfigError, SwarmError
from swarm.rl import DQNAgent, DQNConfig


def _agent(replay, **cfg):
    return DQNAgent((2,), 2, replay, DQNConfig(learning_starts=10**6, **cfg), seed=0)


def _batch(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(n, 2, generator=g),
        "action": torch.randint(2, (n,), generator=g),
        "reward": torch.randn(n, generator=g),
        "next_obs": torch.randn(n, 2, generator=g),
        "done": (torch.rand(n, generator=g) < 0.3).float(),
    }


def _snapshot(agent):
    return (agent.parameters().copy(), agent.target_flat.clone(), agent.rng.bit_generator.state,
            agent.steps, agent.updates, agent._obs, agent._action, agent._pending)


def _same(a, b):
    assert np.array_equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert a[2:5] == b[2:5]
    assert all(x is y for x, y in zip(a[5:], b[5:]))


# ------------------------------------------------------------ step-loop order

def test_deliberate_without_perceive_after_a_pending_transition_is_refused(replay):
    # Before: after reflect(r, False) without next_observations, a second deliberate()
    # acted on the old observation and counted a step, and the next reflect() overwrote
    # the waiting transition: two env steps, one transition in the buffer.
    agent = _agent(replay)
    agent.perceive(np.zeros(2, np.float32))
    agent.deliberate()
    agent.reflect(1.0, False)
    before = _snapshot(agent)
    with pytest.raises(SwarmError, match=r"deliberate\(\) before perceive\(\)"):
        agent.deliberate()
    _same(_snapshot(agent), before)
    agent.perceive(np.ones(2, np.float32))   # the order the driver owes: nothing was lost
    agent.deliberate()
    agent.reflect(2.0, False)
    agent.perceive(np.zeros(2, np.float32))
    assert len(replay) == 2 and [float(r) for r in replay.cols["reward"]] == [1.0, 2.0]
    assert agent.steps == 2


def test_deliberate_twice_without_reflect_is_refused(replay):
    # Before: a second deliberate() replaced the action waiting for its outcome and counted
    # another env step; the first action was never learnt from.
    agent = _agent(replay)
    agent.perceive(np.zeros(2, np.float32))
    agent.deliberate()
    before = _snapshot(agent)
    with pytest.raises(SwarmError, match=r"deliberate\(\) before reflect\(\)"):
        agent.deliberate()
    _same(_snapshot(agent), before)
    agent.reflect(1.0, True)
    agent.perceive(np.zeros(2, np.float32))
    agent.deliberate()                      # the usual loop still runs
    assert agent.steps == 2 and len(replay) == 1
    # A new observation drops an action not reflected on (a loop that only acts), so
    # its outcome cannot be stored against an observation it was not taken on.
    agent.perceive(np.ones(2, np.float32))
    with pytest.raises(SwarmError, match=r"reflect\(\) before deliberate\(\)"):
        agent.reflect(3.0, True)
    agent.deliberate()
    assert agent.steps == 3 and len(replay) == 1


# ------------------------------------------------------------ checkpoint RNG state

_BAD_RNG = {
    "negative state": {"state": -1, "inc": 1},
    "state past 128 bits": {"state": 2**200, "inc": 1},
    "float state": {"state": 1.5, "inc": 1},
    "bool inc": {"state": 1, "inc": True},
    "float inc": {"state": 1, "inc": 3.0},
}


@pytest.mark.parametrize("words", list(_BAD_RNG.values()), ids=list(_BAD_RNG))
def test_a_bad_rng_state_word_is_a_config_error_and_changes_nothing(replay, words):
    # Before: a negative or too large word escaped as a raw OverflowError (which the
    # runner's resume and Restored.apply, catching SwarmError only, let kill the peer),
    # and a float word was accepted.
    agent = _agent(replay)
    good = agent.state_dict()
    bad = {**good, "rng": {**good["rng"], "state": words}, "steps": 99}
    agent.update(_batch(), torch.ones(8))   # let the checkpoint differ from the agent
    before = _snapshot(agent)
    with pytest.raises(ConfigError, match="rng"):
        agent.load_state_dict(bad)
    _same(_snapshot(agent), before)


@pytest.mark.parametrize("field,value", [("uinteger", -5), ("uinteger", 2**40), ("has_uint32", 0.0)])
def test_a_bad_rng_buffered_word_is_a_config_error(replay, field, value):
    # Before: uinteger=-5 escaped as a raw OverflowError; a float has_uint32 was accepted.
    agent = _agent(replay)
    good = agent.state_dict()
    before = _snapshot(agent)
    with pytest.raises(ConfigError, match="rng"):
        agent.load_state_dict({**good, "rng": {**good["rng"], field: value}})
    _same(_snapshot(agent), before)


def test_a_good_rng_state_still_loads(replay):
    agent, other = _agent(replay), _agent(replay)
    other.rng.random(5)
    agent.load_state_dict(other.state_dict())
    assert agent.rng.bit_generator.state == other.rng.bit_generator.state


# ------------------------------------------------------------ seeds

@pytest.mark.parametrize("name", ["seed", "init_seed"])
def test_a_seed_past_64_bits_is_a_config_error(replay, name):
    # Before: 2**64 reached torch.manual_seed, which raised a raw ValueError ("Overflow
    # when unpacking long long").
    with pytest.raises(ConfigError, match=name):
        DQNAgent((2,), 2, replay, DQNConfig(), **{name: 2**64})
    DQNAgent((2,), 2, replay, DQNConfig(), **{name: 2**64 - 1})   # the largest torch takes


# ------------------------------------------------------------ update batches

def _without(key):
    b = _batch()
    del b[key]
    return b, torch.ones(8)


def _with(key, value):
    b = _batch()
    b[key] = value(b[key]) if callable(value) else value
    return b, torch.ones(8)


_BAD_BATCHES = {
    "action": lambda: _with("action", torch.tensor([0, 1, 2, 0, 1, 0, 1, 0])),
    "action ": lambda: _with("action", torch.tensor([0, 1, -1, 0, 1, 0, 1, 0])),
    "action  ": lambda: _with("action", lambda a: a.float()),
    "obs": lambda: _with("obs", lambda o: o.double()),
    "obs ": lambda: _with("obs", lambda o: o[:, :1]),
    "next_obs": lambda: _with("next_obs", lambda o: o[:4]),
    "reward": lambda: _with("reward", lambda r: r[:, None]),
    "done": lambda: _with("done", lambda d: d.double()),
    "done ": lambda: _without("done"),
    "weights": lambda: (_batch(), torch.ones(8, 1)),
    "weights ": lambda: (_batch(), torch.ones(8, dtype=torch.float64)),
    "weights  ": lambda: (_batch(), np.ones(8, np.float32)),
}


@pytest.mark.parametrize("field", list(_BAD_BATCHES), ids=[f"{k.strip()}{len(k) - len(k.strip())}"
                                                            for k in _BAD_BATCHES])
@pytest.mark.parametrize("call", ["update", "gradient"])
def test_a_bad_batch_is_a_swarm_error_naming_the_field_and_changes_nothing(replay, field, call):
    # Before: an action outside [0, n_actions), a float64 observation or a missing key
    # raised raw RuntimeError/KeyError from torch; weights of shape (N, 1) broadcast
    # against the N losses to an N x N loss and stepped on nonsense without a word.
    agent = _agent(replay)
    batch, weights = _BAD_BATCHES[field]()
    before = _snapshot(agent)
    grad = agent._grad_vec.copy()
    with pytest.raises(SwarmError, match=field.strip()):
        getattr(agent, call)(batch, weights)
    _same(_snapshot(agent), before)
    assert np.array_equal(agent._grad_vec, grad)


def test_a_good_batch_still_steps(replay):
    agent = _agent(replay)
    before = agent.parameters().copy()
    loss, td = agent.update(_batch(), torch.ones(8))
    assert np.isfinite(loss) and td.shape == (8,) and not np.array_equal(agent.parameters(), before)
