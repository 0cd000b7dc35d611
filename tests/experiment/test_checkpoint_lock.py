"""An incremental checkpoint holds the replay buffer's lock only while it copies its rows.

The disk writes and syncs come after the lock is released, so a slow disk stalls
the checkpointing thread only: inserts and samples from the training threads go on.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from swarm.buffer import ReplayBuffer
from swarm.buffer.persist import digest
from swarm.experiment.checkpoint import Checkpointer, load_checkpoint
from swarm.rl import DQNAgent, dqn_schema
from swarm.rl.hparams import DQNConfig

WAIT_S = 30.0      # deadline for what must happen in any case (the fsync being reached, threads ending)
INSERT_S = 5.0     # deadline for the insert while the fsync is held: on a lock held over the fsync it never ends


def _rows(n: int, value: float) -> dict[str, np.ndarray]:
    return {"obs": np.full((n, 4), value, np.float32), "action": np.zeros(n, np.int64),
            "reward": np.full(n, value, np.float32), "next_obs": np.full((n, 4), value, np.float32),
            "done": np.zeros(n, np.float32)}


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd to tell which file is synced")
def test_an_insert_goes_on_while_an_increment_is_synced_to_disk(tmp_path, monkeypatch):
    buf = ReplayBuffer(dqn_schema((4,)), 64, seed=0, peer_id="peer0")
    agent = DQNAgent((4,), 2, buf, DQNConfig(learning_starts=20, batch_size=8, hidden=[16]), seed=0)
    ck = Checkpointer(tmp_path / "ckpt", agent, buf, lambda: {"env_steps": agent.steps})
    buf.add(_rows(10, 1.0))
    ck.full(background=False)
    buf.add(_rows(5, 2.0))
    want = digest(buf)           # the state the increment must hold: taken before the insert below

    held, release, inserted = threading.Event(), threading.Event(), threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd):
        # the first sync of one of the increment's buffer columns waits until the test lets it go
        try:
            where = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            where = ""
        if "-inc-" in where and where.endswith(".npy") and not held.is_set():
            held.set()
            release.wait(WAIT_S)
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    out: dict[str, object] = {}

    def take():
        try:
            out["name"] = ck.incremental()
        except BaseException as e:   # re-raised by the test below
            out["error"] = e

    def insert():
        buf.add(_rows(3, 3.0))
        inserted.set()

    writer = threading.Thread(target=take, name="test-increment")
    other = threading.Thread(target=insert, name="test-insert")
    writer.start()
    try:
        assert held.wait(WAIT_S), f"the increment never synced a buffer column: {out}"
        other.start()
        went_on = inserted.wait(INSERT_S)
    finally:
        release.set()
        writer.join(WAIT_S)
        if other.ident is not None:
            other.join(WAIT_S)
    assert not writer.is_alive() and not other.is_alive()
    assert went_on, "an insert waited for the increment's fsync: the buffer's lock was held over the disk write"
    assert "error" not in out, out.get("error")
    # the increment holds the rows as they were when it was taken, not the insert made meanwhile
    r = load_checkpoint(tmp_path / "ckpt" / out["name"])   # its digests are checked against its manifest
    assert digest(r.buffer) == want and r.buffer.total_added == 15 and buf.total_added == 18
