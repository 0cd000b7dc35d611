"""Checkpoints at their edges: counters of numpy types, parameters of another dtype, a
``ckpt`` that is a file at start, increments left without their full checkpoint, and a
``run.json`` whose chain names a folder no path can be."""

from __future__ import annotations

import io
import json
import logging
import shutil

import numpy as np
import pytest
import torch

from swarm.buffer import ReplayBuffer
from swarm.errors import ConfigError
from swarm.experiment.checkpoint import (Checkpointer, _bytes_digest, array_digest, committed, load_checkpoint,
                                         load_newest, read_lineage)
from swarm.rl import DQNAgent, dqn_schema
from swarm.rl.hparams import DQNConfig
from swarm.rl.train import run_agent


def _agent(capacity: int = 300, seed: int = 0) -> DQNAgent:
    buf = ReplayBuffer(dqn_schema((4,)), capacity, seed=seed, peer_id="peer0")
    return DQNAgent((4,), 2, buf, DQNConfig(learning_starts=20, batch_size=8, hidden=[16]), seed=seed)


def _train(agent: DQNAgent, steps: int, ck: Checkpointer | None = None, seed: int = 0) -> None:
    run_agent("CartPole-v1", agent, steps, seed=seed, on_step=(lambda i: ck.step(i.step)) if ck else None)


def test_numpy_counters_are_saved_as_plain_numbers(tmp_path):
    """Before the fix json.dumps of the manifest raised TypeError for np.int64, which
    step() does not catch: the training loop that called it ended."""
    agent = _agent()
    ck = Checkpointer(tmp_path / "ckpt", agent, agent.buffer,
                      lambda: {"env_steps": np.int64(agent.steps), "episodes": np.int32(3),
                               "returns": [np.float32(1.5), 2.0]}, incremental_every_steps=10)
    _train(agent, 30, ck)
    assert ck.failures == 0 and ck.written
    r, skipped = load_newest(tmp_path / "ckpt")
    assert skipped == [] and r.manifest["counters"] == {"env_steps": agent.steps, "episodes": 3, "returns": [1.5, 2.0]}
    assert type(r.counters["env_steps"]) is int


def test_a_counter_json_cannot_hold_fails_the_checkpoint_naming_it_and_training_goes_on(tmp_path, caplog):
    """Before the fix the TypeError of json.dumps escaped step() and ended training."""
    agent = _agent()
    ck = Checkpointer(tmp_path / "ckpt", agent, agent.buffer,
                      lambda: {"env_steps": agent.steps, "started": object()}, incremental_every_steps=10)
    with caplog.at_level(logging.ERROR, "swarm.experiment"):
        _train(agent, 30, ck)
    assert agent.steps == 30 and ck.failures >= 1 and not ck.written
    assert "counter 'started'" in ck.last_error and "counter 'started'" in caplog.text
    assert list((tmp_path / "ckpt").iterdir()) == []   # nothing half written left
    with pytest.raises(ConfigError, match="counter 'started'"):
        ck.close()


def _as_float64(path, first: float) -> None:
    """Rewrite the full checkpoint ``path`` with float64 parameters, ``first`` the first of
    them, and digests that match (another writer's file, or an older version's)."""
    st = torch.load(path / "state.pt", weights_only=False)
    params = st["params"].numpy().astype(np.float64)
    params[0] = first
    st["params"] = torch.from_numpy(params)
    out = io.BytesIO()
    torch.save(st, out)
    (path / "state.pt").write_bytes(out.getvalue())
    m = json.loads((path / "manifest.json").read_text())
    m["files"]["state.pt"] = _bytes_digest(out.getvalue())
    m["digest"]["params"] = array_digest(params)
    (path / "manifest.json").write_text(json.dumps(m))


def test_a_checkpoint_whose_parameters_are_not_float32_is_refused(tmp_path):
    """Before the fix a float64 parameter vector loaded and was cast into the float32
    agent without a word: 1e300, finite in float64, became inf there."""
    agent = _agent()
    ck = Checkpointer(tmp_path / "ckpt", agent, agent.buffer, lambda: {"env_steps": agent.steps})
    _train(agent, 50)
    path = tmp_path / "ckpt" / ck.full(background=False)
    _as_float64(path, 1e300)
    with pytest.raises(ConfigError, match="params is float64 .*, not a 1-D float32 array"):
        load_checkpoint(path)
    r, skipped = load_newest(tmp_path / "ckpt")
    assert r is None and len(skipped) == 1 and "float64" in skipped[0]


