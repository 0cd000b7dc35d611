"""DQN's gradient clipping and its handling of a neighbour's unusable items
(found by read-only reviews, fixed in the fortieth session)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from swarm.rl import DQNAgent, DQNConfig, dqn_schema


def _batch(n=8, seed=0, obs_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(n, 4, generator=g) * obs_scale,
        "action": torch.randint(2, (n,), generator=g),
        "reward": torch.randn(n, generator=g),
        "next_obs": torch.randn(n, 4, generator=g),
        "done": (torch.rand(n, generator=g) < 0.3).float(),
    }


def _fill(replay, n, **fields):
    """Add n random transitions; ``fields`` overrides columns (e.g. done=0.5)."""
    rng = np.random.default_rng(0)
    for _ in range(n):
        item = {k: rng.standard_normal((1, *s)).astype(d) if d == "float32" else np.zeros((1, *s), d)
                for k, (d, s) in dqn_schema((4,)).items()}
        item["done"] = np.zeros_like(item["done"])
        for k, v in fields.items():
            item[k] = np.full_like(item[k], v)
        replay.add(item)


class FixedReplay:
    """Samples the same batch, with the same importance weights, every time."""

    def __init__(self, batch, weights):
        self.batch, self.weights = batch, weights
        self.priority_updates = []

    def add(self, items):
        raise AssertionError("not used")

    def __len__(self):
        return len(self.weights)

    def sample(self, n, beta=0.4):
        assert n == len(self.weights)
        return SimpleNamespace(batch={k: v.copy() for k, v in self.batch.items()},
                               indices=np.arange(n), weights=self.weights.copy())

    def update_priorities(self, indices, td):
        self.priority_updates.append((np.asarray(indices), np.asarray(td)))


def test_clipping_scales_a_gradient_whose_float32_norm_overflows_to_max_norm(replay):
    # Observations of 1e20 give gradient entries up to ~1.7e19, each finite and under
    # MAX_GRAD, but the float32 sum of their squares overflows: the norm was inf, the
    # scale max_norm / inf = 0, and the "clipped" gradient all zeros, without a word.
    raw = DQNAgent((4,), 2, replay, DQNConfig(max_grad_norm=0), seed=0)
    clipped = DQNAgent((4,), 2, replay, DQNConfig(max_grad_norm=10.0), seed=0)
    batch = _batch(obs_scale=1e20)
    raw.gradient(batch, torch.ones(8))
    g = raw.grad.numpy().astype(np.float64)
    assert np.isfinite(g).all() and float(raw.grad.norm()) == np.inf   # the case in question
    clipped.gradient(batch, torch.ones(8))
    c = clipped.grad.numpy().astype(np.float64)
    assert np.linalg.norm(c) == pytest.approx(10.0, rel=1e-5)
    np.testing.assert_allclose(c, g * (10.0 / np.linalg.norm(g)), rtol=1e-5, atol=1e-12)


def test_clip_norm_of_a_flat_vector_against_the_closed_form():
    # The same overflow on a bare vector: 4,610 entries of 1e18 have norm 1e18 * sqrt(4610),
    # past float32 only in the sum of squares; before, there was no robust clip to call.
    from swarm.rl.flat import clip_norm_

    n = 4610
    g = torch.full((n,), 1e18)
    g[::2] = -3e17
    want = np.linalg.norm(g.numpy().astype(np.float64))
    direction = g.numpy().astype(np.float64) / want
    assert clip_norm_(g, 2.0) == pytest.approx(want, rel=1e-5)
    np.testing.assert_allclose(g.numpy(), 2.0 * direction, rtol=1e-5)
    small = torch.tensor([3.0, 4.0])                     # norm 5: under max_norm, left as it is
    assert clip_norm_(small, 10.0) == pytest.approx(5.0) and small.tolist() == [3.0, 4.0]
    bad = torch.tensor([1.0, float("inf")])              # nothing to scale; the optimizer refuses it
    assert clip_norm_(bad, 1.0) == np.inf and bad.tolist() == [1.0, float("inf")]


@pytest.mark.parametrize("done", [0.5, 7.0, -3.0, 1e-30])
def test_a_done_other_than_0_or_1_is_an_unusable_item(replay, done):
    # A neighbour's item passes the buffer's schema (a float32 done) only: a done of 0.5,
    # 7 or -3 was learned from as given, scaling (or flipping) the bootstrap term.
    _fill(replay, 24)
    _fill(replay, 8, done=done)
    bad = set(range(24, 32))
    agent = DQNAgent((4,), 2, replay, DQNConfig(batch_size=16), seed=0)
    for _ in range(20):
        assert np.isfinite(agent.learn())
    assert agent.updates == 20 and agent.skipped == 0 and agent.unusable > 0
    pairs = [(int(i), t) for idx, td in replay.priority_updates for i, t in zip(idx, td)]
    assert any(i in bad for i, _ in pairs) and all(t == 0 for i, t in pairs if i in bad)


def test_reported_loss_td_and_q_are_means_over_the_usable_items_only():
    # The stand-in copies of a usable item weighed nothing in the gradient but counted in
    # the means: a batch of 4 usable items in 8 reported half their loss (and a gradient
    # half theirs), and |TD| and Q means over 8 with the stand-ins counted again.
    rng = np.random.default_rng(3)
    batch = {k: v.numpy() for k, v in _batch(8, seed=1).items()}
    weights = rng.uniform(0.5, 1.0, 8).astype(np.float32)
    bad = np.array([0, 1, 0, 1, 0, 0, 1, 1], bool)
    batch["action"][[1, 6]] = 5           # outside the agent's two actions
    batch["reward"][3] = np.nan
    batch["next_obs"][7, 2] = np.inf
    agent = DQNAgent((4,), 2, FixedReplay(batch, weights), DQNConfig(batch_size=8, max_grad_norm=0), seed=0)
    twin = DQNAgent((4,), 2, FixedReplay(batch, weights), DQNConfig(batch_size=8, max_grad_norm=0), seed=0)
    good = {k: torch.as_tensor(v[~bad]) for k, v in batch.items()}
    want_loss, want_td = twin.gradient(good, torch.as_tensor(weights[~bad]))
    want = twin.metrics()

    loss = agent.learn()   # its gradient is taken before its step: compare with the twin's
    got = agent.metrics()
    assert agent.unusable == 4
    assert loss == pytest.approx(want_loss, rel=1e-6) and got["loss"] == pytest.approx(want["loss"], rel=1e-6)
    assert got["td_abs"] == pytest.approx(want["td_abs"], rel=1e-6)
    assert got["q_mean"] == pytest.approx(want["q_mean"], rel=1e-6)
    np.testing.assert_allclose(agent._grad_vec, twin._grad_vec, rtol=1e-5, atol=1e-7)
    [(idx, td)] = [u for u in agent.buffer.priority_updates if len(u[0]) == 4 and u[1].any()]
    assert idx.tolist() == [0, 2, 4, 5]
    np.testing.assert_allclose(td, want_td.abs().numpy(), rtol=1e-6)


def test_a_gradient_the_relay_refuses_is_a_passed_turn_not_the_end_of_training(replay):
    """Before the fix, a ConfigError from publish (GradientRelay refuses a gradient whose
    encoding decodes past MAX_GRAD: error feedback adds its residual, QSGD rounds up)
    went up through learn() and ended the peer's training loop."""
    from swarm.errors import ConfigError, EncodedTooLarge

    _fill(replay, 40)
    agent = DQNAgent((4,), 2, replay, DQNConfig(batch_size=8), seed=0)
    calls = []

    def publish(g):
        calls.append(g is None)
        if g is not None:
            raise EncodedTooLarge("relay publish: the encoded gradient decodes to |g| above MAX_GRAD; not published")
        return None
    agent.publish = publish
    before = agent.flat.clone()
    loss = agent.learn()
    assert loss is not None and np.isfinite(loss)
    assert calls == [False, True]   # refused, then the turn passed
    assert agent.skipped == agent.refused == 1 and agent.updates == 0 and torch.equal(agent.flat, before)
    # any other refusal (a relay of another size, a bad clock) is the caller's error: it goes up

    def misconfigured(g):
        raise ConfigError("gradient of length 4610; this relay carries 4611")
    agent.publish = misconfigured
    with pytest.raises(ConfigError, match="this relay carries"):
        agent.learn()
