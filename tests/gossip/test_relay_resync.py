"""A relay with ``state`` brings a copy that fell out of step back in step (on the
in-memory hub, peers in threads): frozen past the others' timeout, restarted from
nothing, or different for any other reason (digests). Bad copies change nothing."""

import asyncio
import hashlib
import logging
import threading
import time

import numpy as np
import pytest

from swarm.gossip import GradientRelay
from swarm.gossip.relay import GRAD_LATE, GRAD_STATE, GRAD_SYNC
from swarm.gossip.sim import SimHub

N, D, CLOCKS = 3, 16, 450   # three peers, a turn per clock by rank, every = 3
STEP_S = 0.004               # between two turns a peer steps its env


async def settle(hub):
    for _ in range(20):
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)


def update(x, g):
    """An update whose result depends on the order of the gradients, as Adam's does."""
    return (np.float32(0.5) * x + g) * np.float32(1.01)


class Copy:
    """One peer's copy: a vector and its update count, with the relay's state function."""

    def __init__(self):
        self.x, self.n = np.zeros(D, np.float32), 0
        self.history: dict[int, bytes] = {}   # update count -> the copy after it

    def state(self):
        return {"n": self.n}, [self.x.copy()]

    def apply(self, relay, g):
        self.x, self.n = update(self.x, g), self.n + 1
        self.history[self.n] = self.x.tobytes()
        if self.n % 10 == 0:
            relay.note_digest(self.n, hashlib.blake2b(self.x.tobytes(), digest_size=8).hexdigest())


def take_turns(relay, copy, rank, timeout, start=None, stop=CLOCKS, event=None):
    """A peer's turns as `swarm run` takes them: wait, adopt a copy that came, apply the
    others' gradients in clock order, then its own. ``event(clock)`` may freeze it or
    change its copy."""
    rng = np.random.default_rng(rank + 100 * (start or 0))
    clock = rank if start is None else start
    while clock < stop:
        if event is not None:
            event(clock, copy)
        while not relay.wait(clock, timeout, every=N, first=0) and (snap := relay.snapshot()) is not None:
            copy.x, copy.n = snap.arrays[0].copy(), snap.body["n"]
            relay.adopt(snap)
            clock = snap.next if snap.next is not None else clock
        if clock >= stop:
            break
        for g in relay.take(before=clock):
            copy.apply(relay, g)
        copy.apply(relay, relay.publish(rng.standard_normal(D), clock=clock))
        clock += N
        time.sleep(STEP_S)


async def finish(hub, relays, copies):
    """Every copy after every gradient published (what came after each peer's last turn)."""
    for _ in range(50):
        await settle(hub)
    for r, c in zip(relays, copies):
        for g in r.take(before=CLOCKS + N):
            c.apply(r, g)
    return [c.x for c in copies]


@pytest.mark.parametrize("repair", [True, False])
def test_a_frozen_peer_takes_a_copy_and_the_copies_end_the_same(repair):
    """Peer 1 stops for longer than the others wait for a turn: they go on without it,
    and its gradients reach them after their turns went past them. With state they drop
    those, tell it so, and it takes a copy from one of them, then its turns start again
    a round later; all three end bit for bit the same. Without, they differ for good."""
    frozen = threading.Event()
    relays: list[GradientRelay] = []

    def went_past(clock):
        """Whether peer 0 or 2 took a turn after ``clock`` (its last turn's clock: rank + N ·
        (turns - 1)); one that did gave up waiting for peer 1's turn at ``clock``."""
        return any(r.stats.published and i + N * (r.stats.published - 1) > clock
                   for i, r in enumerate(relays) if i != 1)

    def freeze(clock, copy):
        # stopped until another peer's turns went past this one's next turn too (it gave
        # up waiting twice). It slept 0.5 s, which the others' 0.2 s waits could sit out
        # in a process that the machine left off-CPU meanwhile (beside CPU burners the
        # copies once ended the same without state: that, or the catching up below)
        if clock >= 60 and not frozen.is_set():
            frozen.set()
            deadline = time.monotonic() + 30
            while not went_past(clock + N) and time.monotonic() < deadline:
                time.sleep(0.01)

    async def main():
        hub = SimHub(topology="ring")
        copies = [Copy() for _ in range(N)]
        relays[:] = [GradientRelay(link, D, state=c.state if repair else None, resync_timeout=2.0)
                     for link, c in zip(hub.add_many(N), copies)]
        await asyncio.gather(*(asyncio.to_thread(take_turns, r, c, i, 0.2, event=freeze if i == 1 else None)
                               for i, (r, c) in enumerate(zip(relays, copies))))
        xs = await finish(hub, relays, copies)
        assert not hub.errors
        return copies, xs
    copies, xs = asyncio.run(main())
    assert went_past(61 + N) and frozen.is_set()
    same = all(np.array_equal(x, xs[0]) for x in xs[1:])
    if not repair:
        # The event does make them differ, after the same number of updates. Whether they
        # still differ at the end depends on the timing: once peer 1 is back in step (it
        # may catch up on a loaded machine), this update rule, a contraction, forgets
        # the disorder within some dozens of updates.
        counts = set.intersection(*(set(c.history) for c in copies))
        assert any(len({c.history[n] for c in copies}) > 1 for n in counts)
        return
    assert same, [x[:3] for x in xs]
    first = relays[1].resynced[0]
    # Its turns start again a round later where the peer that served the copy had gone past
    # its next turn (61 + N); a server still short of it (the one that went past was the
    # other) leaves them as they were: a fresh clone's run got its copy at clock 63, next None
    assert "came after" in first["why"], relays[1].resynced
    assert first["next"] is not None or first["clock"] < 61 + N, relays[1].resynced
    assert relays[0].stats.late + relays[2].stats.late > 0
    # one copy for peer 1; one of the others may have fallen out of step too (it waited
    # for peer 1 while the third gave up waiting for it) and taken one as well
    assert sum(r.stats.served for r in relays) == sum(r.stats.resyncs for r in relays) <= 2


