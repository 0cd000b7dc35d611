"""Rates that describe traffic, not bookkeeping: a peer resumed from a checkpoint, a
peer whose figures stopped coming, and a heartbeat whose stats hold more than 64 keys."""

from __future__ import annotations

import asyncio
import time

import pytest
from swarmtest import until

from swarm.coordinator import Coordinator
from swarm.coordinator.report import MAX_STAT_ITEMS, PeerRates, prometheus, status_document
from swarm.peer import Peer


def test_counters_carried_from_a_checkpoint_are_no_traffic():
    """A peer of `swarm run --resume` sends its process's own byte counts until it trains,
    then the run's, carried over from its checkpoint (with its env steps, which were not
    sent before): the rate over that jump read 459 kB/s for ~60 kB/s, for 5 s."""
    r = PeerRates()
    r.observe("peer0", 1, 4.5, {"bytes_out": 55, "bytes_in": 40})
    r.observe("peer0", 1, 5.0, {"bytes_out": 55, "bytes_in": 40})
    r.observe("peer0", 1, 5.5, {"env_steps": 1629, "bytes_out": 512749, "bytes_in": 498000})
    assert r.rates("peer0")["bytes_out"] is None   # one sample of the run's figures: not known yet
    r.observe("peer0", 1, 6.5, {"env_steps": 1755, "bytes_out": 553855, "bytes_in": 530000})
    got = r.rates("peer0")
    assert got["bytes_out"] == pytest.approx(41106) and got["bytes_in"] == pytest.approx(32000)
    assert got["env_steps"] == pytest.approx(126)
    # /metrics has the rate too, beside the run's totals (which a Prometheus rate() misreads on a restart)
    doc = status_document({"members": [{"id": "peer0", "rank": 0, "state": "alive", "stats": {"bytes_out": 553855}}]},
                          r, now=7.0)
    assert 'swarm_peer_bytes_out_per_second{run="",peer="peer0",rank="0"} 41106.0\n' in prometheus(doc)
    # the runner now sends no byte counts before it trains: the same, from None
    r.observe("peer1", 1, 0.0, {"bytes_out": None})
    r.observe("peer1", 1, 1.0, {"env_steps": 2127, "bytes_out": 687542})
    r.observe("peer1", 1, 2.0, {"env_steps": 2226, "bytes_out": 719184})
    assert r.rates("peer1")["bytes_out"] == pytest.approx(31642)


def test_the_rates_of_a_peer_whose_figures_stopped_are_unknown():
    # the page, /metrics and `swarm status --watch` ask as of now, on the clock of the stamps
    now = time.monotonic()
    frozen = PeerRates()
    frozen.observe("p", 1, now - 7.0, {"env_steps": 0})
    frozen.observe("p", 1, now - 6.0, {"env_steps": 100})
    row = status_document({"members": [{"id": "p", "state": "alive", "stats": {"env_steps": 100}}]},
                          frozen)["peers"][0]
    assert row["env_steps"] == 100 and row["env_steps_per_s"] is None   # not the last window's 100/s
    r = PeerRates(window_s=5.0)
    for t in range(6):
        r.observe("p", 1, float(t), {"env_steps": 100 * t})
    assert r.rates("p", now=7.0)["env_steps"] == pytest.approx(100.0)   # 2 s old: still current
    assert r.rates("p", now=10.5)["env_steps"] is None                  # older than the window
    # figures that come further apart than the window (a long peer.heartbeat_s) stay known between them
    slow = PeerRates(window_s=5.0)
    for t in (0.0, 10.0, 20.0):
        slow.observe("q", 1, t, {"env_steps": 10 * t})
    assert slow.rates("q", now=29.0)["env_steps"] == pytest.approx(10.0)
    assert slow.rates("q", now=41.0)["env_steps"] is None


def test_a_heartbeat_of_more_than_64_keys_is_cut_not_dropped():
    """The coordinator dropped such a heartbeat's stats whole and in silence: the peer's
    figures froze at the last that fitted, while its rate went on being shown."""
    async def main():
        async with Coordinator(bind="tcp://127.0.0.1:*") as coord:
            t0, extra = time.monotonic(), {"n": 0}

            def stats() -> dict:
                return {"env_steps": int(100 * (time.monotonic() - t0)),
                        **{f"loss_{i}": 0.5 for i in range(extra["n"])}}

            p = Peer(coordinators=[coord.address], id="p0", rank=0)
            p.stats = stats
            await p.start()
            try:
                def figures() -> dict:
                    return next(m for m in coord.status()["members"] if m["id"] == "p0").get("stats") or {}

                await until(lambda: figures().get("env_steps"), 10.0, "the peer's first figures")
                extra["n"] = 80   # with the peer's own 10 counters: 91 keys
                before = figures()["env_steps"]
                got = await until(lambda: (s := figures()).get("env_steps", 0) > before and "loss_0" in s and s,
                                  10.0, "the figures of a heartbeat of 91 keys")
                assert len(got) == MAX_STAT_ITEMS   # its first 64, as the docs say
            finally:
                await p.close()

    asyncio.run(asyncio.wait_for(main(), 60))
