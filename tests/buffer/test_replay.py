"""The local replay buffer: sampling law, weights, age decay, generations, schemas."""

import numpy as np
import pytest
from swarmtest import Clock

from swarm.buffer import Items, RateLimiter, ReplayBuffer, Schema
from swarm.errors import ReplayError

SCHEMA = {"obs": ("float32", (4,)), "action": ("int64", ()), "reward": ("float32", ()),
          "next_obs": ("float32", (4,)), "done": ("float32", ())}

# 99.9% quantiles of chi-square (no scipy here).
CHI2_999 = {7: 24.32, 15: 37.70, 31: 61.10}


def items(n, start=0):
    k = np.arange(start, start + n)
    return {"obs": np.tile(k[:, None], (1, 4)).astype(np.float32), "action": k.astype(np.int64),
            "reward": k.astype(np.float32), "next_obs": np.zeros((n, 4), np.float32),
            "done": np.zeros(n, np.float32)}


def chi2(counts, probs):
    exp = counts.sum() * probs
    return float(((counts - exp) ** 2 / exp).sum())


@pytest.mark.parametrize("stratified", [False, True])
def test_sampling_matches_exact_probabilities_chi2(stratified):
    clock = Clock()
    buf = ReplayBuffer(SCHEMA, 16, alpha=0.7, eps=1e-3, decay=0.05, seed=1, clock=clock,
                       stratified=stratified)
    times = clock.t - np.arange(16) * 3.0        # different ages
    idx = buf.add(items(16), times=times)
    td = np.linspace(0.1, 2.0, 16)
    buf.update_priorities(idx, td)
    clock.t += 10.0
    expect = (td + 1e-3) ** 0.7 * np.exp(-0.05 * (clock.t - times))
    expect /= expect.sum()
    np.testing.assert_allclose(buf.probabilities(), expect, rtol=1e-12)
    counts = np.zeros(16)
    for _ in range(200):
        s = buf.sample(128)
        np.add.at(counts, s.batch["action"], 1)
    stat = chi2(counts, expect)
    assert stat < CHI2_999[15], stat
    # and the test has power: a wrong law (no decay) is rejected
    wrong = (td + 1e-3) ** 0.7
    assert chi2(counts, wrong / wrong.sum()) > CHI2_999[15]


def _check_weights(buf, s, P, beta):
    """Weights are (N·P(i))^-beta over the max of that over EVERY stored item (not the
    batch); with decay, over the batch (tests/buffer/test_weights_with_decay.py)."""
    slot = s.batch["action"].astype(np.int64) % buf.capacity
    np.testing.assert_allclose(s.probabilities, P[slot], rtol=1e-9)
    n = len(buf)
    wmax = ((n * P[slot] if buf.decay else n * P) ** -beta).max()
    np.testing.assert_allclose(s.weights, ((n * P[slot]) ** -beta / wmax).astype(np.float32), rtol=1e-6)
    assert s.weights.dtype == np.float32


def test_importance_weights_are_exact():
    buf = ReplayBuffer(SCHEMA, 8, alpha=0.5, eps=1e-6, seed=2)
    idx = buf.add(items(8))
    td = np.arange(1, 9, dtype=np.float64)
    buf.update_priorities(idx, td)
    p = (td + 1e-6) ** 0.5
    _check_weights(buf, buf.sample(64, beta=0.7), p / p.sum(), 0.7)
    # a batch that misses the least likely item is still normalised by it
    s = buf.sample(2, beta=0.7)
    if 0 not in s.batch["action"]:
        assert s.weights.max() < 1.0


