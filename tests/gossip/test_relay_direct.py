"""GradientRelay(direct=True) on real peers: the consumer thread sends and takes the
gradients on sockets of its own, passes them round the ring, and refuses bad input
on its inbox without losing anything."""

from __future__ import annotations

import asyncio
import time

import msgpack
import numpy as np
import pytest
import zmq
from swarmtest import wait_for, start_sync_ring

from swarm import wire
from swarm.errors import ConfigError, GossipError
from swarm.gossip import GradientRelay
from swarm.gossip.relay import GRAD
from swarm.gossip.sim import SimHub
from swarm.peer import SyncPeer

D = 50
CODEC = "ef+topk:0.3"


def _direct_relay(sp: SyncPeer, **kw) -> GradientRelay:
    """A direct relay of ``sp``'s peer, built on its loop; this thread owns its sockets."""
    async def make() -> GradientRelay:
        return GradientRelay(sp.peer, D, codec=CODEC, direct=True, **kw)
    return sp.call(make())


@pytest.fixture
def ring(procs):
    """Four SyncPeers on a ring, each with a direct relay that this thread owns."""
    peers, relays = [], []
    try:
        start_sync_ring(procs, peers, 4, "p")
        relays = [_direct_relay(sp, topology="ring") for sp in peers]
        # every relay knows its two neighbours' inboxes (hellos go through the peers)
        assert all(r.ready(timeout=10) for r in relays)
        assert all(len(r._endpoints) == 2 for r in relays)
        yield peers, relays
    finally:
        for r in relays:
            r.close()
        for sp in peers:
            sp.close()


def _poll_until(relays, want, timeout=10.0):
    got = [[] for _ in relays]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(len(g) < w for g, w in zip(got, want)):
        for i, r in enumerate(relays):
            got[i] += r.take()
        time.sleep(0.005)
    return got


def test_direct_relay_reaches_every_peer_on_its_own_sockets(ring):
    _, relays = ring
    rng = np.random.default_rng(0)
    sent = {}
    for i, r in enumerate(relays):
        sent[i] = r.publish(rng.standard_normal(D).astype(np.float32), clock=i)
    got = _poll_until(relays, [3] * 4)
    for i, g in enumerate(got):
        want = sorted(sent[j].tobytes() for j in range(4) if j != i)
        assert sorted(x.tobytes() for x in g) == want, i
    for r in relays:
        s = r.stats
        # on a ring of 4 the far peer's copy goes two hops: one peer in two passes it on
        assert s.direct_out == s.sent and s.direct_in == s.received == 3, s
        assert s.rejected == s.duplicates == s.dropped == 0, s
    assert sum(r.stats.forwarded for r in relays) == 4


def test_direct_inbox_refuses_bad_input_and_keeps_working(ring):
    _, relays = ring
    victim = relays[0]
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.linger = 0
    push.connect(victim._endpoint)
    good_meta = {"n": D}
    bad = [
        [b"not msgpack"],                                                          # not a wire header
        wire.encode("hello", "p1", body={}),                                       # not a gradient
        wire.encode(GRAD, "p1", body={"o": "p1", "s": 1}),                         # body incomplete
        wire.encode(GRAD, "p1", body={"o": "p1", "s": 2, "h": 1, "meta": good_meta},
                    arrays=[np.full(D, np.nan, np.float32)]),                      # not the codec's frames
        [msgpack.packb({"v": 99}), b"x"],                                          # wrong version
    ]
    for frames in bad:
        push.send_multipart([bytes(f) if not isinstance(f, bytes) else f for f in frames])
    wait_for(lambda: victim.poll() >= 0 and victim.stats.rejected >= len(bad), 10, what="rejections")
    assert victim.stats.rejected == len(bad) and victim.stats.received == 0 and victim.pending == 0
    push.close(0)
    ctx.term()
    # a real gradient still goes through (two hops: p3 passes it on when it polls), once
    g = relays[2].publish(np.ones(D, np.float32), clock=0)
    got = _poll_until(relays, [1, 1, 0, 1])[0]
    assert len(got) == 1 and np.array_equal(got[0], g)


