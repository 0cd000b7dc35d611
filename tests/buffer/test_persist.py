"""Save and restore: exact round trip, consistent snapshots while the buffer keeps changing."""

import json
import shutil
import threading

import numpy as np
import pytest
from swarmtest import Clock

from swarm.buffer import Items, ReplayBuffer
from swarm.buffer.persist import digest, load_incremental, save_incremental
from swarm.errors import ReplayError

SCHEMA = {"obs": ("float32", (8,)), "action": ("int64", ()), "reward": ("float32", ())}


def items(n, start=0):
    k = np.arange(start, start + n)
    return {"obs": np.tile(k[:, None], (1, 8)).astype(np.float32), "action": k, "reward": k.astype(np.float32)}


def test_round_trip_is_exact(tmp_path):
    clock = Clock(500.0)
    buf = ReplayBuffer(SCHEMA, 64, decay=0.01, seed=5, clock=clock, peer_id="a")
    idx = buf.add(items(50))
    buf.update_priorities(idx, np.linspace(0, 3, 50))
    buf.insert(Items(items(3, 100), ["b"], np.zeros(3, np.int32), np.arange(3), np.full(3, 490.0),
                     np.ones(3)))
    buf.sample(7)
    buf.save(tmp_path / "snap")
    back = ReplayBuffer.load(tmp_path / "snap", clock=clock)
    assert len(back) == len(buf) and back.total_added == buf.total_added
    np.testing.assert_array_equal(back.probabilities(), buf.probabilities())
    for k in SCHEMA:
        np.testing.assert_array_equal(back._data[k], buf._data[k])
    assert back.ids() == buf.ids()
    assert back.contains("b", 2) and not back.insert(
        Items(items(1), ["b"], np.zeros(1, np.int32), np.array([2]), np.array([490.0]), np.ones(1))).size
    # same rng state: the next samples are identical
    s1, s2 = buf.sample(16), back.sample(16)
    np.testing.assert_array_equal(s1.indices, s2.indices)
    np.testing.assert_array_equal(s1.weights, s2.weights)
    # overwriting the same path works
    buf.save(tmp_path / "snap")


def test_snapshot_is_the_state_at_save_time_while_writes_go_on(tmp_path, monkeypatch):
    import swarm.buffer.persist as persist
    monkeypatch.setattr(persist, "_CHUNK", 16)      # many chunks on a small buffer
    buf = ReplayBuffer(SCHEMA, 256, seed=0)
    idx = buf.add(items(256))
    buf.update_priorities(idx, np.arange(256, dtype=float))
    expect_p = buf.probabilities().copy()
    expect_obs = buf._data["obs"].copy()
    snap = persist.Snapshot(buf, tmp_path / "s")
    # Mutate after the snapshot started, before any chunk is copied.
    buf.add(items(40, 1000))
    buf.update_priorities(buf.sample(32).indices, np.full(32, 77.0))
    snap.run().wait()
    back = ReplayBuffer.load(tmp_path / "s")
    np.testing.assert_allclose(back.probabilities(), expect_p, rtol=1e-12)
    np.testing.assert_array_equal(back._data["obs"], expect_obs)
    assert back.total_added == 256


def test_a_locked_copy_is_bounded_in_bytes_as_well_as_rows(tmp_path, monkeypatch):
    """Rows of 84x84 frames (two of them, 14 kB a row): a snapshot copies at most
    _CHUNK_BYTES under the lock at a time, not _CHUNK rows (32k rows: 460 MB), and the
    snapshot is still the state when the save began, with writes going on."""
    import swarm.buffer.persist as persist
    monkeypatch.setattr(persist, "_CHUNK_BYTES", 64 << 10)   # a few rows a chunk on a small buffer
    frames = {"obs": ("uint8", (84, 84)), "next_obs": ("uint8", (84, 84)), "action": ("int64", ())}
    buf = ReplayBuffer(frames, 40, seed=0)

    def batch(n, start):
        k = np.arange(start, start + n)
        f = np.broadcast_to((k % 251).astype(np.uint8)[:, None, None], (n, 84, 84)).copy()
        return {"obs": f, "next_obs": f[::-1].copy(), "action": k}

    buf.add(batch(40, 0))
    expect = {k: buf._data[k].copy() for k in frames}
    row = sum(c[:1].nbytes for c in persist._columns(buf).values())
    parts = []
    snap = persist.Snapshot(buf, tmp_path / "s")
    for i, part in enumerate(snap._chunks()):
        parts.append(part)
        if i == 0:
            buf.add(batch(40, 100))   # every row overwritten after the first copy
    snap._release()
    copies = [len(p["obs"]) for p in parts]
    assert max(copies) == (64 << 10) // row == 4 and sum(copies) == 40, copies
    for k in frames:   # the rows as they were when the snapshot began
        np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), expect[k])
    # and a save with writes going on still holds the state it began with
    snap = persist.Snapshot(buf, tmp_path / "s2")
    expect = {k: buf._data[k].copy() for k in frames}
    buf.add(batch(10, 500))
    snap.run().wait()
    back = ReplayBuffer.load(tmp_path / "s2")
    for k in frames:
        np.testing.assert_array_equal(back._data[k], expect[k])


