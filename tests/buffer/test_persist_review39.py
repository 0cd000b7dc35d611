"""Persistence defects found by review 39: a snapshot run twice or whose thread cannot
start, an increment written over its full snapshot, bad wait timeouts and since values."""

import json
import math
import threading

import numpy as np
import pytest

from swarm.buffer import ReplayBuffer
from swarm.buffer.persist import Snapshot, load, load_incremental, save, save_incremental, take_incremental
from swarm.errors import ConfigError, ReplayError

SCHEMA = {"x": ("int64", ())}


def buffer(n=4, cap=8):
    buf = ReplayBuffer(SCHEMA, cap, seed=0, first_seq=0)
    buf.add({"x": np.arange(n)})
    return buf


# ------------------------------------------------ a snapshot writes once
@pytest.mark.parametrize("again", ["run", "start"])
def test_a_finished_snapshot_refuses_to_run_again(again, tmp_path):
    """Before: run() or start() on a finished snapshot wrote the rows as they were then
    under the meta.json of its first moment: load() took it, with tickets past `next`."""
    buf = buffer(4)
    snap = save(buf, tmp_path / "s")
    before = (tmp_path / "s" / "meta.json").read_bytes()
    buf.add({"x": np.arange(100, 106)})          # the ring wraps
    with pytest.raises(ReplayError, match="once"):
        getattr(snap, again)()
    assert (tmp_path / "s" / "meta.json").read_bytes() == before
    back = load(tmp_path / "s")
    assert back.total_added == 4 and sorted(s for _, s in back.ids()) == [0, 1, 2, 3]
    save(buf, tmp_path / "s2")                   # the buffer is not left locked


def test_a_second_start_is_refused(tmp_path):
    """Before: two start()s ran two threads over one cursor, into one path."""
    buf = buffer(4)
    snap = Snapshot(buf, tmp_path / "s").start()
    with pytest.raises(ReplayError, match="once"):
        snap.start()
    snap.wait(60)
    assert len(load(tmp_path / "s")) == 4


def test_a_snapshot_with_tickets_past_next_does_not_load(tmp_path):
    """Before: a snapshot written twice (tickets >= its `next`) loaded, and the buffer
    handed out again seqs it already held."""
    buf = buffer(4)
    save(buf, tmp_path / "s")
    tickets = np.load(tmp_path / "s" / "_ticket.npy")
    tickets[0] = 8
    np.save(tmp_path / "s" / "_ticket.npy", tickets)
    with pytest.raises(ReplayError, match="_ticket"):
        load(tmp_path / "s")


def test_a_snapshot_whose_thread_cannot_start_releases_the_buffer(tmp_path, monkeypatch):
    """Before: a Thread.start() that failed raised a raw RuntimeError and left the snapshot
    registered as the buffer's saver for good: every later save refused, every write
    copied aside."""
    class NoThread(threading.Thread):
        def start(self):
            raise RuntimeError("can't start new thread")

    buf = buffer(4)
    snap = Snapshot(buf, tmp_path / "s")
    monkeypatch.setattr(threading, "Thread", NoThread)
    with pytest.raises(ReplayError, match="thread"):
        snap.start()
    monkeypatch.undo()
    assert snap.done
    with pytest.raises(ReplayError, match="thread"):
        snap.wait(0)
    assert buf._saver is None
    assert not (tmp_path / "s").exists()
    save(buf, tmp_path / "s")
    assert len(load(tmp_path / "s")) == 4


# ------------------------------------------------ an increment beside its full snapshot
def test_save_incremental_refuses_the_full_snapshots_directory(tmp_path):
    """Before: an increment saved to its full snapshot's path replaced it without a word:
    the base was gone, and the increment alone does not load."""
    buf = buffer(10, cap=100)
    save(buf, tmp_path / "buffer")
    since = buf.total_added
    buf.add({"x": np.arange(5)})
    with pytest.raises(ReplayError, match="full snapshot"):
        save_incremental(buf, tmp_path / "buffer", since)
    with pytest.raises(ReplayError, match="full snapshot"):
        take_incremental(buf, since).write(tmp_path / "buffer")
    base = load(tmp_path / "buffer")
    assert base.total_added == 10
    save_incremental(buf, tmp_path / "inc", since)
    save_incremental(buf, tmp_path / "inc", since)   # an increment replaces an increment
    assert load_incremental(base, tmp_path / "inc").total_added == 15


def test_a_full_save_refuses_an_increments_directory(tmp_path):
    """Before: save() to an increment's path replaced the increment (any dir with a meta.json)."""
    buf = buffer(10, cap=100)
    save(buf, tmp_path / "buffer")
    since = buf.total_added
    buf.add({"x": np.arange(5)})
    save_incremental(buf, tmp_path / "inc", since)
    meta = json.loads((tmp_path / "inc" / "meta.json").read_text())
    with pytest.raises(ReplayError, match="incremental"):
        save(buf, tmp_path / "inc")
    assert json.loads((tmp_path / "inc" / "meta.json").read_text()) == meta
    save(buf, tmp_path / "buffer")                    # a full snapshot replaces a full snapshot
    assert load(tmp_path / "buffer").total_added == 15


# ------------------------------------------------ argument checks
@pytest.mark.parametrize("timeout", [math.inf, math.nan, -1, "5"], ids=repr)
def test_wait_refuses_a_timeout_that_is_no_finite_number_of_seconds(timeout, tmp_path):
    """Before: inf raised a raw OverflowError, "5" a raw TypeError, NaN and -1 a
    misleading 'not finished'."""
    buf = buffer(4)
    snap = Snapshot(buf, tmp_path / "s")          # not started: it cannot finish meanwhile
    with pytest.raises(ConfigError, match="timeout"):
        snap.wait(timeout)
    snap.run().wait(60)
    assert len(load(tmp_path / "s")) == 4


def test_wait_takes_a_finite_timeout_past_threadings_own_limit(tmp_path):
    """Before: 1e10 s, finite and accepted, raised a raw OverflowError from Event.wait
    (threading.TIMEOUT_MAX is ~9.2e9 s)."""
    buf = buffer(4)
    snap = Snapshot(buf, tmp_path / "s").start()
    assert snap.wait(1e10) is snap
    assert len(load(tmp_path / "s")) == 4


@pytest.mark.parametrize("since", [5.0, 5.5, "5", None, np.float64(5), True], ids=repr)
def test_an_increment_since_a_value_that_is_no_int_is_refused(since, tmp_path):
    """Before: 5.0, "5" and None raised raw TypeErrors; True was taken as item 1."""
    buf = buffer(10, cap=100)
    with pytest.raises(ReplayError, match="since"):
        take_incremental(buf, since)
    with pytest.raises(ReplayError, match="since"):
        save_incremental(buf, tmp_path / "inc", since)
    assert not (tmp_path / "inc").exists()
    assert buf._saver is None
