import numpy as np
import pytest
import torch

from swarm.errors import ConfigError, SwarmError
from swarm.rl import DQNAgent, DQNConfig, dqn_schema


def _batch(n=64, seed=0, obs_dim=4, n_actions=2):
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(n, obs_dim, generator=g),
        "action": torch.randint(n_actions, (n,), generator=g),
        "reward": torch.randn(n, generator=g),
        "next_obs": torch.randn(n, obs_dim, generator=g),
        "done": (torch.rand(n, generator=g) < 0.2).float(),
    }


def test_loss_falls_on_a_fixed_batch(replay):
    agent = DQNAgent((4,), 2, replay, DQNConfig(lr=1e-3, target_every=10**9), seed=0)
    batch, w = _batch(), torch.ones(64)
    losses = [agent.update(batch, w)[0] for _ in range(300)]
    assert all(np.isfinite(losses))
    assert losses[-1] < 0.2 * losses[0], (losses[0], losses[-1])


def test_td_errors_are_double_dqn_targets(replay):
    cfg = DQNConfig(gamma=0.9, target_every=10**9)
    agent = DQNAgent((4,), 3, replay, cfg, seed=1)
    with torch.no_grad():  # make target and online nets differ
        for p in agent.target.parameters():
            p.add_(0.3 * torch.randn_like(p))
    b = _batch(n=16, seed=2, n_actions=3)
    with torch.no_grad():
        a_star = agent.q(b["next_obs"]).argmax(1)
        next_q = agent.target(b["next_obs"])[torch.arange(16), a_star]
        expected = b["reward"] + 0.9 * (1 - b["done"]) * next_q - agent.q(b["obs"])[torch.arange(16), b["action"]]
        plain = b["reward"] + 0.9 * (1 - b["done"]) * agent.target(b["next_obs"]).max(1).values \
            - agent.q(b["obs"])[torch.arange(16), b["action"]]
    _, td = agent.update(b, torch.ones(16))
    assert torch.allclose(td, expected, atol=1e-5)
    assert not torch.allclose(td, plain, atol=1e-3)  # the test can tell double from plain DQN


def test_importance_weights_scale_the_gradient(replay):
    agent = DQNAgent((4,), 2, replay, DQNConfig(max_grad_norm=0), seed=0)
    before = agent.parameters().copy()
    agent.update(_batch(), torch.zeros(64))
    assert np.array_equal(agent.parameters(), before)  # zero weight: no step
    agent.update(_batch(), torch.ones(64))
    assert not np.array_equal(agent.parameters(), before)


def test_gradient_clipping_bounds_the_step(replay):
    # With SGD-like reasoning hard to check through Adam, check the clipped norm directly.
    agent = DQNAgent((4,), 2, replay, DQNConfig(max_grad_norm=0.01), seed=0)
    b = _batch()
    b["reward"] = b["reward"] * 1e3  # huge TD errors, huge gradients
    agent.update(b, torch.ones(64))
    norm = torch.sqrt(sum((p.grad ** 2).sum() for p in agent.q.parameters()))
    assert norm <= 0.01 + 1e-6


def test_target_network_hard_and_soft_updates(replay):
    hard = DQNAgent((4,), 2, replay, DQNConfig(tau=1.0, target_every=3), seed=0)
    for i in range(3):
        assert (i == 0) or not torch.equal(hard.target.net[0].weight, hard.q.net[0].weight)
        hard.update(_batch(seed=i), torch.ones(64))
    for tp, p in zip(hard.target.parameters(), hard.q.parameters()):
        assert torch.equal(tp, p)

    soft = DQNAgent((4,), 2, replay, DQNConfig(tau=0.25, target_every=1), seed=0)
    old = [p.detach().clone() for p in soft.target.parameters()]
    soft.update(_batch(), torch.ones(64))
    for tp, o, p in zip(soft.target.parameters(), old, soft.q.parameters()):
        assert torch.allclose(tp, 0.75 * o + 0.25 * p, atol=1e-6)


def test_learn_feeds_td_errors_back_as_priorities(replay):
    agent = DQNAgent((4,), 2, replay, DQNConfig(batch_size=8), seed=0)
    assert agent.learn() is None  # not enough data yet
    rng = np.random.default_rng(0)
    for _ in range(20):
        replay.add({k: rng.standard_normal((1, *s)).astype(d) if d == "float32" else np.zeros((1, *s), d)
                    for k, (d, s) in dqn_schema((4,)).items()})
    loss = agent.learn()
    assert loss is not None and np.isfinite(loss)
    (idx, td), = replay.priority_updates
    assert idx.shape == (8,) and td.shape == (8,) and (td >= 0).all() and td.max() > 0


