"""The gossip engine on the in-memory hub: convergence against theory, mean
preservation, rejection of bad deltas, view changes, sync modes."""

import asyncio
import math

import numpy as np
import pytest

from swarm import wire
from swarm.errors import ConfigError, GossipError
from swarm.gossip import Gossip, mixing_matrix, spectrum
from swarm.gossip.engine import T_DELTA, T_FULL
from swarm.gossip.sim import SimHub, consensus_error, run_rounds
from swarm.gossip.topology import rounds_to_epsilon


def make(n, d=256, topology="ring", seed=0, **kw):
    hub = SimHub(topology=topology, **{k: kw.pop(k) for k in ("bandwidth_bps", "latency_s") if k in kw})
    links = hub.add_many(n)
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(d).astype(np.float32) + i for i in range(n)]
    engines = [Gossip(l, x, topology=topology, **kw) for l, x in zip(links, xs)]
    return hub, links, xs, engines


@pytest.mark.parametrize("topology,n,bound", [
    ("ring", 16, 133), ("torus", 16, 14), ("one_peer_exponential", 16, 4),
])
def test_exact_gossip_within_theoretical_bound(topology, n, bound):
    async def main():
        hub, _, xs, engines = make(n, topology=topology)
        e0 = consensus_error(xs)
        res = await run_rounds(engines, bound, until=lambda: consensus_error(xs, e0) < 1e-3)
        assert consensus_error(xs, e0) < 1e-3
        assert all(r.ok for rnd in res for r in rnd)
        assert not hub.errors
        return len(res)
    rounds = asyncio.run(main())
    if topology != "one_peer_exponential":
        assert rounds <= rounds_to_epsilon(spectrum(mixing_matrix(topology, n)).rho)


def test_exact_gossip_is_w_times_x():
    async def main():
        _, _, xs, engines = make(8, d=32, topology="ring")
        before = np.stack(xs).astype(np.float64)
        await run_rounds(engines, 1)
        np.testing.assert_allclose(np.stack(xs), mixing_matrix("ring", 8) @ before, rtol=1e-5, atol=1e-5)
    asyncio.run(main())


def _codecs():
    try:
        from swarm.compress import get_codec  # noqa: F401
    except ImportError:
        return [("identity", 1.0)]
    # gamma per codec: CHOCO's step must shrink with the codec's quality
    return [("identity", 1.0), ("fp16", 1.0), ("int8", 0.6), ("qsgd:16", 0.6), ("topk:0.1", 0.1),
            ("randomk:0.1", 0.1), ("sign", 0.3), ("ef+topk:0.1", 0.1), ("ef+sign", 0.3)]


@pytest.mark.parametrize("codec,gamma", _codecs())
def test_mean_preserved_under_codec(codec, gamma):
    async def main():
        _, _, xs, engines = make(8, d=512, topology="ring", codec=codec, gamma=gamma)
        m0 = np.mean(np.stack(xs).astype(np.float64), 0)
        e0 = consensus_error(xs)
        await run_rounds(engines, 40)
        m = np.mean(np.stack(xs).astype(np.float64), 0)
        assert np.linalg.norm(m - m0) / np.linalg.norm(m0) < 1e-6
        assert consensus_error(xs, e0) < 0.9  # and it does move towards consensus
    asyncio.run(main())


@pytest.mark.parametrize("codec", ["identity", "fp16"])
def test_nan_and_wrong_size_deltas_rejected_and_counted(codec):
    async def main():
        hub, links, xs, engines = make(5, d=16, topology="ring", codec=codec)
        e0 = consensus_error(xs)
        await run_rounds(engines, 2)
        target = engines[0]
        before = xs[0].copy()
        hat_before = target._in["p001"].hat.copy()
        bad = np.full(16, np.nan, np.float32)
        ver = engines[1]._out[""].ver + 1   # the stream's next version
        await links[1].send("p000", T_DELTA, {"r": 2, "ver": ver, "meta": {"codec": "identity", "n": 16}}, [bad])
        await links[1].send("p000", T_FULL, {"r": 2, "ver": ver}, [np.zeros(5, np.float32)])
        await asyncio.sleep(0)
        target._apply_pending("p001", target._in["p001"], None)
        assert target.stats.rejected_nonfinite == 1 and target.stats.rejected_size == 1
        np.testing.assert_array_equal(xs[0], before)
        np.testing.assert_array_equal(target._in["p001"].hat, hat_before)
        res = await run_rounds(engines, 40)
        if codec == "identity":
            # every identity message is the sender's whole state: the next one repairs the copy
            assert "p001" in res[0][0].participants
        else:
            # the copy is unusable until a full state arrives; a nack gets one and gossip recovers
            assert "p001" in res[0][0].missing and "p001" in res[2][0].participants
        assert all(r.waited_s < 1.0 for rnd in res for r in rnd)  # nobody burnt the timeout
        assert consensus_error(xs, e0) < 1e-3
    asyncio.run(main())


def test_overflowing_delta_spoils_only_the_copy():
    """Finite values whose sum with the copy overflows: counted as non-finite, the
    copy is not mixed (x untouched) until a full state repairs it."""
    async def main():
        hub, links, xs, engines = make(3, d=8, topology="ring")
        await run_rounds(engines, 2)
        target = engines[0]
        target._in["p001"].hat[:] = 3e38
        before = xs[0].copy()
        big = np.full(8, 3e38, np.float32)
        await links[1].send("p000", T_DELTA, {"r": 2, "ver": 3, "meta": {"codec": "identity", "n": 8}}, [big])
        await asyncio.sleep(0)
        target._apply_pending("p001", target._in["p001"], None)
        assert target.stats.rejected_nonfinite == 1 and target._in["p001"].ver == -1
        np.testing.assert_array_equal(xs[0], before)
    asyncio.run(main())


