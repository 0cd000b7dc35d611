"""Sum-tree defects found by review 41: arguments that are not numbers (strings, 2-D or
ragged arrays, None, objects) reached numpy and Python, which raised their own
ValueError, TypeError or IndexError instead of a ReplayError naming the argument, and
fill_range took a negative ``n``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from swarm.buffer import ReplayBuffer, SumTree
from swarm.buffer.replay import Items
from swarm.errors import ReplayError


def tree():
    t = SumTree(8)
    t.set(np.arange(4), np.array([1.0, 2.0, 3.0, 4.0]))
    return t


def snapshot(t):
    total, low = t.total, t.min   # first: reading the minimum rescans stale blocks
    return t._tree.tolist(), t._bmin.tolist(), t._stale.tolist(), total, low


NOT_NUMBERS = ["abc", np.array(["a", "b"]), ["1", "2"], [object(), object()], [[1.0], [1.0, 2.0]],
               np.array([1 + 1j, 2 + 0j])]
NOT_INTS = ["2", None, 1.5, np.array(1.5), [1], np.ones((2, 2))]


# (call, the argument's name its message must hold)
BAD_CALLS = (
    [(lambda t, v=v: t.set_range(0, v), "values") for v in NOT_NUMBERS + [None, np.ones((2, 2)), np.ones((2, 1))]]
    + [(lambda t, v=v: t.fill_range(0, 2, v), "value")
       for v in NOT_NUMBERS + ["1.5", None, np.ones((2, 2)), np.array([2.0])]]
    + [(lambda t, v=v: t.fill_range(0, 1, v), "value") for v in ["abc", "1.5", None]]
    + [(lambda t, v=v: t.set(np.array([0, 1]), v), "values") for v in NOT_NUMBERS]
    + [(lambda t: t.set([[0], [0, 1]], np.ones(2)), "indices")]
    + [(lambda t: t.get([[0], [0, 1]]), "indices")]
    + [(lambda t, v=v: t.assign(v), "leaves") for v in [np.array(["1"] * 8), [object()] * 8, [[1.0]] * 7 + [[1.0, 2.0]]]]
    + [(lambda t, v=v: t.scale(v), "factor") for v in ["abc", None, np.ones((2, 2)), np.array([True, False])]]
    + [(lambda t, v=v: t.find(v), "prefix") for v in ["abc", [object()], [[1.0], [1.0, 2.0]]]]
    + [(lambda t, v=v: t.set_range(v, np.ones(2)), "start") for v in NOT_INTS]
    + [(lambda t, v=v: t.fill_range(v, 2, 1.0), "start") for v in NOT_INTS]
    + [(lambda t, v=v: t.fill_range(v, 1, 1.0), "start") for v in NOT_INTS]
    + [(lambda t, v=v: t.fill_range(0, v, 1.0), "n") for v in NOT_INTS]
    + [(lambda t, v=v: SumTree(v), "capacity") for v in ["8", None, 8.5, [8]]]
)


@pytest.mark.parametrize("call, name", BAD_CALLS)
def test_sumtree_refuses_arguments_that_are_not_numbers_by_name(call, name):
    """Before: numpy's or Python's own error (ValueError 'could not broadcast', TypeError
    'slice indices must be integers', ...) or, for numeric strings, complex numbers and a
    float capacity, nothing at all; the message now names the argument, and the tree is
    unchanged."""
    t = tree()
    before = snapshot(t)
    with pytest.raises(ReplayError, match=name):
        call(t)
    assert snapshot(t) == before


@pytest.mark.parametrize("start, n", [(2, -1), (5, -3), (8, -1), (0, -8)])
def test_fill_range_refuses_a_negative_n(start, n):
    """Before: fill_range(2, -1, v) returned having written nothing, and fill_range(8, -1, v)
    on 8 leaves passed the range check (start + n <= capacity) and raised numpy's
    IndexError from the block minimum."""
    t = tree()
    before = snapshot(t)
    with pytest.raises(ReplayError, match=f"n must be an int >= 0, got {n}"):
        t.fill_range(start, n, 5.0)
    assert snapshot(t) == before


def test_sumtree_still_takes_numpy_scalars_and_zero_dimensional_arrays():
    """What worked before the checks still does: numpy integers and floats, and 0-d arrays
    of them, as indices, counts and values."""
    t = tree()
    t.fill_range(np.int64(4), np.array(2), np.array(1.5))
    t.fill_range(np.array(6), 1, np.float32(0.5))
    t.set_range(np.int32(7), np.array([2.0]))
    t.scale(np.float64(2.0))
    assert t.leaves.tolist() == [2.0, 4.0, 6.0, 8.0, 3.0, 3.0, 1.0, 4.0]
    assert t.find(np.array(0.5)).tolist() == [0]
    assert SumTree(np.int64(4)).capacity == 4


def test_an_insert_whose_priorities_pass_float64_stores_them_capped():
    # A long double priority past float64's range passed insert's check (finite in its own
    # dtype) and became an Inf leaf with priority_clip = inf; the add's leaf check looked
    # only at the minimum, so the sum-tree refused the leaf after the columns, tickets and
    # id index were written: two items in the ring and the index, with zero leaves. Now
    # such priorities are capped as update_priorities() caps them: stored whole, the sum finite.
    if np.finfo(np.longdouble).max <= np.finfo(np.float64).max:
        pytest.skip("long double is float64 here")
    b = ReplayBuffer({"x": ("float32", ())}, 8, sampler="prioritized")
    b.add({"x": np.arange(2, dtype=np.float32)})
    it = b.items(np.arange(2))
    big = Items(fields=it.fields, origins=np.zeros(2, np.int64), seqs=np.array([5, 6]), times=it.times,
                priorities=np.array([np.longdouble("1e400")] * 2), peers=["other"])
    assert b.insert(big, priority_clip=math.inf).tolist() == [2, 3]
    assert sorted(s for o, s in b.ids() if o == "other") == [5, 6]
    assert b.priorities(np.arange(2, 4)).tolist() == [b._max_raw] * 2
    assert math.isfinite(b._tree.total)


@pytest.mark.parametrize("decay", [0.0, 0.01])
def test_inserted_priorities_near_float_max_keep_the_sum_finite(decay):
    # With decay 0 the leaf was the clipped priority itself: 1e308 twice (priority_clip inf)
    # summed to inf, every later draw had probability 0 and the tree's search read NaN.
    b = ReplayBuffer({"x": ("float32", ())}, 8, sampler="prioritized", decay=decay)
    b.add({"x": np.arange(2, dtype=np.float32)})
    it = b.items(np.arange(2))
    big = Items(fields=it.fields, origins=np.zeros(2, np.int64), seqs=np.array([5, 6]), times=it.times,
                priorities=np.array([1e308] * 2), peers=["other"])
    b.insert(big, priority_clip=math.inf)
    assert math.isfinite(b._tree.total) and b._tree.total > 0
    s = b.sample(4)
    assert np.all(s.probabilities > 0) and set(s.indices.tolist()) <= {0, 1, 2, 3}