def test_ready_waits_for_every_neighbours_relay(procs):
    """A peer that built its relay first must not publish before its neighbours have
    theirs: through the loop, a gradient reaches a peer that does not handle gradients
    yet and is lost (turn-taking peers then each sat out a whole wait timeout)."""
    peers, relays = [], []
    try:
        start_sync_ring(procs, peers, 3, "w")
        relays = [_direct_relay(peers[0], topology="ring"), _direct_relay(peers[1], topology="ring")]
        assert not relays[0].ready(timeout=0.5)   # w2 has no relay yet
        assert relays[0]._endpoints.keys() == {"w1"}
        relays.append(_direct_relay(peers[2], topology="ring"))
        assert all(r.ready(timeout=10) for r in relays)
        g = relays[0].publish(np.full(D, 0.25, np.float32), clock=0)
        got = _poll_until(relays, [0, 1, 1])
        assert all(len(x) == 1 and np.array_equal(x[0], g) for x in got[1:])
        assert relays[0].stats.direct_out == relays[0].stats.sent == 2
    finally:
        for r in relays:
            r.close()
        for sp in peers:
            sp.close()
    with pytest.raises(ConfigError, match="direct mode"):
        async def main() -> None:
            GradientRelay(SimHub(topology="ring").add("a"), D).ready(1.0)
        asyncio.run(main())


def test_direct_needs_a_peer():
    async def main() -> None:
        hub = SimHub(topology="ring")
        link = hub.add("a")
        with pytest.raises(ConfigError, match="direct needs a Peer"):
            GradientRelay(link, D, direct=True)
    asyncio.run(main())


def test_direct_inbox_with_keys_admits_only_the_swarm(procs, tmp_path):
    from swarm.transport import Curve, generate_keys
    kd = tmp_path / "keys"
    generate_keys(str(kd), ["coordinator", "peer"])
    generate_keys(str(tmp_path / "evil"), ["coordinator", "intruder"])
    peers, relays = [], []
    try:
        start_sync_ring(procs, peers, 2, "k", "--keys", str(kd), keys_dir=str(kd), key_name="peer")
        relays = [_direct_relay(sp) for sp in peers]
        assert all(r.ready(timeout=10) for r in relays)
        g = relays[0].publish(np.full(D, 0.5, np.float32), clock=0)
        got = _poll_until(relays, [0, 1])[1]
        assert len(got) == 1 and np.array_equal(got[0], g) and relays[1].stats.direct_in == 1

        # strangers aimed at the inbox: plaintext, and CURVE with a key not on the allow-list
        ctx = zmq.Context()
        plain = ctx.socket(zmq.PUSH)
        wrong = ctx.socket(zmq.PUSH)
        Curve(str(tmp_path / "evil"), "intruder").client(wrong, peers[1].peer.view.member("k1").key)
        body = {"o": "k0", "s": 99, "h": 1, "c": 1, "meta": {}}
        for s in (plain, wrong):
            s.linger = 0
            s.connect(relays[1]._endpoint)
            s.send_multipart([bytes(f) for f in wire.encode(GRAD, "k0", body=body)], zmq.NOBLOCK)
        time.sleep(0.5)
        assert relays[1].poll() == 0                                # nothing came in
        assert relays[1].stats.received == 1 and relays[1].stats.rejected == 0
        plain.close(0)
        wrong.close(0)
        ctx.term()
    finally:
        for r in relays:
            r.close()
        for sp in peers:
            sp.close()


def test_direct_relay_carries_a_pass_round_the_ring(ring):
    _, relays = ring
    relays[1].publish(None, clock=5)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and any(r.stats.passes_in < 1 for i, r in enumerate(relays) if i != 1):
        for r in relays:
            r.poll()
        time.sleep(0.005)
    assert [r.stats.passes_in for r in relays] == [1, 0, 1, 1]
    assert relays[1].stats.passed == 1 and all(r.take() == [] for r in relays)
    assert all(r.stats.rejected == 0 for r in relays)


def test_a_hello_naming_an_inbox_nobody_can_dial_is_refused(ring):
    # grad_hello took any "tcp://..." string: a neighbour's `tcp://h:abc` made the
    # consumer thread's outbox raise, and `tcp://h:0` was dialled for ever
    peers, relays = ring
    good = relays[1]._endpoints["p0"]
    before = peers[1].peer.counters.malformed
    bad = ["tcp://h:abc", "tcp://h:0", "tcp://[::1]:5000", "tcp://h:²", "tcp://a b:5"]
    for ep in bad:
        assert peers[0].send("p1", "grad_hello", {"ep": ep, "r": True})
    wait_for(lambda: peers[1].peer.counters.malformed >= before + len(bad), what="the hellos refused")
    assert relays[1]._endpoints["p0"] == good


def test_a_closed_direct_relay_refuses_ready_and_wait_at_once(ring):
    # ready() said it was for direct mode (close had closed the inbox), and wait() waited
    # out its whole timeout for gradients that can no longer arrive
    _, relays = ring
    relays[0].close()
    with pytest.raises(GossipError, match="relay p0 is closed"):
        relays[0].ready(timeout=5.0)
    with pytest.raises(GossipError, match="relay p0 is closed"):
        relays[0].wait(8, 5.0, every=4, first=0)
    assert relays[0].stats.waited_s == 0 and relays[0].stats.wait_timeouts == 0