@pytest.mark.parametrize("codec,topology", [("qsgd:8", "ring"), ("qsgd:4", "ring"), ("qsgd:2", "torus")])
def test_coarse_qsgd_is_rescaled_and_converges(codec, topology):
    """QSGD with few levels is no contraction (ω = min(B/4s², √B/s) ≥ 1): unscaled,
    CHOCO's public copies grew to Inf and the round raised. Rescaled by 1/(1 + ω)
    on both ends, with γ = 'auto', it converges, keeps the mean, and the copies agree."""
    async def main():
        hub, _, xs, engines = make(8 if topology == "ring" else 16, d=2000, topology=topology,
                                   codec=codec, gamma="auto")
        m0 = np.mean(np.stack(xs).astype(np.float64), 0)
        e0 = consensus_error(xs)
        await run_rounds(engines, 1500, until=lambda: consensus_error(xs, e0) < 1e-3)
        assert consensus_error(xs, e0) < 1e-3
        m = np.mean(np.stack(xs).astype(np.float64), 0)
        assert np.linalg.norm(m - m0) / np.linalg.norm(m0) < 1e-5
        # both ends of every stream hold the same public copy, bit for bit
        for e in engines:
            for src, copy in e._in.items():
                sender = next(s for s in engines if s.link.id == src)
                np.testing.assert_array_equal(copy.hat, sender._out[""].hat)
        assert not hub.errors
    asyncio.run(main())


@pytest.mark.parametrize("d,scaled", [(100, False), (200, False), (256, True), (300, True), (2000, True)])
def test_qsgd_rescaling_takes_omega_from_the_bucket_a_vector_fills(d, scaled):
    """ω = min(B/4s², √B/s) bounds each bucket's variance and grows with B, and a
    vector shorter than a bucket is one bucket of d: qsgd:8 (buckets of 512, ω = 2)
    on d = 200 has ω = 0.78 < 1, a contraction as it is, so neither end rescales
    (the first rounds' copies were a third of the delta, slowing every round);
    at d = 256, ω = 1 exactly, already no contraction: rescaled by 1/2; at d = 300,
    ω = 1.17, and from 512 on, 2."""
    from swarm.compress import get_codec
    from swarm.gossip._codecs import copy_scale

    B = min(512, d)
    omega = min(B / 256, B ** 0.5 / 8)
    assert copy_scale({"codec": "qsgd", "levels": 8, "block": 512, "n": d}) == \
        (1 / (1 + omega) if scaled else 1.0)
    assert copy_scale({"codec": "qsgd", "levels": 8, "block": 512}) == 1 / 3   # no n: the bucket
    # qsgd:8:bucket=256 has ω = 1 on any vector that fills a bucket: the boundary is rescaled
    assert copy_scale({"codec": "qsgd", "levels": 8, "block": 256, "n": 10_000}) == 0.5
    assert copy_scale({"codec": "qsgd", "levels": 8, "block": 256}) == 0.5

    async def main():
        _, links, xs, engines = make(2, d=d, codec="qsgd:8", gamma=0.5)
        x0 = [x.copy() for x in xs]   # each stream starts from x, sent full
        await run_rounds(engines, 1)
        x1 = [x.copy() for x in xs]
        res = await run_rounds(engines, 1)
        assert all(r.ok for rnd in res for r in rnd)
        return links, engines, x0, x1
    links, engines, x0, x1 = asyncio.run(main())
    for e, other, start, x in zip(engines, reversed(engines), x0, x1):
        own = e._out[""].hat   # the first delta was x1 − x0: the copy is x0 plus its decoded levels
        assert np.array_equal(other._in[e.link.id].hat, own)
        mult = get_codec("qsgd:8").encode(x - start).frames[1]   # the bucket norms / 8 (not random)
        levels = (own - start) / np.repeat(mult, B)[:d]
        frac = np.abs(levels - np.rint(levels))
        if scaled:   # levels / (1 + ω): most fall between integers
            assert frac.max() > 0.1
        else:        # whole levels: the copy is the decoded delta, unscaled
            assert frac.max() < 1e-4 and np.abs(levels).max() <= 8


@pytest.mark.parametrize("codec,gamma", [("identity", 1.0), ("fp16", 1.0), ("int8", 0.6), ("sign", 1.0),
                                         ("topk:0.01", 0.02), ("ef+topk:0.1", 0.2), ("randomk:0.1", 0.1),
                                         ("ef+topk:0.01:values=fp16", 0.02), ("randomk:0.1:seed=3", 0.1)])
def test_auto_gamma_per_codec(codec, gamma):
    from swarm.gossip import suggested_gamma
    assert suggested_gamma(codec) == pytest.approx(gamma)
    hub = SimHub()
    (link,) = hub.add_many(1)
    assert Gossip(link, np.zeros(4, np.float32), codec=codec, gamma="auto").gamma == pytest.approx(gamma)


def test_spec_default_codec_with_auto_gamma_converges_and_gamma_1_warns(caplog):
    """The experiment spec's default codec, ef+topk:0.01, diverges at γ = 1 (so the
    engine warns) and converges at γ = 'auto'."""
    async def main():
        _, _, xs, engines = make(6, d=2000, topology="ring", codec="ef+topk:0.01", gamma="auto")
        e0 = consensus_error(xs)
        await run_rounds(engines, 150)
        return consensus_error(xs, e0)
    assert asyncio.run(main()) < 0.5
    with caplog.at_level("WARNING", logger="swarm.gossip.engine"):
        hub = SimHub()
        (link,) = hub.add_many(1)
        Gossip(link, np.zeros(4, np.float32), codec="ef+topk:0.01", gamma=1.0)
    assert "divergence" in caplog.text


