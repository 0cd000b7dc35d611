"""load_newest passes over a checkpoint that holds NaN or Inf for an older one that is whole.

Such a checkpoint was written whole (its digests match: training had diverged), so
every start that loaded it would fail the same way. An older committed one in the
same ckpt/ folder is resumed from instead, with a warning naming the bad one, which
stays on disk; with none, the bad one is the ConfigError it always was.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from swarm.buffer import ReplayBuffer
from swarm.buffer.persist import digest
from swarm.errors import ConfigError
from swarm.experiment.checkpoint import Checkpointer, committed, load_newest
from swarm.rl import DQNAgent, dqn_schema
from swarm.rl.hparams import DQNConfig
from swarm.rl.train import run_agent


def _agent(seed: int = 0) -> DQNAgent:
    buf = ReplayBuffer(dqn_schema((4,)), 300, seed=seed, peer_id="peer0")
    return DQNAgent((4,), 2, buf, DQNConfig(learning_starts=20, batch_size=8, hidden=[16]), seed=seed)


def _poison(agent: DQNAgent, where: str) -> None:
    if where == "q":
        agent.parameters()[3] = np.nan            # the Q-net lives in the flat vector
    elif where == "target":
        agent.target_flat[3] = float("nan")
    else:
        agent.optimizer.exp_avg[3] = float("inf")


def _full_and_increment(root: Path) -> tuple[DQNAgent, Checkpointer, Path, Path]:
    """An agent trained a little, its Checkpointer at ``root``, and the full checkpoint
    and increment taken after 60 and 80 env steps."""
    agent = _agent()
    ck = Checkpointer(root, agent, agent.buffer, lambda: {"env_steps": agent.steps})
    run_agent("CartPole-v1", agent, 60, seed=0)
    full = root / ck.full(background=False)
    run_agent("CartPole-v1", agent, 20, seed=1)
    return agent, ck, full, root / ck.incremental()


@pytest.mark.parametrize("where", ["q", "target", "optimizer"])
def test_a_checkpoint_holding_nan_falls_back_to_the_older_whole_one(tmp_path, caplog, where):
    root = tmp_path / "ckpt"
    agent, ck, full, good = _full_and_increment(root)
    want = (agent.parameters().copy(), digest(agent.buffer), agent.steps)
    run_agent("CartPole-v1", agent, 10, seed=2)
    _poison(agent, where)
    bad = root / ck.incremental()

    caplog.set_level("WARNING", logger="swarm.experiment")
    r, skipped = load_newest(root)
    assert r is not None and r.path == good, r and r.path
    assert len(skipped) == 1 and skipped[0].startswith(f"checkpoint {bad}: ") and "NaN or infinite" in skipped[0]
    assert f"checkpoint {bad}: " in caplog.text and f"resuming from the older checkpoint {good}" in caplog.text
    assert committed(root) == [bad, good, full]   # the bad one is left on disk, for inspection
    # what it restores is the older checkpoint's state, and it applies
    assert np.array_equal(r.params, want[0]) and digest(r.buffer) == want[1] and r.counters["env_steps"] == want[2]
    fresh = _agent(seed=5)
    fresh.buffer = r.buffer
    r.apply(fresh)
    assert np.array_equal(fresh.parameters(), want[0])


def test_with_no_older_whole_checkpoint_the_newest_holding_nan_is_the_config_error(tmp_path):
    agent = _agent()
    root = tmp_path / "ckpt"
    ck = Checkpointer(root, agent, agent.buffer, lambda: {"env_steps": agent.steps})
    run_agent("CartPole-v1", agent, 60, seed=0)
    _poison(agent, "target")
    ck.full(background=False)
    inc = root / ck.incremental()
    with pytest.raises(ConfigError, match=f"^checkpoint {re.escape(str(inc))}: its agent state target.* NaN or "
                                          "infinite"):
        load_newest(root)
    assert len(committed(root)) == 2               # nothing was removed