def test_a_restarted_peer_takes_a_copy_and_the_copies_end_the_same():
    """Peer 1's process dies at clock 40 and a new one starts under its id from
    nothing (a fresh relay and copy, its turns from clock 1 again): its first turn is
    late for the others, and it takes a copy; the copies end the same."""
    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(N)
        copies = [Copy() for _ in range(N)]
        relays = [GradientRelay(link, D, state=c.state, resync_timeout=2.0) for link, c in zip(links, copies)]
        others = [asyncio.create_task(asyncio.to_thread(take_turns, relays[i], copies[i], i, 0.2)) for i in (0, 2)]
        await asyncio.to_thread(take_turns, relays[1], copies[1], 1, 0.2, stop=40)
        await asyncio.sleep(0.5)   # the others go on without it
        copies[1] = Copy()
        relays[1] = GradientRelay(links[1], D, state=copies[1].state, resync_timeout=2.0)   # its handlers now
        again = asyncio.to_thread(take_turns, relays[1], copies[1], 1, 0.2, start=1)
        await asyncio.gather(again, *others)
        xs = await finish(hub, relays, copies)
        assert not hub.errors
        return relays, xs
    relays, xs = asyncio.run(main())
    assert all(np.array_equal(x, xs[0]) for x in xs[1:]), [x[:3] for x in xs]
    # its turns start again well past where its first process stopped
    assert relays[1].resynced[0]["next"] > 40 and "clock 1 came after" in relays[1].resynced[0]["why"]


def test_a_copy_that_differs_is_found_by_its_digests_and_replaced():
    """Peer 2's copy changes outside the relay at clock 60 (nothing is late: a lost
    message would do the same): its digests differ from those of peer 0, the lowest
    ranked peer it keeps step with, and it takes peer 0's copy without leaving its
    turns; the copies end the same."""
    def flip(clock, copy):
        if clock == 59:
            copy.x[0] += 1.0

    async def main():
        hub = SimHub(topology="ring")
        copies = [Copy() for _ in range(N)]
        relays = [GradientRelay(link, D, state=c.state, resync_timeout=2.0)
                  for link, c in zip(hub.add_many(N), copies)]
        await asyncio.gather(*(asyncio.to_thread(take_turns, r, c, i, 2.0, event=flip if i == 2 else None)
                               for i, (r, c) in enumerate(zip(relays, copies))))
        xs = await finish(hub, relays, copies)
        assert not hub.errors
        return relays, xs
    relays, xs = asyncio.run(main())
    assert all(np.array_equal(x, xs[0]) for x in xs[1:]), [x[:3] for x in xs]
    assert [r.stats.resyncs for r in relays] == [0, 0, 1]
    (r,) = relays[2].resynced
    assert r["from"] == "p000" and r["next"] is None and "differs from p000's" in r["why"], r
    assert sum(r.stats.late for r in relays) == 0


