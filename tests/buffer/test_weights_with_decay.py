"""Importance weights under age decay do not vanish as the buffer's age span grows.

Before, weights were divided by the largest weight of any stored item, that of the
least likely one: with decay, the oldest, whose probability falls like
exp(-decay·age). Every weight then shrank like exp(-beta·decay·age span) (a mean of
2e-13 at 6,000 s with decay 0.01) and learning stopped. With decay they are
normalised over the batch; without decay nothing changes.
"""

from __future__ import annotations

import numpy as np
from swarmtest import Clock

from swarm.buffer import ReplayBuffer

SCHEMA = {"obs": ("float32", (4,)), "action": ("int64", ())}


def items(n: int, start: int = 0) -> dict[str, np.ndarray]:
    k = np.arange(start, start + n)
    return {"obs": np.tile(k[:, None], (1, 4)).astype(np.float32), "action": k.astype(np.int64)}


def _batch_weights(s, beta: float) -> np.ndarray:
    """(N·P(i))^-beta over its largest value in the batch (N cancels)."""
    w = s.probabilities ** -beta
    return (w / w.max()).astype(np.float32)


def test_weights_keep_their_scale_however_old_the_oldest_item():
    clock = Clock()
    buf = ReplayBuffer(SCHEMA, 2000, alpha=0.6, decay=0.01, seed=3, clock=clock)
    rng = np.random.default_rng(0)
    # items added one step a second for 6,000 s: the first ones are e^-60 less likely
    # than the newest (the buffer rebases on the way), as in a long run with decay
    spans = []
    for k in range(6):
        for j in range(10):
            idx = buf.add(items(100, (k * 10 + j) * 100))
            buf.update_priorities(idx, rng.random(100) + 0.1)
            clock.t += 100.0
        s = buf.sample(64, beta=0.4)
        np.testing.assert_allclose(s.weights, _batch_weights(s, 0.4), rtol=1e-6)
        assert s.weights.dtype == np.float32 and s.weights.max() == 1.0
        spans.append(float(s.weights.mean()))
    # the batch's items are a few hundred seconds apart at most: weights of order 1,
    # the same at a 1,000 s span as at 6,000 s (before: 1e-2 falling to 1e-12)
    assert min(spans) > 0.05, spans


def test_a_batch_of_old_and_new_items_weighs_them_against_each_other():
    clock = Clock()
    buf = ReplayBuffer(SCHEMA, 8, alpha=1.0, eps=1e-6, decay=0.1, seed=0, clock=clock)
    idx = buf.add(items(4), times=clock.t - np.array([0.0, 10.0, 20.0, 30.0]))
    buf.update_priorities(idx, np.ones(4))
    s = buf.sample(256, beta=1.0)
    np.testing.assert_allclose(s.weights, _batch_weights(s, 1.0), rtol=1e-6)
    # the oldest drawn item gets 1, a newer one e^-(0.1·age difference)
    age = clock.t - s.origin_times
    np.testing.assert_allclose(s.weights, np.exp(-0.1 * (age.max() - age)), rtol=1e-5)


def test_without_decay_weights_still_go_by_the_least_likely_stored_item():
    buf = ReplayBuffer(SCHEMA, 8, alpha=1.0, eps=1e-6, seed=1)
    idx = buf.add(items(8))
    td = np.array([1e-3, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    buf.update_priorities(idx, td)
    p = (td + 1e-6) / (td + 1e-6).sum()
    for _ in range(5):
        s = buf.sample(4, beta=0.5)
        slot = s.batch["action"]
        np.testing.assert_allclose(s.weights, ((p[slot] / p.min()) ** -0.5).astype(np.float32), rtol=1e-6)