@pytest.mark.parametrize("decay", [0.0, 0.01])
def test_importance_weights_follow_the_minimum_through_updates_and_decay(decay):
    clock = Clock()
    cap = 300                                    # several blocks of the tree's block minimum
    buf = ReplayBuffer(SCHEMA, cap, alpha=1.0, eps=1e-6, decay=decay, seed=4, clock=clock)
    rng = np.random.default_rng(0)
    times = clock.t - rng.random(250) * 50.0
    idx = buf.add(items(250), times=times)       # not full: empty slots must not count
    td = rng.random(250) + 0.5
    buf.update_priorities(idx, td)
    low = int(np.argmin((td + 1e-6) * np.exp(-decay * (clock.t - times))))
    for step in range(3):
        raw = (td + 1e-6) * np.exp(-decay * (clock.t - times))
        P = raw / raw.sum()
        _check_weights(buf, buf.sample(128, beta=0.5), P, 0.5)
        # raise the least likely item: the minimum must move to the next one
        td[low] = 10.0 + step
        buf.update_priorities(idx[low:low + 1], td[low:low + 1])
        clock.t += 7.0
        low = int(np.argmin((td + 1e-6) * np.exp(-decay * (clock.t - times))))


def test_new_items_get_the_max_priority():
    buf = ReplayBuffer(SCHEMA, 8, alpha=1.0, eps=1e-6, seed=0)
    idx = buf.add(items(4))
    buf.update_priorities(idx, [0.5, 3.0, 0.1, 0.2])
    new = buf.add(items(1, 4))
    assert buf.priorities(new)[0] == pytest.approx(3.0 + 1e-6)


def test_age_decay_is_correct_across_a_rebase():
    clock = Clock(0.0)
    buf = ReplayBuffer(SCHEMA, 32, alpha=1.0, eps=1e-6, decay=2.0, seed=0, clock=clock)
    added = []
    for k in range(8):
        clock.t = k * 9.0                       # 2 * 9 * 7 = 126 > rebase threshold
        added.append((buf.add(items(2, 2 * k)), clock.t))
    assert buf._base > 0.0                      # at least one rebase happened
    for i, (idx, t0) in enumerate(added):
        buf.update_priorities(idx, [float(i + 1), float(i + 2)])
    clock.t = 70.0
    idx = np.concatenate([a for a, _ in added])
    t0 = np.repeat([t for _, t in added], 2)
    td = np.array([[i + 1, i + 2] for i in range(8)], dtype=float).ravel()
    expect = (td + 1e-6) * np.exp(-2.0 * (70.0 - t0))
    np.testing.assert_allclose(buf.priorities(idx), expect, rtol=1e-9)
    # the newest items dominate the law as they should
    P = buf.probabilities()
    np.testing.assert_allclose(P, expect / expect.sum(), rtol=1e-9, atol=1e-300)
    # an explicit rebase does not change the law
    buf.rebase(80.0)
    np.testing.assert_allclose(buf.probabilities(), P, rtol=1e-9, atol=1e-300)


def test_stale_priority_updates_are_ignored():
    buf = ReplayBuffer(SCHEMA, 4, alpha=1.0, eps=1e-6, seed=0)
    old = buf.add(items(4))
    buf.add(items(2, 4))                        # overwrites slots 0 and 1
    before = buf.probabilities().copy()
    applied = buf.update_priorities(old[:2], [100.0, 100.0])
    assert applied == 0
    np.testing.assert_array_equal(buf.probabilities(), before)
    assert buf.update_priorities(old[2:], [5.0, 5.0]) == 2
    assert np.isnan(buf.priorities(old[:2])).all()


def test_duplicate_indices_in_one_update_last_wins():
    buf = ReplayBuffer(SCHEMA, 4, alpha=1.0, eps=1e-6, seed=0)
    idx = buf.add(items(4))
    buf.update_priorities(np.array([idx[0], idx[0], idx[1]]), [9.0, 1.0, 1.0])
    assert buf.priorities(idx[:1])[0] == pytest.approx(1.0 + 1e-6)
    np.testing.assert_allclose(buf._tree.total, buf._tree.leaves.sum())


def test_uniform_is_a_configuration():
    buf = ReplayBuffer(SCHEMA, 8, prioritized=False, seed=3)
    idx = buf.add(items(8))
    assert buf.update_priorities(idx, np.full(8, 100.0)) == 0
    counts = np.zeros(8)
    for _ in range(100):
        s = buf.sample(80)
        assert (s.weights == 1).all()
        np.add.at(counts, s.batch["action"], 1)
    assert chi2(counts, np.full(8, 1 / 8)) < CHI2_999[7]


