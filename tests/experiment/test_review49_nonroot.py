"""A peer's folders in a run folder that others may write, and errors it cannot help (review 49).

- Links planted as ``peer0/``, ``tb/`` or ``ckpt/`` by another user were followed: swarm
  removed the victim's event files and ``full-*`` folders where they pointed, and wrote there.
- A ``tb/`` that could not be written at start printed TensorBoard's thread traceback raw,
  then refused the peer, naming the file as ``b'...'``.
- A permission error at start advised to "make room on its disk".
- `swarm run`'s table said a peer that exited 0 without a summary.json had crashed.
- A ``ckpt/`` that could not be listed at start was logged again at the first checkpoint due.

These tests run as root (as CI does), which reads and writes any file: another user's link
is made with ``os.lchown``, and a failed write with monkeypatch.
"""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path

import pytest
# a coordinator process for in-process peers (tests/ is on the path)
from experiment.test_runner import ONE, coordinator  # noqa: F401 - a fixture
from swarmtest import Clock, run_child

from swarm.errors import ConfigError
from swarm.experiment import load_spec
from swarm.experiment.checkpoint import FAILURE_LOG_S, Checkpointer
from swarm.experiment.launch import summarize
from swarm.experiment.runner import _at_start, _drop_old_results, make_peer_dir, run_peer

OTHER_UID = 4242   # another user's, as the links planted in a shared folder are


def _planted(link: Path, target: Path) -> None:
    """``link`` to ``target``, owned by another user."""
    os.symlink(target, link)
    os.lchown(link, OTHER_UID, OTHER_UID)


def _victim(tmp_path: Path) -> tuple[Path, Path]:
    """This user's own folders outside the run folder: one with an event file, one with a checkpoint."""
    tb, ckpt = tmp_path / "precious_tb", tmp_path / "precious_ckpt"
    tb.mkdir()
    (tb / "events.out.tfevents.123.mine").write_text("mine")
    (ckpt / "full-000009").mkdir(parents=True)
    (ckpt / "full-000009" / "note").write_text("mine")
    return tb, ckpt


