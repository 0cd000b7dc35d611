"""Bad input to the replay buffer and its federation: a clear error, raised before anything
is written or sent; numpy scalars count as numbers, bools do not."""

import asyncio
import math

import numpy as np
import pytest

from fakelink import Hub
from swarm.buffer import Federation, Items, RateLimiter, ReplayBuffer
from swarm.buffer.federation import _slice
from swarm.errors import ConfigError, PeerTimeout, ReplayError
from swarm.wire import MAX_SRC_LEN

SCHEMA = {"obs": ("float32", (2,))}


def obs(n, v=1.0):
    return {"obs": np.full((n, 2), v, np.float32)}


def state(buf):
    """What an add or insert would change."""
    return (len(buf), buf.total_added, buf._next_seq, buf.limiter.inserted, buf.peers(),
            buf._tree.total, buf._time.tobytes(), buf._data["obs"].tobytes())


def counting(link):
    """Record the type of every message ``link`` is asked to send."""
    sent, orig = [], link.send

    async def send(dst, t, *args, **kw):
        sent.append(t)
        return await orig(dst, t, *args, **kw)

    link.send = send
    return sent


# ------------------------------------------------------------------ schema
def test_a_big_endian_schema_is_stored_native_and_its_items_are_shared():
    """'>f4' passed the schema check (its name is float32) but no item could go on the
    wire: every flush raised WireError, after taking the new items off its list."""
    async def main():
        hub = Hub()
        a = ReplayBuffer({"obs": (">f4", (2,))}, 8, first_seq=0, peer_id="a")
        b = ReplayBuffer(SCHEMA, 8, peer_id="b")
        fa = Federation(a, hub.link("a", ["b"]), share=1.0)
        Federation(b, hub.link("b", ["a"]))
        a.add({"obs": np.arange(4, dtype=">f4").reshape(2, 2)})
        assert await fa.flush() == 2
        await hub.settle()
        await hub.close()
        return a, b

    a, b = asyncio.run(main())
    assert a.schema.fields[0].dtype == np.dtype("float32") and a.schema.fields[0].dtype.isnative
    assert a.schema == b.schema
    assert sorted(b.ids()) == [("a", 0), ("a", 1)]
    assert sorted(b.items([0, 1]).fields["obs"].ravel().tolist()) == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("spec, word", [((None, (2,)), "None"), (("float32", (2.5,)), "ints"),
                                        (("float32", 2.5), "ints"),
                                        (("float32", (True,)), "ints"), (("float32", True), "ints"),
                                        (("float32", (2, np.float64(3))), "ints"),
                                        (("float32", "2"), "ints")])
def test_a_schema_refuses_a_none_dtype_and_shapes_that_are_not_ints(spec, word):
    # before: None became float64, 2.5 became 2, True became 1
    with pytest.raises(ReplayError, match=f"field 'a'.*{word}"):
        ReplayBuffer({"a": spec}, 4)


def test_a_schema_takes_numpy_int_dimensions():
    buf = ReplayBuffer({"a": ("int8", (np.int64(2), np.uint8(3))), "b": ("float32", np.int32(4))}, 4)
    assert [f.shape for f in buf.schema] == [(2, 3), (4,)]
    assert all(type(d) is int for f in buf.schema for d in f.shape)


# ------------------------------------------------------------------- clock
BAD_TIMES = [float("nan"), math.inf, None, "now", True]


@pytest.mark.parametrize("decay", [0.0, 0.1])
@pytest.mark.parametrize("bad", BAD_TIMES, ids=repr)
def test_a_clock_that_returns_no_finite_time_fails_an_add_before_it_writes(bad, decay):
    """Before: with decay a NaN clock wrote the items and then raised (no priorities set);
    without, None stored NaN origin times (every neighbour drops those items), 'now' a
    ValueError."""
    now = [100.0]
    buf = ReplayBuffer(SCHEMA, 4, decay=decay, clock=lambda: now[0], peer_id="me")
    buf.add(obs(1))
    before = state(buf)
    now[0] = bad
    for times in (None, 50.0):
        with pytest.raises(ReplayError, match="clock"):
            buf.add(obs(2, 7.0), times=times)
        assert state(buf) == before
    now[0] = 200.0
    assert buf.add(obs(1)).tolist() == [1]


