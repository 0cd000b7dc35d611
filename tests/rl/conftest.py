"""Fixtures for the RL tests: a minimal uniform replay with the swarm.buffer API.

The agent is tested against this small double so that its tests do not depend on
the federated buffer's internals; one test also runs it on the real buffer.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

torch.set_num_threads(1)


class UniformReplay:
    """Stores everything; samples uniformly; records priority updates."""

    def __init__(self, seed: int = 0):
        self.cols: dict[str, list[np.ndarray]] = {}
        self.rng = np.random.default_rng(seed)
        self.priority_updates: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, items):
        n = len(next(iter(items.values())))
        for k, v in items.items():
            self.cols.setdefault(k, []).extend(np.asarray(v))
        return np.arange(len(self) - n, len(self))

    def __len__(self):
        return len(self.cols.get("obs", []))

    def sample(self, n, beta=0.4):
        idx = self.rng.integers(len(self), size=n)
        batch = {k: np.stack([v[i] for i in idx]) for k, v in self.cols.items()}
        return SimpleNamespace(batch=batch, indices=idx, weights=np.ones(n, np.float32))

    def update_priorities(self, indices, td):
        self.priority_updates.append((np.asarray(indices), np.asarray(td)))


@pytest.fixture
def replay():
    return UniformReplay()
