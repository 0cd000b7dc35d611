"""A vectorised sum-tree, with a min-tree beside it, over float64 priorities.

The tree is one flat array in heap order: node ``i`` has children ``2i`` and
``2i+1``, and the ``capacity`` leaves (rounded up to a power of two) sit at
``[cap, 2*cap)``. Only the levels *below* a top level of at most
``2**_TOP_BITS`` nodes are kept up to date; the total and the minimum come from
that top level, and :meth:`SumTree.find` starts with one ``searchsorted`` over
its running sum. At a million leaves this skips the twelve narrow top levels,
which would cost a numpy call each per operation while holding a few nodes.
Every operation works on a whole batch at once, so the Python cost is one loop
over the eight or so remaining levels, not over items:

* :meth:`SumTree.find` descends all prefix sums together, level by level;
* :meth:`SumTree.set` writes the leaves and adds each leaf's change to all its
  kept ancestors with a single ``np.add.at``. Adding differences lets rounding
  error build up in the sums, so they are rebuilt exactly from the leaves after
  every ``capacity`` leaf writes (amortised, well under a microsecond per
  write), and at once when a leaf has fallen while the largest leaf written since
  the last rebuild was more than 2^26 times its parent's new sum, as soon as the
  total is below that largest leaf (at that fall, or when another huge leaf goes,
  whichever write path takes it): that leaf's rounding error (2^-52 of it) stays
  in every sum it passed through, however many steps it took down, and would
  cancel out the other leaves' share;
  :meth:`SumTree.set_range` recomputes its ancestors exactly.

Beside the sums the tree keeps the smallest *positive* leaf of every block of
``_BLOCK`` leaves, which gives prioritized replay its largest importance
weight ``(N·P_min)^−β`` exactly without touching every item. A write that
lowers a leaf lowers its block's minimum at once; a write that raises the leaf
that *was* its block's minimum marks the block stale, and stale blocks are
rescanned on the next :attr:`SumTree.min`. (A min-tree in heap order would
cost a random memory access per level per write: twice the whole update.)
Zero leaves (empty slots, or priorities decayed to nothing) are left out of
the minimum: they are never sampled, so they need no weight.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from ..errors import ReplayError

__all__ = ["SumTree"]

# Up to 2**12 top nodes: a cumsum over them costs about as much as two levels of
# descent, and replaces twelve (measured at 1M leaves).
_TOP_BITS = 12
# Leaves per block of the block minimum: 16K blocks at 1M leaves (a 128 KB array
# that stays in cache), and a stale block costs a 64-leaf rescan.
_BLOCK = 64
# Up to this many blocks, a run's block minima are one masked reduction (5 us for two
# blocks, against 19 for a plain one and a second pass over the blocks with zero leaves,
# as a ring that is not full yet always has); over many blocks the plain one is faster.
_FEW_BLOCKS = 4
_INF = np.inf
# A sum that once held a leaf past this many times its present value has lost more
# than 2**-26 of it to rounding (float64 keeps 2**-52 of the leaf).
_SWING = float(2 ** 26)
# The ufuncs' own reductions: ndarray.min and .max go through a Python wrapper.
_min, _max = np.minimum.reduce, np.maximum.reduce


class SumTree:
    """Batched sum-tree (and min-tree) over ``capacity`` non-negative float64 leaves.

    >>> t = SumTree(4)
    >>> t.set(np.array([0, 1, 2]), np.array([1.0, 2.0, 3.0]))
    >>> t.total, t.min
    (6.0, 1.0)
    >>> t.find(np.array([0.5, 1.5, 5.9])).tolist()
    [0, 1, 2]
    """

    def __init__(self, capacity: int) -> None:
        capacity = _int(capacity, "SumTree capacity")
        if capacity < 1:
            raise ReplayError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.depth = max(1, (self.capacity - 1).bit_length())
        self._cap = 1 << self.depth
        self._top = min(self.depth, _TOP_BITS)        # level kept as the tree's top
        self._tree = np.full(2 * self._cap, 0.0)   # full(), not zeros(): every page resident from the start
        self._block = min(_BLOCK, self._cap)
        self._bmin = np.full(self._cap // self._block, _INF)   # smallest positive leaf per block
        self._stale = np.zeros(self._bmin.size, dtype=bool)   # blocks whose _bmin may be too low
        self._total: float | None = 0.0               # cached; None when the top changed
        self._levels = self.depth - self._top          # levels kept below the top
        # Ancestors of heap node i below the top: i >> 1, ..., i >> _levels.
        self._shifts = np.arange(1, self._levels + 1, dtype=np.int64)[:, None]
        self._writes = 0
        self._peak = 0.0   # the largest leaf written since the sums were last exact
        # a leaf fell from far above its neighbours' sum (under _peak) since: its rounding
        # error is in the sums, harmless until the total falls below _peak (see _set)
        self._owed = False

    # -------------------------------------------------------------- reading
    @property
    def total(self) -> float:
        """Sum of all leaves."""
        if self._total is None:
            k = 1 << self._top
            self._total = float(self._tree[k:2 * k].sum())
        return self._total

    @property
    def min(self) -> float:
        """Smallest positive leaf (``inf`` while every leaf is zero)."""
        if self._stale.any():
            b = np.flatnonzero(self._stale)
            rows = self._tree[self._cap:].reshape(-1, self._block)[b]
            self._bmin[b] = _min_positive(rows, axis=1)
            self._stale[b] = False
        return float(np.minimum.reduce(self._bmin))

    @property
    def leaves(self) -> np.ndarray:
        """The leaf values (a view; write only through :meth:`set` or :meth:`assign`)."""
        return self._tree[self._cap:self._cap + self.capacity]

    def get(self, idx: np.ndarray) -> np.ndarray:
        """Leaf values at ``idx`` (integers in ``[0, capacity)``, else :class:`ReplayError`, a ValueError)."""
        idx = _integers(idx)
        if idx.size:
            self._check_leaves(int(_min(idx)), int(_max(idx)))
        return self._tree[idx + self._cap]

    def _get(self, idx: np.ndarray) -> np.ndarray:
        """:meth:`get` for callers whose int64 ``idx`` are leaves already (the replay
        buffer's slots: ~2 us of a 128-item sample's ~50 went to the checks)."""
        return self._tree[idx + self._cap]

    def _check_leaves(self, lo: int, hi: int) -> None:
        """ReplayError unless leaves ``lo..hi`` exist: past them a number would reach a
        padding leaf (left out of every sum) or, negative, an inner node."""
        if lo < 0 or hi >= self.capacity:
            raise ReplayError(f"leaf indices [{lo}, {hi}] out of range [0, {self.capacity})")

    # -------------------------------------------------------------- writing
    def set(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Set leaves ``idx`` to ``values``, one per index, finite and >= 0 (else ReplayError,
        and nothing changes). Where ``idx`` repeats, the last value wins."""
        idx = _integers(idx)
        values = _floats(values, "set values")
        if values.shape != idx.shape:
            raise ReplayError(f"set takes one value per index: {values.shape} values for {idx.shape} indices")
        if idx.size == 0:
            return
        idx, values = idx.reshape(-1), values.reshape(-1)
        # A NaN fails both comparisons. A negative or infinite leaf would make the sums,
        # and the sampling law, meaningless.
        if not (0.0 <= _min(values) and _max(values) < _INF):
            raise ReplayError("leaf values must be finite and >= 0")
        self._check_leaves(int(_min(idx)), int(_max(idx)))
        self._set(idx, values)

    def _set(self, idx: np.ndarray, values: np.ndarray) -> None:
        """:meth:`set` for callers whose leaves and values are checked already (the replay
        buffer's slots and priorities): flat int64 ``idx``, float64 ``values`` of its size.
        (The checks were ~9% of a priority update.)"""
        if idx.size == 0:
            return
        # Sorted leaves give sorted parents: rows are then touched in memory order.
        order = np.argsort(idx, kind="stable")
        heap = idx[order]
        if heap.size > 1 and (heap[1:] == heap[:-1]).any():
            # numpy does not promise which of repeated assignments lands: keep the last.
            last = np.empty(heap.size, dtype=bool)
            np.not_equal(heap[1:], heap[:-1], out=last[:-1])
            last[-1] = True
            heap, order = heap[last], order[last]
        heap += self._cap
        v = values[order]
        t = self._tree
        old = t[heap]
        t[heap] = v
        top = _max(v)
        if top > self._peak:
            self._peak = float(top)
        # Block minimum: lowering is immediate; raising a block's minimum makes it stale.
        blk = (heap - self._cap) // self._block
        vpos = np.where(v > 0, v, _INF)
        self._stale[blk[(vpos > old) & (old <= self._bmin[blk])]] = True
        np.minimum.at(self._bmin, blk, vpos)
        if self._levels:
            # One add.at carries every leaf's change to all its kept ancestors. Flat,
            # contiguous operands keep numpy on its fast path (and numpy 2.4's
            # add.at mis-adds when left to broadcast itself).
            # (Filling an array is a tenth of np.broadcast_to's Python cost.)
            fell = old > v
            v -= old
            d = np.empty((self._levels, heap.size))
            d[...] = v
            np.add.at(t, (heap >> self._shifts).ravel(), d.ravel())
            self._total = None
            # A leaf far larger than the sum it leaves (one of 1e20 set back to 1, at
            # once or in steps of 100x) left its rounding error in every sum above it,
            # which cancels out the other leaves' share: rebuild exactly once the total
            # is below that leaf (now, or when another huge leaf goes: see _settle).
            if fell.any() and self._peak > _SWING * _min(t[heap[fell] >> 1]):
                self._owed = True
            if self._settle():
                return
        self._total = None
        # Added differences let rounding error build up in the sums: recompute them
        # exactly from the leaves after every `capacity` leaf writes (amortised,
        # well under a microsecond per write).
        self._writes += heap.size
        if self._writes >= self.capacity:   # not _cap, capacity rounded up: up to twice as many
            self.rebuild()

    def set_range(self, start: int, values: np.ndarray) -> None:
        """Set the contiguous leaves ``[start, start + len(values))`` to ``values`` (a 1-D
        array of real numbers), finite and >= 0 (else ReplayError, and nothing changes, as
        :meth:`set`).

        The ancestors of a run of leaves form one run per level, so each level is
        recomputed with a single slice operation.
        """
        start = _int(start, "set_range start")
        values = _floats(values, "set_range values")
        if values.ndim > 1:
            raise ReplayError(f"set_range values must be a 1-D array of leaf values, got shape {values.shape}")
        if values.size and not (0.0 <= _min(values, axis=None) and _max(values, axis=None) < _INF):
            raise ReplayError("leaf values must be finite and >= 0")
        self._write_range(start, values.size, values)

    def fill_range(self, start: int, n: int, value: float) -> None:
        """Set the ``n`` leaves from ``start`` on to ``value`` (new items at the max priority),
        a real number, finite and >= 0, and ``n`` >= 0 (else ReplayError, and nothing
        changes, as :meth:`set`)."""
        start, n = _int(start, "fill_range start"), _int(n, "fill_range n")
        if n < 0:
            raise ReplayError(f"fill_range n must be an int >= 0, got {n}")
        # add() passes a float: the check of anything else costs it nothing
        value = value if type(value) is float else _float(value, "fill_range value")
        if not 0.0 <= value < _INF:   # a NaN fails both comparisons
            raise ReplayError(f"leaf values must be finite and >= 0, got {value!r}")
        if n == 1:
            self._write_one(start, value)
        else:
            self._write_range(start, n, value)

    def _write_one(self, i: int, value: float) -> None:
        """:meth:`_write_range` of one leaf, with the same result, in scalars: a learner adds
        its own items one per env step, and for one leaf a numpy call per tree level and a
        rescan of its block cost several times the arithmetic (~15 us against ~3 at 50,000)."""
        if i < 0 or i + 1 > self.capacity:
            raise ReplayError(f"leaves [{i}, {i + 1}) out of range [0, {self.capacity})")
        t, node = self._tree, i + self._cap
        old = t.item(node)
        t[node] = value
        if value > self._peak:
            self._peak = value
        # The block minimum stays exact: a fresh one rescans only where the leaf raised
        # was the minimum (or the block was stale); elsewhere the new leaf can only lower it.
        b = i // self._block
        v = value if value > 0 else _INF
        bmin = self._bmin.item(b)
        if self._stale[b] or (v > old > 0 and old <= bmin):
            self._bmin[b] = _min_positive(t[self._cap + b * self._block:self._cap + (b + 1) * self._block])
            self._stale[b] = False
        elif v < bmin:
            self._bmin[b] = v
        for _ in range(self._levels):   # Python floats add as numpy's float64 do: the same sums
            node >>= 1
            t[node] = t.item(2 * node) + t.item(2 * node + 1)
        self._total = None
        if self._owed and value < old:
            self._settle()
        if self.capacity == 1:   # as _write_range: the one leaf is every leaf, the sums exact
            self._writes = 0

    def _write_range(self, start: int, n: int, values: np.ndarray | float) -> None:
        if n == 0:
            return
        if start < 0 or start + n > self.capacity:
            raise ReplayError(f"leaves [{start}, {start + n}) out of range [0, {self.capacity})")
        lo, hi = start + self._cap, start + n + self._cap
        self._tree[lo:hi] = values
        bs = self._block
        b0, b1 = start // bs, (start + n - 1) // bs + 1
        self._stale[b0:b1] = False
        if isinstance(values, float):
            # A constant run: every block it covers whole has that minimum; only
            # the (at most two) blocks it covers in part need a look at their leaves.
            self._bmin[b0:b1] = values if values > 0 else _INF
            for b in {b0, b1 - 1}:
                if b * bs < start or (b + 1) * bs > start + n:
                    row = self._tree[self._cap + b * bs:self._cap + (b + 1) * bs]
                    self._bmin[b] = _min_positive(row)
        else:
            rows = self._tree[self._cap:].reshape(-1, bs)[b0:b1]
            if b1 - b0 <= _FEW_BLOCKS:   # a few items (a message's): one masked pass
                self._bmin[b0:b1] = _min_positive(rows, axis=1)
            else:
                bmin = rows.min(axis=1)
                zero = bmin <= 0
                if zero.any():  # blocks holding zero leaves: leave those out (the rare path)
                    z = rows[zero]
                    bmin[zero] = _min_positive(z, axis=1)
                self._bmin[b0:b1] = bmin
        self._fix_runs(lo, hi - 1)
        top = values if isinstance(values, float) else float(_max(values))
        self._peak = max(self._peak, top)
        if self._owed and not (start == 0 and n == self.capacity):
            self._settle()
        elif start == 0 and n == self.capacity:
            # every sum was recomputed from the leaves: no drift left, and no leaf
            # larger than the largest there is left its rounding error. (Counted by
            # leaves, not heap nodes: with a capacity that is not a power of two the
            # run never spans the whole heap, and every set() after the first
            # `capacity` writes rebuilt the whole tree, 0.55 ms instead of 0.11 ms
            # for a DQN update's 64 priorities at 50,000 items.)
            self._writes = 0
            self._peak, self._owed = top, False

    def assign(self, leaves: np.ndarray) -> None:
        """Replace every leaf at once and rebuild the tree exactly; the leaves must be finite
        and >= 0 (else ReplayError, and nothing changes, as :meth:`set`)."""
        leaves = _floats(leaves, "assign leaves")
        if leaves.shape != (self.capacity,):
            raise ReplayError(f"expected {self.capacity} leaves, got shape {leaves.shape}")
        self._tree[self._cap + self.capacity:] = 0.0
        self.set_range(0, leaves)

    def scale(self, factor: float) -> None:
        """Multiply every leaf by ``factor`` (used to rebase age decay): ReplayError, and
        nothing changes, where a product is not finite and >= 0."""
        self.set_range(0, self.leaves * _float(factor, "scale factor"))

    def _settle(self) -> bool:
        """Rebuild now where a fallen leaf's rounding error is in the sums (``_owed``) and
        the total is below the largest leaf since the last rebuild: that error is then no
        longer a negligible share of the mass. Whether it rebuilt."""
        if self._owed and self._peak > self.total:
            self.rebuild()
            return True
        return False

    def rebuild(self) -> None:
        """Recompute every inner node from the leaves."""
        # They were checked when written: not again on this O(capacity) path.
        self._write_range(0, self.capacity, self.leaves.copy())

    def _fix_runs(self, lo: int, hi: int) -> None:
        """Recompute the ancestors of heap nodes ``[lo, hi]`` (inclusive) up to the top level."""
        t = self._tree
        for _ in range(self._levels):
            lo, hi = lo >> 1, hi >> 1
            np.add(t[2 * lo:2 * hi + 2:2], t[2 * lo + 1:2 * hi + 2:2], out=t[lo:hi + 1])
        self._total = None

    # -------------------------------------------------------------- search
    def find(self, prefix: np.ndarray) -> np.ndarray:
        """Leaf index ``i`` for each prefix sum ``u`` with ``sum(leaves[:i]) <= u < sum(leaves[:i+1])``.

        ``u`` should lie in ``[0, total)``; a value at or past the total (or a
        rounding slip at a boundary) is clipped to a valid index. A leaf of 0 is never
        returned (its interval is empty) unless every leaf is 0.
        """
        u = np.array(_floats(prefix, "find prefix"), dtype=np.float64, copy=True).reshape(-1)
        t = self._tree
        k = 1 << self._top
        level = t[k:2 * k]
        cs = np.cumsum(level)
        j = np.searchsorted(cs, u, side="right")
        np.minimum(j, k - 1, out=j)
        u -= cs[j] - level[j]
        idx = j + k
        for _ in range(self.depth - self._top):
            idx <<= 1
            left = t[idx]
            right = u >= left
            np.subtract(u, left, out=u, where=right)
            idx += right
        # Rounding can leave u at or past a node's sum (the running sum of the top level is
        # not its pairwise total; u - (cs[j] - level[j]) may be a hair off), and the descent
        # then ends on a zero leaf: an empty slot, a padding leaf past the last, or a
        # forgotten item drawn again. One gather tells; the rare fix moves each such u to
        # the positive leaf it slipped off. (No padding leaf is positive: nothing to clip.)
        found_zero = idx.size > 0 and not _min(t[idx]) > 0
        idx -= self._cap
        if found_zero:
            # The descent starts at the top level and only goes down, so idx >= 0 (np.clip's
            # Python wrapper cost 6 us of a 128-item sample).
            np.minimum(idx, self.capacity - 1, out=idx)
            idx = self._off_zero(idx)
        return idx

    def _off_zero(self, idx: np.ndarray) -> np.ndarray:
        """``idx`` with each zero leaf replaced by the nearest positive leaf on its left (a
        zero leaf's interval is empty: u slipped past the end of that one), or on its right
        where there is none (u slipped below 0). Unchanged while every leaf is zero."""
        pos = np.flatnonzero(self.leaves > 0)   # O(capacity), on the rare path only
        if pos.size == 0:
            return idx
        zero = self.leaves[idx] == 0
        k = np.searchsorted(pos, idx[zero]) - 1   # the last positive leaf before each
        idx[zero] = pos[np.maximum(k, 0)]
        return idx