@pytest.mark.parametrize("bad", BAD_TIMES, ids=repr)
def test_a_clock_that_returns_no_finite_time_fails_an_insert_before_it_writes(bad):
    src = ReplayBuffer(SCHEMA, 4, peer_id="src", clock=lambda: 10.0)
    src.add(obs(3))
    now = [100.0]
    buf = ReplayBuffer(SCHEMA, 4, peer_id="me", clock=lambda: now[0])
    before = state(buf)
    now[0] = bad
    with pytest.raises(ReplayError, match="clock"):
        buf.insert(src.items([0, 1, 2]))
    assert state(buf) == before
    assert buf.peers() == ["me"]


@pytest.mark.parametrize("bad", [float("nan"), None, "now"], ids=repr)
def test_a_decaying_buffer_refuses_a_bad_clock_when_made_and_when_ageing(bad):
    with pytest.raises(ReplayError, match="clock"):
        ReplayBuffer(SCHEMA, 4, decay=0.1, clock=lambda: bad)
    now = [100.0]
    buf = ReplayBuffer(SCHEMA, 4, decay=0.1, clock=lambda: now[0])
    buf.add(obs(2))
    now[0] = bad
    with pytest.raises(ReplayError, match="clock"):
        buf.rebase()
    with pytest.raises(ReplayError, match="clock"):
        buf.priorities([0, 1])


# -------------------------------------------------------- federation waits
@pytest.mark.parametrize("bad", [float("nan"), math.inf, -1, "x", True], ids=repr)
def test_pull_refuses_a_bad_timeout_before_it_sends(bad):
    """Before: NaN and inf waited for ever on a peer that never answers, -1 sent the pull
    and timed out at once, 'x' sent it and raised a TypeError."""
    async def main():
        hub = Hub()
        hub.link("mute", [])                     # no federation: never answers
        link = hub.link("b", ["mute"])
        fb = Federation(ReplayBuffer(SCHEMA, 8, peer_id="b"), link)
        sent = counting(link)
        try:
            with pytest.raises(ConfigError, match="timeout"):
                await asyncio.wait_for(fb.pull("mute", 2, timeout=bad), 5)
        finally:
            await hub.close()
        assert sent == [] and fb._pulls == {}
    asyncio.run(main())


@pytest.mark.parametrize("bad", [float("nan"), math.inf, -1, 0, "x", None], ids=repr)
def test_run_refuses_a_bad_interval_before_it_flushes(bad):
    """Before: NaN stalled after one flush, -1 (and 0) flushed without pause."""
    async def main():
        hub = Hub()
        a = ReplayBuffer(SCHEMA, 8, peer_id="a")
        link = hub.link("a", ["b"])
        fa = Federation(a, link, share=1.0)
        Federation(ReplayBuffer(SCHEMA, 8, peer_id="b"), hub.link("b", ["a"]))
        a.add(obs(2))
        sent = counting(link)
        try:
            with pytest.raises(ConfigError, match="interval"):
                await asyncio.wait_for(fa.run(interval=bad), 5)
        finally:
            await hub.close()
        assert sent == []
        assert len(fa._new) == 1                  # still to be shared at the next flush
    asyncio.run(main())


# ------------------------------------------------ numpy scalars, bools, types
def test_numpy_scalars_count_as_numbers():
    buf = ReplayBuffer(SCHEMA, np.int64(8), alpha=np.float32(0.5), eps=np.float64(1e-6),
                       decay=np.float32(0.0), limiter=RateLimiter(min_size=np.int64(2)))
    buf.add(obs(3))
    s = buf.sample(np.int64(2), beta=np.float32(0.4))
    assert len(s) == 2 and np.isfinite(s.weights).all()
    assert type(buf.limiter.min_size) is int and buf.limiter.state()["min_size"] == 2


@pytest.mark.parametrize("kw, word", [({"alpha": True}, "alpha"), ({"eps": True}, "eps"),
                                      ({"decay": True}, "decay"), ({"capacity": True}, "capacity")])
def test_a_bool_is_not_a_number_for_the_buffer(kw, word):
    kw = {"capacity": 8, **kw}
    with pytest.raises(ReplayError, match=word):
        ReplayBuffer(SCHEMA, **kw)


def test_a_bool_is_not_a_min_size():
    with pytest.raises(ReplayError, match="min_size"):
        RateLimiter(min_size=True)