@pytest.mark.parametrize("topology", ["ring", "one_peer_exponential"])
@pytest.mark.parametrize("codec", ["identity", "fp16", "int8", "sign", "topk:0.5", "randomk:0.5",
                                   "ef+topk:0.5"])
def test_a_round_with_non_finite_params_raises_and_changes_nothing(codec, topology):
    """NaN/Inf in a peer's own x: GossipError before anything is sent or changed, for
    every codec (top-k never sends a NaN coordinate, so neighbours would average
    towards a stale copy; dense codecs' messages would all be refused)."""
    async def main():
        hub, _, xs, engines = make(4, d=70_000, topology=topology, codec=codec, gamma="auto")
        e = engines[0]
        # in the first round (a stream starts from x) and in later ones (x − x̂, checked
        # a block at a time: the bad value in the first block, the last, between)
        for rounds, at, bad in [(0, 5, math.nan), (2, 69_999, math.inf), (2, 66_000, -math.inf), (2, 5, math.nan)]:
            if e.stats.rounds < rounds:
                await run_rounds(engines, rounds)
            xs[0][at] = bad
            before, sent, t = xs[0].copy(), hub.messages_sent, e.t
            hats = {k: (s.ver, s.hat.copy()) for k, s in e._out.items()}
            with pytest.raises(GossipError, match="NaN or Inf"):
                await e.round()
            np.testing.assert_array_equal(xs[0], before)
            assert hub.messages_sent == sent and e.t == t and e.stats.rounds == rounds
            for k, s in e._out.items():   # public copies as they were (a new one: never sent)
                ver, hat = hats.get(k, (0, np.zeros(70_000, np.float32)))
                assert s.ver == ver and np.array_equal(s.hat, hat)
            xs[0][at] = 0.0     # repaired: it gossips on, and its neighbours with it
        res = await run_rounds(engines, 2)
        assert all(r.ok and r.rejected == 0 for rnd in res for r in rnd) and not hub.errors
    asyncio.run(main())


def test_a_lone_peer_with_non_finite_params_raises_too():
    async def main():
        _, _, xs, engines = make(1, d=8)
        xs[0][3] = math.nan
        with pytest.raises(GossipError, match="NaN or Inf"):
            await engines[0].round()
        assert engines[0].t == 0 and engines[0].stats.rounds == 0
    asyncio.run(main())


def test_ef_prefix_is_case_insensitive():
    """"EF+X" runs as X (CHOCO's own feedback), like "ef+X"."""
    async def main():
        _, _, xs, engines = make(4, d=64, topology="ring", codec="EF+topk:0.5", gamma="auto")
        assert engines[0].gamma == 1.0
        assert all(type(s.codec).__name__ == "TopK" for s in engines[0]._out.values())
        m0 = np.mean(np.stack(xs).astype(np.float64), 0)
        res = await run_rounds(engines, 5)
        assert all(r.ok for rnd in res for r in rnd)
        np.testing.assert_allclose(np.mean(np.stack(xs), 0), m0, atol=1e-5)
    asyncio.run(main())


def test_nan_delta_through_a_round_never_reaches_params():
    async def main():
        hub, links, xs, engines = make(3, d=16, topology="ring", sync="async")
        await run_rounds(engines, 1)
        await links[2].send("p000", T_DELTA, {"r": 1, "ver": 2, "meta": {"codec": "identity", "n": 16}},
                            [np.full(16, np.inf, np.float32)])
        await asyncio.sleep(0)
        r = await engines[0].round()
        assert r.rejected == 1 and np.isfinite(xs[0]).all()
    asyncio.run(main())


def test_alone_is_not_success():
    async def main():
        hub, _, xs, engines = make(1, d=8)
        before = xs[0].copy()
        r = await engines[0].round()
        assert not r.ok and r.participants == [] and "alone" in r.reason
        np.testing.assert_array_equal(xs[0], before)
    asyncio.run(main())


def test_killed_peer_survivors_relink_and_converge():
    async def main():
        # a delta codec: identity messages are whole states, so they need no full-state resync
        hub, _, xs, engines = make(8, d=64, topology="ring", round_timeout=0.5, codec="fp16")
        await run_rounds(engines, 5)
        hub.remove("p003")
        live = [e for e in engines if e.link.id != "p003"]
        lx = [e.x for e in live]
        m0 = np.mean(np.stack(lx).astype(np.float64), 0)
        e0 = consensus_error(lx)
        res = await run_rounds(live, 200, until=lambda: consensus_error(lx, e0) < 1e-3)
        assert consensus_error(lx, e0) < 1e-3
        # p002 and p004 became neighbours: each got the other's full state once
        assert res[0][2].full_sent >= 1 and "p004" in res[0][2].participants
        assert all(r.ok for rnd in res for r in rnd)
        np.testing.assert_allclose(np.mean(np.stack(lx), 0), m0, rtol=1e-4, atol=1e-5)
    asyncio.run(main())


