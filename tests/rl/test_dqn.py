import numpy as np
import pytest
import torch
import torch.nn.functional as F

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


@pytest.mark.parametrize("double", [True, False])
def test_td_errors_bootstrap_as_configured(replay, double):
    """Double DQN: the online net picks the next action, the target net values it; plain
    DQN (double=False): the target net's max. Both bootstrap from the target network."""
    cfg = DQNConfig(gamma=0.9, target_every=10**9, double=double)
    agent = DQNAgent((4,), 3, replay, cfg, seed=1)
    with torch.no_grad():  # make target and online nets differ
        for p in agent.target.parameters():
            p.add_(0.3 * torch.randn_like(p))
    b = _batch(n=16, seed=2, n_actions=3)
    with torch.no_grad():
        q_taken = agent.q(b["obs"])[torch.arange(16), b["action"]]
        a_star = agent.q(b["next_obs"]).argmax(1)
        next_q = agent.target(b["next_obs"])[torch.arange(16), a_star]
        double_td = b["reward"] + 0.9 * (1 - b["done"]) * next_q - q_taken
        plain_td = b["reward"] + 0.9 * (1 - b["done"]) * agent.target(b["next_obs"]).max(1).values - q_taken
        online_td = b["reward"] + 0.9 * (1 - b["done"]) * agent.q(b["next_obs"]).max(1).values - q_taken
    _, td = agent.update(b, torch.ones(16))
    expected, others = (double_td, [plain_td, online_td]) if double else (plain_td, [double_td, online_td])
    assert torch.allclose(td, expected, atol=1e-5)
    for other in others:   # the test can tell double, plain and online-bootstrapped targets apart
        assert not torch.allclose(td, other, atol=1e-3)


def test_importance_weights_scale_the_gradient(replay):
    agent = DQNAgent((4,), 2, replay, DQNConfig(max_grad_norm=0), seed=0)
    before = agent.parameters().copy()
    agent.update(_batch(), torch.zeros(64))
    assert np.array_equal(agent.parameters(), before)  # zero weight: no step
    agent.update(_batch(), torch.ones(64))
    assert not np.array_equal(agent.parameters(), before)


def test_importance_weights_weight_each_item_by_their_size(replay):
    """The loss is mean(w_i * Huber_i): weights of 2 give twice the loss and gradient of
    weights of 1, and uneven weights give the w-weighted sum of the one-item gradients
    (not only zero against nonzero)."""
    agent = DQNAgent((4,), 2, replay, DQNConfig(max_grad_norm=0), seed=0)
    b = _batch(n=16)
    loss1, td1 = agent.gradient(b, torch.ones(16))
    g1 = agent.grad.clone()
    loss2, td2 = agent.gradient(b, torch.full((16,), 2.0))
    g2 = agent.grad.clone()
    assert loss2 == pytest.approx(2 * loss1, rel=1e-6) and torch.equal(td1, td2)
    assert torch.allclose(g2, 2 * g1, rtol=1e-6, atol=1e-9)
    w = torch.linspace(0.1, 3.1, 16)
    loss_w, _ = agent.gradient(b, w)
    g_w = agent.grad.clone()
    want_loss, want_g = 0.0, torch.zeros_like(g1)
    for i in range(16):   # the gradient with item i's weight 1 and every other 0
        li, _ = agent.gradient(b, torch.eye(16)[i])
        want_loss += float(w[i]) * li
        want_g += w[i] * agent.grad
    assert loss_w == pytest.approx(want_loss, rel=1e-5)
    assert torch.allclose(g_w, want_g, rtol=1e-4, atol=1e-7)
    assert not loss_w == pytest.approx(loss1 * float(w.mean()), rel=1e-2)   # uneven is not the mean weight