@pytest.mark.parametrize("beta", [math.inf, True, float("nan"), -0.5])
def test_sample_refuses_a_beta_that_is_not_a_finite_number(beta):
    buf = ReplayBuffer(SCHEMA, 8, seed=0)
    buf.add(obs(4))
    with pytest.raises(ReplayError, match="beta"):
        buf.sample(2, beta=beta)
    assert buf.limiter.sampled == 0


@pytest.mark.parametrize("kw, word", [({"replicas": True}, "replicas"), ({"max_items": True}, "max_items"),
                                      ({"seed": -1}, "seed"), ({"seed": "x"}, "seed"),
                                      ({"seed": 1.5}, "seed")])
def test_federation_refuses_bad_counts_and_seeds(kw, word):
    hub = Hub()
    with pytest.raises(ReplayError, match=word):
        Federation(ReplayBuffer(SCHEMA, 8), hub.link("a", []), **kw)


def test_federation_refuses_what_is_not_a_buffer_or_a_link():
    hub = Hub()
    with pytest.raises(ReplayError, match="buffer must be a ReplayBuffer"):
        Federation(None, hub.link("a", []))
    with pytest.raises(ReplayError, match="Link shape"):
        Federation(ReplayBuffer(SCHEMA, 8), None)


def test_federation_takes_numpy_ints_and_pull_sizes():
    async def main():
        hub = Hub()
        a = ReplayBuffer(SCHEMA, 8, peer_id="a")
        a.add(obs(4))
        Federation(a, hub.link("a", ["b"]), share=0.0)
        b = ReplayBuffer(SCHEMA, 8, peer_id="b")
        link = hub.link("b", ["a"])
        fb = Federation(b, link, share=0.0, replicas=np.int64(0), max_items=np.int32(8), seed=np.int64(3))
        assert type(fb.replicas) is int and type(fb.max_items) is int
        sent = counting(link)
        with pytest.raises(ReplayError, match="pull size"):
            await fb.pull("a", True)
        assert sent == []
        got = await fb.pull("a", np.int64(3), timeout=5.0)
        await hub.close()
        return got, b

    got, b = asyncio.run(main())
    assert 0 < got <= 3 and len(b) == got


# ----------------------------------------------------------------- insert
def one(seqs):
    seqs = np.asarray(seqs)
    n = seqs.size
    return Items({"obs": np.ones((n, 2), np.float32)}, ["x"], np.zeros(n, np.int32), seqs,
                 np.zeros(n), np.ones(n))


@pytest.mark.parametrize("bad", [{"obs": np.ones((1, 2), np.float32)}, None], ids=["dict", "None"])
def test_insert_takes_only_items(bad):
    buf = ReplayBuffer(SCHEMA, 8)
    with pytest.raises(ReplayError, match="Items"):
        buf.insert(bad)


@pytest.mark.parametrize("seqs", [np.array([3, 2**64 - 1], np.uint64), np.array([3, -1], np.int64)],
                         ids=["uint64 past int64", "negative"])
def test_insert_refuses_seqs_that_are_no_id(seqs):
    """Before: 2**64-1 was stored as seq -1, a negative id no origin ever issues."""
    buf = ReplayBuffer(SCHEMA, 8, peer_id="me")
    before = state(buf)
    with pytest.raises(ReplayError, match="seqs"):
        buf.insert(one(seqs))
    assert state(buf) == before
    assert buf.insert(one(np.array([3, 2**63 - 1], np.uint64))).size == 2
    assert sorted(buf.ids()) == [("x", 3), ("x", 2**63 - 1)]


@pytest.mark.parametrize("peers", ["xy", b"xy", None], ids=repr)
def test_insert_refuses_peers_that_are_no_list(peers):
    """Before: "xy" was taken as the list ["x", "y"] and the item stored as one of peer x."""
    buf = ReplayBuffer(SCHEMA, 8, peer_id="me")
    before = state(buf)
    items = Items(obs(1), peers, np.zeros(1, np.int32), np.zeros(1, np.int64), np.zeros(1), np.ones(1))
    with pytest.raises(ReplayError, match="items.peers"):
        buf.insert(items)
    assert state(buf) == before


