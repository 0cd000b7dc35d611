"""Property tests for the batched sum-tree."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.buffer import ReplayBuffer, SumTree

values = st.floats(min_value=0.0, max_value=1e3, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(cap=st.integers(1, 70), ops=st.lists(st.tuples(st.integers(0, 69), values), min_size=1, max_size=60))
def test_set_keeps_every_inner_node_the_sum_of_its_leaves(cap, ops):
    t = SumTree(cap)
    ref = np.zeros(cap)
    for i in range(0, len(ops), 7):  # batches of up to 7 writes, with repeats
        chunk = [(j % cap, v) for j, v in ops[i:i + 7]]
        idx = np.array([j for j, _ in chunk])
        val = np.array([v for _, v in chunk])
        t.set(idx, val)
        for j, v in chunk:  # last write wins
            ref[j] = v
    np.testing.assert_allclose(t.leaves, ref)
    assert abs(t.total - ref.sum()) <= 1e-9 * max(1.0, ref.sum())
    assert t.min == (ref[ref > 0].min() if (ref > 0).any() else np.inf)


@settings(max_examples=60, deadline=None)
@given(cap=st.integers(1, 70), start=st.integers(0, 69), vals=st.lists(values, min_size=1, max_size=70))
def test_set_range_is_exact(cap, start, vals):
    start = start % cap
    vals = np.array(vals[:cap - start])
    t = SumTree(cap)
    t.set(np.arange(cap), np.full(cap, 0.5))
    t.set_range(start, vals)
    ref = np.full(cap, 0.5)
    ref[start:start + vals.size] = vals
    np.testing.assert_array_equal(t.leaves, ref)
    assert abs(t.total - ref.sum()) <= 1e-9 * max(1.0, ref.sum())


@settings(max_examples=60, deadline=None)
@given(leaves=st.lists(st.floats(0.01, 100.0), min_size=1, max_size=70), data=st.data())
def test_find_inverts_the_prefix_sum(leaves, data):
    leaves = np.array(leaves)
    t = SumTree(leaves.size)
    t.assign(leaves)
    cum = np.concatenate([[0.0], np.cumsum(leaves)])
    us = np.array(data.draw(st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=1, max_size=20)))
    u = us * t.total
    got = t.find(u)
    for k, i in enumerate(got):
        # exact except within rounding of a boundary
        assert cum[i] - 1e-9 <= u[k] < cum[i + 1] + 1e-9


def test_find_never_lands_on_an_empty_leaf_past_the_filled_prefix():
    t = SumTree(1000)
    t.set_range(0, np.ones(300))
    got = t.find(np.array([0.0, 299.999999, t.total, t.total * 2]))
    assert (got < 1000).all()
    assert got[0] == 0 and got[1] == 299


def test_drift_is_removed_by_rebuild():
    rng = np.random.default_rng(0)
    t = SumTree(64)
    for _ in range(200):
        t.set(rng.integers(0, 64, 16), rng.random(16) * 10.0 ** rng.integers(-3, 6))
    t.rebuild()
    assert t.total == np.sum(t.leaves) or abs(t.total - t.leaves.sum()) < 1e-12 * t.leaves.sum()


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 299), st.floats(0.0, 5.0)), min_size=1, max_size=200))
def test_min_is_the_smallest_positive_leaf_across_blocks(ops):
    # 300 leaves span several blocks of the block minimum; raising a block's
    # minimum (the stale path) and writing zeros (left out) are both exercised.
    t = SumTree(300)
    ref = np.linspace(1.0, 2.0, 300)
    t.set_range(0, ref)
    for i in range(0, len(ops), 5):
        idx = np.array([j for j, _ in ops[i:i + 5]])
        val = np.array([v for _, v in ops[i:i + 5]])
        t.set(idx, val)
        for j, v in ops[i:i + 5]:
            ref[j] = v
        assert t.min == (ref[ref > 0].min() if (ref > 0).any() else np.inf)


@settings(max_examples=40, deadline=None)
@given(start=st.integers(0, 299), n=st.integers(1, 300), value=st.floats(0.0, 3.0))
def test_fill_range_keeps_sums_and_minimum(start, n, value):
    n = min(n, 300 - start)
    ref = np.linspace(0.5, 2.5, 300)
    ref[::7] = 0.0                               # zero leaves never count for the minimum
    t = SumTree(300)
    t.set_range(0, ref)
    t.fill_range(start, n, value)
    ref[start:start + n] = value
    np.testing.assert_array_equal(t.leaves, ref)
    assert abs(t.total - ref.sum()) <= 1e-9 * max(1.0, ref.sum())
    assert t.min == (ref[ref > 0].min() if (ref > 0).any() else np.inf)


@pytest.mark.parametrize("capacity", [1000, 1024])
def test_sums_are_rebuilt_once_per_capacity_writes_not_on_every_write(capacity, monkeypatch):
    t = SumTree(capacity)
    rebuilds = []
    real = SumTree.rebuild
    monkeypatch.setattr(SumTree, "rebuild", lambda self: (rebuilds.append(1), real(self)))
    rng = np.random.default_rng(0)
    for _ in range(100):                       # 100 batches of 64: 6,400 leaf writes
        t.set(rng.integers(0, capacity, 64), rng.random(64))
    # one per `capacity` distinct writes (repeats within a batch count once): not one per set()
    assert 1 <= len(rebuilds) <= 6400 // capacity
    np.testing.assert_allclose(t.total, t.leaves.sum(), rtol=1e-12)


def test_a_leaf_that_falls_far_does_not_cancel_out_its_neighbours():
    # Below the top level (capacity > 4096) set() adds differences to the sums: a leaf
    # of 1e20 set back to 1 took 1e20 off a sum that held 1e20 + 1, and its neighbour's 1
    # was lost in the rounding (leaves 0 and 1 were then never drawn, until a rebuild).
    t = SumTree(8192)
    t.set_range(0, np.ones(8192))
    t.set(np.array([0]), np.array([1e20]))
    t.set(np.array([0]), np.array([1.0]))
    assert t.total == 8192.0
    assert t.find(np.array([0.5, 1.5, 2.5])).tolist() == [0, 1, 2]
    # a leaf set to 0 where its neighbour is 0 too
    t.set(np.array([2, 3]), np.array([0.0, 0.0]))
    assert t.total == 8190.0 and t.find(np.array([1.5, 2.5])).tolist() == [1, 4]



def test_a_leaf_that_falls_back_in_steps_does_not_cancel_out_its_neighbours():
    # A TD error of 1e20 that comes back down 100x per update never fell 2**26x in one
    # write, so no rebuild came; its rounding error stayed in every sum above it. The
    # top-level node over leaves 0..3 held -8191 (exact 4): they were never drawn, and
    # the total was half the mass, until the rebuild `capacity` writes later.
    t = SumTree(1 << 14)
    t.set_range(0, np.ones(1 << 14))
    for v in (1e20, 1e18, 1e16, 1e14, 1e12, 1e10, 1e8, 1e6, 1e4, 1e2, 1.0):
        t.set(np.array([0]), np.array([v]))
    assert t.total == float(1 << 14)
    assert t.find(np.array([0.5, 1.5, 2.5, 3.5])).tolist() == [0, 1, 2, 3]
    # the peak is counted from the last rebuild: ordinary writes after it rebuild nothing
    rebuilt = []
    real = t.rebuild
    t.rebuild = lambda: (rebuilt.append(1), real())
    rng = np.random.default_rng(0)
    for _ in range(20):
        t.set(rng.integers(0, 1 << 14, 64), rng.random(64))
    assert rebuilt == []
    np.testing.assert_allclose(t.total, t.leaves.sum(), rtol=1e-12)

def test_min_follows_single_leaf_writes_that_raise_the_smallest_leaf():
    # fill_range(i, 1, v) is the one-leaf path a learner's add() takes every env step. A
    # write that raises the leaf holding its block's minimum (or one of two equal minima)
    # must move the minimum up to the next smallest positive leaf.
    t = SumTree(300)
    ref = np.linspace(1.0, 2.0, 300)
    t.set_range(0, ref)
    for i, v in [(0, 3.0),                  # the smallest leaf of all, raised
                 (70, 0.5), (70, 2.5),      # lowered to the minimum, then raised past others
                 (64, 0.25), (65, 0.25),    # two equal minima in one block
                 (64, 4.0), (65, 4.0),      # raised one after the other
                 (1, 0.0)]:                 # the smallest set to zero: left out
        t.fill_range(i, 1, v)
        ref[i] = v
        assert t.min == ref[ref > 0].min(), (i, v)
    assert t.min == ref[2]


def test_replay_add_over_the_least_likely_item_moves_the_weights_minimum():
    # Once the ring wraps, add() writes a new item at the max priority over the oldest
    # slot: where that slot held the smallest priority, the importance weights
    # (p_i / p_min)^-beta must be taken against the smallest priority still stored.
    buf = ReplayBuffer({"x": ("float32", ())}, 8, alpha=1.0, eps=1e-6, seed=0)
    idx = buf.add({"x": np.arange(8, dtype=np.float32)})
    buf.update_priorities(idx, np.arange(1, 9) / 10.0)   # slot 0 is the least likely: 0.1 + eps
    buf.add({"x": np.array([8.0], np.float32)})          # one item, over slot 0, at max priority 1
    np.testing.assert_array_equal(buf.priorities(np.arange(1, 9)), [k / 10.0 + 1e-6 for k in range(2, 9)] + [1.0])
    assert buf._tree.min == 0.2 + 1e-6   # p_min: the evicted 0.1 + eps is gone
    s = buf.sample(256, beta=1.0)
    p = buf.priorities(s.indices)
    np.testing.assert_allclose(s.weights, ((0.2 + 1e-6) / p).astype(np.float32), rtol=1e-6)
    assert s.weights.max() == 1.0   # the least likely item stored was drawn (and weighs 1)


@pytest.mark.parametrize("capacity,leaf", [(1 << 16, 1.0), (10_000, 0.25)])
def test_find_at_an_exact_boundary_below_the_top_level_returns_the_leaf_starting_there(capacity, leaf):
    """find's contract sum(leaves[:i]) <= u < sum(leaves[:i+1]) at u exactly on a boundary,
    in trees past the 4096 nodes of the kept top level, so the descent below it decides
    (u > left there returned the leaf before: 1000 for u = 1001). Sums of 1.0 or 0.25 are exact."""
    t = SumTree(capacity)
    t.set_range(0, np.full(capacity, leaf))
    want = np.array([0, 1, 2, 3, 1001, 2047, 2048, 4095, 4096, 4097, 9999])
    if capacity == 1 << 16:
        want = np.concatenate([want, [40001, 65534, 65535]])
    np.testing.assert_array_equal(t.find(want * leaf), want)


def test_a_leaf_that_fell_beside_another_huge_one_is_settled_when_that_one_goes():
    # Leaf 0 fell back from 1e20 while leaf 40000 still held 1e20 (the total was above
    # it: no rebuild); the ring then overwrote leaf 40000 through the add path, which
    # never looked again: leaves 0 and 1's sum read 0 and leaves 0..15 were never drawn.
    for n_add in (1, 2):   # fill_range of one leaf and of a run take different paths
        t = SumTree(1 << 16)
        t.assign(np.ones(1 << 16))
        t.set(np.array([0, 40000]), np.array([1e20, 1e20]))
        t.set(np.array([0]), np.array([1.0]))
        t.fill_range(40000, n_add, 1.0)
        assert t.total == float(1 << 16)
        assert t.find(np.array([0.5, 1.5, 2.5])).tolist() == [0, 1, 2]