def test_joiner_gets_full_state_and_adopts_round():
    async def main():
        hub, links, xs, engines = make(4, d=32, topology="ring")
        await run_rounds(engines, 3)
        link = hub.add("late")
        xl = np.full(32, 100.0, np.float32)
        late = Gossip(link, xl, topology="ring")
        await asyncio.gather(*(e.round() for e in engines))  # they send full state to it
        r = await late.round()
        assert r.round == 3 and r.ok and late.stats.out_of_sync == 0
        all_x = xs + [xl]
        e0 = consensus_error(all_x)
        await run_rounds(engines + [late], 100, until=lambda: consensus_error(all_x, e0) < 1e-3)
        assert consensus_error(all_x, e0) < 1e-3
    asyncio.run(main())


def test_lost_delta_is_repaired_by_nack_and_full_state():
    async def main():
        hub, links, xs, engines = make(4, d=32, topology="ring", codec="fp16")
        await run_rounds(engines, 2)
        # lose one message: drop what p001 queued for p000 by skipping a version
        engines[1]._out[""].ver += 1
        await run_rounds(engines, 3)
        assert engines[0].stats.out_of_sync >= 1 and engines[1].stats.full_sent >= 1
        e0 = consensus_error(xs)
        await run_rounds(engines, 60)
        assert consensus_error(xs, e0) < 1e-3
    asyncio.run(main())


def _slow_neighbour(sync, **kw):
    """p000's neighbour p001 runs no rounds; how long does p000's round wait? Returns the
    round's result, every x before it (after a local step moved p000's), and p000's x
    after it."""
    async def main():
        hub, links, xs, engines = make(3, d=8, topology="ring", sync=sync, round_timeout=0.3, **kw)
        await run_rounds(engines, 2)
        xs[0] += np.arange(8, dtype=np.float32) - 20.0   # a local step between rounds
        before = [x.copy() for x in xs]
        r0 = await asyncio.gather(engines[0].round(), engines[2].round())
        return r0[0], before, xs[0].copy()
    return asyncio.run(main())


def test_lockstep_waits_then_reports_missing():
    r, before, after = _slow_neighbour("lockstep")
    assert r.waited_s >= 0.25 and r.missing == ["p001"] and r.participants == ["p002"]
    # and mixes p002 alone, with its own weight on both sides: x0 + γ w02 (x2 − x0) (γ = 1,
    # identity copies). Subtracting the late p001's weight too pulled x0 towards 0.
    w02 = mixing_matrix("ring", 3)[0, 2]
    assert w02 == pytest.approx(1 / 3)
    np.testing.assert_allclose(after, before[0] + w02 * (before[2] - before[0]), rtol=1e-6, atol=1e-6)


def test_async_never_waits():
    r, _, _ = _slow_neighbour("async")
    assert r.waited_s < 0.25 and set(r.participants) == {"p001", "p002"}
    assert r.staleness["p001"] == 1


def test_bounded_waits_only_past_max_staleness():
    r, _, _ = _slow_neighbour("bounded", max_staleness=1)
    assert r.waited_s < 0.25 and set(r.participants) == {"p001", "p002"}

    async def main():
        hub, links, xs, engines = make(3, d=8, topology="ring", sync="bounded", max_staleness=1,
                                       round_timeout=0.3)
        await run_rounds(engines, 2)
        await asyncio.gather(engines[0].round(), engines[2].round())
        r = (await asyncio.gather(engines[0].round(), engines[2].round()))[0]
        return r
    r = asyncio.run(main())  # now p001 is 2 rounds behind: p000 waits and leaves it out
    assert r.waited_s >= 0.25 and r.missing == ["p001"]


def test_a_message_arriving_while_a_nack_is_sent_ends_the_wait():
    # A nack goes out from inside the round's wait loop, and Peer.send yields when
    # the neighbour's queue is full. A message that arrived meanwhile from a sender
    # already looked at used to be forgotten (the arrival flag was cleared after the
    # nack), so the round waited out round_timeout with every state it needed in hand.
    async def main():
        hub, links, xs, engines = make(3, d=16, topology="ring", codec="fp16", round_timeout=60.0)
        await run_rounds(engines, 2)
        first, nacked = list(engines[0]._in)       # the order p000 looks at its senders in
        late, gap = (engines[int(p[1:])] for p in (first, nacked))
        gap._out[""].ver += 1                      # p000 will see a gap and nack
        go = asyncio.Event()
        send = links[0].send

        async def slow_nack(dst, t, body=None, arrays=(), *, timeout=None):
            if t == "gsp_nack":
                go.set()                           # the other state arrives now ...
                for _ in range(100):
                    if engines[0]._in[first].pending:
                        break
                    await asyncio.sleep(0)
            return await send(dst, t, body, arrays, timeout=timeout)
        links[0].send = slow_nack

        async def later():
            await go.wait()
            return await late.round()
        other = asyncio.create_task(later())
        # ... and p000's round ends with it (the 30 s guard only stops a hung test)
        r0, _ = await asyncio.wait_for(asyncio.gather(engines[0].round(), gap.round()), 30)
        await asyncio.wait_for(other, 30)
        return r0, first, nacked
    r0, first, nacked = asyncio.run(main())
    assert r0.participants == [first] and r0.missing == [nacked]