def test_apply_refuses_parameters_of_another_dtype_and_leaves_the_agent_as_it_was(tmp_path):
    """Before the fix apply() copied float64 parameters into the float32 agent (1e300 -> inf)."""
    agent = _agent()
    ck = Checkpointer(tmp_path / "ckpt", agent, agent.buffer, lambda: {"env_steps": agent.steps})
    _train(agent, 50)
    r = load_checkpoint(tmp_path / "ckpt" / ck.full(background=False))
    r.params = r.params.astype(np.float64)
    r.params[0] = 1e300
    fresh = _agent(seed=5)
    was = fresh.parameters().copy()
    with pytest.raises(ConfigError, match="float64"):
        r.apply(fresh)
    np.testing.assert_array_equal(fresh.parameters(), was)


def test_a_ckpt_that_is_a_file_at_start_is_logged_and_training_goes_on(tmp_path, caplog):
    """Before the fix Checkpointer() raised the raw FileExistsError of its mkdir, outside
    any handler: the peer ended before it trained."""
    agent = _agent()
    root = tmp_path / "ckpt"
    root.write_text("not a folder")
    with caplog.at_level(logging.ERROR, "swarm.experiment"):
        ck = Checkpointer(root, agent, agent.buffer, lambda: {"env_steps": agent.steps}, full_every_steps=10)
        assert ck.failures == 1 and str(root) in ck.last_error and str(root) in caplog.text
        _train(agent, 30, ck)
    assert agent.steps == 30 and ck.failures >= 2
    assert root.read_text() == "not a folder"
    root.unlink()   # put right: the next one due is written
    name = ck.full(background=False)
    assert [p.name for p in committed(root)] == [name]


def test_increments_left_without_their_full_checkpoint_do_not_collide_with_new_ones(tmp_path):
    """Before the fix the numbers went on from the full folders only: with full-000001
    gone and its increments left, a restart wrote a new full-000001, whose increments
    failed (the rename onto the stale ones: ENOTEMPTY), and a resume tried the stale
    ones, sorted newest, first (and found them damaged)."""
    root = tmp_path / "ckpt"
    a = _agent()
    ck = Checkpointer(root, a, a.buffer, lambda: {"env_steps": a.steps})
    _train(a, 40)
    ck.full(background=False)
    for _ in range(2):
        _train(a, 20)
        ck.incremental()
    shutil.rmtree(root / "full-000001")   # a damaged full one, removed by hand
    b = _agent(seed=3)   # the restart (nothing loads: from step 0)
    ck2 = Checkpointer(root, b, b.buffer, lambda: {"env_steps": b.steps})
    _train(b, 40)
    assert ck2.full(background=False) == "full-000002"
    _train(b, 10)
    assert ck2.incremental() == "full-000002-inc-0001"
    assert [p.name for p in committed(root)] == ["full-000002-inc-0001", "full-000002"]   # the stale ones pruned
    r, skipped = load_newest(root)
    assert r.path.name == "full-000002-inc-0001" and skipped == []


def test_increments_of_a_full_checkpoint_just_committed_left_from_before_are_pruned(tmp_path):
    """Before the fix increments named after a full checkpoint just committed, left from
    before (another process's), stayed: sorted newest, a resume tried them first."""
    root = tmp_path / "ckpt"
    a = _agent()
    ck = Checkpointer(root, a, a.buffer, lambda: {"env_steps": a.steps})
    stale = root / "full-000001-inc-0007"
    stale.mkdir()
    (stale / "manifest.json").write_text("{}")
    _train(a, 40)
    assert ck.full(background=False) == "full-000001"
    assert [p.name for p in committed(root)] == ["full-000001"]


def test_a_folder_with_a_nul_in_the_runs_a_run_continues_is_dropped(tmp_path, caplog):
    """Before the fix Lineage.of kept it and Lineage.sources, which a restart calls first,
    raised a raw ValueError ("embedded null byte")."""
    (tmp_path / "run.json").write_text(json.dumps(
        {"run": "abc", "continues": [["/runs/old\u0000/peer0", "def"], ["", "x"], [7, "y"],
                                     ["/runs/older/peer0", "ghi"]]}))
    with caplog.at_level(logging.WARNING, "swarm.experiment"):
        lin = read_lineage(tmp_path)
    assert lin.continues == (("/runs/older/peer0", "ghi"),)
    assert "cannot be read" in caplog.text
    assert [str(f) for f, _ in lin.sources(tmp_path)] == [str(tmp_path), "/runs/older/peer0"]