def test_a_peer_back_in_step_says_so_itself_when_the_copys_sender_stops():
    """Peer 1 is away while the others take four rounds of turns; its first turn back
    is late for them, it asks the peer that told it for a copy (S) and its turns start
    again at clock 16. S's run then ends before its next message, which would have told
    the third peer (T) so. Peer 1 tells T itself: T waits for its turn at 16 and applies
    it in order. Before, T did not wait for peer 1 (out of step, as far as it knew), and
    peer 1's gradient came after T's turn went past it."""
    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(N)
        copies = [Copy() for _ in range(N)]
        relays = [GradientRelay(link, D, state=c.state, resync_timeout=2.0) for link, c in zip(links, copies)]
        sent = {}

        def turn(i, clock, timeout=0.0):
            """Peer i's turn at ``clock``: what its wait returned and what it took."""
            ok = relays[i].wait(clock, timeout, every=N, first=0)
            got = relays[i].take(before=clock)
            sent[clock] = relays[i].publish(np.full(D, clock, np.float32), clock=clock)
            return ok, got

        for clock in [0, 1, 2, 3] + [5, 6, 8, 9, 11, 12]:   # peer 1 is away after its turn at 1
            turn(clock % N, clock)
            await settle(hub)
        turn(1, 4)   # peer 1 back: late for both others, who tell it so
        await settle(hub)
        asking = asyncio.create_task(asyncio.to_thread(relays[1].wait, 7, 2.0, every=N, first=0))
        for _ in range(50):   # the request went to S
            await settle(hub)
            if relays[1].resyncing:
                break
        await settle(hub)
        for r in relays[0], relays[2]:
            r.poll()   # the one asked answers between its turns
        assert await asking is False
        snap = relays[1].snapshot()
        assert snap.next == 16, snap
        relays[1].adopt(snap)
        s = int(snap.src[1:])
        (t,) = {0, 2} - {s}
        hub.remove(snap.src)   # S's run ends (it sends nothing more) and it leaves the view
        await settle(hub)
        late = relays[t].stats.late
        before = 13 + (t - 13) % N   # T's turn before 16 (14 or 15)
        turn(t, before)
        await settle(hub)
        # and its turn past peer 1's at 16, taken meanwhile on another thread
        t_turn = asyncio.create_task(asyncio.to_thread(turn, t, before + N, 2.0))
        for _ in range(10):
            if t_turn.done():
                break
            await settle(hub)
        turn(1, 16)
        await settle(hub)
        ok, got = await t_turn
        assert not hub.errors
        return ok, got, relays[t].stats.late - late, sent
    ok, got, late, sent = asyncio.run(main())
    assert ok and late == 0
    assert any(np.array_equal(g, sent[16]) for g in got), [g[0] for g in got]


def _asking(links):
    """Relay ``a`` of rank 0 (with state), and its next turn: a wait at clock 3 that,
    once ``a`` is told its gradient came late, asks for a copy and waits for it (what
    the wait returned goes into ``result``)."""
    a = GradientRelay(links[0], D, state=Copy().state, resync_timeout=3.0)
    result = {}

    def turn():
        result["done"] = a.wait(3, 3.0, every=N, first=0)
    return a, result, turn