def test_round_results_count_every_byte_and_rejection_once():
    # Neighbours' messages mostly arrive while a peer trains between its rounds.
    # Each round counted only what arrived during it (the counters were reset when
    # a round began), so the rounds' bytes_in summed to less than the engine's
    # stats, and a bootstrap request refused between rounds was in no round's
    # `rejected`. Now a round counts what arrived since the previous one.
    async def main():
        hub, links, xs, engines = make(2, d=64, topology="ring", sync="async")
        res = {e: [] for e in engines}
        for _ in range(4):
            for e in engines:                      # each message lands between rounds
                res[e].append(await e.round())
                await asyncio.sleep(0)
        await links[0].send("p001", "gsp_boot_req", {"lo": 5, "hi": 1, "nonce": 1})
        for _ in range(100):                       # refused by p001's handler task
            if engines[1].stats.rejected_malformed:
                break
            await asyncio.sleep(0)
        for e in reversed(engines):
            res[e].append(await e.round())
            await asyncio.sleep(0)
        return engines, res
    (a, b), res = asyncio.run(main())
    assert sum(r.bytes_in for r in res[a]) == a.stats.bytes_in > 0
    # (a's last message reached b after b's last round)
    assert sum(r.bytes_in for r in res[b]) + res[a][-1].bytes_out == b.stats.bytes_in
    assert [r.rejected for r in res[b]] == [0, 0, 0, 0, 1] and b.stats.rejected_malformed == 1


def test_a_stalled_neighbour_costs_one_timeout_not_one_per_round():
    async def main():
        hub, links, xs, engines = make(3, d=8, topology="ring", sync="lockstep", round_timeout=0.3)
        await run_rounds(engines, 2)
        # p001 stalls: p000's first round without it waits out the deadline ...
        first = (await asyncio.gather(engines[0].round(), engines[2].round()))[0]
        # ... and the next rounds go on at once, still leaving it out
        later = [(await asyncio.gather(engines[0].round(), engines[2].round()))[0] for _ in range(3)]
        # p001 comes back (at its old round 2): once a message from it has arrived,
        # p000 waits for it again, here in vain since lockstep needs its round 6
        await engines[1].round()
        back = (await asyncio.gather(engines[0].round(), engines[2].round()))[0]
        return first, later, back
    first, later, back = asyncio.run(main())
    assert first.waited_s >= 0.25 and first.missing == ["p001"]
    assert all(r.waited_s < 0.25 and r.missing == ["p001"] for r in later)
    assert back.waited_s >= 0.25 and back.missing == ["p001"]


@pytest.mark.parametrize("sync,slack", [("lockstep", 0), ("bounded", 2)])
@pytest.mark.parametrize("codec", ["identity", "fp16"])
def test_a_peer_left_behind_catches_up_instead_of_holding_every_newer_message(sync, slack, codec):
    # p001 stalls (slow, or frozen) while its neighbours go on without it. Before,
    # when it came back it held back every message from their later rounds (a
    # backlog that grew as long as they ran ahead: memory without bound), mixed
    # their oldest states, and waited for round numbers its neighbours had long
    # passed (which never come: a neighbour's messages arrive in order), so that
    # it and its neighbours each waited out round_timeout every round until it had
    # crept forward one round at a time (55 s of 1 s rounds after a 3 s SIGSTOP on
    # a live 4-ring). Now it takes their round, less the staleness its mode allows.
    ahead = 8

    async def main():
        hub, links, xs, engines = make(3, d=16, topology="ring", codec=codec, sync=sync,
                                       max_staleness=2, round_timeout=0.2)
        await run_rounds(engines, 2)
        await run_rounds([engines[0], engines[2]], ahead)   # at round 10; p001 is at 2
        await asyncio.sleep(0)                              # the hub delivers
        held = sum(len(c.pending) for c in engines[1]._in.values())
        keep, xs[1][0] = xs[1][0], np.nan          # a round that raises moves no round number
        with pytest.raises(GossipError):
            await engines[1].round()
        assert engines[1].t == 2
        xs[1][0] = keep
        back = await engines[1].round()
        left = sum(len(c.pending) for c in engines[1]._in.values())
        together = await run_rounds(engines, 3)
        return held, back, left, together
    held, back, left, together = asyncio.run(main())
    assert held >= 2 * ahead                     # every message of their rounds without it
    newest = 2 + ahead - 1                       # the round of the neighbours' last message
    assert back.round == newest - slack and sorted(back.participants) == ["p000", "p002"]
    assert left == 2 * slack                     # at most the rounds the mode lets them lead
    # from then on the three average together again, each round with both neighbours
    assert all(len(r.participants) == 2 for rnd in together[1:] for r in rnd), together


def test_a_peer_left_behind_keeps_its_round_in_async_and_on_time_varying_graphs():
    async def main():
        hub, links, xs, engines = make(3, d=16, topology="ring", sync="async", round_timeout=0.2)
        await run_rounds(engines, 2)
        await run_rounds([engines[0], engines[2]], 5)
        await asyncio.sleep(0)
        return await engines[1].round()
    r = asyncio.run(main())
    # async waits for nobody and holds nothing back: its round number is its own
    assert r.round == 2 and r.ok

    async def one_peer():
        # one-peer exponential, n = 4: round t even, i sends to i+1; odd, to i+2. A
        # sender of a later round does not wait for this peer, so a message from
        # round 3 is no sign of having been left behind at round 2.
        hub, links, xs, engines = make(4, d=16, topology="one_peer_exponential", round_timeout=0.1)
        await run_rounds(engines, 2)
        await asyncio.gather(engines[2].round(), engines[3].round())   # round 2
        await engines[3].round()                  # round 3: sends to p001
        await asyncio.sleep(0)
        assert [m.body["r"] for m in engines[1]._in["p003"].pending] == [3]
        return await engines[1].round()
    r = asyncio.run(one_peer())
    assert r.round == 2


def test_lockstep_with_latency_keeps_exactness():
    async def main():
        _, _, xs, engines = make(4, d=32, topology="ring", latency_s=0.002)
        before = np.stack(xs).astype(np.float64)
        await run_rounds(engines, 1)
        np.testing.assert_allclose(np.stack(xs), mixing_matrix("ring", 4) @ before, rtol=1e-5, atol=1e-5)
    asyncio.run(main())


