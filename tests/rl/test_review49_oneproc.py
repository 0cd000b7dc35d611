"""Training in the caller's process leaves the caller's floating-point mode and torch
thread count as they were (swarm/rl/flat.py, swarm/rl/dqn.py, swarm/experiment/runner.py).

Before: the first FlatAdam step (any DQNAgent update) flushed denormals on its thread for
good, float64 and Python floats included, and in every thread it started later; run_peer
left the process's torch at one intra-op thread. Agents train on threads of this process;
run_peer runs in the test's own thread beside a real coordinator process on loopback.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
import torch
# tests/ is on the path: a coordinator process (ended by its pid) for an in-process peer
from experiment.test_runner import ONE, coordinator  # noqa: F401 - a fixture

from swarm.buffer import ReplayBuffer
from swarm.experiment import load_spec
from swarm.experiment.runner import run_peer
from swarm.rl import DQNAgent, DQNConfig, dqn_schema
from swarm.rl.flat import flush_denormals

pytestmark = pytest.mark.skipif(not torch.set_flush_denormal(False), reason="this CPU cannot flush denormals")


def ieee() -> bool:
    """Whether this thread keeps denormals: a float64 one, 5.6e-309, is not 0."""
    return sys.float_info.min / 4 > 0.0


def on_a_thread(work):
    """Run ``work`` on a fresh thread (a mode it leaves dies with it) and return its result."""
    out: dict = {}

    def run():
        try:
            out["result"] = work()
        except BaseException as e:   # noqa: BLE001 - re-raised in the test's thread
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "the work did not end within 60 s"
    if "error" in out:
        raise out["error"]
    return out["result"]


def test_training_a_dqn_agent_leaves_its_thread_and_later_threads_with_ieee_floats():
    """Before the fix: False on the thread after training, and on a thread it started then."""
    def work():
        before = ieee()
        buf = ReplayBuffer(dqn_schema((3,)), 1000, seed=0)
        agent = DQNAgent((3,), 2, buf, DQNConfig(learning_starts=20, batch_size=8), seed=0)
        rng = np.random.default_rng(0)
        for step in range(60):
            agent.perceive(rng.standard_normal(3).astype(np.float32))
            agent.deliberate()
            agent.reflect(1.0, terminal=step % 10 == 9)
        child: list[bool] = []
        t = threading.Thread(target=lambda: child.append(ieee()))
        t.start()
        t.join(timeout=30)
        return before, agent.updates, ieee(), child

    before, updates, after, child = on_a_thread(work)
    assert before and updates > 0
    assert after, "training left its thread flushing denormals (sys.float_info.min / 4 == 0.0)"
    assert child == [True], "a thread started after training inherited the flush"


def test_flush_denormals_holds_for_its_block_only_and_nests():
    def work():
        seen = [ieee()]
        with flush_denormals():
            seen.append(ieee())
            with flush_denormals():                   # nested: a no-op
                seen.append(ieee())
            seen.append(ieee())                       # the outer block still flushes
        seen.append(ieee())
        with pytest.raises(ZeroDivisionError), flush_denormals():
            1 / 0                                     # a block that raises gives the mode back too
        seen.append(ieee())
        torch.set_flush_denormal(True)                # a thread that flushes by its own choice
        with flush_denormals():
            pass
        seen.append(ieee())                           # keeps flushing
        return seen

    assert on_a_thread(work) == [True, False, False, False, True, True, False]


def test_run_peer_gives_the_process_its_torch_thread_count_back(coordinator, tmp_path):  # noqa: F811
    """Before the fix: one thread after run_peer, and this thread flushed denormals."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        summary = run_peer(load_spec(None, ONE), 0, coordinator, tmp_path, tensorboard=False, join_timeout=10)
        assert summary["reason"] == "budget" and summary["env_steps"] == 200
        assert torch.get_num_threads() == 2
        assert ieee(), "run_peer left the caller's thread flushing denormals"
    finally:   # as the test found them, also when it fails
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)
