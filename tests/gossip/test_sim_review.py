"""SimHub, run_rounds and View.apply on the inputs a reviewer found mishandled."""

import asyncio

import numpy as np
import pytest

from swarm import wire
from swarm.errors import ConfigError
from swarm.gossip.sim import SimHub, run_rounds
from swarm.link import Member, View

T = "gsp_full"   # any registered type: the hub only routes it


# ------------------------------------------------------------ add_many

@pytest.mark.parametrize("first, batch", [([], ["a", "a"]), (["x"], ["y", ""]), (["x"], ["y", "x"]),
                                          (["x"], ["y", 3]), (["x"], -2), (["x"], True), (["x"], "yz")])
def test_refused_add_many_changes_nothing(first, batch):
    hub = SimHub()
    hub.add_many(first)
    before = (list(hub.links), hub.view, hub._next_rank)
    with pytest.raises(ConfigError, match="peer"):
        hub.add_many(batch)
    assert (list(hub.links), hub.view, hub._next_rank) == before
    hub.add("a")   # an id the refused batch named is still free
    assert hub.view.ids == first + ["a"]


def test_add_many_takes_a_numpy_count_and_an_empty_batch_installs_nothing():
    hub = SimHub()
    assert [link.id for link in hub.add_many(np.int64(2))] == ["p000", "p001"]
    epoch = hub.view.epoch
    assert hub.add_many(0) == [] and hub.add_many([]) == []
    assert hub.view.epoch == epoch


# ------------------------------------------------------------ custom graphs

def test_custom_neighbours_in_a_view_smaller_than_the_graph():
    hub = SimHub(topology="custom", edges=[(0, 1), (1, 2)])
    a, b = hub.add_many(2)
    assert a.neighbours() == ["p001"] and b.neighbours() == ["p000"]
    c = hub.add("c")
    assert b.neighbours() == ["p000", "c"] and c.neighbours() == ["p001"]


def test_generator_edges_serve_every_call():
    hub = SimHub(topology="custom", edges=iter([(0, 1), (1, 2)]))
    links = hub.add_many(3)
    first = [link.neighbours() for link in links]
    assert first == [["p001"], ["p000", "p002"], ["p001"]]
    assert [link.neighbours() for link in links] == first


@pytest.mark.parametrize("kw, name", [
    (dict(topology="custom"), "edges"),
    (dict(topology="custom", edges=[(0, 1.5)]), "edge"),
    (dict(topology="random_pairing", seed="x"), "seed"),
    (dict(seed=None), "seed"),
    (dict(seed=-1), "seed"),
    (dict(seed=True), "seed"),
    (dict(queue_limit=True), "queue_limit"),
    (dict(queue_limit=0), "queue_limit"),
    (dict(bandwidth_bps=True), "bandwidth_bps"),
    (dict(bandwidth_bps="1e6"), "bandwidth_bps"),
    (dict(bandwidth_bps=float("inf")), "bandwidth_bps"),
    (dict(latency_s="1"), "latency_s"),
    (dict(latency_s=float("inf")), "latency_s"),
    (dict(latency_s=None), "latency_s"),
])
def test_bad_hub_arguments_are_refused_at_construction(kw, name):
    with pytest.raises(ConfigError, match=name):
        SimHub(**kw)


def test_numpy_hub_arguments_are_fine():
    hub = SimHub(topology="random_pairing", seed=np.int64(3), queue_limit=np.int64(4),
                 bandwidth_bps=np.float32(1e6), latency_s=np.float64(0.0))
    assert hub.queue_limit == 4 and len(hub.add_many(4)[0].neighbours()) == 1


# ------------------------------------------------------------ close()

def test_close_drops_deliveries_still_scheduled():
    async def main():
        hub = SimHub(latency_s=0.05)
        a, b = hub.add_many(2)
        ran = []
        b.on(T, lambda msg: ran.append(msg.t))
        assert await a.send("p001", T, {})
        await hub.close()
        await asyncio.sleep(0.1)
        sent_after = await a.send("p001", T, {})
        await asyncio.sleep(0.1)
        return ran, sent_after, hub

    ran, sent_after, hub = asyncio.run(main())
    assert ran == [] and sent_after is False and not hub._tasks
    assert hub._in_flight[("p000", "p001")] == 0


# ------------------------------------------------------------ run_rounds

class _Engine:
    def __init__(self, fail: bool):
        self.fail, self.done, self.cancelled = fail, 0, False

    async def round(self):
        if self.fail:
            await asyncio.sleep(0)
            raise RuntimeError("boom")
        try:
            await asyncio.sleep(0.2)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        self.done += 1


def test_run_rounds_failure_cancels_and_awaits_the_other_engines():
    async def main():
        engines = [_Engine(True), _Engine(False), _Engine(False)]
        with pytest.raises(RuntimeError, match="boom"):
            await run_rounds(engines, 1)
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        await asyncio.sleep(0.3)
        return engines, left

    engines, left = asyncio.run(main())
    assert left == []
    assert [e.done for e in engines[1:]] == [0, 0] and all(e.cancelled for e in engines[1:])


def test_run_rounds_cancelled_cancels_the_engines():
    async def main():
        engines = [_Engine(False), _Engine(False)]
        task = asyncio.ensure_future(run_rounds(engines, 3))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return engines, [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    engines, left = asyncio.run(main())
    assert left == [] and all(e.cancelled for e in engines)


def test_run_rounds_results_in_engine_order():
    class E:
        def __init__(self, k):
            self.k = k

        async def round(self):
            await asyncio.sleep(0.01 * (3 - self.k))
            return self.k

    assert asyncio.run(run_rounds([E(0), E(1), E(2)], 2)) == [[0, 1, 2], [0, 1, 2]]


# ------------------------------------------------------------ View.apply

def _m(i, r):
    return Member(i, "tcp://" + i, r)


VIEW = View(1, (_m("a", 0), _m("b", 1), _m("ab", 2)))


@pytest.mark.parametrize("delta", [
    {"base": 1, "epoch": 2, "add": [], "remove": "ab"},          # a str would remove "a" and "b"
    {"base": 1, "epoch": 2, "add": [], "remove": ["ab", 3]},
    {"base": 1, "epoch": 0, "add": [], "remove": []},            # epoch going backwards
    {"base": "1", "epoch": 2, "add": [], "remove": []},
    {"base": 1, "epoch": "2", "add": [], "remove": []},
    {"base": True, "epoch": 2, "add": [], "remove": []},
    {"base": 1, "epoch": 2, "add": "x", "remove": []},
])
def test_view_apply_refuses_malformed_deltas(delta):
    with pytest.raises(ValueError):
        VIEW.apply(delta)


def test_view_apply_still_round_trips():
    new = View(3, (_m("b", 1), _m("c", 3)))
    assert VIEW.apply(new.delta(VIEW)) == new
    assert VIEW.apply(VIEW.delta(VIEW)) == VIEW
    assert T in wire.known_types()