def test_pseudo_gradient_lr1_no_momentum_is_plain_averaging():
    async def main():
        _, _, xa, ea = make(4, d=16, seed=3)
        _, _, xb, eb = make(4, d=16, seed=3, mode="pseudo_gradient", outer_lr=1.0, outer_momentum=0.0)
        for _ in range(3):
            for x in xa + xb:
                x -= 0.1  # a "local step"
            await run_rounds(ea, 1)
            await run_rounds(eb, 1)
        np.testing.assert_allclose(np.stack(xa), np.stack(xb), rtol=1e-5, atol=1e-5)
    asyncio.run(main())


def test_pseudo_gradient_nesterov_accelerates_common_drift():
    async def main():
        _, _, xs, engines = make(4, d=16, mode="pseudo_gradient", outer_lr=1.0, outer_momentum=0.9,
                                 local_steps=2)
        start = np.mean(np.stack(xs), 0)
        for _ in range(10):
            for e in engines:
                e.x -= 0.1
                await asyncio.sleep(0)
            await asyncio.gather(*(e.local_step() for e in engines))
        moved = float(np.mean(start - np.mean(np.stack(xs), 0)))
        assert moved > 1.0 * 1.5  # plain averaging would move exactly 10 × 0.1
    asyncio.run(main())


@pytest.mark.parametrize("kw,word", [
    (dict(topology="star"), "star"), (dict(gamma=0), "gamma"), (dict(gamma=1.5), "gamma"),
    (dict(sync="sometimes"), "sometimes"), (dict(max_staleness=-1), "max_staleness"),
    (dict(mode="sgd"), "sgd"), (dict(round_timeout=0), "round_timeout"),
    (dict(codec="nonsense:3"), "nonsense"), (dict(local_steps=0), "local_steps"),
    (dict(topology="custom"), "edges"), (dict(gamma="fast"), "gamma"), (dict(gamma=True), "gamma"),
    (dict(mode="pseudo_gradient", outer_lr=math.inf), "outer_lr"), (dict(outer_lr=math.nan), "outer_lr"),
    (dict(topology="random_pairing", seed="abc"), "seed"), (dict(seed=1.5), "seed"),
    (dict(topology="random_pairing", seed=-1), "seed"), (dict(seed=2**32), "seed"), (dict(seed=True), "seed"),
    (dict(send_timeout=-1), "send_timeout"), (dict(send_timeout=math.nan), "send_timeout"),
    (dict(send_timeout=math.inf), "send_timeout"), (dict(send_timeout="1"), "send_timeout"),
    (dict(round_timeout=math.inf), "round_timeout"),
])
def test_bad_config_names_the_value(kw, word):
    hub = SimHub()
    (link,) = hub.add_many(1)
    with pytest.raises(ConfigError, match=word):
        Gossip(link, np.zeros(4, np.float32), **kw)


@pytest.mark.parametrize("x", [np.zeros(4), np.zeros((2, 2), np.float32), np.zeros(0, np.float32), [1.0]])
def test_bad_params_rejected(x):
    hub = SimHub()
    (link,) = hub.add_many(1)
    with pytest.raises(ConfigError, match="params"):
        Gossip(link, x)


def test_many_peers_in_one_process():
    async def main():
        hub, _, xs, engines = make(256, d=2000, topology="exponential")
        e0 = consensus_error(xs)
        await run_rounds(engines, 3)
        assert consensus_error(xs, e0) < 0.5 and not hub.errors
        assert hub.bytes_sent > 256 * 2000 * 4
    asyncio.run(main())


def _choco_reference(xs0, codec, gamma, rounds):
    """CHOCO-gossip on a ring written out with numpy (float64 mixing), the codec's own
    encode/decode for q: what the engine must compute, round by round."""
    from swarm.compress import get_codec

    n = len(xs0)
    X = np.stack(xs0).astype(np.float32)
    H = X.copy()   # each stream starts from x, sent full: no delta in the first round
    codecs = [get_codec(codec) for _ in range(n)]
    errs = []
    for r in range(rounds):
        for i in range(n if r else 0):
            H[i] += codecs[i].decode(codecs[i].encode(X[i] - H[i]))
        Hd = H.astype(np.float64)
        mix = (np.roll(Hd, 1, 0) + np.roll(Hd, -1, 0) - 2 * Hd) / 3
        X = (X + gamma * mix).astype(np.float32)
        errs.append(consensus_error(list(X)))
    return X, errs


# xtol: how far x may drift from the float64 reference, relative to the consensus
# error. One scale over the whole vector makes sign chaotic: near-zero entries of
# x − x̂ flip with rounding and the iterates drift apart (25% measured, while
# a float32 reference with the engine's order of operations matched bit for bit).
# Blocked sign drifts less: 7% since streams start from x (the first delta is
# x1 − x0, not x itself; under 1% before), the float32 reference again bit for bit.
@pytest.mark.parametrize("codec,gamma,xtol", [("sign", 1.0, 0.1), ("sign:block=0", 0.9, None),
                                              ("topk:0.1", 0.2, 1e-3)])