def test_links_another_user_planted_for_tb_and_ckpt_are_refused_and_what_they_point_to_stays(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("makes links owned by another user with os.lchown, which needs root")
    tb, ckpt = _victim(tmp_path)
    run = tmp_path / "shared"
    out = run / "peer0"
    out.mkdir(parents=True)
    _planted(out / "tb", tb)
    _planted(out / "ckpt", ckpt)
    # the peer refuses its folder before it writes anything there (as swarm peer and run_peer make it)
    with pytest.raises(ConfigError, match=f"{out / 'tb'} is a symbolic link .*another user \\(uid {OTHER_UID}\\)"):
        make_peer_dir(run, 0)
    # and each place that writes or prunes through them refuses them too
    with pytest.raises(ConfigError, match=f"{out / 'tb'} is a symbolic link"):
        _drop_old_results(run, out)
    ck = Checkpointer(out / "ckpt", None, None, lambda: {"env_steps": 0})
    assert ck.failures == 1 and f"{out / 'ckpt'} is a symbolic link" in ck.last_error
    with pytest.raises(ConfigError, match=f"{out / 'ckpt'} is a symbolic link"):
        ck.full(background=False)
    assert (tb / "events.out.tfevents.123.mine").read_text() == "mine"
    assert (ckpt / "full-000009" / "note").read_text() == "mine"
    assert sorted(p.name for p in ckpt.iterdir()) == ["full-000009"]

    # peer0 itself a link to the victim's folder
    victim = tmp_path / "victim"
    victim.mkdir()
    other = tmp_path / "shared2"
    other.mkdir()
    _planted(other / "peer0", victim)
    with pytest.raises(ConfigError, match=f"{other / 'peer0'} is a symbolic link"):
        make_peer_dir(other, 0)
    assert list(victim.iterdir()) == []


def test_a_link_of_this_users_own_is_followed(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    run = tmp_path / "run"
    (run / "peer0").mkdir(parents=True)
    os.symlink(scratch, run / "peer0" / "ckpt")   # ckpt/ on a scratch disk, on purpose
    assert make_peer_dir(run, 0) == run / "peer0"
    ck = Checkpointer(run / "peer0" / "ckpt", None, None, lambda: {"env_steps": 0})
    assert ck.failures == 0 and ck._n == 0


# A _Logs whose tb/ cannot be written from its first event (gfile's _write raises EACCES,
# naming the file as bytes, as TensorBoard does), in a process of its own, so that
# threading's hook is Python's default one, which prints to stderr.
UNWRITABLE_TB = """
    import errno, json, logging, os, sys, threading
    from pathlib import Path
    from tensorboard.compat.tensorflow_stub.io import gfile
    from swarm.experiment.runner import _Logs, _Unwritten

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    hook = threading.excepthook

    def denied(self, filename, content, mode):
        raise PermissionError(errno.EACCES, "Permission denied", os.fsencode(filename))

    gfile.LocalFileSystem._write = denied
    out = Path(sys.argv[1])
    logs = _Logs(out, tensorboard=True, failed=_Unwritten(0))
    logs.scalars(1, {"a": 1.0})   # a no-op now
    logs.episodes.writerow({"env_steps": 1, "episode": 1})
    logs.close()
    print(json.dumps({"tb": logs.tb is None, "counts": logs._failed.counts,
                      "hook_back": threading.excepthook is hook,
                      "metrics": (out / "metrics.csv").read_text()}))
"""


def test_a_tb_folder_that_cannot_be_written_at_start_drops_tensorboard_with_one_error_and_no_traceback(tmp_path):
    pytest.importorskip("tensorboard")
    out = tmp_path / "peer0"
    code, got, err = run_child(tmp_path, UNWRITABLE_TB, str(out))
    # the old runner: "Exception in thread Thread-1" and TensorBoard's traceback, then the
    # PermissionError raised out of _Logs
    assert code == 0, err
    assert "Exception in thread" not in err and "Traceback" not in err, err
    got = json.loads(got.strip().splitlines()[-1])
    assert got["tb"] and got["counts"] == {"tb/": 1} and got["hook_back"], got
    assert got["metrics"].splitlines()[-1].startswith(","), got   # the CSV files go on
    [error] = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert f"peer0: cannot write tb/ ([Errno 13] Permission denied: '{out / 'tb'}/events.out" in error, err


def test_a_peer_whose_tb_folder_cannot_be_written_trains_to_its_budget(coordinator, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.compat.tensorflow_stub.io import gfile

    def denied(self, filename, content, mode):
        raise PermissionError(errno.EACCES, "Permission denied", os.fsencode(filename))
    monkeypatch.setattr(gfile.LocalFileSystem, "_write", denied)
    spec = load_spec(None, ONE + ["budget.env_steps=100"])
    # the old runner: ConfigError "cannot write b'.../tb/events.out...' (Permission denied); make room ..."
    s = run_peer(spec, 0, coordinator, tmp_path / "x", tensorboard=True, join_timeout=10)
    assert s["reason"] == "budget" and s["env_steps"] == 100, s
    assert s["write_failures"] == {"tb/": 1}, s


def test_a_permission_error_at_start_says_to_make_it_writable_not_to_make_room(tmp_path):
    ro = tmp_path / "metrics.csv"
    ro.write_text("")
    ro.chmod(0o444)

    def denied():   # what open(ro, "a") gives a user who is not root
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(ro))
    with pytest.raises(ConfigError) as e:
        _at_start(tmp_path, denied if os.geteuid() == 0 else lambda: open(ro, "a"), ro)
    msg = str(e.value)
    assert "Permission denied" in msg and "make room" not in msg, msg
    assert f"make it writable by this user (its owner is uid {os.getuid()}" in msg, msg

    def full():
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(ro))
    with pytest.raises(ConfigError, match="No space left on device\\); make room on its disk"):
        _at_start(tmp_path, full, ro)

    def named_as_bytes():   # as TensorBoard names its files
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsencode(ro))
    with pytest.raises(ConfigError) as e:
        _at_start(tmp_path, named_as_bytes)
    assert f"cannot write {ro} (Permission denied)" in str(e.value), e.value


def test_a_peer_that_exited_0_without_a_summary_is_not_said_to_have_crashed(tmp_path):
    (tmp_path / "peer0").mkdir()
    (tmp_path / "peer1").mkdir()
    spec = load_spec(None, ["peers=2"])
    rows = summarize(tmp_path, spec, {"peer0": 0, "peer1": -9})
    assert rows[0]["reason"] == "no summary.json (not written: see logs/peer0.log)", rows[0]
    assert "crashed" in rows[1]["reason"], rows[1]   # killed: a crash, as before
    assert "crashed" in summarize(tmp_path, spec)[0]["reason"]   # how it ended unknown: as before


def test_a_ckpt_folder_that_cannot_be_listed_at_start_is_the_first_failure_logged(tmp_path, monkeypatch, caplog):
    root = tmp_path / "ckpt"
    real = Path.iterdir

    def iterdir(self):   # as a folder without read permission (root reads any folder)
        if self == root:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real(self)
    monkeypatch.setattr(Path, "iterdir", iterdir)
    clock = Clock()
    with caplog.at_level(logging.ERROR, "swarm.experiment"):
        ck = Checkpointer(root, None, None, lambda: {"env_steps": 0}, full_every_steps=10, clock=clock)
        assert ck.step(0) is None
        clock.t += 1
        assert ck.step(10) is None   # due, and fails: counted, not logged a second after the first
        assert ck.failures == 2
        assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1, caplog.text
        clock.t += FAILURE_LOG_S + 1
        assert ck.step(20) is None
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and "(1 more failed since the last one logged)" in errors[1], errors
    assert ck.failures == 3