@pytest.mark.parametrize("body,arrays,match", [
    ({"r": 1, "n": None, "app": {}, "na": 0, "po": [], "g": {}}, [], "c must be a clock"),
    ({"r": 1, "c": 5, "n": 5, "app": {}, "na": 0, "po": [], "g": {}}, [], "n None or a clock after c"),
    ({"r": 1, "c": 5, "n": None, "app": [], "na": 0, "po": [], "g": {}}, [], "app must be a map"),
    ({"r": 1, "c": 5, "n": None, "app": {}, "na": 2, "po": [], "g": {}}, [np.zeros(D, np.float32)], "na the count"),
    ({"r": 1, "c": 5, "n": None, "app": {}, "na": 0, "po": [[4, "p001"]], "g": {}},
     [np.zeros((1, D), np.float32)], "po must list"),
    ({"r": 1, "c": 5, "n": None, "app": {}, "na": 0, "po": [[7, "p001"]], "g": {}},
     [np.zeros((1, D + 1), np.float32)], f"1 x {D} finite"),
    ({"r": 1, "c": 5, "n": None, "app": {}, "na": 0, "po": [[7, "p001"]], "g": {}},
     [np.full((1, D), np.nan, np.float32)], f"1 x {D} finite"),
    ({"r": 1, "c": 5, "n": None, "app": {}, "na": 0, "po": [], "g": {"p001": ["x"]}}, [], "g must map"),
    # clocks past what publish sends (2**63 - 1): taken in, the next wait on the training
    # thread raised, and every gradient after was dropped as late
    ({"r": 1, "c": 0, "n": 2**64 - 1, "app": {}, "na": 0, "po": [], "g": {}}, [], "n None or a clock after c"),
    ({"r": 1, "c": 2**63, "n": None, "app": {}, "na": 0, "po": [], "g": {}}, [], "c must be a clock"),
    ({"r": 1, "c": 5, "n": None, "app": {}, "na": 0, "po": [[2**63, "p001"]], "g": {}},
     [np.zeros((1, D), np.float32)], "po must list"),
    ({"r": 1, "c": 5, "n": None, "app": {}, "na": 0, "po": [], "g": {"p001": [2**63]}}, [], "g must map"),
    ({"r": 0, "no": "busy"}, [], "r must be a request number"),
])
def test_a_malformed_copy_is_refused_and_changes_nothing(body, arrays, match):
    """A grad_state that is not what the protocol says (a missing clock, a jump that is
    not ahead, pending gradients of the wrong shape or not finite, ...) is refused where
    it comes in, with the reason; the asking peer keeps waiting for a good one, and one
    that comes then is handed out."""
    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(N)
        a, result, turn = _asking(links)
        a.publish(np.ones(D), clock=0)   # a's last message: clock 0, next turn at 3
        await links[1].send("p000", GRAD_LATE, {"c": 0, "at": 5})
        await settle(hub)
        t = asyncio.create_task(asyncio.to_thread(turn))
        for _ in range(50):   # the request went to p001
            await settle(hub)
            if a.resyncing:
                break
        await links[1].send("p000", GRAD_STATE, body, arrays)
        await settle(hub)
        assert len(hub.errors) == 1 and match in str(hub.errors[0]), hub.errors
        assert a.snapshot() is None and a.resyncing and a.stats.resyncs == 0
        good = np.arange(D, dtype=np.float32)
        await links[1].send("p000", GRAD_STATE, {"r": 1, "c": 2, "n": None, "app": {"n": 7}, "na": 1,
                                                  "po": [], "g": {}}, [good])
        await t
        snap = a.snapshot()
        assert result["done"] is False and snap is not None and snap.clock == 2 and snap.body == {"n": 7}
        assert np.array_equal(snap.arrays[0], good)
    asyncio.run(main())


def test_a_copy_the_caller_cannot_load_is_refused_and_changes_nothing(caplog):
    """The caller checks the copy's own content (a DQN's parameters, say); one it cannot
    load is refused with a log line that says why, and the relay is as before: the
    gradients it holds stay, and it asks again a second later at the earliest."""
    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(N)
        a, result, turn = _asking(links)
        a.publish(np.ones(D), clock=0)
        await links[2].send("p000", "grad", {"o": "p002", "s": 1, "h": 1, "c": 2, "meta": {"codec": "identity",
                                                                                          "n": D}},
                            [np.ones(D, np.float32)])
        await links[1].send("p000", GRAD_LATE, {"c": 0, "at": 5})
        await settle(hub)
        t = asyncio.create_task(asyncio.to_thread(turn))
        for _ in range(50):
            await settle(hub)
            if a.resyncing:
                break
        await links[1].send("p000", GRAD_STATE, {"r": 1, "c": 1, "n": None, "app": {"n": 7}, "na": 1,
                                                  "po": [], "g": {}}, [np.zeros(D + 1, np.float32)])
        await t
        snap = a.snapshot()
        with caplog.at_level(logging.WARNING, logger="swarm.gossip.relay"):
            a.refuse(snap, "parameters of 17 values; this network has 16")
        assert "refused the copy of 'p001': parameters of 17 values; this network has 16; nothing changed" in caplog.text
        assert a.snapshot() is None and not a.resyncing and a.stats.resyncs == 0 and a.stats.resync_failed == 1
        assert a.pending == 1   # p002's gradient at clock 2 is still there
        assert [g.tolist() for g in a.take(before=3)] == [[1.0] * D]
    asyncio.run(main())