def test_fifo_is_a_configuration():
    buf = ReplayBuffer(SCHEMA, 8, sampler="fifo")
    buf.add(items(5))
    assert buf.sample(3).batch["action"].tolist() == [0, 1, 2]
    buf.add(items(7, 5))                         # 12 written; 0..2 read; 3 lost to overwrite
    assert buf.sample(100).batch["action"].tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    with pytest.raises(ReplayError, match="no unread"):
        buf.sample(1)


def test_ring_overwrites_oldest_and_big_batches_keep_the_newest():
    buf = ReplayBuffer(SCHEMA, 5, seed=0)
    idx = buf.add(items(12))
    assert len(buf) == 5
    assert idx.tolist() == [7, 8, 9, 10, 11]
    assert sorted(buf.sample(50).batch["action"].tolist())[0] >= 7


@pytest.mark.parametrize("bad, field", [
    ({"obs": np.zeros((2, 3), np.float32)}, "obs"),                   # wrong shape
    ({"action": np.zeros(2, np.float32)}, "action"),                  # float into int
    ({"reward": np.zeros(3, np.float32)}, "reward"),                  # wrong count
    ({"obs": np.array([["a"] * 4] * 2)}, "obs"),                      # wrong dtype kind
])
def test_bad_items_are_rejected_naming_the_field_and_nothing_changes(bad, field):
    buf = ReplayBuffer(SCHEMA, 8, seed=0)
    buf.add(items(3))
    before = (len(buf), buf.total_added, buf.probabilities().copy(), buf._data["obs"].copy())
    good = items(2)
    good.update(bad)
    with pytest.raises(ReplayError, match=field):
        buf.add(good)
    assert (len(buf), buf.total_added) == before[:2]
    np.testing.assert_array_equal(buf.probabilities(), before[2])
    np.testing.assert_array_equal(buf._data["obs"], before[3])


def test_missing_and_extra_fields_are_named():
    buf = ReplayBuffer(SCHEMA, 8)
    it = items(2)
    del it["done"]
    with pytest.raises(ReplayError, match="done"):
        buf.add(it)
    it = items(2)
    it["bogus"] = np.zeros(2)
    with pytest.raises(ReplayError, match="bogus"):
        buf.add(it)


@pytest.mark.parametrize("kw, word", [({"capacity": 0}, "capacity"), ({"alpha": -1}, "alpha"),
                                      ({"eps": 0}, "eps"), ({"decay": -0.1}, "decay"),
                                      ({"sampler": "lifo"}, "sampler"), ({"seed": "x"}, "seed"),
                                      ({"seed": -1}, "seed"), ({"clock": "str"}, "clock"),
                                      ({"limiter": 5}, "limiter")])
def test_bad_configuration_is_named(kw, word):
    args = {"capacity": 8}
    args.update(kw)
    with pytest.raises(ReplayError, match=word):
        ReplayBuffer(SCHEMA, **args)


def test_bad_schema_is_named():
    with pytest.raises(ReplayError, match="obs"):
        Schema({"obs": ("object", (4,))})
    with pytest.raises(ReplayError, match="x"):
        Schema({"x": ("float32", (0,))})


def test_bad_updates_change_nothing():
    buf = ReplayBuffer(SCHEMA, 8, seed=0)
    idx = buf.add(items(4))
    before = buf.probabilities().copy()
    with pytest.raises(ReplayError, match="NaN"):
        buf.update_priorities(idx, [1.0, np.nan, 1.0, 1.0])
    with pytest.raises(ReplayError, match="shape"):
        buf.update_priorities(idx, [1.0, 2.0])
    with pytest.raises(ReplayError, match="range"):
        buf.update_priorities([99], [1.0])
    np.testing.assert_array_equal(buf.probabilities(), before)


