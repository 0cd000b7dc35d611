"""A vectorised sum-tree over float64 priorities.

The tree is one flat array in heap order: node 1 is the root, node ``i`` has
children ``2i`` and ``2i+1``, and the ``capacity`` leaves (rounded up to a
power of two) sit at ``[cap, 2*cap)``. Every operation works on a whole batch
at once, so the Python cost is one loop over the ~20 levels, not over items:

* :meth:`SumTree.find` descends all prefix sums level by level together;
* :meth:`SumTree.set` writes the leaves and adds each leaf's change to all its
  ancestors with a single ``np.add.at`` (one call for every level).

Adding differences lets rounding error build up in the inner nodes, so the
tree is rebuilt exactly from its leaves after every ``capacity`` leaf writes
(an O(capacity) pass that costs well under a microsecond per write amortised).
"""

from __future__ import annotations

import numpy as np

__all__ = ["SumTree"]


class SumTree:
    """Batched sum-tree over ``capacity`` non-negative float64 leaves.

    >>> t = SumTree(4)
    >>> t.set(np.array([0, 1, 2]), np.array([1.0, 2.0, 3.0]))
    >>> t.total
    6.0
    >>> t.find(np.array([0.5, 1.5, 5.9])).tolist()
    [0, 1, 2]
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.depth = max(1, (self.capacity - 1).bit_length())
        self._cap = 1 << self.depth
        self._tree = np.zeros(2 * self._cap, dtype=np.float64)
        # Ancestors of a leaf at heap index i are i >> 1, i >> 2, ..., i >> depth (the root).
        self._shifts = np.arange(1, self.depth + 1, dtype=np.int64)[:, None]
        self._writes = 0
        self._mark = np.zeros(self.capacity, dtype=np.int64)
        self._arange = np.arange(1024, dtype=np.int64)
        # find() starts from a prefix sum over this level instead of descending
        # the top of the tree one level at a time: fewer, larger numpy calls.
        self._top = min(self.depth, 12)

    @property
    def total(self) -> float:
        """Sum of all leaves."""
        return float(self._tree[1])

    @property
    def leaves(self) -> np.ndarray:
        """The leaf values (a view; write only through :meth:`set` or :meth:`assign`)."""
        return self._tree[self._cap:self._cap + self.capacity]

    def get(self, idx: np.ndarray) -> np.ndarray:
        """Leaf values at ``idx``."""
        return self._tree[np.asarray(idx, dtype=np.int64) + self._cap]

    def set(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Set leaves ``idx`` to ``values``. Where ``idx`` repeats, the last value wins."""
        idx = np.asarray(idx, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        n = idx.size
        if n == 0:
            return
        if n > self._arange.size:
            self._arange = np.arange(n, dtype=np.int64)
        # A leaf that repeats must count its change once: stamp each leaf with the
        # position of its last write and keep only that one (no sort needed).
        pos = self._arange[:n]
        self._mark[idx] = pos
        winner = self._mark[idx] == pos
        heap = idx + self._cap
        delta = values - self._tree[heap]
        delta *= winner
        self._tree[heap[winner]] = values[winner]
        # One add.at for all levels. Flat, contiguous operands keep numpy on its
        # fast path (and numpy 2.4's add.at mis-adds when left to broadcast itself).
        np.add.at(self._tree, (heap >> self._shifts).ravel(),
                  np.broadcast_to(delta, (self.depth, n)).ravel())
        self._writes += n
        if self._writes >= self._cap:
            self.rebuild()

    def set_range(self, start: int, values: np.ndarray) -> None:
        """Set the contiguous leaves ``[start, start + len(values))``, exactly.

        The ancestors of a run of leaves form one run per level, so each level is
        recomputed with a single slice operation (no rounding drift).
        """
        values = np.asarray(values, dtype=np.float64)
        n = values.size
        if n == 0:
            return
        if start < 0 or start + n > self.capacity:
            raise ValueError(f"leaves [{start}, {start + n}) out of range [0, {self.capacity})")
        t = self._tree
        lo, hi = start + self._cap, start + n - 1 + self._cap
        t[lo:hi + 1] = values
        while lo > 1:
            lo, hi = lo >> 1, hi >> 1
            np.add(t[2 * lo:2 * hi + 2:2], t[2 * lo + 1:2 * hi + 2:2], out=t[lo:hi + 1])

    def assign(self, leaves: np.ndarray) -> None:
        """Replace every leaf at once and rebuild the tree exactly."""
        leaves = np.asarray(leaves, dtype=np.float64)
        if leaves.shape != (self.capacity,):
            raise ValueError(f"expected {self.capacity} leaves, got shape {leaves.shape}")
        self._tree[self._cap:self._cap + self.capacity] = leaves
        self._tree[self._cap + self.capacity:] = 0.0
        self.rebuild()

    def scale(self, factor: float) -> None:
        """Multiply every leaf by ``factor`` (used to rebase age decay)."""
        self._tree *= factor
        self.rebuild()

    def rebuild(self) -> None:
        """Recompute every inner node from the leaves (drops accumulated rounding)."""
        t = self._tree
        n = self._cap
        while n > 1:
            h = n >> 1
            np.add(t[n:2 * n:2], t[n + 1:2 * n:2], out=t[h:n])
            n = h
        self._writes = 0

    def find(self, prefix: np.ndarray) -> np.ndarray:
        """Leaf index ``i`` for each prefix sum ``u`` with ``sum(leaves[:i]) <= u < sum(leaves[:i+1])``.

        ``u`` should lie in ``[0, total)``; a value at or past the total (or a
        rounding slip at a boundary) is clipped to a valid index.
        """
        u = np.array(prefix, dtype=np.float64, copy=True)
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
        idx -= self._cap
        np.clip(idx, 0, self.capacity - 1, out=idx)
        return idx