def test_background_save_does_not_stall_sampling_long(tmp_path):
    buf = ReplayBuffer(SCHEMA, 200_000, seed=0)
    buf.add(items(200_000))
    stop = threading.Event()
    n = [0]

    def learner():
        while not stop.is_set():
            s = buf.sample(64)
            buf.update_priorities(s.indices, np.ones(64))
            n[0] += 1

    th = threading.Thread(target=learner)
    th.start()
    try:
        snap = buf.save(tmp_path / "big", background=True)
        snap.wait(timeout=60)
    finally:
        stop.set()
        th.join()
    assert n[0] > 0
    # chunk copies are bounded by size, not by the buffer: a loose bound, not a speed target
    assert snap.max_stall_s < 0.5
    assert len(ReplayBuffer.load(tmp_path / "big")) == 200_000


def test_one_save_at_a_time_and_bad_paths(tmp_path):
    buf = ReplayBuffer(SCHEMA, 8)
    buf.add(items(2))
    from swarm.buffer.persist import Snapshot
    s = Snapshot(buf, tmp_path / "x")
    with pytest.raises(ReplayError, match="already"):
        buf.save(tmp_path / "y")
    s.run().wait()
    with pytest.raises(ReplayError, match="not a replay snapshot"):
        ReplayBuffer.load(tmp_path / "nothing")
    (tmp_path / "x" / "_seq.npy").unlink()
    with pytest.raises(ReplayError, match="_seq"):
        ReplayBuffer.load(tmp_path / "x")


