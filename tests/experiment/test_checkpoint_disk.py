"""Checkpoints when the disk misbehaves: full, read only, a ckpt folder gone or replaced.

The standard: a checkpoint that cannot be written is logged and training goes on,
the newest committed checkpoint stays whole and loadable, no temporary folder is
left using the disk; a damaged file at load is an error that names it. Full and
read-only disks are real where the machine allows it (a small tmpfs in a mount
namespace of the test's own); other failures are made with monkeypatch.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from swarmtest import on_small_disk

from swarm.buffer import ReplayBuffer
from swarm.errors import ConfigError
from swarm.experiment.checkpoint import Checkpointer, committed, load_checkpoint, load_newest
from swarm.rl import DQNAgent, dqn_schema
from swarm.rl.hparams import DQNConfig
from swarm.rl.train import run_agent


# A child that trains with a checkpoint due every 50 env steps, in sys.argv[1]/ckpt.
CHILD = """
    import json, logging, os, sys, time
    import numpy as np
    from swarm.buffer import ReplayBuffer
    from swarm.experiment.checkpoint import Checkpointer, load_newest
    from swarm.rl import DQNAgent, dqn_schema
    from swarm.rl.hparams import DQNConfig
    from swarm.rl.train import run_agent

    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    root = os.path.join(sys.argv[1], "ckpt")
    buf = ReplayBuffer(dqn_schema((4,)), 4500, seed=0, peer_id="peer0")   # ~400 KB a checkpoint
    agent = DQNAgent((4,), 2, buf, DQNConfig(learning_starts=20, batch_size=8, hidden=[16]), seed=0)
    ck = Checkpointer(root, agent, buf, lambda: {"env_steps": agent.steps}, full_every_steps=50)

    def on_step(info):
        ck.step(info.step)   # a true return would end the run

    run_agent("CartPole-v1", agent, int(os.environ["STEPS"]), seed=0, on_step=on_step)
    if ck._pending is not None:   # a full one still written in the background: commit (or fail) it
        while not ck._pending[2].done:
            time.sleep(0.01)
        ck.step(agent.steps)
    r, skipped = load_newest(root)
    print(json.dumps({"steps": agent.steps, "failures": getattr(ck, "failures", None),
                      "last_error": getattr(ck, "last_error", None),
                      "left": sorted(os.listdir(root)), "newest": r and r.path.name, "skipped": skipped}))