def test_rate_limiter_min_size_and_ratio():
    lim = RateLimiter(min_size=4, samples_per_insert=2.0, tolerance=8)
    buf = ReplayBuffer(SCHEMA, 64, seed=0, limiter=lim)
    buf.add(items(3))
    assert not buf.can_sample(1)
    with pytest.raises(ReplayError, match="min_size"):
        buf.sample(1)
    buf.add(items(3, 3))                     # 6 inserted: 2 above min_size pay for 4 (+8 tolerance)
    assert buf.can_sample(12) and not buf.can_sample(13)
    buf.sample(12)
    assert not buf.can_sample(1)
    buf.add(items(1, 6))
    assert buf.can_sample(2) and not buf.can_sample(3)
    assert lim.insert_room() == lim.insert_room()  # pure
    assert lim.can_insert(lim.insert_room()) and not lim.can_insert(lim.insert_room() + 1)


def test_can_insert_answers_as_the_buffer_applies_the_ratio():
    # a second formula for the rule disagreed with insert_room() at the boundary (float rounding)
    lim = RateLimiter(min_size=20, samples_per_insert=0.3, tolerance=0.3)
    lim.inserted, lim.sampled = 152, 354
    room = lim.insert_room()
    assert room == 1049
    assert lim.can_insert(room) and not lim.can_insert(room + 1)


def test_schema_accepts_a_plain_dict_and_a_schema_object():
    a = ReplayBuffer(SCHEMA, 4)
    b = ReplayBuffer(Schema(SCHEMA), 4)
    assert a.schema == b.schema


def test_add_one():
    buf = ReplayBuffer(SCHEMA, 4)
    i = buf.add_one(obs=np.ones(4, np.float32), action=2, reward=1.0, next_obs=np.ones(4, np.float32), done=0.0)
    assert i == 0 and buf.sample(1).batch["action"][0] == 2


def _state(buf):
    """What a refused call must leave as it was."""
    return (len(buf), buf.total_added, buf._next_seq, buf.max_priority, buf._base, buf._tree.total,
            buf.limiter.inserted, buf.limiter.sampled, buf.probabilities().tolist(), buf._tree.leaves.tolist(),
            buf._data["action"].tolist(), str(buf._rng.bit_generator.state))


def test_future_add_times_are_clipped_to_now_and_do_not_wipe_priorities():
    clock = Clock()
    buf = ReplayBuffer(SCHEMA, 16, alpha=1.0, decay=0.01, seed=0, clock=clock)
    buf.add(items(5))
    i = buf.add(items(1, 5), times=clock.t * 1000)   # e.g. milliseconds by mistake
    buf.add(items(2, 6))
    assert buf.items(i).times.tolist() == [clock.t]
    # all eight were made "now" with the max priority: equally likely, none wiped
    np.testing.assert_allclose(buf.probabilities(), np.full(8, 1 / 8), rtol=1e-12)
    assert buf._base <= clock.t
    buf.rebase(clock.t * 1000)                   # the same through an explicit rebase
    np.testing.assert_allclose(buf.probabilities(), np.full(8, 1 / 8), rtol=1e-12)
    before = _state(buf)
    for t in (float("nan"), "soon"):
        with pytest.raises(ReplayError, match="rebase time"):
            buf.rebase(t)
    assert _state(buf) == before


def test_indices_never_handed_out_are_refused_and_change_nothing():
    buf = ReplayBuffer(SCHEMA, 16, alpha=1.0, seed=0)   # not full: slot 15 is empty, its ticket -1
    idx = buf.add(items(5))
    buf.update_priorities(idx, [1.0, 2.0, 3.0, 4.0, 5.0])
    before = _state(buf)
    for bad in ([-1], [5], [0, -1], [2**40]):
        with pytest.raises(ReplayError, match="out of range"):
            buf.update_priorities(bad, np.full(len(bad), 100.0))
        with pytest.raises(ReplayError, match="out of range"):
            buf.priorities(bad)
        with pytest.raises(ReplayError, match="out of range"):
            buf.items(bad)
    assert _state(buf) == before
    with pytest.raises(ReplayError, match="integers"):
        buf.items([1.5])
    assert buf.update_priorities(idx[:2], [7.0, 8.0]) == 2   # real indices still work


