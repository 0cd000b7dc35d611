"""Checkpoints: full + incremental restore exactly; kill -9 → resume restores the last one bit for bit."""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest
from swarmtest import free_port, status, wait_for

from swarm.buffer import ReplayBuffer
from swarm.buffer.persist import load_incremental, save_incremental
from swarm.errors import ConfigError, ReplayError
from swarm.experiment import load_spec
from swarm.experiment.checkpoint import Checkpointer, latest, load_checkpoint, state_digest
from swarm.experiment.runner import run_peer
from swarm.rl import DQNAgent, dqn_schema
from swarm.rl.hparams import DQNConfig
from swarm.rl.train import run_agent


def _agent(capacity: int = 300, seed: int = 0) -> DQNAgent:
    buf = ReplayBuffer(dqn_schema((4,)), capacity, seed=seed, peer_id="peer0")
    cfg = DQNConfig(learning_starts=20, batch_size=8, hidden=[16])
    return DQNAgent((4,), 2, buf, cfg, seed=seed)


def _train(agent: DQNAgent, steps: int, ck: Checkpointer | None = None, seed: int = 0) -> None:
    def on_step(info):
        if ck is not None:
            ck.step(info.step)
    run_agent("CartPole-v1", agent, steps, seed=seed, on_step=on_step)


def test_incremental_buffer_snapshot_round_trip_and_refusals(tmp_path):
    buf = ReplayBuffer({"x": ("float32", (3,))}, 16, seed=1, decay=0.01)
    buf.add({"x": np.ones((5, 3), np.float32)})
    buf.save(tmp_path / "full")
    buf.add({"x": np.full((7, 3), 2, np.float32)})      # wraps nothing yet
    buf.update_priorities(np.arange(0, 5), np.linspace(0.1, 3, 5))   # touches rows of the full one
    assert save_incremental(buf, tmp_path / "inc", since=5) == 7
    back = load_incremental(ReplayBuffer.load(tmp_path / "full"), tmp_path / "inc")
    from swarm.buffer.persist import digest
    assert digest(back) == digest(buf)
    # applying it to the wrong base changes nothing and says why
    other = ReplayBuffer.load(tmp_path / "full")
    other.add({"x": np.zeros((1, 3), np.float32)})
    before = digest(other)
    with pytest.raises(ReplayError, match="another full snapshot"):
        load_incremental(other, tmp_path / "inc")
    assert digest(other) == before
    buf.add({"x": np.zeros((20, 3), np.float32)})
    with pytest.raises(ReplayError, match="more than capacity"):
        save_incremental(buf, tmp_path / "inc2", since=5)


def test_full_then_incremental_restores_agent_and_buffer_exactly(tmp_path):
    agent = _agent()
    ck = Checkpointer(tmp_path / "ckpt", agent, agent.buffer, lambda: {"env_steps": agent.steps},
                      full_every_steps=120, incremental_every_steps=40)
    _train(agent, 200, ck)
    ck._wait_pending() if ck._pending else None
    name = ck.written[-1]
    newest = latest(tmp_path / "ckpt")
    assert newest is not None and newest.name == name
    # one full and its increments only: older full ones were dropped once the new one was committed
    fulls = [p.name for p in (tmp_path / "ckpt").iterdir() if "-inc-" not in p.name]
    assert len(fulls) == 1, fulls
    inc = ck.incremental()
    want = state_digest(agent.parameters(), agent.buffer)
    want_opt = agent.optimizer.state_dict()["state"]
    r = load_checkpoint(tmp_path / "ckpt" / inc)
    assert r.manifest["kind"] == "incremental" and r.manifest["digest"] == want
    fresh = _agent(seed=5)               # other seed: other weights and RNG until restored
    fresh.buffer = r.buffer
    r.apply(fresh)
    assert np.array_equal(fresh.parameters().view(np.uint32), agent.parameters().view(np.uint32))
    assert state_digest(fresh.parameters(), r.buffer) == want
    got_opt = fresh.optimizer.state_dict()["state"]
    for k in want_opt:
        for name_ in ("exp_avg", "exp_avg_sq"):
            assert want_opt[k][name_].equal(got_opt[k][name_])
    assert fresh.steps == agent.steps and fresh.rng.bit_generator.state == agent.rng.bit_generator.state


def test_a_half_written_checkpoint_is_never_picked(tmp_path):
    agent = _agent()
    ck = Checkpointer(tmp_path / "ckpt", agent, agent.buffer, lambda: {"env_steps": agent.steps})
    _train(agent, 30)
    first = ck.full(background=False)
    (tmp_path / "ckpt" / ".tmp-full-000002").mkdir()                 # a crash in the middle of a write
    (tmp_path / "ckpt" / "full-000009").mkdir()                      # no manifest: not committed
    assert latest(tmp_path / "ckpt").name == first
    with pytest.raises(ConfigError, match="cannot be read"):
        load_checkpoint(tmp_path / "ckpt" / "full-000009")