# --------------------------------------------------------- big schemas
@pytest.mark.parametrize("schema, capacity, word", [
    ({"obs": ("float32", (10**6, 10**6))}, 1000, "field 'obs'.*capacity 1000.*TiB"),   # past the address space
    ({"obs": ("float32", (10**9, 10**9, 10**9))}, 4, "field 'obs'.*capacity 4.*bytes"),      # past numpy's largest size
    ({"a": ("int8", ())}, 2**50, "field 'a'.*capacity 1125899906842624.*bytes"),
])
def test_a_buffer_too_large_to_allocate_is_a_replay_error_naming_field_and_size(schema, capacity, word):
    """Before: a raw MemoryError (or ValueError) from numpy."""
    with pytest.raises(ReplayError, match=word):
        ReplayBuffer(schema, capacity)


# --------------------------------------------------------- snapshots
@pytest.mark.parametrize("bad", BAD_TIMES, ids=repr)
def test_save_refuses_a_bad_clock_before_it_writes(bad, tmp_path):
    """Before: NaN and inf were written into meta.json (NaN is no JSON), None and 'now'
    raised a raw TypeError / ValueError."""
    now = [100.0]
    buf = ReplayBuffer(SCHEMA, 4, clock=lambda: now[0])
    buf.add(obs(2))
    now[0] = bad
    with pytest.raises(ReplayError, match="clock"):
        buf.save(tmp_path / "snap")
    assert list(tmp_path.iterdir()) == []
    now[0] = 101.0
    buf.save(tmp_path / "snap")                   # the buffer is not left locked by the failed save
    assert len(ReplayBuffer.load(tmp_path / "snap")) == 2


# --------------------------------------------------- rides, rates, windows
@pytest.mark.parametrize("src, body, arrays", [("b", None, []), ("b", {"fields": ["obs"]}, None),
                                               (None, {"fields": ["obs"]}, []), ("b", [], [])], ids=repr)
def test_arrive_counts_and_drops_a_ride_that_is_no_body_and_arrays(src, body, arrays):
    """Before: a None body raised AttributeError on the thread that takes gradients in."""
    buf = ReplayBuffer(SCHEMA, 8, peer_id="a")
    fed = Federation(buf, Hub().link("a", ["b"]), ride=True)
    fed.arrive(src, body, arrays)
    assert fed.stats.dropped_messages == 1 and "a ride needs" in fed.stats.errors[0]
    assert len(buf) == 0


@pytest.mark.parametrize("burst", [-5, 0, 0.5, math.nan, math.inf, "3", True], ids=repr)
def test_a_burst_is_checked_with_no_rate_too(burst):
    """Before: with rate=None any finite burst (-5, 0) passed; it has no effect there,
    but the same value with a rate is refused."""
    from swarm.buffer.limiter import TokenBucket
    with pytest.raises(ReplayError, match="burst"):
        TokenBucket(None, burst)
    with pytest.raises(ReplayError, match="burst"):
        Federation(ReplayBuffer(SCHEMA, 8), Hub().link("a", []), rate=None, burst=burst)


def test_no_rate_and_a_good_burst_are_accepted():
    from swarm.buffer.limiter import TokenBucket
    assert TokenBucket(None).take(10**6) == 10**6
    assert TokenBucket(None, 5).take(10**6) == 10**6
    assert TokenBucket(10.0, np.float32(2)).take(5) == 2


@pytest.mark.parametrize("bad", [math.inf, math.nan, -1.0, True, "300"], ids=repr)
def test_rereplicate_s_must_be_finite(bad):
    """Before: inf was taken: every ack went into one bucket that never closed (never
    pruned either), kept for the run."""
    with pytest.raises(ReplayError, match="rereplicate_s"):
        Federation(ReplayBuffer(SCHEMA, 8), Hub().link("a", []), rereplicate_s=bad)
    Federation(ReplayBuffer(SCHEMA, 8), Hub().link("b", []), rereplicate_s=0)


# ------------------------------------------------------ what other peers send
@pytest.mark.parametrize("body", [{"n": True, "rid": 1}, {"n": 2, "rid": True}, {"n": 2.0, "rid": 1}],
                         ids=["n True", "rid True", "n float"])