def test_transitions_are_assembled_from_the_step_loop(replay):
    agent = DQNAgent((2,), 2, replay, DQNConfig(learning_starts=10**6), seed=0)
    o = [np.full(2, i, np.float32) for i in range(5)]
    agent.perceive(o[0]); agent.deliberate(); agent.reflect(1.0, False)
    agent.perceive(o[1]); agent.deliberate(); agent.reflect(2.0, True)   # terminal
    agent.perceive(o[2]); agent.deliberate()
    agent.reflect(3.0, False, truncated=True, next_observations=o[3])   # time limit
    agent.perceive(o[4])
    c = {k: np.stack(v) for k, v in replay.cols.items()}
    assert len(replay) == 3
    np.testing.assert_array_equal(c["obs"][:, 0], [0, 1, 2])
    np.testing.assert_array_equal(c["next_obs"][[0, 2], 0], [1, 3])
    np.testing.assert_array_equal(c["reward"], [1, 2, 3])
    np.testing.assert_array_equal(c["done"], [0, 1, 0])
    assert agent.steps == 3


def test_misuse_is_a_clear_error(replay):
    agent = DQNAgent((2,), 2, replay, seed=0)
    with pytest.raises(SwarmError, match="before perceive"):
        agent.deliberate()
    with pytest.raises(SwarmError, match="shape"):
        agent.perceive(np.zeros(3))
    agent.perceive(np.zeros(2))
    with pytest.raises(SwarmError, match="before deliberate"):
        agent.reflect(0.0, False)
    agent.deliberate()
    with pytest.raises(SwarmError, match="next_observations"):
        agent.reflect(0.0, False, truncated=True)
    with pytest.raises(ConfigError, match="eps_end"):
        DQNAgent((2,), 2, replay, DQNConfig(eps_start=0.1, eps_end=0.5))
    with pytest.raises(ConfigError, match="buffer"):
        DQNAgent((2,), 2, object())


def test_epsilon_and_beta_schedules(replay):
    agent = DQNAgent((2,), 2, replay, DQNConfig(eps_start=1.0, eps_end=0.1, eps_steps=100,
                                                 beta_start=0.4, beta_steps=200), seed=0)
    assert agent.epsilon == 1.0 and agent.beta == pytest.approx(0.4)
    agent.steps = 50
    assert agent.epsilon == pytest.approx(0.55) and agent.beta == pytest.approx(0.55)
    agent.steps = 10_000
    assert agent.epsilon == pytest.approx(0.1) and agent.beta == 1.0


def test_gossip_writes_into_parameters_change_the_policy(replay):
    a = DQNAgent((4,), 2, replay, seed=0)
    b = DQNAgent((4,), 2, replay, seed=1)
    vec = a.parameters()
    assert vec is a.parameters() and vec.dtype == np.float32
    assert vec.size == sum(p.numel() for p in a.q.parameters())
    obs = np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32)
    assert [a.act(o) for o in obs] != [b.act(o) for o in obs]
    vec[:] = b.parameters()          # what a gossip round does, in place
    a.on_parameters_changed()
    assert [a.act(o) for o in obs] == [b.act(o) for o in obs]


def test_greedy_action_is_the_q_networks_argmax(replay):
    agent = DQNAgent((4,), 3, replay, DQNConfig(hidden=[32, 16, 8]), seed=3)
    rng = np.random.default_rng(1)
    agent.parameters()[:] = rng.standard_normal(agent.parameters().size)  # as a gossip round writes them
    obs = rng.standard_normal((300, 4)).astype(np.float32)
    with torch.no_grad():
        want = agent.q(torch.from_numpy(obs)).argmax(1).tolist()
    assert [agent.act(o) for o in obs] == want
    assert len(set(want)) == 3   # the check sees every action


