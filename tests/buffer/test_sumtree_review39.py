"""SumTree defects found by review 39: set/get past the leaves, bad values, and find
landing on a zero leaf."""

import numpy as np
import pytest

from swarm.buffer import SumTree
from swarm.errors import ReplayError


def ones(cap):
    t = SumTree(cap)
    t.set_range(0, np.ones(cap))
    return t


def snapshot(t):
    return t._tree.tolist(), t.total, t.min


@pytest.mark.parametrize("idx", [[6], [5], [-1], [0, 5], [2**40]])
def test_set_and_get_refuse_an_index_outside_the_leaves(idx):
    """set([6]) on 5 leaves wrote a padding leaf (total 105, leaves summing to 5), set([-1])
    an inner node; get read them back. set_range refused the same."""
    t = ones(5)
    before = snapshot(t)
    with pytest.raises(ReplayError, match=r"out of range \[0, 5\)"):
        t.set(np.array(idx), np.full(len(idx), 100.0))
    with pytest.raises(ReplayError, match=r"out of range \[0, 5\)"):
        t.get(np.array(idx))
    assert snapshot(t) == before


@pytest.mark.parametrize("values", [[np.nan], [-3.0], [np.inf], [1.0, np.nan]])
def test_set_refuses_a_value_that_is_not_finite_and_non_negative(values):
    """NaN and negative leaves were taken: the total became NaN and the minimum ignored them."""
    t = ones(5)
    before = snapshot(t)
    with pytest.raises(ReplayError, match="finite and >= 0"):
        t.set(np.arange(len(values)), np.array(values))
    assert snapshot(t) == before


def test_set_and_get_refuse_non_integer_indices_and_mismatched_values():
    t = ones(5)
    before = snapshot(t)
    with pytest.raises(ReplayError, match="integers"):
        t.set(np.array([1.7]), np.array([2.0]))
    with pytest.raises(ReplayError, match="integers"):
        t.get(np.array([1.7]))
    with pytest.raises(ReplayError, match="one value per index"):
        t.set(np.array([0, 1]), np.array([2.0]))
    assert snapshot(t) == before
    t.set(np.array([], dtype=np.int64), np.array([]))
    assert t.get(np.array([], dtype=np.int64)).size == 0 and snapshot(t) == before


@pytest.mark.parametrize("leaves, u, expect", [
    # the running sum of the leaves (4.499999999999999) falls short of the total (4.5): u in
    # between went past the last positive leaf, onto leaf 7 (0), a forgotten item
    ([1.0, 0.7, 0.9, 0.9, 0.8, 0.1, 0.1, 0.0], 4.499999999999999, 6),
    ([1.0, 1.0, 1.0, 1.0, 0.0], 4.0, 3),        # u at the total: clipped onto the zero last leaf
])
def test_find_never_lands_on_a_zero_leaf(leaves, u, expect):
    t = SumTree(len(leaves))
    t.set_range(0, np.array(leaves))
    got = t.find(np.array([u, 0.0]))
    assert got.tolist() == [expect, 0]
    assert t.find(np.array([])).size == 0


def test_find_below_zero_goes_to_the_first_positive_leaf_not_a_zero_one():
    t = SumTree(4)
    t.set_range(0, np.array([0.0, 0.0, 1.0, 1.0]))   # the first two forgotten
    assert t.find(np.array([-1e-17, 0.0, 1.5])).tolist() == [2, 2, 3]
    t.set_range(0, np.zeros(4))                        # nothing positive: clipped as before
    assert t.find(np.array([0.0])).tolist() == [3]


def test_find_on_a_large_tree_with_many_zero_leaves_lands_on_positive_leaves_only():
    """With the descent below the top level: rounding at a node's boundary sent u right into a
    run of zero leaves (found by prefix sums at and around each leaf boundary)."""
    rng = np.random.default_rng(0)
    cap = 1 << 13
    for _ in range(20):
        t = SumTree(cap)
        v = rng.random(cap) * rng.choice([1e-3, 1.0, 1e3], cap)
        v[rng.random(cap) < 0.5] = 0.0
        t.set_range(0, v)
        b = np.cumsum(v)[v > 0]
        u = np.concatenate([b, np.nextafter(b, np.inf), np.nextafter(b, -np.inf), [0.0]])
        u = u[(u >= 0) & (u < t.total)]
        assert (t.leaves[t.find(u)] > 0).all()