def test_insert_refuses_a_bad_priority_clip_and_changes_nothing():
    buf = ReplayBuffer(SCHEMA, 16, seed=0)
    buf.add(items(3))
    got = Items(items(2, 10), ["b"], np.zeros(2, np.int32), np.arange(2), np.full(2, 1000.0), np.ones(2))
    before = _state(buf)
    for clip in (float("nan"), "x", 0.0, -1.0):
        with pytest.raises(ReplayError, match="priority_clip"):
            buf.insert(got, priority_clip=clip)
    assert _state(buf) == before
    assert buf.insert(got, priority_clip=float("inf")).size == 2   # inf: no clip
    assert np.isfinite(buf._tree.total)


def test_insert_takes_long_doubles_past_float64_that_are_finite():
    """Finite is judged in the values' own dtype: a long-double time or priority past
    float64's range is stored (clipped as any large value), not refused as infinite."""
    big = np.longdouble(10) ** 400
    if not np.isfinite(big):
        pytest.skip("long double is float64 on this platform")
    buf = ReplayBuffer(SCHEMA, 4, seed=0, clock=lambda: 2000.0)
    for seq, (t, p) in enumerate(((big, np.longdouble(1)), (np.longdouble(1000), big))):
        got = Items(items(1), ["b"], np.zeros(1, np.int32), np.array([seq]), np.array([t]), np.array([p]))
        idx = buf.insert(got)
        assert idx.size == 1 and np.isfinite(buf.items(idx).priorities).all()
    with pytest.raises(ReplayError, match="must be finite"):
        buf.insert(Items(items(1), ["b"], np.zeros(1, np.int32), np.array([2]), np.array([np.longdouble("inf")]),
                         np.ones(1)))


def test_insert_within_the_limiter_room_counts_only_new_items():
    # room 2: the items held already (seqs 0, 1) take none of it; the last new ones are kept
    buf = ReplayBuffer(SCHEMA, 16, seed=0, limiter=RateLimiter(min_size=1, samples_per_insert=1.0, tolerance=3))

    def got(seqs):
        n = len(seqs)
        return Items(items(n), ["b"], np.zeros(n, np.int32), np.array(seqs), np.zeros(n), np.ones(n))

    assert buf.insert(got([0, 1]), limit=True).size == 2
    assert buf.insert(got([2, 0, 3, 1, 4]), limit=True).size == 2
    assert sorted(s for _, s in buf.ids()) == [0, 1, 3, 4]
    assert buf.limiter.insert_room() == 0 and buf.insert(got([5]), limit=True).size == 0
    assert buf.insert(got([5])).size == 1                              # without limit: no room needed


def test_sampling_when_every_priority_decayed_to_zero_is_refused_not_nan():
    clock = Clock(1e6)
    buf = ReplayBuffer(SCHEMA, 8, decay=0.1, seed=0, clock=clock)
    buf.add(items(3), times=0.0)                 # 1e6 s old at decay 0.1: every leaf underflows to 0
    before = _state(buf)
    assert not buf.can_sample(2)
    with pytest.raises(ReplayError, match="every priority .* is 0"):
        buf.sample(2)
    assert _state(buf) == before
    assert buf.probabilities().tolist() == [0.0, 0.0, 0.0]
    buf.add(items(1, 3))                         # a fresh item makes the buffer sampleable again
    s = buf.sample(4)
    assert buf.can_sample(4) and (s.batch["action"] == 3).all() and np.isfinite(s.weights).all()


