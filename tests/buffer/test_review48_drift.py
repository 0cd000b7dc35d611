"""Review 48, long runs: the sum-tree's exact rebuild came every capacity rounded up to a
power of two leaf writes (65,536 for 50,000), not every ``capacity`` as its docs say."""

from __future__ import annotations

import numpy as np

from swarm.buffer.sumtree import SumTree


def test_the_sum_tree_is_rebuilt_every_capacity_writes():
    tree = SumTree(50_000)
    tree.set_range(0, np.ones(50_000))
    rebuilt_at: list[int] = []
    writes = 0
    rebuild = tree.rebuild

    def counted() -> None:
        rebuilt_at.append(writes)
        rebuild()

    tree.rebuild = counted
    rng = np.random.default_rng(0)
    while len(rebuilt_at) < 3:
        idx = rng.choice(50_000, 64, replace=False)
        writes += 64
        tree.set(idx, rng.random(64) + 0.5)
    gaps = np.diff([0, *rebuilt_at])
    assert all(50_000 <= g < 50_000 + 64 for g in gaps), rebuilt_at
    assert abs(tree.total - tree._tree[tree._cap:tree._cap + 50_000].sum()) < 1e-6
