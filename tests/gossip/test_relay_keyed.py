"""GradientRelay(direct=True) in a keyed swarm, while a receiver's view lags.

With keys a peer checks a sender's key against the one its view lists. A member's
view can lag: the coordinator tells a joiner (or a member that rejoins) of the new
view before the others. The peer's loop holds such a sender's messages until its
view lists the sender (tests/peer/test_curve_race.py); these tests show what the
relay's own inbox does meanwhile. Real peers on loopback, a keyed coordinator
process; the receiver's view installs are held back by the test, so the lag
happens every run.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from swarmtest import free_port, hold_views, wait_for

from swarm.gossip import GradientRelay
from swarm.gossip import relay as relay_module
from swarm.peer import SyncPeer
from swarm.transport import generate_keys

D = 50
CODEC = "ef+topk:0.3"


@pytest.fixture(autouse=True)
def long_hold(monkeypatch):
    """Held gradients wait 30 s, not 2: a loaded machine does not expire them mid-test."""
    monkeypatch.setattr(relay_module, "_HOLD_S", 30.0)


@pytest.fixture
def keyed(procs, tmp_path):
    """A keyed coordinator (a member silent for 1 s is probed, and dead 0.5 s later) and
    a function that starts a keyed SyncPeer on a ring; every peer is closed at the end."""
    kd = str(tmp_path / "keys")
    generate_keys(kd, ["coordinator", "peer"])
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs.start("coordinator", "--bind", addr, "--keys", kd, "--set", "coordinator.heartbeat_timeout_s=1.0",
                "--set", "coordinator.probe_timeout_s=0.5", name="coord")
    peers: list[SyncPeer] = []

    def start(pid: str, rank: int) -> SyncPeer:
        sp = SyncPeer(coordinators=[addr], id=pid, rank=rank, topology="ring", join_timeout_s=20,
                      keys_dir=kd, key_name="peer")
        peers.append(sp)
        return sp.start()
    try:
        yield start
    finally:
        for sp in reversed(peers):
            sp.close()


def _direct_relay(sp: SyncPeer) -> GradientRelay:
    async def make() -> GradientRelay:
        return GradientRelay(sp.peer, D, codec=CODEC, direct=True)
    return sp.call(make())


def _hold(sp: SyncPeer):
    """Hold ``sp``'s view installs (on its loop); returns (views, release, install), where
    ``install(view)`` installs one view and keeps holding the later ones."""
    async def on_loop():
        install = sp.peer._install
        views, release = hold_views(sp.peer)
        return views, release, install
    views, release, install = sp.call(on_loop())

    def on(fn):
        def run(view) -> None:
            async def go() -> None:
                fn(view)
            sp.call(go())
        return run
    return views, on(release), on(install)


def _poll_until(relay: GradientRelay, pred, what: str, timeout: float = 20.0) -> list[np.ndarray]:
    got: list[np.ndarray] = []
    deadline = time.monotonic() + timeout
    while not pred(got):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; stats {relay.stats}")
        got += relay.take()
        time.sleep(0.005)
    return got


def test_a_joiners_first_gradients_go_through_the_loop_and_are_held_there(keyed):
    """A joiner learns a member's inbox from the member's hello, which the member sends
    only once its view lists the joiner: until then the joiner's gradients go through
    the loop, whose hold keeps them. None is lost, and none waits on the inbox."""
    b = keyed("b", 0)
    relays = []
    try:
        relays.append(_direct_relay(b))
        views, release, _ = _hold(b)
        a = keyed("a", 1)
        relays.append(_direct_relay(a))
        rb, ra = relays
        assert b.view.member("a") is None and a.view.epoch > b.view.epoch   # the lag, every run
        assert not ra.ready(timeout=0.5)          # b has not answered a's hello: its view lags
        g = ra.publish(np.full(D, 0.5, np.float32), clock=0)
        assert ra.stats.direct_out == 0           # handed to a's loop, not on an inbox
        wait_for(lambda: b.peer.counters.held_in >= 2, what="a's hello and gradient held by b's loop")
        release(wait_for(lambda: next((v for v in views if v.member("a")), None), what="a view listing a"))
        got = _poll_until(rb, lambda got: len(got) >= 1, "a's gradient at b")
        assert len(got) == 1 and np.array_equal(got[0], g)
        assert rb.stats.direct_in == 0 and rb.stats.rejected == 0 and rb.stats.held_in == 0
        assert ra.ready(timeout=10)               # b answered: from now on, direct
    finally:
        for r in relays:
            r.close()


class _Rejoined:
    """b and a on a ring, each with a direct relay; a froze, was declared dead and came back
    under its id, and b's view does not list it yet: b installed the view that a left, and
    the later views wait in ``views`` (``release(view)`` installs one and lets the rest
    through)."""

    def __init__(self, keyed, relays: list[GradientRelay], thaw: threading.Event) -> None:
        self.b, self.a = keyed("b", 0), keyed("a", 1)
        relays += [_direct_relay(self.b), _direct_relay(self.a)]
        self.rb, self.ra = relays
        assert self.rb.ready(timeout=10) and self.ra.ready(timeout=10)
        g = self.ra.publish(np.full(D, 0.25, np.float32), clock=0)
        got = _poll_until(self.rb, lambda got: len(got) >= 1, "a's first gradient")
        assert np.array_equal(got[0], g) and self.rb.stats.direct_in == 1

        self.views, self.release, install = _hold(self.b)
        self.a.call_soon(thaw.wait, 60)           # a's loop frozen: no heartbeats, no probe answer
        self.dead = wait_for(lambda: next((v for v in self.views if v.member("a") is None), None), 30,
                             what="a view without a (a declared dead)")
        install(self.dead)                        # b's view: a is gone; later views are held
        thaw.set()
        wait_for(lambda: self.a.view.member("a") is not None and self.a.view.epoch > self.dead.epoch, 20,
                 what="a back in a view of its own")

    def send(self, value: float, clock: int) -> np.ndarray:
        """a publishes on b's inbox (from a view that b does not have); returns the gradient
        once it is there."""
        before = self.rb.stats.direct_bytes_in
        out = self.ra.publish(np.full(D, value, np.float32), clock=clock)
        assert self.ra.stats.direct_out == clock + 1      # straight to b's inbox, not through the loop
        _poll_until(self.rb, lambda _: self.rb.stats.direct_bytes_in > before, "the gradient on b's inbox")
        return out

    def list_a(self) -> None:
        self.release(wait_for(lambda: next((v for v in self.views if v.member("a") and v.epoch > self.dead.epoch),
                                           None), 20, what="the view that lists a again"))


@pytest.fixture
def rejoined(keyed):
    relays: list[GradientRelay] = []
    thaw = threading.Event()
    try:
        yield _Rejoined(keyed, relays, thaw)
    finally:
        thaw.set()
        for r in relays:
            r.close()


def test_a_rejoiners_direct_gradients_wait_until_the_view_lists_it(rejoined):
    """A member declared dead (frozen) rejoins under its id: it still knows the others'
    inboxes and sends on them at once, from a view that lists it, while a receiver's
    view does not yet. The receiver's relay holds those gradients (they came on its
    inbox: the loop's hold never sees them), and takes them in once its view lists the
    sender. They were dropped as from a wrong key."""
    s = rejoined
    g = s.send(0.75, clock=1)
    assert s.b.view.member("a") is None and s.rb.take() == []
    s.list_a()
    got = _poll_until(s.rb, lambda got: len(got) >= 1, "the held gradient taken in")
    assert len(got) == 1 and np.array_equal(got[0], g)
    st = s.rb.stats
    assert (st.received, st.direct_in, st.held_in, st.held_dropped, st.rejected) == (2, 2, 1, 0, 0), st


def test_a_held_gradient_that_waits_too_long_is_dropped_and_counted(rejoined):
    s = rejoined
    s.rb._hold_s = 0.2
    s.send(-1.0, clock=1)
    _poll_until(s.rb, lambda _: s.rb.stats.held_dropped >= 1, "the held gradient to age out")
    s.rb._hold_s = 30.0
    g = s.send(0.5, clock=2)
    s.list_a()
    got = _poll_until(s.rb, lambda got: len(got) >= 1, "the second gradient taken in")
    assert len(got) == 1 and np.array_equal(got[0], g)   # the first is not
    st = s.rb.stats
    assert (st.received, st.held_in, st.held_dropped, st.rejected) == (2, 2, 1, 0), st