@pytest.mark.parametrize("field, value, fits", [
    ("a", np.array([300]), np.array([-128])),                                 # int64 into int8
    ("b", np.array([2**64 - 1], np.uint64), np.array([2**63 - 1], np.uint64)),  # uint64 into int64
    ("c", np.array([1e39]), np.array([-2.0**127])),                           # float64 into float32
    ("d", np.array([70000]), np.array([65504])),                              # int64 into float16
])
def test_values_that_do_not_fit_a_narrower_field_are_refused(field, value, fits):
    buf = ReplayBuffer({"a": ("int8", ()), "b": ("int64", ()), "c": ("float32", ()), "d": ("float16", ())}, 8)
    good = {"a": np.array([1]), "b": np.array([1], np.uint64), "c": np.array([1.5]), "d": np.array([7])}
    buf.add(good)
    before = {k: c.copy() for k, c in buf._data.items()}, len(buf), buf.total_added
    two = {k: np.concatenate([v, v]) for k, v in good.items()}
    with pytest.raises(ReplayError, match=f"field '{field}': .* (do not fit|overflows)"):
        buf.add(dict(two, **{field: np.concatenate([fits, value])}))
    assert (len(buf), buf.total_added) == before[1:]
    for k, c in buf._data.items():
        np.testing.assert_array_equal(c, before[0][k])
    i = buf.add(dict(good, **{field: fits}))                 # values that fit are stored exactly
    assert buf._data[field][i[0]] == fits[0]
    buf.add(dict(good, c=np.array([np.inf])))                # inf given stays inf: nothing was lost
    assert np.isinf(buf._data["c"][2])


def test_bad_arguments_to_add_and_update_are_named_and_change_nothing():
    buf = ReplayBuffer(SCHEMA, 8, decay=0.1, seed=0)
    idx = buf.add(items(3))
    calls = []
    buf.on_add(calls.append)
    before = _state(buf)
    with pytest.raises(ReplayError, match="times"):
        buf.add(items(2), times="now")
    with pytest.raises(ReplayError, match="td"):
        buf.update_priorities(idx[:1], ["x"])
    with pytest.raises(ReplayError, match="indices"):
        buf.update_priorities([[0], [1, 2]], [1.0])
    assert buf.add(items(0)).tolist() == []       # an empty batch is a no-op, with or without decay
    assert _state(buf) == before and calls == []


def test_rate_limiter_refuses_infinite_or_non_numeric_settings():
    for kw, word in [({"samples_per_insert": 1, "tolerance": float("inf")}, "tolerance"),
                     ({"samples_per_insert": float("inf")}, "samples_per_insert"),
                     ({"samples_per_insert": "1"}, "samples_per_insert"),
                     ({"tolerance": float("nan")}, "tolerance")]:
        with pytest.raises(ReplayError, match=word):
            RateLimiter(**kw)
    lim = RateLimiter(samples_per_insert=np.float32(2.0), tolerance=np.int64(3))   # numpy numbers are fine
    assert lim.insert_room() == 2


def test_fifo_can_sample_follows_min_size_and_the_ratio_like_sample():
    """can_sample() told a FIFO learner yes below min_size (sample() then raised) and past the ratio."""
    lim = RateLimiter(min_size=4, samples_per_insert=1.0, tolerance=0)
    buf = ReplayBuffer(SCHEMA, 64, sampler="fifo", limiter=lim)
    buf.add(items(3))
    assert not buf.can_sample(1)
    with pytest.raises(ReplayError, match="min_size"):
        buf.sample(1)
    buf.add(items(3, 3))                     # 6 inserted, 2 above min_size: they pay for 2 samples
    assert buf.can_sample(2) and not buf.can_sample(3)
    assert len(buf.sample(2)) == 2
    assert not buf.can_sample(1)             # 4 unread, but the ratio is spent
    buf.add(items(1, 6))
    assert buf.can_sample(1) and not buf.can_sample(6)   # 5 unread