def test_engine_matches_numpy_choco_and_copies_stay_identical(codec, gamma, xtol):
    # The engine against the algorithm written out by hand on the same start,
    # and every receiver's copy of a sender bit-identical to the sender's own.
    async def main():
        _, links, xs, engines = make(8, d=3000, codec=codec, gamma=gamma)
        x0 = [x.copy() for x in xs]
        res = await run_rounds(engines, 25)
        assert all(r.ok for rnd in res for r in rnd)
        return links, xs, engines, x0
    links, xs, engines, x0 = asyncio.run(main())
    X, errs = _choco_reference(x0, codec, gamma, 25)
    e0 = consensus_error(x0)
    assert consensus_error(xs) / e0 < 0.5
    # a mixing step that used stale or wrong copies misses by far more than this
    assert abs(consensus_error(xs) - errs[-1]) <= 1e-2 * errs[-1]
    if xtol is not None:
        assert np.linalg.norm(np.stack(xs) - X) <= xtol * errs[-1]
    ids = [l.id for l in links]
    for i, e in enumerate(engines):
        own = e._out[""].hat
        for j in ((i - 1) % 8, (i + 1) % 8):
            assert np.array_equal(engines[j]._in[ids[i]].hat, own)


def test_large_frames_handed_to_send_are_never_rewritten():
    # A zero-copy transport may still hold a large frame several sends later
    # (a slow receiver); the engine must not rewrite an array it handed over.
    async def main():
        hub, links, xs, engines = make(3, d=20_000, topology="ring", codec="identity")
        handed: list[tuple[np.ndarray, np.ndarray]] = []
        send = links[0].send

        async def recording_send(dst, t, body=None, arrays=(), **kw):
            handed.extend((a, a.copy()) for a in arrays if a.nbytes >= 64 * 1024)
            return await send(dst, t, body, arrays, **kw)

        links[0].send = recording_send
        await run_rounds(engines, 4)
        return handed
    handed = asyncio.run(main())
    assert len(handed) >= 8
    assert all(np.array_equal(a, snap) for a, snap in handed)


def test_identity_messages_are_whole_states_kept_without_a_copy():
    async def main():
        hub, links, xs, engines = make(4, d=32, topology="ring")
        await run_rounds(engines, 2)
        # a lost message (a skipped version) needs no nack: the next state replaces the copy
        engines[1]._out[""].ver += 1
        res = await run_rounds(engines, 1)
        assert "p001" in res[0][0].participants
        assert engines[0].stats.out_of_sync == 0 and engines[0].stats.nacks_sent == 0
        # the copy is the sender's snapshot as sent, and the receiver holds the received buffer
        sent = engines[1]._out[""].hat
        got = engines[0]._in["p001"].hat
        np.testing.assert_array_equal(got, sent)
        assert not np.shares_memory(got, sent)
        # the snapshot is not x: x moved on when p001 mixed, the snapshot did not
        assert not np.array_equal(sent, xs[1])
        assert all(e.stats.full_sent == 0 for e in engines)
    asyncio.run(main())


@pytest.mark.parametrize("codec,topology", [("fp16", "ring"), ("ef+topk:0.1", "ring"),
                                            ("int8", "one_peer_exponential")])
def test_copies_allocated_up_front_give_the_same_rounds(codec, topology, monkeypatch):
    async def run(prealloc):
        if not prealloc:
            monkeypatch.setattr(Gossip, "_preallocate", lambda self: None)
        hub, _, xs, engines = make(8, d=300, topology=topology, codec=codec, gamma=0.5)
        if prealloc:
            # our streams to the first rounds' receivers are made (their copies written), not
            # started; the neighbours' copies need none (a stream's first message is a full state)
            assert all(s.ver == 0 for e in engines for s in e._out.values())
            assert {len(e._out) for e in engines} == ({1} if topology == "ring" else {3})
            assert {len(e._in) for e in engines} == {0}
        await run_rounds(engines, 4)
        monkeypatch.undo()
        return np.stack(xs)

    np.testing.assert_array_equal(asyncio.run(run(True)), asyncio.run(run(False)))


def test_identity_snapshot_buffers_are_reused_only_once_released():
    async def main():
        hub, links, xs, engines = make(4, d=1000, topology="ring")
        await run_rounds(engines, 1)
        # a snapshot still referenced (as a transport does until the frame is sent) is never rewritten
        held = engines[0]._out[""].hat
        kept = held.copy()
        seen = set()
        for _ in range(4):
            await run_rounds(engines, 1)
            hat = engines[0]._out[""].hat
            assert not np.shares_memory(hat, held)
            seen.add(hat.__array_interface__["data"][0])
        np.testing.assert_array_equal(held, kept)
        # with the held one out of play, rounds alternate between the buffers that come back
        assert len(seen) <= 3
        await hub.close()
    asyncio.run(main())


def test_a_codec_whose_frames_alias_its_input_is_refused(monkeypatch):
    from swarm.compress.dense import FP16
    monkeypatch.setattr(FP16, "aliases_input", True)
    hub = SimHub(topology="ring")
    link = hub.add_many(2)[0]
    with pytest.raises(ConfigError, match="alias"):
        Gossip(link, np.zeros(8, np.float32), codec="fp16")


def test_a_peer_that_starts_behind_adopts_the_round_until_it_has_averaged():
    # A neighbour gossiped before this engine existed (those messages are lost) and is
    # rounds ahead; in bounded mode its later messages, and the full state that
    # repairs the copy, would be "future" to a peer starting at round 0.
    async def main():
        hub = SimHub(topology="ring")
        la, lb = hub.add_many(2)
        xa, xb = np.zeros(64, np.float32), np.ones(64, np.float32)
        kw = dict(topology="ring", codec="fp16", sync="bounded", max_staleness=4, round_timeout=0.05)
        a = Gossip(la, xa, **kw)
        for _ in range(6):
            await a.round()                     # nobody is listening yet
        b = Gossip(lb, xb, **kw)
        res = await run_rounds([a, b], 6)
        return [r[1] for r in res]
    got = [(r.round, r.participants) for r in asyncio.run(main())]
    # it takes the neighbour's round in its second round (its first saw no message yet),
    # gets a full state for the deltas it missed, and averages from then on
    assert got[1][0] >= 6 and got[-1][1] == ["p000"], got