@pytest.mark.parametrize("delta", [0.25, 5.0])
def test_loss_is_huber_with_the_configured_delta(replay, delta):
    """DQNConfig.huber_delta is the Huber threshold: the loss is F.huber_loss(q, target,
    delta), on TD errors on both sides of delta."""
    agent = DQNAgent((4,), 2, replay, DQNConfig(huber_delta=delta, gamma=0.9), seed=0)
    b = _batch(n=32)
    b["done"] = torch.zeros(32)
    b["reward"] = torch.linspace(-3 * delta, 3 * delta, 32)
    with torch.no_grad():
        q = agent.q(b["obs"])[torch.arange(32), b["action"]]
        a_star = agent.q(b["next_obs"]).argmax(1)
        target = b["reward"] + 0.9 * agent.target(b["next_obs"])[torch.arange(32), a_star]
        want = F.huber_loss(q, target, delta=delta).item()
    err = (target - q).abs()
    assert (err < delta).sum() >= 4 and (err > delta).sum() >= 4   # both branches of the loss
    loss, _ = agent.gradient(b, torch.ones(32))
    assert loss == pytest.approx(want, rel=1e-6)
    assert loss != pytest.approx(F.huber_loss(q, target, delta=1.0).item(), rel=1e-3)   # not the default


def test_training_starts_at_learning_starts_not_a_step_later(replay):
    """deliberate() trains from env step learning_starts itself: none before it."""
    agent = DQNAgent((4,), 2, replay, DQNConfig(learning_starts=5, train_every=1), seed=0)
    trained_at = []
    agent.learn = lambda: trained_at.append(agent.steps)
    obs = np.zeros(4, np.float32)
    for _ in range(8):
        agent.perceive(obs)
        agent.deliberate()
        agent.reflect(0.0, False)
    assert trained_at == [5, 6, 7]
    agent.cfg = DQNConfig(learning_starts=100, train_every=4)
    assert not agent.learns_at(99) and agent.learns_at(100)
    assert [s for s in range(92, 110) if agent.learns_at(s)] == [100, 104, 108]


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
        replay.add({k: rng.standard_normal((1, *s)).astype(d) if d == "float32" and k != "done" else np.zeros((1, *s), d)
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
    with pytest.raises(ConfigError, match="lacks"):
        b.load_state_dict({"q": {}})
    small = DQNAgent((4,), 2, replay, DQNConfig(hidden=[8]), seed=0)
    with pytest.raises(ConfigError, match="does not fit"):
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
        replay.add({k: rng.standard_normal((1, *s)).astype(d) if d == "float32" and k != "done" else np.zeros((1, *s), d)
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


# ------------------------------------------------------------ bad input: a clear error, nothing changed

def _fill(replay, n, **fields):
    """Add n random transitions; ``fields`` overrides columns (e.g. next_obs=np.nan)."""
    rng = np.random.default_rng(0)
    for _ in range(n):
        item = {k: rng.standard_normal((1, *s)).astype(d) if d == "float32" and k != "done" else np.zeros((1, *s), d)
                for k, (d, s) in dqn_schema((4,)).items()}
        for k, v in fields.items():
            item[k] = np.full_like(item[k], v)
        replay.add(item)


def _snapshot(agent):
    return (agent.flat.clone(), agent.target_flat.clone(), agent.optimizer.exp_avg.clone(),
            agent.optimizer.exp_avg_sq.clone(), agent.optimizer.t, agent.updates, agent.steps,
            agent.rng.bit_generator.state)


def _same(a, b):
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_observation_is_refused_and_nothing_is_stored(replay, bad):
    agent = DQNAgent((4,), 2, replay, DQNConfig(learning_starts=10**6), seed=0)
    obs = np.zeros(4, np.float32)
    nan_obs = np.array([0.0, bad, 0.0, 0.0])
    with pytest.raises(SwarmError, match="NaN or infinite"):
        agent.perceive(nan_obs)                     # the first of an episode
    agent.perceive(obs); agent.deliberate(); agent.reflect(1.0, False)
    with pytest.raises(SwarmError, match="NaN or infinite"):
        agent.perceive(nan_obs)                     # one that would complete a transition
    assert len(replay) == 0
    agent.perceive(obs); agent.deliberate()
    for kw in ({"terminal": True}, {"terminal": False}, {"terminal": False, "truncated": True}):
        with pytest.raises(SwarmError, match="NaN or infinite"):
            agent.reflect(1.0, next_observations=nan_obs, **kw)
    with pytest.raises(SwarmError, match="NaN or infinite"):
        agent.act(nan_obs)
    with pytest.raises(SwarmError, match="must be finite"):
        agent.reflect(float(bad), False)
    assert len(replay) == 1 and np.isfinite(np.stack(replay.cols["obs"])).all()
    agent.reflect(2.0, True, next_observations=obs)   # the refused calls left the action to reflect on
    assert len(replay) == 2 and replay.cols["reward"][-1] == 2.0


@pytest.mark.parametrize("kw, match", [
    ({"terminal": "no"}, "terminal must be True or False"),
    ({"terminal": None}, "terminal must be True or False"),
    ({"terminal": 2}, "terminal must be True or False"),
    ({"terminal": False, "truncated": "no"}, "truncated must be True or False"),
])
def test_reflect_refuses_a_terminal_or_truncated_that_is_not_a_bool(replay, kw, match):
    """reflect(1.0, "no") stored done=1 without a word: the flag decides the bootstrap."""
    agent = DQNAgent((4,), 2, replay, DQNConfig(learning_starts=10**6), seed=0)
    obs = np.zeros(4, np.float32)
    agent.perceive(obs); agent.deliberate()
    with pytest.raises(SwarmError, match=match):
        agent.reflect(1.0, next_observations=obs, **kw)
    assert len(replay) == 0
    agent.reflect(1.0, np.bool_(True), next_observations=obs)   # numpy's bool is one
    assert len(replay) == 1 and replay.cols["done"][-1] == 1.0


def test_a_complex_observation_is_refused(replay):
    """Cast to float32, only its real part was kept (numpy's ComplexWarning alone said so)."""
    agent = DQNAgent((4,), 2, replay, DQNConfig(learning_starts=10**6), seed=0)
    with pytest.raises(SwarmError, match="complex"):
        agent.perceive(np.array([1 + 2j, 0, 0, 0]))


def test_learn_skips_a_finite_gradient_too_large_for_adam(replay):
    # Without clipping, observations of 1e20 give a finite loss and gradient entries past
    # MAX_GRAD, which FlatAdam refuses (their squares overflow float32): learn() raised
    # out of the peer's training loop. It is a skipped update now, as a NaN one is.
    _fill(replay, 16, obs=1e20, next_obs=1e20)
    agent = DQNAgent((4,), 2, replay, DQNConfig(batch_size=8, max_grad_norm=0.0), seed=0)
    before = _snapshot(agent)
    agent.learn()
    assert agent.skipped == 1 and replay.priority_updates == []
    assert _same(_snapshot(agent), before)


def test_learn_skips_a_non_finite_batch_counts_it_and_changes_nothing(replay):
    # Finite items whose loss is not (observations of 3e38 overflow the network): the
    # update would make every parameter NaN, so it is not taken.
    _fill(replay, 16, next_obs=3e38)
    agent = DQNAgent((4,), 2, replay, DQNConfig(batch_size=8), seed=0)
    before = _snapshot(agent)
    loss = agent.learn()
    assert loss is not None and not np.isfinite(loss)
    assert agent.skipped == 1 and replay.priority_updates == []
    assert _same(_snapshot(agent), before) and np.isfinite(agent.parameters()).all()
    assert agent.metrics()["skipped"] == 1.0


@pytest.mark.parametrize("bad, match", [
    ("nan", "NaN or infinite"), ("inf", "NaN or infinite"), ("short", "3 values"),
    ("str", "dtype"), ("object", "gradient"), ("complex", "dtype"),
])
def test_apply_gradient_refuses_a_bad_gradient_and_changes_nothing(replay, bad, match):
    agent = DQNAgent((4,), 2, replay, DQNConfig(tau=1.0), seed=0)
    d = agent.parameters().size
    agent.apply_gradient(np.full(d, 1e-3, np.float32))
    grads = {"nan": np.full(d, np.nan, np.float32), "inf": np.r_[np.zeros(d - 1), np.inf].astype(np.float32),
             "short": np.zeros(3, np.float32), "str": "abc", "object": object(),
             "complex": np.zeros(d, np.complex64)}
    before = _snapshot(agent)
    with pytest.raises(SwarmError, match=match):
        agent.apply_gradient(grads[bad])
    assert _same(_snapshot(agent), before)
    agent.apply_gradient(torch.zeros(d, dtype=torch.float64))   # a finite vector of another dtype is fine
    assert agent.updates == 2


@pytest.mark.parametrize("key, value, match", [
    ("optimizer", {"t": 1}, "not FlatAdam"),
    ("steps", "abc", "steps = 'abc'"),
    ("updates", -1, "updates = -1"),
    ("rng", "x", "rng"),
    ("q", {}, "does not fit"),
    ("target", "q-weights", "does not fit"),
])
def test_a_failed_checkpoint_load_changes_nothing(replay, key, value, match):
    a = DQNAgent((4,), 2, replay, seed=0)
    for i in range(3):
        a.update(_batch(seed=i), torch.ones(64))
    a.steps = 50
    b = DQNAgent((4,), 2, replay, seed=7)
    b.update(_batch(seed=9), torch.ones(64))
    state = a.state_dict()
    state[key] = value
    before = _snapshot(b)
    with pytest.raises(ConfigError, match=match):   # every start that loads it would meet it: not restarted
        b.load_state_dict(state)
    assert _same(_snapshot(b), before)


def test_a_checkpoint_with_a_misfit_or_non_finite_tensor_changes_nothing(replay):
    a = DQNAgent((4,), 2, replay, seed=0)
    b = DQNAgent((4,), 2, replay, seed=7)
    before = _snapshot(b)
    state = a.state_dict()
    state["target"] = dict(state["target"])
    state["target"]["net.4.bias"] = torch.zeros(3)   # q is fine and would load first
    with pytest.raises(ConfigError, match="target.net.4.bias"):   # every start would meet it: swarm run gives up
        b.load_state_dict(state)
    state = a.state_dict()
    state["q"] = {k: v.clone() for k, v in state["q"].items()}
    state["q"]["net.0.weight"][0, 0] = float("nan")
    with pytest.raises(ConfigError, match="q.net.0.weight has NaN"):   # so does a NaN in the file
        b.load_state_dict(state)
    state = a.state_dict()
    state["optimizer"] = dict(state["optimizer"], exp_avg=torch.full_like(state["optimizer"]["exp_avg"], np.inf))
    with pytest.raises(ConfigError, match="exp_avg has NaN"):
        b.load_state_dict(state)
    with pytest.raises(ConfigError, match="not a dict"):
        b.load_state_dict([1, 2])
    assert _same(_snapshot(b), before)


@pytest.mark.parametrize("args, match", [
    ((4, 2), "obs_shape = 4"),
    (((-1,), 2), r"obs_shape = \(-1,\)"),
    (((4.5,), 2), "obs_shape"),
    (((), 2), "one-hot"),
    (((4,), "2"), "n_actions = '2'"),
    (((4,), 2.5), "n_actions = 2.5"),
    (((4,), 0), "n_actions = 0"),
])
def test_bad_constructor_arguments_are_config_errors(replay, args, match):
    with pytest.raises(ConfigError, match=match):
        DQNAgent(*args, replay)


def test_a_config_or_seed_of_the_wrong_kind_is_a_config_error(replay):
    with pytest.raises(ConfigError, match="expected a DQNConfig, got dict"):
        DQNAgent((4,), 2, replay, {"lr": 1e-3})
    with pytest.raises(ConfigError, match="seed = 'a'"):
        DQNAgent((4,), 2, replay, seed="a")
    cfg = DQNConfig()
    cfg.train_every = 0       # assigned after it was built
    with pytest.raises(ConfigError, match="train_every = 0"):
        DQNAgent((4,), 2, replay, cfg)


def test_a_buffer_whose_schema_does_not_fit_is_refused_at_construction():
    from swarm.buffer import ReplayBuffer

    def buf(shape):
        return ReplayBuffer(dqn_schema(shape), capacity=10, alpha=0.6, eps=1e-6, decay=0.0, prioritized=True, seed=0)
    with pytest.raises(ConfigError, match=r"schema does not fit.*dqn_schema\(\(4,\)\)"):
        DQNAgent((4,), 2, buf((3,)))
    other = ReplayBuffer({"obs": ("float32", (4,)), "action": ("int64", ())}, capacity=10, alpha=0.6, eps=1e-6,
                         decay=0.0, prioritized=True, seed=0)
    with pytest.raises(ConfigError, match="schema does not fit"):
        DQNAgent((4,), 2, other)
    DQNAgent((4,), 2, buf((4,)))


def test_non_numeric_input_is_a_clear_error_and_changes_nothing(replay):
    agent = DQNAgent((4,), 2, replay, DQNConfig(learning_starts=10**6), seed=0)
    with pytest.raises(SwarmError, match="not an array of numbers"):
        agent.perceive("abcd")
    with pytest.raises(SwarmError, match="not an array of numbers"):
        agent.perceive([1, 2, "x", 4])
    agent.perceive(np.zeros(4))
    agent.deliberate()
    with pytest.raises(SwarmError, match="must be a real number"):
        agent.reflect("x", False)
    with pytest.raises(SwarmError, match="must be a real number"):
        agent.reflect(None, True)
    with pytest.raises(SwarmError, match="must be a real number"):   # float("1.5") took it
        agent.reflect("1.5", False)
    with pytest.raises(SwarmError, match="must be a real number"):   # and float(True)
        agent.reflect(True, False)
    with pytest.raises(SwarmError, match="next_observations"):
        agent.reflect(1.0, False, truncated=True)
    agent.reflect(1.0, True)   # the action is still there to reflect on
    assert len(replay) == 1


def test_a_reward_past_float32_is_refused_and_nothing_is_stored(replay):
    """Stored as float32 it was inf, and every update that drew it was skipped."""
    agent = DQNAgent((4,), 2, replay, DQNConfig(learning_starts=10**6), seed=0)
    obs = np.zeros(4, np.float32)
    agent.perceive(obs); agent.deliberate()
    for bad in (1e39, -1e39, 10**40):
        with pytest.raises(SwarmError, match="past float32's largest value"):
            agent.reflect(bad, True, next_observations=obs)
    assert len(replay) == 0
    agent.reflect(3e38, True, next_observations=obs)
    assert len(replay) == 1


@pytest.mark.parametrize("field, value", [("action", 5), ("action", -1), ("done", np.inf), ("reward", np.nan),
                                          ("obs", np.inf), ("next_obs", np.nan)])
def test_items_no_update_can_learn_from_are_left_out_and_drawn_less(replay, field, value):
    # A neighbour's items pass the buffer's schema only: an action of 5 for a 2-action
    # agent made every update that drew it raise torch's IndexError, a NaN reward made
    # it a skipped one. They weigh nothing now, and are not drawn again.
    _fill(replay, 24)
    _fill(replay, 8, **{field: value})
    bad = set(range(24, 32))
    agent = DQNAgent((4,), 2, replay, DQNConfig(batch_size=16), seed=0)
    for _ in range(20):
        assert np.isfinite(agent.learn())
    assert agent.updates == 20 and agent.skipped == 0 and np.isfinite(agent.parameters()).all()
    m = agent.metrics()
    assert agent.unusable > 0 and m["unusable"] == agent.unusable and np.isfinite(m["loss"])
    pairs = [(int(i), t) for idx, td in replay.priority_updates for i, t in zip(idx, td)]
    assert all(t == 0 for i, t in pairs if i in bad) and any(i in bad for i, _ in pairs)
    assert any(t > 0 for i, t in pairs if i not in bad)


def test_items_no_update_can_learn_from_are_never_drawn_again_nor_shrink_the_weights():
    # A priority of eps**alpha would become the buffer's smallest, and the importance
    # weights, normalised by it, of every other item fell ~20x at beta 0.4.
    from swarm.buffer import ReplayBuffer
    buf = ReplayBuffer(dqn_schema((4,)), 64, seed=0)
    _fill(buf, 48)
    _fill(buf, 16, action=5)
    bad = np.arange(48, 64)
    agent = DQNAgent((4,), 2, buf, DQNConfig(batch_size=32), seed=0)
    for _ in range(50):   # until each was drawn once
        agent.learn()
        if not buf.priorities(bad).any():
            break
    assert not buf.priorities(bad).any() and agent.unusable >= 16 and agent.skipped == 0
    drawn = np.concatenate([buf.sample(32).indices for _ in range(20)])
    assert not np.isin(drawn, bad).any(), "an item no update can learn from was drawn again"
    assert buf.sample(32, beta=0.4).weights.mean() > 0.3


def test_a_batch_of_nothing_but_unusable_items_takes_no_update(replay):
    _fill(replay, 16, next_obs=np.nan)
    agent = DQNAgent((4,), 2, replay, DQNConfig(batch_size=8), seed=0)
    before = _snapshot(agent)
    assert agent.learn() is None
    assert agent.unusable == 8 and agent.skipped == 0
    assert _same(_snapshot(agent), before)
    [(idx, td)] = replay.priority_updates
    assert len(idx) == 8 and not np.any(td)


def test_apply_gradient_refuses_a_finite_gradient_too_large_to_square(replay):
    # A relayed gradient with one entry of 1e20 was taken: exp_avg_sq became inf for good,
    # and the agent's own checkpoint no longer loaded ("exp_avg_sq has NaN or infinite entries").
    agent = DQNAgent((4,), 2, replay, DQNConfig(tau=1.0), seed=0)
    grad = np.zeros(agent.parameters().size, np.float32)
    grad[0] = 1e20
    before = _snapshot(agent)
    with pytest.raises(SwarmError, match="too large"):
        agent.apply_gradient(grad)
    assert _same(_snapshot(agent), before)
    DQNAgent((4,), 2, replay, seed=0).load_state_dict(agent.state_dict())


def test_a_checkpoint_tensor_of_another_dtype_is_refused(replay):
    # Only shape and finiteness were checked: a float64 q entry of 1e300 is finite, passed,
    # and loaded into the float32 network as inf.
    a = DQNAgent((4,), 2, replay, seed=0)
    b = DQNAgent((4,), 2, replay, seed=7)
    before = _snapshot(b)
    state = a.state_dict()
    state["q"] = {k: v.double() for k, v in state["q"].items()}
    state["q"]["net.0.bias"][0] = 1e300
    with pytest.raises(ConfigError, match="q.net.0.weight is torch.float64, the network's torch.float32"):
        b.load_state_dict(state)
    state = a.state_dict()
    state["optimizer"] = dict(state["optimizer"], exp_avg_sq=state["optimizer"]["exp_avg_sq"].double())
    with pytest.raises(ConfigError, match="exp_avg_sq is torch.float64; needs float32"):
        b.load_state_dict(state)
    assert _same(_snapshot(b), before) and np.isfinite(b.parameters()).all()