def test_items_decayed_to_nothing_leave_with_a_finite_priority():
    """An item far older than the decay base has a leaf of 0 (or subnormal): leaf·e^{+x} was NaN or
    Inf, and a receiver drops a message holding one such priority whole."""
    clock = Clock(1e6)
    buf = ReplayBuffer(SCHEMA, 8, alpha=1.0, decay=0.01, seed=0, clock=clock)
    gone = buf.add(items(2), times=clock.t - 1e5)          # e^-1000: the leaves are exactly 0
    faint = buf.add(items(1, 2), times=clock.t - 71_500)    # e^-715: a subnormal leaf, e^+715 overflows
    fresh = buf.add(items(2, 3))
    it = buf.items(np.concatenate([gone, faint, fresh]))
    assert np.isfinite(it.priorities).all()
    assert it.priorities[:2].tolist() == [0.0, 0.0]
    np.testing.assert_allclose(it.priorities[2:], 1.0, rtol=1e-6)
    other = ReplayBuffer(SCHEMA, 8, alpha=1.0, decay=0.01, seed=0, clock=clock, peer_id="other")
    assert other.insert(it).size == 5


def _from(origin, seq, peers=None):
    """One received item from ``origin`` (its message may list other ``peers`` too)."""
    peers = peers or [origin]
    return Items(items(1, seq), peers, np.array([peers.index(origin)], np.int32), np.array([seq]),
                 np.zeros(1), np.ones(1))


def test_origin_ids_no_stored_item_refers_to_are_dropped_and_the_rest_read_back():
    """Every restarted neighbour is a new origin id: the list grew by one per origin ever
    stored (10,001 here, ~140 B each) though a ring of 8 holds at most 8 of them."""
    from swarm.buffer import replay
    buf = ReplayBuffer(SCHEMA, 8, seed=0, peer_id="me")
    held = [None] * 8                       # the id each slot should hold
    longest = 0
    for i in range(10_000):
        if i % 7 == 0:
            idx = buf.add(items(1, i))
            ids = [("me", int(buf._seq[idx[0] % 8]))]
        else:   # a few messages list an origin whose item is not in them
            idx = buf.insert(_from(f"p{i}", i, [f"p{i}", f"q{i}"] if i % 5 == 0 else None))
            ids = [(f"p{i}", i)]
        held[int(idx[0]) % 8] = ids[0]
        longest = max(longest, len(buf.peers()))
        if i % 97 == 0 or i == 9_999:
            assert buf.ids() == held[:len(buf)]
    assert longest <= replay._COMPACT_PEERS + 1          # was 10,001 (every origin ever stored)
    assert buf.peers()[0] == "me" and set(buf.peers()) >= {p for p, _ in held}
    # the items read back under their own ids; deduplication still knows them
    it = buf.items(np.arange(buf.total_added - 8, buf.total_added))
    assert [(it.peers[o], int(s)) for o, s in zip(it.origins, it.seqs)] == held
    assert all(buf.contains(p, s) for p, s in held)
    assert buf._foreign.count == sum(p != "me" for p, _ in held)
    foreign = [(p, s) for p, s in held if p != "me"]
    assert all(buf.insert(_from(p, s)).size == 0 for p, s in foreign)
    assert buf.insert(_from("p1", 1)).size == 1            # an origin dropped long ago comes back
    assert buf.contains("p1", 1) and not buf.contains("p2", 2)


def test_origin_ids_are_not_renumbered_while_a_snapshot_is_written(tmp_path):
    """Renumbering the origin column under a snapshot would change the rows it has not
    copied yet while its meta.json keeps the old list: they would load under other ids."""
    from swarm.buffer.persist import Snapshot
    buf = ReplayBuffer(SCHEMA, 100, seed=0, peer_id="me")
    for i in range(50):
        buf.insert(_from(f"o{i}", i))
    before = buf.ids()
    snap = Snapshot(buf, tmp_path / "s")
    for i in range(70):                        # o0..o19's items are overwritten: 121 ids, 101 in use
        buf.insert(_from(f"n{i}", i))
    assert len(buf.peers()) == 121             # deferred
    snap.run().wait()
    assert ReplayBuffer.load(tmp_path / "s").ids() == before
    after = buf.ids()
    buf.insert(_from("late", 0))               # the snapshot is written: the next insert compacts
    after[20] = ("late", 0)                    # (it overwrites o20's item)
    assert len(buf.peers()) == 101 and buf.ids() == after