def test_late_gradients_are_dropped_and_their_origin_told_once_a_second():
    """Past a turn's clock, a gradient that comes for an earlier one is not applied (it
    would go elsewhere in the order than at the peers that had it in time); its origin
    gets one grad_late notice, not one per gradient."""
    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(2)
        notices = []
        a = GradientRelay(links[0], D, state=Copy().state)
        links[1].on(GRAD_LATE, notices.append)
        assert a.take(before=6) == []
        for seq, clock in ((1, 3), (2, 5), (3, 7)):
            await links[1].send("p000", "grad", {"o": "p001", "s": seq, "h": 1, "c": clock,
                                                 "meta": {"codec": "identity", "n": D}}, [np.ones(D, np.float32)])
        await settle(hub)
        assert a.stats.late == 2 and a.stats.received == 1 and a.pending == 1
        assert [m.body for m in notices] == [{"c": 3, "at": 6, "f": 1}]   # f: about a first copy
    asyncio.run(main())


def test_a_pass_that_says_its_origin_is_back_is_not_late():
    """A peer that adopted a copy and takes turns again from clock 19 says so itself: a
    pass of its turns up to 16 that names it in j. A peer whose turns went past 16 does
    not count that pass late nor tell its origin so, and waits for the origin's turn at
    19 again (it was out of step, and not waited for)."""
    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(2)
        notices = []
        links[1].on(GRAD_LATE, notices.append)
        a = GradientRelay(links[0], D, state=Copy().state)
        msg = {"o": "p001", "h": 1, "meta": {"codec": "identity", "n": D}}
        await links[1].send("p000", "grad", dict(msg, s=1, c=1), [np.ones(D, np.float32)])
        await settle(hub)
        assert a.wait(18, 0.0, every=N, first=0)   # p001 (last heard at 1) is out of step
        assert len(a.take(before=18)) == 1
        await links[1].send("p000", "grad", dict(msg, s=2, c=16, p=1, meta={}, j=[["p001", 16]]))
        await settle(hub)
        assert a.stats.late == 0 and a.stats.passes_in == 1 and notices == []
        waiting = asyncio.create_task(asyncio.to_thread(a.wait, 21, 5.0, every=N, first=0))
        await settle(hub)
        assert not waiting.done()   # for p001's turn at 19
        await links[1].send("p000", "grad", dict(msg, s=3, c=19), [np.full(D, 2.0, np.float32)])
        assert await waiting
        assert [g[0] for g in a.take(before=21)] == [2.0] and a.stats.late == 0 and not hub.errors
    asyncio.run(main())


def test_a_notice_from_a_peer_behind_this_one_is_ignored():
    """A peer that was frozen takes the others' old messages in after its first turn
    back, so they are late for it, and it says so; they are not out of step (its turns
    are behind their last messages) and ask nobody. A notice from a peer whose turns
    are past this one's last message is acted on."""
    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(N)
        asks = []
        links[1].on(GRAD_SYNC, asks.append)
        a = GradientRelay(links[0], D, state=Copy().state, resync_timeout=0.3)
        a.publish(np.ones(D), clock=30)
        await links[1].send("p000", GRAD_LATE, {"c": 27, "at": 28})    # from a peer at clock 28
        await settle(hub)
        await asyncio.to_thread(a.wait, 33, 0.1, every=N, first=0)
        await settle(hub)
        assert asks == [] and not a.resyncing and a.stats.resync_failed == 0
        await links[1].send("p000", GRAD_LATE, {"c": 30, "at": 40})    # from one at clock 40
        await settle(hub)
        await asyncio.to_thread(a.wait, 33, 0.1, every=N, first=0)   # asks, and gives up waiting
        assert [m.body for m in asks] == [{"r": 1, "b": 30}]
    asyncio.run(main())


def test_a_request_that_cannot_be_sent_is_given_up_at_once(caplog):
    """The peer asked is not reachable (it left the view, or its link is down a moment
    after it was frozen): the asker gives up at once and its turn goes on, instead of
    waiting resync_timeout with nothing on its way."""
    caplog.set_level(logging.INFO, logger="swarm.gossip.relay")

    async def main():
        hub = SimHub(topology="ring")
        links = hub.add_many(N)
        a = GradientRelay(links[0], D, state=Copy().state, resync_timeout=60.0)
        a.publish(np.ones(D), clock=0)
        await links[1].send("p000", GRAD_LATE, {"c": 0, "at": 5})
        await settle(hub)
        hub.remove("p001")
        await asyncio.to_thread(a.wait, 3, 0.2, every=N, first=0)
        assert a.stats.resync_failed == 1 and not a.resyncing
    asyncio.run(main())
    assert "could not ask 'p001' for its copy (no link to it now)" in caplog.text
