"""The relay's cheaper paths decide as the wire does: a ride that _ride_fits passes without
its trial encode is one the wire takes, a ride near the limits goes or is left off as the
wire says, one the wire refuses is still a WireError; and on the direct sockets, every byte
a relay counts out (from the header and the arrays it sent) another counts in (from what
decode summed, or from the frames of what it refused)."""

from __future__ import annotations

import asyncio

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from swarmtest import wait_for, start_sync_ring

from swarm import wire
from swarm.errors import WireError
from swarm.gossip import GradientRelay
from swarm.gossip.relay import _HEADER_ROOM, GRAD
from swarm.gossip.sim import SimHub
from swarm.peer import SyncPeer

LIMITS = [
    wire.DEFAULT_LIMITS,
    # small, yet with room for the relay's 7-key header and a short ride in every container
    # limit: below that _ride_fits passes nothing and the case would check nothing
    wire.Limits(max_header_bytes=_HEADER_ROOM + 400, max_str_len=128, max_bin_len=128, max_array_len=128,
                max_map_len=128, max_frames=12, max_ndim=2),
]


def _relay(limits: wire.Limits) -> GradientRelay:
    async def make() -> GradientRelay:
        hub = SimHub(topology="ring")
        a, _ = hub.add_many(2)
        a.limits = limits
        return GradientRelay(a, 4, codec="ef+topk:0.5")
    return asyncio.run(make())


RELAYS = [_relay(lim) for lim in LIMITS]

_leaves = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats()
           | st.text(max_size=80) | st.binary(max_size=80)
           | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=4)))
_bodies = st.dictionaries(st.text(max_size=10) | st.integers(0, 3), st.recursive(
    _leaves, lambda kids: st.lists(kids, max_size=10) | st.dictionaries(st.text(max_size=6), kids, max_size=6),
    max_leaves=20), max_size=6)
_arrays = st.lists(st.builds(
    lambda dt, shape: np.zeros(shape, dt),
    st.sampled_from(["float32", "int64", "bool", ">f4", "complex64", "uint8"]),
    st.lists(st.integers(0, 5), max_size=3).map(tuple)), max_size=14)


@pytest.mark.parametrize("which", range(len(LIMITS)))
def test_a_ride_that_passes_without_its_trial_encode_is_one_the_wire_takes(which):
    # the small-limits case checked nothing: its map limit was below the relay's header, so
    # the relay had no envelope, _ride_fits passed no ride and no example reached the encode
    relay, lim = RELAYS[which], LIMITS[which]
    assert relay._envelope is not None
    passed = [0]

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(body=_bodies, arrays=_arrays, frames=st.integers(0, 64), spare=st.integers(0, 4000),
           header=st.integers(0, 4000))
    def check(body, arrays, frames, spare, header):
        ride = {"x": [body, len(arrays)]}
        if not relay._ride_fits(ride, arrays, frames, spare, header):
            return
        passed[0] += 1
        left = wire.Limits(**{**vars(lim), "max_frames": frames, "max_message_bytes": spare,
                              "max_header_bytes": header})
        wire.encode(GRAD, relay.link.id, body=ride, arrays=arrays, limits=left)   # raises if it was wrong

    check()
    assert passed[0] > 0


def test_an_everyday_ride_passes_without_its_trial_encode():
    """The federation's ride (field names, the origin, nine small arrays) is the common case."""
    relay = RELAYS[0]
    arrays = [np.zeros((8, 4), np.float32), np.zeros(8, np.int64), np.zeros(8, np.float32), np.zeros((8, 4), np.float32),
              np.zeros(8, bool), np.zeros(8, np.int32), np.zeros(8, np.int64), np.zeros(8), np.zeros(8)]
    ride = {"x": [{"fields": ["obs", "action", "reward", "next_obs", "done"], "peers": ["p000"]}, 9]}
    assert relay._ride_fits(ride, arrays, 40, 1 << 20, 1 << 20)


class Gives:
    def __init__(self) -> None:
        self.gives, self.got, self.refused_n = None, [], 0

    def ride(self):
        return self.gives

    def arrive(self, src, body, arrays):
        self.got.append(body)

    def refused(self):
        self.refused_n += 1


