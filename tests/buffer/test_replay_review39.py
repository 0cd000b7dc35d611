"""Replay buffer defects found by review 39: forgotten items shared, extreme origin
times, a clock read mid-write, overflowing priorities, can_sample's and contains'
arguments."""

import warnings

import numpy as np
import pytest

from swarm.buffer import Items, ReplayBuffer
from swarm.errors import ReplayError

SCHEMA = {"x": ("float32", ())}


def xs(n):
    return {"x": np.arange(n, dtype=np.float32)}


def received(times, priorities=None, peer="a"):
    """Items from ``peer`` with seqs 0..n-1 at ``times``."""
    times = np.asarray(times)
    n = times.size
    pri = np.ones(n) if priorities is None else np.asarray(priorities, dtype=np.float64)
    return Items(xs(n), [peer], np.zeros(n, np.int32), np.arange(n, dtype=np.int64), times, pri)


def state(buf):
    """What a refused call must leave as it was."""
    return (len(buf), buf.total_added, buf._next_seq, buf.max_priority, buf._base, buf.limiter.inserted,
            buf._tree.leaves.tolist(), buf._data["x"].tolist(), buf.peers())


# -------------------------------------------------------------- forget, shared
def test_a_forgotten_item_stays_forgotten_at_its_receiver_and_shrinks_no_weight():
    """A forgotten item (priority 0) arrived raised to eps**alpha: never drawn at its origin,
    but the receiver's smallest priority, which cut every other item's weight from 1 to 0.036."""
    a = ReplayBuffer(SCHEMA, 64, seed=0, first_seq=0, peer_id="A")
    r = ReplayBuffer(SCHEMA, 64, seed=1, first_seq=0, peer_id="R")
    ia = a.add(xs(4))
    a.update_priorities(ia, np.ones(4))
    assert a.forget(ia[:1]) == 1
    ir = r.add(xs(4))
    r.update_priorities(ir, np.ones(4))
    got = r.insert(a.items(ia))          # as a share or a replication push stores them
    assert got.size == 4
    assert r.priorities(got[:1]).tolist() == [0.0]
    s = r.sample(2000, beta=0.4)
    assert not (s.indices == got[0]).any()
    np.testing.assert_array_equal(s.weights, 1.0)
    # and a replica of the replica still holds it forgotten
    r2 = ReplayBuffer(SCHEMA, 64, seed=2, first_seq=0, peer_id="R2")
    got2 = r2.insert(r.items(got))
    assert r2.priorities(got2[:1]).tolist() == [0.0] and (r2.priorities(got2[1:]) > 0).all()


def test_a_tiny_positive_received_priority_is_still_raised_to_the_floor():
    r = ReplayBuffer(SCHEMA, 8, alpha=0.5, eps=1e-4, seed=0, first_seq=0, peer_id="R")
    got = r.insert(received([0.0, 0.0], [1e-30, 0.0]))
    np.testing.assert_allclose(r.priorities(got), [1e-4 ** 0.5, 0.0])


