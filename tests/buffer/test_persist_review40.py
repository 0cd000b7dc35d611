"""Persistence defects found by review 40: a folder with any meta.json taken for a snapshot
and replaced whole, a received priority-0 item half stored while a snapshot deferred the
decay rebase, and schema field names used as file names unchecked."""

import json
import os

import numpy as np
import pytest

from swarm.buffer import ReplayBuffer
from swarm.buffer.persist import Increment, Snapshot, load, save, save_incremental
from swarm.buffer.replay import Items
from swarm.buffer.schema import Schema
from swarm.errors import ReplayError

SCHEMA = {"x": ("int64", ())}


def buffer(n=4, cap=8):
    buf = ReplayBuffer(SCHEMA, cap, seed=0, first_seq=0, clock=lambda: 1.0)
    buf.add({"x": np.arange(n)})
    return buf


def listing(path):
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


# ------------------------------------------------ what counts as a snapshot
@pytest.mark.parametrize("meta", ['{"run": "exp1", "lr": 0.001}', "not json at all", "[1, 2]",
                                  '{"format": 1, "schema": {"x": ["int64", []]}}'])
@pytest.mark.parametrize("how", ["save", "save_incremental"])
def test_a_folder_with_a_meta_json_of_its_own_is_not_replaced(tmp_path, meta, how):
    """Before: any directory holding a meta.json (JSON without this package's snapshot
    keys, a JSON list, or not JSON: "a damaged snapshot") was replaced whole, and a
    results folder lost every other file in it."""
    res = tmp_path / "results"
    res.mkdir()
    (res / "meta.json").write_text(meta)
    (res / "returns.csv").write_text("step,return\n1,2\n")
    before = listing(res)
    with pytest.raises(ReplayError, match="not a replay snapshot"):
        if how == "save":
            save(buffer(), res)
        else:
            save_incremental(buffer(), res, 0)
    assert listing(res) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]   # no temporary directory left


def test_a_damaged_snapshot_with_a_foreign_file_is_not_replaced(tmp_path):
    """Before: a snapshot whose meta.json no longer parsed was replaced with every other file
    in the folder, whatever they were."""
    save(buffer(), tmp_path / "s")
    (tmp_path / "s" / "meta.json").write_text("{trunc")
    (tmp_path / "s" / "notes.txt").write_text("keep me")
    before = listing(tmp_path / "s")
    with pytest.raises(ReplayError, match="not a replay snapshot"):
        save(buffer(6), tmp_path / "s")
    assert listing(tmp_path / "s") == before


@pytest.mark.parametrize("meta", ["{trunc", "[1, 2]", "{}"])
def test_a_damaged_snapshot_of_only_snapshot_files_is_still_replaced(tmp_path, meta):
    """A snapshot whose meta.json was damaged, holding nothing else but its .npy columns, is
    replaced as before (the fix must not lock a user out of the path)."""
    save(buffer(), tmp_path / "s")
    (tmp_path / "s" / "meta.json").write_text(meta)
    save(buffer(6), tmp_path / "s")
    assert len(load(tmp_path / "s")) == 6


def test_a_snapshot_and_an_increment_are_still_replaced_by_their_kind(tmp_path):
    """The kinds are still told apart: a full snapshot replaces a full one, an increment an increment."""
    buf = buffer()
    save(buf, tmp_path / "s")
    save_incremental(buf, tmp_path / "i", 4)
    buf.add({"x": np.arange(2)})
    save(buf, tmp_path / "s")
    assert save_incremental(buf, tmp_path / "i", 4) == 2
    with pytest.raises(ReplayError, match="holds a full snapshot"):
        save_incremental(buf, tmp_path / "s", 4)
    with pytest.raises(ReplayError, match="holds an incremental snapshot"):
        save(buf, tmp_path / "i")


# ------------------------------------------------ a write while a snapshot defers the rebase
def decaying(now):
    buf = ReplayBuffer({"obs": ("float32", (2,))}, 8, decay=1.0, seed=0, first_seq=0, clock=lambda: now[0])
    buf.add({"obs": np.zeros((2, 2), np.float32)})
    return buf


def received(priority):
    return Items({"obs": np.ones((1, 2), np.float32)}, ["nbr"], np.zeros(1, np.int32), np.array([5]),
                 np.array([800.0]), np.array([priority]))