def test_random_pairing_past_the_stream_cap_converges_and_keeps_the_mean():
    # 12 peers meet 11 partners, more than the 8 per-receiver streams kept, so
    # streams are forgotten and restarted all the time. A restart used to begin
    # from zero (top-k of x into an empty copy) and pull both ends towards that
    # sparse copy: the consensus error stayed near 0.4 of the start. Now a
    # forgotten stream restarts from x itself, sent full.
    async def main():
        hub, _, xs, engines = make(12, d=200, topology="random_pairing", codec="ef+topk:0.1",
                                   gamma="auto")
        m0 = np.stack(xs).astype(np.float64).mean(0)
        e0 = consensus_error(xs)
        most = 0
        for _ in range(600):
            await run_rounds(engines, 1)
            most = max(most, max(len(g._out) for g in engines))
        m = np.stack(xs).astype(np.float64).mean(0)
        assert consensus_error(xs, e0) < 1e-3
        assert np.linalg.norm(m - m0) / np.linalg.norm(m0) < 1e-6
        assert most == 8                                      # the cap holds, and is reached
        assert sum(g.stats.full_sent for g in engines) > 0    # forgotten streams restart full
        assert not hub.errors
    asyncio.run(main())


def test_a_receiver_leaving_the_view_mid_round_does_not_break_the_round():
    # one-peer exponential, n = 4, round 0: p000 sends to p001 and mixes p003's
    # state. p001 leaves while p000 waits; the view drops p000's stream to it,
    # and the mix looked that stream up afterwards: KeyError, the peer's loop died.
    async def main():
        hub, _, xs, engines = make(4, d=16, topology="one_peer_exponential", codec="topk:0.5",
                                   gamma=0.5, round_timeout=5.0)
        first = asyncio.create_task(engines[0].round())
        await asyncio.sleep(0)                   # p000 has sent and waits for p003
        hub.remove("p001")
        engines[3].round_timeout = 0.05          # p003 waits in vain for p002
        res, _ = await asyncio.gather(first, engines[3].round())
        return res
    res = asyncio.run(main())
    assert res.ok and res.participants == ["p003"]


def test_a_peer_left_behind_on_a_time_varying_graph_skips_rounds_its_partners_passed():
    # p001 misses its partners' messages for a while (frozen and out of their view,
    # as a live 3 s SIGSTOP did). Back, it is rounds behind; each round's partner
    # passed that round long ago, so its message is never coming. It waited
    # round_timeout for a new partner every round and never caught up (live: 40 s
    # of waiting per peer for a 3 s freeze). A partner that has sent a later round
    # is not waited for.
    async def main():
        hub, links, xs, engines = make(4, d=16, topology="random_pairing", round_timeout=0.05)
        others = [engines[0], engines[2], engines[3]]
        await run_rounds(engines, 2)
        links[1].on(T_FULL, lambda msg: None)    # what is sent to p001 is lost
        await run_rounds(others, 10)
        links[1].on(T_FULL, engines[1]._on_message)
        await run_rounds(others, 8)              # p001 hears from each of them again
        await asyncio.sleep(0)
        assert all(engines[1]._in[j].pending for j in ("p000", "p002", "p003"))
        engines[1].round_timeout = 60.0          # a wait for a passed round would never end
        res = [await asyncio.wait_for(engines[1].round(), 20) for _ in range(18)]
        return res
    res = asyncio.run(main())
    assert [r.round for r in res] == list(range(2, 20))
    assert not any(r.ok for r in res[:10])       # its partners' states of those rounds were lost
    assert any(r.ok for r in res[10:])           # the later ones it mixes


@pytest.mark.parametrize("topology", ["ring", "one_peer_exponential"])
def test_after_bootstrap_receivers_get_full_states(topology):
    # bootstrap() voids this peer's public copies; the next round sends its receivers
    # x in full, not a first delta against zero (top-k of x), which left its
    # receivers' copies of it sparse and pulled their x towards them.
    async def main():
        hub, _, xs, engines = make(4, d=64, topology=topology, codec="topk:0.1", gamma=0.2)
        await run_rounds(engines, 3)
        await engines[1].bootstrap(donors=2, timeout=5.0)
        before = xs[1].copy()
        res = (await run_rounds(engines, 1))[0][1]
        got = [g._in["p001"].hat for g in engines if "p001" in g._in and g._in["p001"].round == 3]
        return res, before, got
    res, before, got = asyncio.run(main())
    assert res.full_sent == res.sent == len(got) > 0
    for hat in got:
        np.testing.assert_array_equal(hat, before)


def test_one_peer_exponential_keeps_a_stream_per_receiver_past_256_peers():
    # n = 257: τ = 9 receivers in turn, one more than the 8 streams random pairing
    # keeps, so every stream was forgotten before its next use and restarted full
    async def main():
        hub, _, xs, engines = make(257, d=8, topology="one_peer_exponential", codec="topk:0.5",
                                   gamma=0.5)
        await run_rounds(engines, 9)
        res = await run_rounds(engines, 9)
        return res, engines
    res, engines = asyncio.run(main())
    assert {len(g._out) for g in engines} == {9}
    assert sum(r.full_sent for rnd in res for r in rnd) == 0
