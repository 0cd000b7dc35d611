"""DQNAgent.replica / load_replica: the copy a relay peer out of step takes from a
neighbour. Taken whole, the next updates are bit for bit the same; parameters alone
are not enough; a copy that does not fit is refused and changes nothing."""

import numpy as np
import pytest

from swarm.buffer import ReplayBuffer
from swarm.errors import SwarmError
from swarm.rl import DQNAgent, DQNConfig, dqn_schema


def make(seed: int) -> DQNAgent:
    buf = ReplayBuffer(dqn_schema((4,)), 64, alpha=0.6, eps=1e-6, decay=0.0, prioritized=True, seed=seed)
    return DQNAgent((4,), 2, buf, DQNConfig(hidden=[8], tau=0.5, target_every=2), seed=seed, init_seed=seed)


def grads(agent: DQNAgent, n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(agent.parameters().size).astype(np.float32) for _ in range(n)]


def whole(agent: DQNAgent) -> list[np.ndarray]:
    _, arrays = agent.replica()
    return arrays + [np.array([agent.updates, agent.optimizer.t])]


def test_a_replica_takes_the_same_updates_and_parameters_alone_do_not():
    a, b, c = make(0), make(1), make(2)
    for g in grads(a, 5, 0):
        a.apply_gradient(g)
    b.load_replica(*a.replica())
    c.parameters()[:] = a.parameters()      # what parameter averaging would copy
    assert all(np.array_equal(x, y) for x, y in zip(whole(a), whole(b)))
    for g in grads(a, 3, 1):                # the target follows at every second update
        for agent in (a, b, c):
            agent.apply_gradient(g)
    assert np.array_equal(a.parameters(), b.parameters())
    assert np.array_equal(a.target_flat.numpy(), b.target_flat.numpy()) and a.updates == b.updates == 8
    assert not np.array_equal(a.parameters(), c.parameters())   # Adam's moments differ


@pytest.mark.parametrize("change,match", [
    (lambda body, arrays: (body, arrays[:3]), "3 arrays; expected 4"),
    (lambda body, arrays: (body, [arrays[0][:-1]] + arrays[1:]), "parameters is .*this network needs"),
    (lambda body, arrays: (body, arrays[:3] + [arrays[3].astype(np.float64)]), "target is"),
    (lambda body, arrays: (body, [np.full_like(arrays[0], np.nan)] + arrays[1:]), "parameters has NaN"),
    (lambda body, arrays: (body, arrays[:2] + [-np.ones_like(arrays[2]), arrays[3]]), "negative"),
    (lambda body, arrays: (dict(body, updates=-1), arrays), "must be counts"),
    (lambda body, arrays: (dict(body, adam_t="3"), arrays), "must be counts"),
    (lambda body, arrays: ([], arrays), "expected a map"),
])
def test_a_replica_that_does_not_fit_is_refused_and_changes_nothing(change, match):
    a, b = make(0), make(1)
    for g in grads(a, 3, 0):
        a.apply_gradient(g)
        b.apply_gradient(g)
    b.apply_gradient(grads(b, 1, 9)[0])
    before = [x.copy() for x in whole(b)]
    with pytest.raises(SwarmError, match=match):
        b.load_replica(*change(*a.replica()))
    assert all(np.array_equal(x, y) for x, y in zip(before, whole(b)))