def test_a_priority_0_item_received_while_a_snapshot_defers_the_rebase_is_stored_whole(tmp_path):
    """Before: with the rebase deferred by a snapshot, the item's leaf was 0 * exp(800) =
    0 * inf = NaN: insert raised after the columns, ticket and counters were written (the
    item was in the ring but not in the id index or sum-tree, and a retry stored it twice)."""
    now = [0.0]
    buf = decaying(now)
    snap = Snapshot(buf, tmp_path / "s")
    now[0] = 800.0
    assert buf.insert(received(0.0)).tolist() == [2]
    assert buf.contains("nbr", 5) and len(buf) == 3 and buf.limiter.inserted == 3
    assert np.isfinite(buf._tree.leaves).all() and buf._tree.leaves[2] == 0.0
    assert buf.insert(received(0.0)).size == 0                # a retry is a duplicate
    snap.run().wait()
    assert len(load(tmp_path / "s")) == 2


def test_a_write_whose_leaves_are_refused_changes_nothing(monkeypatch):
    """Before: the leaves were computed and checked after the columns, ticket, ring head and
    limiter count were written: a refused leaf left the item half stored."""
    now = [0.0]
    buf = decaying(now)
    before = (len(buf), buf.total_added, buf.limiter.inserted, buf.ids(), buf._tree.leaves.copy(),
              buf._data["obs"].copy(), buf._ticket.copy())
    monkeypatch.setattr(buf, "_leaf", lambda raw, times: np.full(raw.shape, np.nan))
    with pytest.raises(ReplayError, match="finite"):
        buf.insert(received(1.0))
    after = (len(buf), buf.total_added, buf.limiter.inserted, buf.ids(), buf._tree.leaves,
             buf._data["obs"], buf._ticket)
    assert after[:4] == before[:4]
    for a, b in zip(after[4:], before[4:]):
        np.testing.assert_array_equal(a, b)
    assert not buf.contains("nbr", 5)


# ------------------------------------------------ field names are file names
BAD_NAMES = ["/abs/x", "../up", "a/b", "a\\b", "x\0y", ".", "..", "x" * 201, "é" * 101, "\ud800"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_field_name_that_is_no_plain_file_name_is_refused(name):
    """Before: a field name was taken as it was and became the file <name>.npy of every
    snapshot: "/..." or "../" wrote (and load read) outside the snapshot, "a/b" made a
    buffer that could never be saved, a NUL made save_incremental raise a raw ValueError."""
    with pytest.raises(ReplayError, match="schema field name") as e:
        Schema({"obs": ("float32", (2,)), name: ("int64", ())})
    assert repr(name)[:40] in str(e.value)


def test_a_field_name_of_200_bytes_is_saved(tmp_path):
    """The limit leaves every plain name a file system takes (255 bytes with .npy) alone."""
    buf = ReplayBuffer({"x" * 200: ("int64", ()), "é" * 100: ("int8", ())}, 4, seed=0, first_seq=0)
    buf.add({"x" * 200: np.arange(2), "é" * 100: np.arange(2, dtype=np.int8)})
    save(buf, tmp_path / "s")
    assert len(load(tmp_path / "s")) == 2


def test_load_refuses_a_meta_json_whose_field_name_leaves_the_snapshot(tmp_path):
    """Before: a crafted meta.json naming a field "../outside" made load() read outside.npy
    beside the snapshot."""
    save(buffer(), tmp_path / "s")
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())
    meta["schema"] = {"../outside": meta["schema"]["x"]}
    (tmp_path / "s" / "meta.json").write_text(json.dumps(meta))
    os.replace(tmp_path / "s" / "x.npy", tmp_path / "outside.npy")
    with pytest.raises(ReplayError, match=r"meta.json: schema field name '\.\./outside'"):
        load(tmp_path / "s")


def test_an_increment_write_that_numpy_or_the_os_refuses_is_a_replay_error(tmp_path):
    """Before: Increment.write turned only OSError into ReplayError: a file name with a NUL
    (ValueError) escaped raw."""
    inc = Increment(0, np.zeros(0, np.int64), {"x\0y": np.zeros(0, np.int64)}, {"format": 1, "since": 0})
    with pytest.raises(ReplayError, match="incremental snapshot to .* failed"):
        inc.write(tmp_path / "i")
    assert list(tmp_path.iterdir()) == []
