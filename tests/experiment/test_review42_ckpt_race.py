"""load_newest of a peer folder that a live peer is still writing (swarm run --resume of a
run still going, swarm eval): a checkpoint pruned while it was read is not damage.

The peer commits a new full checkpoint and deletes the older ones with their increments.
A reader that had listed the folder before that commit met the files of the one it was
reading gone: it called that good checkpoint damaged, went on to the older ones (gone
too), and found that no checkpoint loads (2 of 1,081 loads in a loop on a live run).

The test makes the moment exact, with no sleep: the state.pt of the checkpoint to be read
is a FIFO carrying its own bytes, so the reader has listed the folder and is inside that
checkpoint when its open returns; only then does the peer (a real Checkpointer, on the
test's thread) commit the next full checkpoint and prune, and only then get the bytes.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
from pathlib import Path

import pytest
from swarmtest import wait_for

from swarm.buffer import ReplayBuffer
from swarm.experiment.checkpoint import Checkpointer, committed, load_newest
from swarm.rl import DQNAgent, dqn_schema
from swarm.rl.hparams import DQNConfig
from swarm.rl.train import run_agent


def _agent() -> DQNAgent:
    buf = ReplayBuffer(dqn_schema((4,)), 300, seed=0, peer_id="peer0")
    return DQNAgent((4,), 2, buf, DQNConfig(learning_starts=20, batch_size=8, hidden=[16]), seed=0)


def _writer_once_read(fifo: Path) -> int | bool:
    """The FIFO's write end, once a reader has opened it (False until then)."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ENXIO:   # no reader yet
            return False
        raise
    os.set_blocking(fd, True)
    return fd


@pytest.mark.parametrize("read", ["full", "incremental"])
def test_a_checkpoint_pruned_while_it_is_read_is_not_damage(tmp_path, caplog, read):
    root = tmp_path / "ckpt"
    agent = _agent()
    ck = Checkpointer(root, agent, agent.buffer, lambda: {"env_steps": agent.steps})
    run_agent("CartPole-v1", agent, 60, seed=0)
    full = root / ck.full(background=False)
    run_agent("CartPole-v1", agent, 20, seed=1)
    inc = root / ck.incremental()
    target = full if read == "full" else inc
    assert committed(root)[0 if read == "incremental" else 1] == target

    if read == "full":   # the increment loads first; without it the full one is the newest
        shutil.rmtree(inc)
    state = target / "state.pt"
    data = state.read_bytes()
    state.unlink()
    os.mkfifo(state)

    got: dict = {}

    def load() -> None:
        try:
            got["result"] = load_newest(root)
        except BaseException as e:   # raised in the test's thread below
            got["error"] = e

    caplog.set_level("WARNING", logger="swarm.experiment")
    reader = threading.Thread(target=load, name="load_newest")
    reader.start()
    fd = None
    try:
        fd = wait_for(lambda: _writer_once_read(state), timeout=60, what=f"load_newest to open {state}")
        run_agent("CartPole-v1", agent, 20, seed=2)
        newer = root / ck.full(background=False)   # commits full-000002, deletes full-000001 and its increment
        assert committed(root) == [newer] and not target.exists()
        os.write(fd, data)
    finally:
        if fd is None and state.exists():   # the reader may still come to open it: O_RDWR does not block
            fd = os.open(state, os.O_RDWR)
        if fd is not None:
            os.close(fd)   # the reader gets EOF, whatever happened above
        reader.join(60)
    assert not reader.is_alive()
    if "error" in got:
        raise got["error"]
    restored, skipped = got["result"]
    assert restored is not None and restored.path == newer, (restored and restored.path, skipped)
    assert skipped == [] and "damaged" not in caplog.text, (skipped, caplog.text)
    assert restored.counters["env_steps"] == agent.steps
