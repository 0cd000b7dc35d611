"""A peer that takes its parameters from neighbours (a bootstrap) takes the target with them.

Before, a late joiner's online network became the donors' while its target stayed the
untrained initial network, and its first updates pulled Q back towards r + γ·Q_init.
An ordinary gossip round must still leave the target to its slow (Polyak) update.
"""

from __future__ import annotations

import numpy as np
import torch

from swarm.buffer import ReplayBuffer
from swarm.experiment import load_spec
from swarm.experiment.checkpoint import load_checkpoint
from swarm.rl import DQNAgent, DQNConfig, dqn_schema
from experiment.test_runner import coordinator  # noqa: F401 - a fixture


def _agent(init_seed: int) -> DQNAgent:
    buf = ReplayBuffer(dqn_schema((4,)), capacity=256, seed=0)
    return DQNAgent((4,), 2, buf, DQNConfig(hidden=[8], learning_starts=10, batch_size=4), seed=0,
                    init_seed=init_seed)


def test_sync_target_copies_the_online_network_and_a_gossip_round_does_not():
    a, donor = _agent(0), _agent(1)
    before = a.target_flat.clone()
    # a gossip round moves the online network a little: the target stays where it was
    a.parameters()[:] += 0.01
    a.on_parameters_changed()
    assert torch.equal(a.target_flat, before)
    # a bootstrap replaces it wholesale: the target becomes the same network
    np.copyto(a.parameters(), donor.parameters())
    a.sync_target()
    assert np.array_equal(a.target_flat.numpy(), donor.parameters())
    assert not a.target_flat.requires_grad
    # a copy, not an alias: the next optimizer step moves the online network only
    a.parameters()[:] += 1.0
    assert np.array_equal(a.target_flat.numpy(), donor.parameters())


def test_a_peer_that_bootstraps_in_the_runner_takes_the_donors_network_as_its_target(
        coordinator, tmp_path, monkeypatch):
    """run_peer's bootstrap, its donor played by a stand-in for Gossip.bootstrap. The
    peer learns, but its target never updates in so short a run (dqn.target_every), so
    the final checkpoint's target is what the bootstrap left."""
    from swarm.experiment import runner
    from swarm.gossip import Gossip

    donated: list[np.ndarray] = []

    async def bootstrap(self, donors=3, timeout=5.0):
        x = np.random.default_rng(7).normal(0.0, 0.3, self.x.size).astype(np.float32)
        self.x[:] = x
        donated.append(x)
        return ["peer9"]

    monkeypatch.setattr(runner, "_should_bootstrap", lambda *a, **k: True)
    monkeypatch.setattr(Gossip, "bootstrap", bootstrap)
    spec = load_spec(None, ["peers=1", "budget.env_steps=60", "dqn.learning_starts=30",
                            "dqn.target_every=1000000",
                            "dqn.batch_size=16", "eval.every=0", "gossip.codec=identity",
                            "gossip.step_size=1.0"])
    s = runner.run_peer(spec, 0, coordinator, tmp_path, tensorboard=False, join_timeout=10)
    assert s["reason"] == "budget" and s["bootstrap"] == ["peer9"] and len(donated) == 1

    ckpt = load_checkpoint(sorted((tmp_path / "peer0" / "ckpt").glob("full-*"))[-1])
    assert ckpt.agent_state["updates"] > 0                   # it learned from the donor's network
    # whose copy is its target, not the initial network every peer of the run builds
    net = DQNAgent((4,), 2, ReplayBuffer(dqn_schema((4,)), capacity=16, seed=0), spec.dqn,
                   seed=0, init_seed=spec.seed).target
    net.load_state_dict(ckpt.agent_state["target"])
    assert np.array_equal(torch.cat([p.reshape(-1) for p in net.parameters()]).numpy(), donated[0])