"""


def _small_disk(tmp_path: Path, size: str, steps: int, then_read_only: int = 0) -> dict:
    """Run CHILD for ``steps`` env steps on a tmpfs of ``size`` (swarmtest.on_small_disk); with
    ``then_read_only``, first that many steps on it writable, then ``steps`` after a
    read-only remount. 1 would be an OSError out of step()."""
    return on_small_disk(tmp_path, size, CHILD, env={"STEPS": str(steps)},
                         read_only_after={"STEPS": str(then_read_only)} if then_read_only else None)


def test_a_disk_that_fills_fails_the_checkpoint_and_training_goes_on_from_the_one_kept(tmp_path):
    got = _small_disk(tmp_path, "600k", 300)   # one checkpoint fits, not two side by side
    assert got["steps"] == 300
    assert got["failures"] >= 1 and "No space left on device" in got["last_error"]
    assert "checkpoint failed: " in got["log"] and "training goes on (the newest checkpoint stays full-000001)" \
        in got["log"]
    assert got["left"] == ["full-000001"]      # no half checkpoint left using the full disk
    assert got["newest"] == "full-000001" and got["skipped"] == []


def test_a_read_only_checkpoint_folder_fails_the_checkpoint_and_training_goes_on(tmp_path):
    got = _small_disk(tmp_path, "4m", 200, then_read_only=60)
    assert got["steps"] == 200 and got["failures"] >= 3 and "Read-only file system" in got["last_error"]
    assert got["left"] == ["full-000001"] and got["newest"] == "full-000001"


def _unlistable(monkeypatch, root: Path) -> None:
    """From now on listing ``root`` fails as a folder without read permission does (this
    test may run as root, which reads any folder)."""
    real = Path.iterdir

    def iterdir(self):
        if self == root:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real(self)
    monkeypatch.setattr(Path, "iterdir", iterdir)


def _agent(capacity: int = 300, seed: int = 0) -> DQNAgent:
    buf = ReplayBuffer(dqn_schema((4,)), capacity, seed=seed, peer_id="peer0")
    return DQNAgent((4,), 2, buf, DQNConfig(learning_starts=20, batch_size=8, hidden=[16]), seed=seed)


def _train(agent: DQNAgent, steps: int, ck: Checkpointer, seed: int = 0) -> None:
    def on_step(info):
        ck.step(agent.steps)   # a true return would end the run
    run_agent("CartPole-v1", agent, steps, seed=seed, on_step=on_step)


def _renames_into_fail(monkeypatch, root: Path) -> None:
    """From now on a rename into ``root`` (a checkpoint's commit) fails with ENOSPC."""
    real = os.replace

    def replace(src, dst, *a, **k):
        if Path(dst).parent == root:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return real(src, dst, *a, **k)
    monkeypatch.setattr(os, "replace", replace)


def test_a_commit_rename_that_fails_is_logged_and_training_goes_on(tmp_path, monkeypatch, caplog):
    agent = _agent()
    root = tmp_path / "ckpt"
    ck = Checkpointer(root, agent, agent.buffer, lambda: {"env_steps": agent.steps}, full_every_steps=20)
    _train(agent, 25, ck)
    ck.full(background=False)
    assert [p.name for p in committed(root)] == ["full-000002"]
    _renames_into_fail(monkeypatch, root)   # the disk is full when a checkpoint is committed
    with caplog.at_level(logging.ERROR, "swarm.experiment"):
        _train(agent, 50, ck, seed=1)
        if ck._pending is not None:
            # the full one due was still written in the background when training ended
            # (a loaded machine): its commit, at the next step, is the rename that fails
            while not ck._pending[2].done:
                time.sleep(0.01)
            ck.step(agent.steps)
    with pytest.raises(OSError, match="No space left on device"):   # the runner logs what close() raises
        ck.close()
    monkeypatch.undo()
    assert agent.steps == 75 and ck.failures >= 1 and "No space left on device" in ck.last_error
    assert "training goes on (the newest checkpoint stays full-000002)" in caplog.text
    assert sorted(p.name for p in root.iterdir()) == ["full-000002"]
    assert load_checkpoint(root / "full-000002").counters["env_steps"] == 25


def test_a_checkpoint_folder_that_vanishes_gets_a_full_checkpoint_not_an_orphan_increment(tmp_path):
    agent = _agent()
    root = tmp_path / "ckpt"
    ck = Checkpointer(root, agent, agent.buffer, lambda: {"env_steps": agent.steps})
    _train(agent, 25, ck)
    ck.full(background=False)
    shutil.rmtree(root)                      # a cleanup script, a hand
    assert ck.incremental() == "full-000002"
    r, skipped = load_newest(root)
    assert r is not None and skipped == [] and r.manifest["kind"] == "full"
    np.testing.assert_array_equal(r.params, agent.parameters())


def test_a_checkpoint_folder_replaced_by_a_file_is_logged_and_left_alone(tmp_path, caplog):
    agent = _agent()
    root = tmp_path / "ckpt"
    ck = Checkpointer(root, agent, agent.buffer, lambda: {"env_steps": agent.steps}, full_every_steps=10)
    _train(agent, 15, ck)
    ck.full(background=False)   # none in flight while the folder is taken away
    shutil.rmtree(root)
    root.write_text("not a folder")
    with caplog.at_level(logging.ERROR, "swarm.experiment"):
        _train(agent, 30, ck, seed=1)
    assert agent.steps == 45 and ck.failures >= 2 and "Not a directory" in ck.last_error
    assert root.read_text() == "not a folder"
    root.unlink()                            # put right: the next checkpoint due is written
    _train(agent, 10, ck, seed=2)
    ck.close()
    assert load_newest(root)[0].counters["env_steps"] == agent.steps


def test_the_next_full_checkpoint_removes_what_a_crash_left_half_written(tmp_path):
    agent = _agent()
    root = tmp_path / "ckpt"
    ck = Checkpointer(root, agent, agent.buffer, lambda: {"env_steps": agent.steps})
    _train(agent, 25, ck)
    ck.full(background=False)
    ck.incremental()
    for stale in (".tmp-full-000001-inc-0002", ".tmp-full-000001"):   # a process killed while it wrote
        (root / stale / "buffer").mkdir(parents=True)
        (root / stale / "state.pt").write_bytes(b"x" * 1000)
    ck.full(background=False)
    assert sorted(p.name for p in root.iterdir()) == ["full-000002"]


def test_every_file_of_a_checkpoint_is_on_disk_before_it_is_committed(tmp_path, monkeypatch):
    """A power cut after the rename must not leave empty files in the checkpoint that
    replaced the older ones: each file is fsynced before the commit's rename."""
    synced: set[tuple[int, int]] = set()    # files by (device, inode): a snapshot's are renamed
    real_fsync, real_replace = os.fsync, os.replace
    at_commit: dict[str, set[str]] = {}

    def fsync(fd):
        st = os.fstat(fd)
        synced.add((st.st_dev, st.st_ino))
        return real_fsync(fd)

    def replace(src, dst, *a, **k):
        if Path(src).name.startswith(".tmp-full"):
            at_commit[Path(dst).name] = {str(p.relative_to(src)) for p in Path(src).rglob("*")
                                         if p.is_file() and (p.stat().st_dev, p.stat().st_ino) not in synced}
        return real_replace(src, dst, *a, **k)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    agent = _agent()
    ck = Checkpointer(tmp_path / "ckpt", agent, agent.buffer, lambda: {"env_steps": agent.steps})
    _train(agent, 25, ck)
    ck.full(background=False)
    ck.incremental()
    assert set(at_commit) == {"full-000001", "full-000001-inc-0001"}
    assert at_commit == {"full-000001": set(), "full-000001-inc-0001": set()}


@pytest.mark.parametrize("file,data,why", [
    ("manifest.json", b"", "manifest.json: empty file"),
    ("manifest.json", b'{"name": "full-0', "manifest.json: Unterminated string"),
    ("manifest.json", b"[1, 2]", "manifest.json: AttributeError"),
    ("state.pt", b"", "state.pt: empty file"),
    ("state.pt", b"\x00garbage" * 10, "state.pt: UnpicklingError"),
])
def test_a_damaged_manifest_or_state_is_an_error_naming_the_file(tmp_path, file, data, why):
    agent = _agent()
    root = tmp_path / "ckpt"
    ck = Checkpointer(root, agent, agent.buffer, lambda: {"env_steps": agent.steps})
    _train(agent, 25, ck)
    path = root / ck.full(background=False)
    (path / file).write_bytes(data)
    with pytest.raises(ConfigError, match=f"checkpoint {path} cannot be read \\(damaged\\?\\): {why}"):
        load_checkpoint(path)


def test_a_checkpoint_folder_that_cannot_be_listed_is_a_config_error_naming_it(tmp_path, monkeypatch):
    agent = _agent()
    root = tmp_path / "ckpt"
    ck = Checkpointer(root, agent, agent.buffer, lambda: {"env_steps": agent.steps})
    _train(agent, 25, ck)
    ck.full(background=False)
    if os.geteuid() != 0:
        root.chmod(0o300)                   # no read permission: it cannot be listed
    else:                                   # root reads any folder: make the refusal by hand
        _unlistable(monkeypatch, root)
    try:
        with pytest.raises(ConfigError, match=f"checkpoint folder {root} cannot be listed \\(Permission denied\\)"):
            load_newest(root)
    finally:
        root.chmod(0o755)


def test_a_failed_checkpoint_names_the_newest_committed_one_an_increment_too(tmp_path, monkeypatch, caplog):
    # It named the newest full checkpoint, though an increment after it was committed
    # (what a restart loads).
    agent = _agent()
    root = tmp_path / "ckpt"
    ck = Checkpointer(root, agent, agent.buffer, lambda: {"env_steps": agent.steps}, full_every_steps=10_000,
                      incremental_every_steps=10)
    ck.full(background=False)
    _train(agent, 25, ck)
    newest = committed(root)[0].name
    assert "-inc-" in newest
    _renames_into_fail(monkeypatch, root)   # the disk is full from now on
    with caplog.at_level(logging.ERROR, "swarm.experiment"):
        _train(agent, 15, ck, seed=1)
    assert ck.failures >= 1
    assert f"training goes on (the newest checkpoint stays {newest})" in caplog.text
