"""`swarm run` refuses replay buffers that cannot fit in this host's memory, before it
starts any process (each peer would otherwise fail on its own allocating its buffer)."""

from __future__ import annotations

import io
import math
import os
import subprocess
import sys
import tracemalloc

import pytest
from swarmtest import ROOT

from swarm.buffer.replay import ReplayBuffer
from swarm.errors import ConfigError
from swarm.experiment import launch as launch_mod
from swarm.experiment.launch import Launch, _replay_bytes, run_experiment
from swarm.rl.dqn import dqn_schema


@pytest.mark.parametrize("capacity, obs", [(50_000, (4,)), (70_001, (8,)), (20_000, (2, 3))])
def test_the_estimate_is_what_a_real_buffer_allocates(capacity, obs):
    ReplayBuffer(dqn_schema(obs), 10, seed=0)   # what the first buffer made imports, once
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        buf = ReplayBuffer(dqn_schema(obs), capacity, seed=0)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    estimate = _replay_bytes(capacity, math.prod(obs))
    assert len(buf) == 0
    # within 1%, less the buffer's few kB of Python objects
    assert 0.99 * held - 32_000 <= estimate <= 1.01 * held, (estimate, held)


def test_a_buffer_beyond_the_available_memory_is_refused_before_any_process_starts(tmp_path, monkeypatch):
    started: list[str] = []

    def start(self, name, *args, **kwargs):
        started.append(name)
        raise RuntimeError(f"{name} started")

    monkeypatch.setattr(Launch, "start", start)
    monkeypatch.setattr(launch_mod, "_available_memory", lambda: 4_000_000)
    each = _replay_bytes(50_000, 4)     # CartPole-v1: 5.9 MB a peer
    with pytest.raises(ConfigError) as e:
        run_experiment(None, ["peers=2", "buffer.capacity=50000"], runs_root=tmp_path / "runs", stream=io.StringIO())
    assert str(e.value) == (
        f"buffer.capacity = 50000: the replay buffers of the 2 peers would take about 11.8 MB (5.9 MB each, "
        f"{each / 50_000:.0f} bytes a transition of CartPole-v1), more than the 4 MB of memory this host has "
        "available; lower buffer.capacity or peers")
    assert started == [] and not (tmp_path / "runs").exists()
    # a buffer that fits (3.3 MB) goes past the check, to the first process's start
    with pytest.raises(RuntimeError, match="coordinator started"):
        run_experiment(None, ["peers=1", "buffer.capacity=30000"], runs_root=tmp_path / "runs", stream=io.StringIO())
    assert started == ["coordinator"]


@pytest.mark.parametrize("capacity", [10**12, 2**63])
def test_swarm_run_refuses_a_huge_capacity_naming_the_key_and_the_estimate(tmp_path, capacity):
    args = [sys.executable, "-m", "swarm.cli", "run", "--set", "peers=2", "--set", f"buffer.capacity={capacity}"]
    p = subprocess.run(args, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith(f"swarm: error: buffer.capacity = {capacity}: the replay buffers of the 2 peers "
                               "would take about "), p.stderr
    assert "of memory this host has available; lower buffer.capacity or peers" in p.stderr
    # no run folder: nothing was started (Launch.start writes the run folder's logs/ and pids.json)
    assert not (tmp_path / "runs").exists()