def test_a_pull_request_with_a_bool_count_or_rid_is_dropped_and_answered_with_nothing(body):
    # n=True passed as a count and reached the sampler, whose TypeError left the handler
    async def main():
        hub = Hub()
        a = ReplayBuffer(SCHEMA, 8, peer_id="a")
        a.add(obs(4))
        fa = Federation(a, hub.link("a", ["evil"]), share=0.0)
        evil = hub.link("evil", ["a"])
        answers = []
        evil.on("buf.items", answers.append)
        assert await evil.send("a", "buf.pull", body)
        await hub.settle()      # a handler's exception would be raised here
        await hub.close()
        return fa, answers

    fa, answers = asyncio.run(main())
    assert fa.stats.dropped_messages == 1 and "bad pull request" in fa.stats.errors[0]
    assert answers == [] and fa.stats.served == 0


def test_a_pull_answer_from_a_peer_not_asked_is_dropped():
    # answers were matched by rid alone (rids count up from 1 and pushes carry them too):
    # a third peer's answer was stored as the asked peer's, and the real answer ignored
    async def main():
        hub = Hub()
        hub.link("a", ["b"])                    # asked, and never answers
        b = ReplayBuffer(SCHEMA, 8, peer_id="b")
        fb = Federation(b, hub.link("b", ["a", "evil"]), share=0.0)
        e = ReplayBuffer(SCHEMA, 8, peer_id="evil")
        e.add(obs(2, 9.0))
        fe = Federation(e, hub.link("evil", ["b"]), share=0.0)
        pulling = asyncio.create_task(fb.pull("a", 2, timeout=1.0))
        await asyncio.sleep(0.05)
        (rid,) = fb._pulls
        assert await fe._send_items("b", "buf.items", e.items([0, 1]), {"rid": rid})
        await hub.settle()
        with pytest.raises(PeerTimeout, match="'a'"):
            await pulling
        await hub.close()
        return b, fb

    b, fb = asyncio.run(main())
    assert len(b) == 0 and b.ids() == []
    assert fb.stats.dropped_messages == 1 and "sent to 'a'" in fb.stats.errors[0]


@pytest.mark.parametrize("n", [0, MAX_SRC_LEN + 1])
def test_origin_ids_that_cannot_be_peer_ids_are_refused(n):
    # any length was kept, as long as the origin's items stayed (and went into meta.json)
    buf = ReplayBuffer(SCHEMA, 8, peer_id="b")
    buf.insert(Items(obs(1), ["x" * MAX_SRC_LEN], np.zeros(1, np.int32), np.array([5]), np.zeros(1), np.ones(1)))
    before = state(buf)
    with pytest.raises(ReplayError, match=f"1 to {MAX_SRC_LEN} chars"):
        buf.insert(Items(obs(1), ["y" * n], np.zeros(1, np.int32), np.array([5]), np.zeros(1), np.ones(1)))
    assert state(buf) == before
    with pytest.raises(ReplayError, match="peer_id"):
        ReplayBuffer(SCHEMA, 8, peer_id="y" * n)


def test_a_cut_answer_names_only_the_origins_it_holds():
    # a pull answer the wire refused for its header is cut in half and tried again; the
    # halves named every origin of the whole, so a header of long ids never got smaller
    peers = [f"p{i}" * 40 for i in range(4)]
    items = Items(obs(5), peers, np.array([3, 1, 3, 0, 2], np.int32), np.arange(10, 15), np.zeros(5),
                  np.ones(5))
    for sel in (slice(0, 3), slice(1, 3), slice(3, None), slice(0, 0)):
        cut = _slice(items, sel)
        ids = [(items.peers[o], int(s)) for o, s in zip(items.origins[sel], items.seqs[sel])]
        assert [(cut.peers[o], int(s)) for o, s in zip(cut.origins, cut.seqs)] == ids
        assert sorted(cut.peers) == sorted({p for p, _ in ids}) and cut.origins.dtype == np.int32


# --------------------------------------------------------------- found by the thirty-eighth session's review

def test_a_nan_beside_a_float32_overflow_does_not_hide_it():
    buf = ReplayBuffer(SCHEMA, 8)
    before = state(buf)
    with pytest.raises(ReplayError, match="'obs': 1e\\+39 overflows float32"):
        buf.add({"obs": np.array([[np.nan, 1e39]])})
    assert state(buf) == before
    buf.add({"obs": np.array([[np.nan, 1.0]])})   # a NaN alone is stored as given
    assert len(buf) == 1


def test_ragged_items_are_a_replay_error_naming_the_field():
    buf = ReplayBuffer(SCHEMA, 8)
    before = state(buf)
    with pytest.raises(ReplayError, match="field 'obs': not an array numpy can make"):
        buf.add({"obs": [[1.0, 2.0], [3.0]]})
    assert state(buf) == before