@pytest.mark.parametrize("n", [300, 320, 330, 340, 350, 360, 380])
def test_a_ride_near_the_header_limit_goes_or_is_left_off_as_the_wire_says(n):
    """Beside the gradients a ride's header has 400 bytes here: a string of n characters
    fits or not by a few bytes, which only the trial encode can tell."""
    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(2)
        lim = wire.Limits(max_header_bytes=_HEADER_ROOM + 400)
        for link in links:
            link.limits = lim
        riders = [Gives(), Gives()]
        a, b = [GradientRelay(link, 4, codec="ef+topk:0.5", rider=r) for link, r in zip(links, riders)]
        body = {"s": "y" * n}
        arrays = [np.arange(3)]
        left = wire.Limits(**{**vars(lim), "max_header_bytes": 400, "max_frames": lim.max_frames - 2,
                              "max_message_bytes": lim.max_message_bytes - a._update_bytes - _HEADER_ROOM})
        try:
            wire.encode(GRAD, a.link.id, body={"x": [body, 1]}, arrays=arrays, limits=left)
            fits = True
        except WireError:
            fits = False
        riders[0].gives = (body, arrays)
        a.publish(np.array([1, 2, 3, 4], np.float32), clock=0)
        for _ in range(20):
            await asyncio.sleep(0)
        assert (a.stats.rider_refused, riders[0].refused_n) == ((0, 0) if fits else (1, 1))
        assert riders[1].got == ([body] if fits else []) and b.pending == 1
        await hub.close()
    asyncio.run(main())


def _nested(depth: int) -> list:
    x: list = []
    for _ in range(depth):
        x = [x]
    return x


@pytest.mark.parametrize("gives,match", [
    (({1: 2}, []), "key 1 is not a str"),                                  # msgpack packs it; receivers refuse it
    (({"e": msgpack.ExtType(1, b"x")}, []), "header is not valid msgpack"),   # likewise
    # past the receiver's unpack stack only as deep as a header holds it (the ride alone unpacks)
    (({"k": _nested(1020)}, []), "header is not valid msgpack"),
])
def test_a_ride_that_packs_but_that_receivers_refuse_is_still_refused(gives, match):
    async def main():
        hub = SimHub(topology="ring")
        rider = Gives()
        a, b = [GradientRelay(link, 4, codec="ef+topk:0.5", rider=r) for link, r in zip(hub.add_many(2), [rider, None])]
        rider.gives = gives
        with pytest.raises(WireError, match=f"the rider's ride\\(\\) gave what the wire refuses: .*{match}"):
            a.publish(np.array([1, 2, 3, 4], np.float32), clock=0)
        assert a.stats.published == 0 and a.stats.sent == 0
        await hub.close()
    asyncio.run(main())


class Rides:
    """A rider whose every ride is a few small arrays (what the federation sends)."""

    def __init__(self, me: str) -> None:
        self.me, self.got = me, 0

    def ride(self):
        return {"fields": ["obs"], "peers": [self.me]}, [np.ones((3, 4), np.float32), np.arange(3)]

    def arrive(self, src, body, arrays):
        self.got += 1


def test_every_byte_counted_out_on_the_direct_sockets_is_counted_in(procs):
    """direct_bytes_out adds the header and the arrays a relay sent (its own with their
    rides, and those it passed on), direct_bytes_in what decode summed, or the frames of a
    message it refused: over a ring they add up, junk included."""
    peers, relays = [], []
    try:
        start_sync_ring(procs, peers, 4, "q")

        def make(sp: SyncPeer) -> GradientRelay:
            async def build() -> GradientRelay:
                return GradientRelay(sp.peer, 50, codec="ef+topk:0.3", topology="ring", direct=True,
                                     rider=Rides(sp.peer.id))
            return sp.call(build())
        relays = [make(sp) for sp in peers]
        assert all(r.ready(timeout=10) for r in relays)
        junk = [[b"not msgpack"], [bytes(f) for f in wire.encode("hello", "q1", arrays=[np.ones(7)])]]
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.linger = 0
        push.connect(relays[0]._endpoint)
        for frames in junk:
            push.send_multipart(frames)
        for i, r in enumerate(relays):
            r.publish(np.full(50, i + 1, np.float32), clock=i, hold=True)
            r.publish(np.full(50, -i, np.float32), clock=i + 4)
        # each peer takes the three others' turns, one of them passed on by a neighbour
        def all_in() -> bool:
            for r in relays:   # every one polls: a neighbour passes a turn on only then
                r.poll()
            return all(r.stats.received == 6 for r in relays) and relays[0].stats.rejected == 2
        wait_for(all_in, 10, what="every turn and the junk")
        push.close(0)
        ctx.term()
        assert sum(r.stats.forwarded for r in relays) == 4 and sum(r.rider.got for r in relays) == 8
        junk_bytes = sum(len(f) for frames in junk for f in frames)
        out, into = (sum(getattr(r.stats, k) for r in relays) for k in ("direct_bytes_out", "direct_bytes_in"))
        assert into == out + junk_bytes and sum(r.stats.direct_out for r in relays) == 12
    finally:
        for r in relays:
            r.close()
        for sp in peers:
            sp.close()