def _truncate(p):
    f = p / "obs.npy"
    data = f.read_bytes()
    f.write_bytes(data[:len(data) // 2])


def _nan_leaf(p):
    a = np.load(p / "_leaf.npy")
    a[0] = np.nan
    np.save(p / "_leaf.npy", a)


def _no_counter(p):
    meta = json.loads((p / "meta.json").read_text())
    del meta["next"]
    (p / "meta.json").write_text(json.dumps(meta))


def _unknown_origin(p):
    a = np.load(p / "_origin.npy")
    a[0] = len(json.loads((p / "meta.json").read_text())["peers"])   # one past the origin list
    np.save(p / "_origin.npy", a)


def _nan_time(p):
    a = np.load(p / "_time.npy")
    a[1] = np.nan
    np.save(p / "_time.npy", a)


def _zero_max_p(p):
    """New items take priority max_p: 0 would leave everything collected after the restore unsampled."""
    meta = json.loads((p / "meta.json").read_text())
    meta["max_p"] = 0.0
    (p / "meta.json").write_text(json.dumps(meta))


def _ticket_at_next(p):
    """Tickets run 0 .. next-1: one equal to next would be handed out again while a row holds it."""
    a = np.load(p / "_ticket.npy")
    a[0] = json.loads((p / "meta.json").read_text())["next"]
    np.save(p / "_ticket.npy", a)


@pytest.mark.parametrize("damage, word", [(_truncate, "obs"), (_nan_leaf, "_leaf"), (_no_counter, "meta.json"),
                                          (_unknown_origin, "_origin"),
                                          (_nan_time, "column '_time' holds NaN or Inf origin times"),
                                          (_zero_max_p, r"meta.json is corrupt: .* max_p 0\.0,"),
                                          (_ticket_at_next, r"column '_ticket' holds item numbers >= (5|8),")])
def test_a_damaged_snapshot_is_refused_and_the_base_buffer_left_alone(tmp_path, damage, word):
    buf = ReplayBuffer(SCHEMA, 16, decay=0.01, seed=0, clock=Clock(500.0))
    buf.add(items(5))
    buf.save(tmp_path / "full")
    base = ReplayBuffer.load(tmp_path / "full", clock=Clock(500.0))
    buf.add(items(3, 5))
    save_incremental(buf, tmp_path / "inc", since=5)
    shutil.copytree(tmp_path / "full", tmp_path / "bad")
    damage(tmp_path / "bad")
    with pytest.raises(ReplayError, match=word):
        ReplayBuffer.load(tmp_path / "bad")
    damage(tmp_path / "inc")
    before = digest(base)
    with pytest.raises(ReplayError, match=word):
        load_incremental(base, tmp_path / "inc")
    assert digest(base) == before
    assert np.isfinite(base.sample(4).weights).all()


def test_an_explicit_rebase_while_a_snapshot_is_written_is_deferred(tmp_path):
    """rebase() rescaled the rows not yet copied while meta.json kept the old base: the restored
    priorities were off by the rebase factor, and new items outweighed the old ones."""
    from swarm.buffer.persist import Snapshot
    clock = Clock(1000.0)
    buf = ReplayBuffer(SCHEMA, 64, decay=0.1, seed=0, clock=clock)
    idx = buf.add(items(64), times=np.linspace(900.0, 1000.0, 64))
    buf.update_priorities(idx, np.linspace(0.0, 3.0, 64))
    snap = Snapshot(buf, tmp_path / "s")
    clock.t = 1010.0
    buf.rebase()
    snap.run().wait()
    back = ReplayBuffer.load(tmp_path / "s", clock=clock)
    # restored as at the snapshot's moment, 1000: the 10 s until the load are not age
    np.testing.assert_allclose(back.priorities(idx), buf.priorities(idx) * np.exp(0.1 * 10.0), rtol=1e-12)
    buf.add(items(1, 100), times=1000.0)       # as old as back's new item is by back's time
    back.add(items(1, 100))
    np.testing.assert_allclose(back.probabilities(), buf.probabilities(), rtol=1e-12)
    buf.rebase()                               # once the snapshot is written, it goes ahead
    assert buf._base == 1010.0


def test_save_refuses_a_path_that_is_not_a_snapshot_and_leaves_it_alone(tmp_path):
    """save() renamed whatever was at the path aside and deleted it: a results directory lost its files."""
    buf = ReplayBuffer(SCHEMA, 8, seed=0)
    buf.add(items(2))
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "model.pt").write_text("weights")
    (tmp_path / "notes.txt").write_text("notes")
    for path in (tmp_path / "results", tmp_path / "notes.txt"):
        with pytest.raises(ReplayError, match="not a replay snapshot"):
            buf.save(path)
        with pytest.raises(ReplayError, match="not a replay snapshot"):
            save_incremental(buf, path, since=0)
    assert (tmp_path / "results" / "model.pt").read_text() == "weights"
    assert (tmp_path / "notes.txt").read_text() == "notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "results"]
    (tmp_path / "empty").mkdir()                # an empty directory, or an older snapshot, is replaced
    buf.save(tmp_path / "empty")
    buf.add(items(1, 2))
    buf.save(tmp_path / "empty", background=True).wait(10)
    assert len(ReplayBuffer.load(tmp_path / "empty")) == 3


def _received(buf, origins, start=0):
    """One item from each of ``origins`` in turn (seqs from ``start``)."""
    for k, o in enumerate(origins):
        buf.insert(Items(items(1, start + k), [o], np.zeros(1, np.int32), np.array([start + k]),
                         np.full(1, 490.0), np.ones(1)))


def test_a_buffer_whose_origin_list_was_compacted_round_trips(tmp_path):
    clock = Clock(500.0)
    buf = ReplayBuffer(SCHEMA, 16, decay=0.01, seed=0, clock=clock, peer_id="a")
    buf.add(items(4))
    _received(buf, [f"r{i}" for i in range(100)])      # a neighbour restarted 100 times
    buf.add(items(4, 4))
    assert len(buf.peers()) < 100
    buf.save(tmp_path / "snap")
    back = ReplayBuffer.load(tmp_path / "snap", clock=clock)
    assert back.ids() == buf.ids() and back.peers() == buf.peers() and digest(back) == digest(buf)
    assert all(back.contains(p, s) for p, s in back.ids())


def test_a_snapshot_with_an_uncompacted_origin_list_still_loads(tmp_path, monkeypatch):
    """Snapshots written before the origin list was compacted list every origin ever stored
    (the format is the same): they load as they are, and the next insert compacts."""
    from swarm.buffer import replay
    monkeypatch.setattr(replay, "_COMPACT_PEERS", 10**9)     # as older code: never compacts
    buf = ReplayBuffer(SCHEMA, 16, seed=0, peer_id="a")
    _received(buf, [f"r{i}" for i in range(300)])
    buf.add(items(3))
    buf.save(tmp_path / "old")
    monkeypatch.undo()
    meta = json.loads((tmp_path / "old" / "meta.json").read_text())
    assert meta["format"] == 1 and len(meta["peers"]) == 301
    back = ReplayBuffer.load(tmp_path / "old")
    assert back.ids() == buf.ids() and back.peers() == buf.peers()
    ids, slot = buf.ids(), back.total_added % 16
    _received(back, ["new"], 1000)                          # overwrites the oldest item
    ids[slot] = ("new", 1000)
    assert back.ids() == ids and len(back.peers()) < 20
    assert set(back.peers()) == {p for p, _ in back.ids()} and back.peers()[0] == "a"


def test_an_increment_taken_after_the_origin_list_was_compacted_applies_to_its_full_snapshot(tmp_path):
    """The rows an increment leaves in place keep the full snapshot's origin numbers, which
    mean other origins once the list is compacted: they are renumbered by name."""
    clock = Clock(500.0)
    buf = ReplayBuffer(SCHEMA, 32, seed=0, clock=clock, peer_id="a")
    _received(buf, [f"r{i}" for i in range(60)])       # 61 ids, the ring holds r28..r59
    buf.save(tmp_path / "full")
    since = buf.total_added
    _received(buf, [f"s{i}" for i in range(10)], 100)  # compacts at s3: r32..r59 renumbered
    assert buf.peers()[:2] == ["a", "r32"]
    save_incremental(buf, tmp_path / "inc", since=since)   # the rows of s0..s9 only
    back = load_incremental(ReplayBuffer.load(tmp_path / "full", clock=clock), tmp_path / "inc")
    assert back.ids() == buf.ids() and back.peers() == buf.peers() and digest(back) == digest(buf)
    assert all(back.contains(p, s) for p, s in buf.ids())
    # an increment that does not list the origin of a row it leaves in place is not for this base
    meta = json.loads((tmp_path / "inc" / "meta.json").read_text())
    meta["peers"][meta["peers"].index("r50")] = "x"
    (tmp_path / "inc" / "meta.json").write_text(json.dumps(meta))
    base = ReplayBuffer.load(tmp_path / "full", clock=clock)
    before = digest(base)
    with pytest.raises(ReplayError, match="r50"):
        load_incremental(base, tmp_path / "inc")
    assert digest(base) == before


def test_an_increment_restores_the_rate_limiters_counts(tmp_path):
    # the increment's meta.json held the limiter's counts, but the restored buffer kept the
    # full snapshot's: a samples_per_insert ratio went on from the wrong place
    from swarm.buffer import RateLimiter

    buf = ReplayBuffer({"x": ("float32", ())}, 16, seed=0, first_seq=0,
                       limiter=RateLimiter(min_size=1, samples_per_insert=100.0, tolerance=1e9))
    buf.add({"x": np.zeros(4, np.float32)})
    buf.save(tmp_path / "full")
    since = buf.total_added
    buf.add({"x": np.ones(6, np.float32)})
    buf.sample(8)
    save_incremental(buf, tmp_path / "inc", since)
    want = (buf.limiter.inserted, buf.limiter.sampled)
    assert want == (10, 8)
    got = load_incremental(ReplayBuffer.load(tmp_path / "full"), tmp_path / "inc")
    assert (got.limiter.inserted, got.limiter.sampled) == want
    assert got.limiter.samples_per_insert == 100.0

    meta = json.loads((tmp_path / "inc" / "meta.json").read_text())
    meta["limiter"]["sampled"] = -1
    (tmp_path / "inc" / "meta.json").write_text(json.dumps(meta))
    base = ReplayBuffer.load(tmp_path / "full")
    before = (len(base), base.limiter.inserted, base.limiter.sampled)
    with pytest.raises(ReplayError, match="limiter"):
        load_incremental(base, tmp_path / "inc")
    assert (len(base), base.limiter.inserted, base.limiter.sampled) == before


def test_an_increment_is_refused_by_any_full_snapshot_but_its_own(tmp_path):
    """A folder of several full snapshots: an increment applied to an older one than it was
    taken against would leave the rows written between the two as the older one's."""
    buf = ReplayBuffer(SCHEMA, 16, seed=0, peer_id="a")
    buf.add(items(5))
    buf.save(tmp_path / "fullA")                      # next 5
    buf.add(items(3, 5))
    buf.save(tmp_path / "fullB")                      # next 8
    buf.add(items(2, 8))
    save_incremental(buf, tmp_path / "inc", since=8)  # against fullB
    base = ReplayBuffer.load(tmp_path / "fullA")
    before = digest(base)
    with pytest.raises(ReplayError, match="taken since item 8, but the base buffer has written 5 items; "
                                          "it belongs to another full snapshot"):
        load_incremental(base, tmp_path / "inc")
    assert digest(base) == before and base.total_added == 5
    back = load_incremental(ReplayBuffer.load(tmp_path / "fullB"), tmp_path / "inc")
    assert digest(back) == digest(buf) and back.total_added == 10


def test_an_increment_naming_the_slot_one_past_the_ring_is_refused(tmp_path):
    """Slot == capacity passed a check off by one and failed inside the copy with a bare IndexError."""
    buf = ReplayBuffer(SCHEMA, 8, seed=0, peer_id="a")
    buf.add(items(3))
    buf.save(tmp_path / "full")
    buf.add(items(2, 3))
    save_incremental(buf, tmp_path / "inc", since=3)
    slots = np.load(tmp_path / "inc" / "_slots.npy")
    assert slots.tolist() == [3, 4]
    slots[-1] = 8                                     # == capacity
    np.save(tmp_path / "inc" / "_slots.npy", slots)
    base = ReplayBuffer.load(tmp_path / "full")
    before = digest(base)
    with pytest.raises(ReplayError, match="row slots outside the capacity 8"):
        load_incremental(base, tmp_path / "inc")
    assert digest(base) == before
    slots[-1] = 7                                     # the last slot of the ring is in it
    np.save(tmp_path / "inc" / "_slots.npy", slots)
    assert load_incremental(base, tmp_path / "inc").total_added == 5


def test_a_snapshot_saved_after_the_clock_is_restored_with_no_shift(tmp_path):
    """The clock was set back 4000 s since the save: the buffer runs at the clock, not ahead of it."""
    buf = ReplayBuffer(SCHEMA, 8, decay=0.01, seed=0, peer_id="a", clock=Clock(5000.0))
    buf.add(items(2))
    buf.save(tmp_path / "s")
    back = ReplayBuffer.load(tmp_path / "s", clock=Clock(1000.0))
    assert back._lag == 0.0 and back._now() == 1000.0
    later = ReplayBuffer.load(tmp_path / "s", clock=Clock(5030.0))   # 30 s after the save: not age
    assert later._lag == 30.0 and later._now() == 5000.0


def test_resume_sequence_only_raises_the_sequence_counter(tmp_path):
    """A floor below what the buffer issued (the clock set back) must not hand out its ids again."""
    from swarm.buffer.persist import resume_sequence
    buf = ReplayBuffer(SCHEMA, 8, seed=0, peer_id="a", first_seq=0)
    buf.add(items(5))
    assert buf._next_seq == 5
    resume_sequence(buf, 2)
    assert buf._next_seq == 5
    resume_sequence(buf, 5)
    assert buf._next_seq == 5
    resume_sequence(buf, 100)
    assert buf._next_seq == 100
    buf.add(items(1, 5))
    assert buf.ids()[-1] == ("a", 100)