# -------------------------------------------------------------- origin times
def test_a_long_double_time_before_float64s_range_is_stored_as_the_oldest_float64_time(tmp_path):
    """np.longdouble('-1e400') is finite in its own dtype: it was stored as -inf, every
    neighbour then refused each batch holding it, and a snapshot saved but did not load."""
    if np.finfo(np.longdouble).max <= np.finfo(np.float64).max:
        pytest.skip("long double is float64 here")
    r = ReplayBuffer(SCHEMA, 8, seed=0, first_seq=0, peer_id="R", clock=lambda: 2000.0)
    r.add(xs(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # no overflow in a cast on the way
        got = r.insert(received(np.array([np.longdouble("-1e400"), np.longdouble("1e400")])))
    oldest = np.finfo(np.float64).min
    assert r.items(got).times.tolist() == [oldest, 2000.0]
    n = ReplayBuffer(SCHEMA, 8, seed=0, first_seq=0, peer_id="N")
    assert n.insert(r.items(np.arange(r.total_added))).size == 4
    r.save(tmp_path / "snap")
    back = ReplayBuffer.load(tmp_path / "snap", clock=lambda: 2000.0)
    assert back.items(got).times.tolist() == [oldest, 2000.0]


def test_a_time_so_old_that_its_decay_overflows_travels_with_priority_0_not_nan():
    """A finite time of -1.7e308 at decay 10: items() computed decay*(time-base) = -inf and
    log(0) - (-inf) = NaN as its priority, and the neighbour dropped the whole message."""
    a = ReplayBuffer(SCHEMA, 8, seed=0, first_seq=0, peer_id="A", decay=10.0, clock=lambda: 0.0)
    idx = a.add(xs(2), times=np.array([-1.7e308, 0.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # no overflow warning on the way either
        it = a.items(idx)
    assert it.priorities[0] == 0.0 and np.isfinite(it.priorities).all()
    n = ReplayBuffer(SCHEMA, 8, seed=0, first_seq=0, peer_id="N", decay=10.0, clock=lambda: 0.0)
    got = n.insert(it)
    assert got.size == 2 and n.priorities(got)[0] == 0.0 and n.priorities(got)[1] > 0


# -------------------------------------------------------------- the clock
def test_a_rebase_due_in_an_add_does_not_read_the_clock_a_second_time():
    """The add read the clock again inside the rebase, after the columns, ids and counters were
    written: a bad second reading raised with the items stored at priority 0 and on_add not called."""
    readings = iter([0.0, 0.0, 100.0, float("nan")])
    buf = ReplayBuffer(SCHEMA, 8, seed=0, first_seq=0, decay=1.0, clock=lambda: next(readings))
    heard = []
    buf.on_add(heard.append)
    buf.add(xs(2))                           # at 0: no rebase
    idx = buf.add(xs(2))                     # at 100: a rebase is due; the clock is read once
    assert idx.tolist() == [2, 3] and [h.tolist() for h in heard] == [[0, 1], [2, 3]]
    assert buf._base == 100.0 and (buf._tree.leaves[2:4] > 0).all()
    before = state(buf)
    with pytest.raises(ReplayError, match="clock"):   # the NaN: refused before anything is written
        buf.add(xs(1))
    assert state(buf) == before


# -------------------------------------------------------------- update_priorities
def test_a_finite_td_whose_priority_overflows_is_capped_not_refused_as_nan():
    """td=1e200 at alpha 2: the power overflowed to inf and the update was refused as
    'td contains NaN or Inf', though the docstring caps priorities past float max / (4 cap)."""
    buf = ReplayBuffer(SCHEMA, 8, alpha=2.0, seed=0, first_seq=0)
    idx = buf.add(xs(4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert buf.update_priorities(idx[:2], [1e200, 1.0]) == 2
    cap = np.finfo(np.float64).max / (4 * 8)
    assert buf.priorities(idx[:1]).tolist() == [cap] and buf.max_priority == cap
    before = state(buf)
    for bad in (np.nan, np.inf):
        with pytest.raises(ReplayError, match="NaN or Inf"):
            buf.update_priorities(idx[:2], [1e200, bad])
        assert state(buf) == before


# -------------------------------------------------------------- can_sample, contains
@pytest.mark.parametrize("sampler", ["prioritized", "uniform", "fifo"])
@pytest.mark.parametrize("n", [0, -3, 2.5, "x", None, True])
def test_can_sample_refuses_a_batch_size_sample_refuses(sampler, n):
    """can_sample(0), (-3) and (2.5) said True though sample() refuses them; on a FIFO
    buffer can_sample('x') raised a raw TypeError."""
    buf = ReplayBuffer(SCHEMA, 8, seed=0, first_seq=0, sampler=sampler)
    buf.add(xs(4))
    with pytest.raises(ReplayError, match="batch size"):
        buf.can_sample(n)
    with pytest.raises(ReplayError, match="batch size"):
        buf.sample(n)


@pytest.mark.parametrize("peer", ["A", "R"])
def test_contains_answers_for_int_seqs_only_on_both_paths(peer):
    """For a foreign peer contains('A', 1.9) and ('A', '1') were True through int(seq), while
    the local path said False; ('A', 2**70) raised a raw OverflowError."""
    r = ReplayBuffer(SCHEMA, 8, seed=0, first_seq=0, peer_id="R")
    r.add(xs(2))
    r.insert(received([0.0, 0.0], peer="A"))
    assert r.contains(peer, 1) and r.contains(peer, np.int64(1)) and not r.contains(peer, 5)
    for seq in (2**70, -1, np.uint64(2**64 - 1)):   # no id has such a seq
        assert not r.contains(peer, seq)
    for seq in (1.9, 1.0, "1", None, True):
        with pytest.raises(ReplayError, match="seq"):
            r.contains(peer, seq)
    with pytest.raises(ReplayError, match="peer"):
        r.contains(["A"], 1)


@pytest.mark.parametrize("field", ["origins", "seqs", "times", "priorities"])
def test_insert_of_ragged_ids_times_or_priorities_is_a_replay_error_and_changes_nothing(field):
    # np.asarray of a ragged list raised numpy's own ValueError out of insert
    buf = ReplayBuffer(SCHEMA, 8, seed=0)
    buf.add(xs(2))
    before = state(buf)
    good = received([1.0, 2.0])
    ragged = {"origins": [[0], [0, 0]], "seqs": [[0], [1, 2]], "times": [[1.0], [2.0, 3.0]],
              "priorities": [[1.0], [1.0, 1.0]]}[field]
    bad = Items(good.fields, good.peers, *[ragged if f == field else getattr(good, f)
                                         for f in ("origins", "seqs", "times", "priorities")])
    with pytest.raises(ReplayError, match="arrays of numbers"):
        buf.insert(bad)
    assert state(buf) == before