def _integers(idx: np.ndarray) -> np.ndarray:
    """``idx`` as an int64 array, or ReplayError if it holds other than integers."""
    try:
        a = np.asarray(idx)
    except ValueError as e:   # a ragged list
        raise ReplayError(f"leaf indices must be an array of integers: {e}") from None
    if a.size and a.dtype.kind not in "iu":
        raise ReplayError(f"leaf indices must be integers, got {a.dtype}")
    return a.astype(np.int64, copy=False)


def _floats(values: Any, what: str) -> np.ndarray:
    """``values`` as a float64 array, or ReplayError naming ``what`` unless they are real
    numbers: numpy would parse strings ("1.5") and drop a complex number's imaginary part."""
    try:
        a = np.asarray(values)
    except ValueError as e:   # a ragged list
        raise ReplayError(f"{what} must be an array of numbers: {e}") from None
    if a.dtype.kind not in "biuf":
        raise ReplayError(f"{what} must be real numbers (ints or floats), got {a.dtype}: {values!r:.80}")
    return a.astype(np.float64, copy=False)


def _float(value: Any, what: str) -> float:
    """A real number (a numpy scalar or 0-d array of one too) as a float, or ReplayError
    naming ``what``."""
    try:
        a = np.asarray(value)
    except ValueError:   # a ragged list
        a = None
    if a is None or a.ndim or a.dtype.kind not in "biuf":
        raise ReplayError(f"{what} must be a real number (an int or a float), got {value!r:.80}")
    return float(a)


def _int(value: Any, what: str) -> int:
    """An integer (a numpy one or a 0-d integer array too, as a slice takes) as an int, or
    ReplayError naming ``what``."""
    try:
        return operator.index(value)
    except TypeError:
        raise ReplayError(f"{what} must be an int, got {value!r:.80}") from None


def _min_positive(a: np.ndarray, axis: int | None = None) -> np.ndarray | float:
    """The smallest positive entry of ``a`` (along ``axis``), ``inf`` where there is none."""
    # The ufunc's own reduce: np.min's Python wrapper costs as much again on a block of leaves.
    return np.minimum.reduce(a, axis=axis, where=a > 0, initial=_INF)