def test_checkpoint_round_trip(replay):
    a = DQNAgent((4,), 2, replay, seed=0)
    for i in range(5):
        a.update(_batch(seed=i), torch.ones(64))
    a.steps = 123
    b = DQNAgent((4,), 2, replay, seed=7)
    b.load_state_dict(a.state_dict())
    np.testing.assert_array_equal(a.parameters(), b.parameters())
    b.on_parameters_changed()  # still flat after loading
    assert b.steps == 123 and b.updates == 5 and b.optimizer.t == 5
    assert torch.equal(b.optimizer.exp_avg_sq, a.optimizer.exp_avg_sq)
    assert a.rng.random() == b.rng.random()
    with pytest.raises(SwarmError, match="lacks"):
        b.load_state_dict({"q": {}})
    small = DQNAgent((4,), 2, replay, DQNConfig(hidden=[8]), seed=0)
    with pytest.raises(SwarmError, match="does not fit"):
        small.load_state_dict(a.state_dict())


def test_init_seed_gives_peers_one_initial_network(replay):
    # Peers pass their own seed (exploration) and the swarm's init_seed (weights).
    a = DQNAgent((4,), 2, replay, DQNConfig(eps_start=1.0), seed=1, init_seed=7)
    b = DQNAgent((4,), 2, replay, DQNConfig(eps_start=1.0), seed=2, init_seed=7)
    c = DQNAgent((4,), 2, replay, DQNConfig(eps_start=1.0), seed=1)
    assert np.array_equal(a.parameters(), b.parameters())
    assert not np.array_equal(a.parameters(), c.parameters())
    # exploration still differs: the random actions come from `seed`
    obs = np.zeros(4, np.float32)
    acts = []
    for agent in (a, b):
        seq = []
        for _ in range(32):
            agent.perceive(obs)
            seq.append(agent.deliberate())
        acts.append(seq)
    assert acts[0] != acts[1]


def test_gradient_then_apply_is_update_and_peers_applying_one_gradient_agree(replay):
    """update() = gradient() + apply_gradient(); two agents from one network that apply
    the same gradient sequence (one computing, one receiving) stay identical."""
    cfg = DQNConfig(lr=1e-3, tau=0.1)
    a = DQNAgent((4,), 2, replay, cfg, seed=0, init_seed=7)
    b = DQNAgent((4,), 2, replay, cfg, seed=1, init_seed=7)
    c = DQNAgent((4,), 2, replay, cfg, seed=2, init_seed=7)
    for i in range(5):
        batch, w = _batch(seed=i), torch.ones(64)
        a.update(batch, w)
        b.gradient(batch, w)
        g = b.grad.clone()
        b.apply_gradient()
        c.apply_gradient(g.numpy())           # a peer that received it
    assert torch.equal(a.flat, b.flat) and torch.equal(b.flat, c.flat)
    assert torch.equal(a.target_flat, c.target_flat) and a.updates == c.updates == 5


def test_publish_sends_each_gradient_and_applies_what_it_returns(replay):
    rng = np.random.default_rng(0)
    for _ in range(40):
        replay.add({k: rng.standard_normal((1, *s)).astype(d) if d == "float32" else np.zeros((1, *s), d)
                    for k, (d, s) in dqn_schema((4,)).items()})
    agent = DQNAgent((4,), 2, replay, DQNConfig(batch_size=8, lr=1e-2), seed=0)
    sent = []

    def publish(g):
        sent.append(None if g is None else g.copy())
        return None if g is None else np.zeros_like(g)   # what "the swarm" applies: nothing moves
    agent.publish = publish
    before = agent.flat.clone()
    assert agent.learn() is not None
    assert len(sent) == 1 and np.isfinite(sent[0]).all() and np.abs(sent[0]).sum() > 0
    assert torch.equal(agent.flat, before) and agent.updates == 1   # Adam on zeros: no step
    # a non-finite gradient is neither published nor applied: the turn is passed
    with torch.no_grad():
        agent.flat[0] = float("nan")
    assert agent.learn() is not None
    assert len(sent) == 2 and sent[1] is None and agent.skipped == 1 and agent.updates == 1
    # too little data for a batch: passed too
    agent.cfg = DQNConfig(batch_size=64)
    assert agent.learn() is None and len(sent) == 3 and sent[2] is None and agent.updates == 1
    # phases: with train_every 4 and phase 2 the agent learns at steps 2, 6, 10 ...
    agent.cfg = DQNConfig(train_every=4, learning_starts=0)
    agent.phase = 2
    assert [s for s in range(12) if agent.learns_at(s)] == [2, 6, 10]