def test_a_nan_td_error_is_refused_also_with_alpha_0():
    # NaN ** 0 is 1: the priorities alone would not show it
    buf = ReplayBuffer(SCHEMA, 8, alpha=0.0)
    idx = buf.add(obs(3))
    buf.update_priorities(idx, [1.0, 2.0, 3.0])
    before = buf.priorities(idx).tolist()
    for bad in (math.nan, math.inf):
        with pytest.raises(ReplayError, match="NaN or Inf"):
            buf.update_priorities(idx, [bad, 1.0, 1.0])
    assert buf.priorities(idx).tolist() == before


def test_finite_priorities_never_add_up_to_an_infinite_total():
    buf = ReplayBuffer(SCHEMA, 8, alpha=8.0, seed=0)
    idx = buf.add(obs(8))
    big = np.float32(3e38)   # a float32 TD error's largest: 6e305 to the 8th, three of them inf
    assert buf.update_priorities(idx[:3], [big] * 3) == 3
    assert math.isfinite(buf._tree.total)
    drawn = set(buf.sample(64).indices.tolist())
    assert drawn <= set(idx[:3].tolist()) and drawn


def test_a_rebase_far_back_that_would_overflow_is_refused_and_changes_nothing():
    now = [100.0]
    buf = ReplayBuffer(SCHEMA, 4, decay=0.01, clock=lambda: now[0])
    idx = buf.add(obs(2))
    before = buf.priorities(idx).tolist(), buf._tree.total
    with pytest.raises(ReplayError, match="would overflow"):
        buf.rebase(-1e6)
    assert (buf.priorities(idx).tolist(), buf._tree.total) == before
    buf.rebase(50.0)   # a base moved back within range still works
    assert buf.priorities(idx).tolist() == pytest.approx(before[0])


def test_a_tiny_ratio_leaves_insert_room_unbounded_instead_of_overflowing():
    lim = RateLimiter(1, 1e-310)
    assert lim.insert_room() == 1 << 62
    buf = ReplayBuffer(SCHEMA, 8, limiter=lim)
    items = Items(obs(2), ["b"], np.zeros(2, np.int32), np.arange(2), np.zeros(2), np.ones(2))
    assert buf.insert(items, limit=True).size == 2


@pytest.mark.parametrize("key,bad", [("inserted", -1000), ("sampled", 2.5), ("min_size", 1.5),
                                     ("tolerance", "x"), ("inserted", True)])
def test_a_snapshot_whose_limiter_counts_are_no_counts_is_refused(tmp_path, key, bad):
    import json
    buf = ReplayBuffer(SCHEMA, 8)
    buf.add(obs(2))
    buf.save(tmp_path / "snap")
    meta = json.loads((tmp_path / "snap" / "meta.json").read_text())
    meta["limiter"][key] = bad
    (tmp_path / "snap" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ReplayError, match="meta.json"):
        ReplayBuffer.load(tmp_path / "snap")


def test_forget_takes_live_items_out_of_sampling_and_refuses_foreign_indices():
    buf = ReplayBuffer(SCHEMA, 8, seed=0)
    idx = buf.add(obs(8))
    assert buf.forget(idx[:6]) == 6
    assert set(buf.sample(64).indices.tolist()) <= {6, 7}
    with pytest.raises(ReplayError, match="not from this buffer"):
        buf.forget([8])
    buf.add(obs(2))          # 0 and 1 overwritten: their old indices are stale, not errors
    assert buf.forget(idx[:2]) == 0
    assert ReplayBuffer(SCHEMA, 8, sampler="uniform").forget([]) == 0


def test_finite_priorities_add_up_to_a_finite_total_with_age_decay_too():
    # the leaf is the raw priority times exp(decay * age), up to e^40 before a rebase
    now = [1000.0]
    buf = ReplayBuffer(SCHEMA, 8, alpha=8.0, decay=1.0, clock=lambda: now[0], seed=0)
    buf.add(obs(4))
    now[0] += 35
    idx = buf.add(obs(4))
    buf.update_priorities(idx, np.full(4, 3e38, np.float32))
    assert math.isfinite(buf._tree.total)
    assert np.isfinite(buf.sample(8, beta=0.4).weights).all()
