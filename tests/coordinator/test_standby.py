"""A standby coordinator takes over at the primary's death (how fast: scripts/bench_failover.py),
with a higher epoch, while gossip between peers never stops; no split brain, also
when the coordinators cannot talk to each other (keys), one of them watches
none, or they report one address; of two active ones the newer epoch stays."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time

import pytest
import zmq
import zmq.asyncio
from swarmtest import free_port, freeze, run_frozen, start_ticking_peers, status, tick_neighbours, until, wait_for

from swarm import Coordinator, wire
from swarm.cli import query_status
from swarm.coordinator.report import PeerRates, format_table, status_document
from swarm.transport import generate_keys



def test_standby_takes_over(procs):
    a = f"tcp://127.0.0.1:{free_port()}"
    b = f"tcp://127.0.0.1:{free_port()}"
    # the lower address is the one that is active first
    primary, standby = sorted([a, b])
    cp = procs.start("coordinator", "--bind", primary, "--others", standby, name="primary")
    cs = procs.start("coordinator", "--bind", standby, "--others", primary, name="standby")
    wait_for(lambda: status(primary)["mode"] == "active" and status(standby)["mode"] == "standby", 15,
             what="primary active, standby standing by")

    async def main() -> None:
        peers, got = await start_ticking_peers([f"s{i}" for i in range(4)], [primary, standby])
        try:
            e0 = max(p.epoch for p in peers)

            cp.kill()
            cp.wait()
            stop = asyncio.Event()

            async def gossip() -> None:   # neighbours keep exchanging through the failover
                while not stop.is_set():
                    await tick_neighbours(peers)
                    await asyncio.sleep(0.02)

            task = asyncio.create_task(gossip())
            try:
                before = dict(got)
                # the views' deadline decides: how fast the takeover is is scripts/bench_failover.py's
                # to measure, as a time limit in a unit test fails on a loaded machine alone
                await asyncio.gather(*(p.wait_view(lambda v: v.epoch > e0 and len(v.members) == 4, timeout=10)
                                       for p in peers))
            finally:
                # ended here, not by asyncio.run after the peers it sends from are closed;
                # its sends have deadlines, so it ends within a round
                stop.set()
                await task
            assert all(got[k] > before[k] for k in got), (before, got)
            st = await asyncio.to_thread(status, standby)
            assert st["mode"] == "active" and st["epoch"] > e0
            assert sorted(m[0] for m in st["view"]["members"]) == [p.id for p in peers]

            # the old primary comes back (fresh, empty): it must not hand out views
            cp2 = procs.start("coordinator", "--bind", primary, "--others", standby, name="primary2")
            await asyncio.sleep(2.5)
            st2 = await asyncio.to_thread(status, primary)
            assert st2["mode"] == "standby", st2["mode"]
            assert max(p.epoch for p in peers) == (await asyncio.to_thread(status, standby))["epoch"]
            assert cp2.poll() is None and cs.poll() is None
        finally:
            for p in peers:
                await p.close()

    asyncio.run(main())


def test_a_bad_address_of_another_coordinator_ends_the_process(procs):
    # it used to log the failure and then hang, up but deaf, until a signal came
    c = procs.start("coordinator", "--bind", f"tcp://127.0.0.1:{free_port()}", "--others", "foo", name="bad")
    assert c.wait(15) == 2
    log = procs.log(c)
    assert "swarm: error: --others 'foo'" in log   # refused before it binds
    assert "swarm coordinator on" not in log and "Traceback" not in log


def _status(addr: str, keys: str) -> dict:
    return asyncio.run(query_status(addr, 2.0, keys))


def _key_folders(tmp_path, case: str) -> tuple[str, str]:
    """--keys of a primary and of a standby that cannot talk to it ("" for none)."""
    k1 = tmp_path / "k1"
    generate_keys(str(k1), ["coordinator", "peer"])
    if case == "other keys":     # another `swarm keys generate`: another coordinator key pair
        generate_keys(str(tmp_path / "k2"), ["coordinator", "peer"])
        return str(k1), str(tmp_path / "k2")
    if case == "no keys":
        return str(k1), ""
    # the same pair, but the primary's authorized/ lacks coordinator.key: it refuses the standby
    shutil.copytree(k1, tmp_path / "k1b")
    (k1 / "authorized" / "coordinator.key").unlink()
    return str(k1), str(tmp_path / "k1b")


@pytest.mark.parametrize("case", ["other keys", "no keys", "key not authorized"])
def test_a_standby_that_cannot_talk_to_the_primary_stands_by_and_says_why(procs, tmp_path, case):
    # it took over at once, as if the primary were down: two active coordinators, each
    # handing out views to the peers that could reach it (a split brain)
    primary, standby = sorted(f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    kp, ks = _key_folders(tmp_path, case)
    cp = procs.start("coordinator", "--bind", primary, "--others", standby, *(["--keys", kp] if kp else []),
                     name="primary")
    wait_for(lambda: _status(primary, kp)["mode"] == "active", 15, what="the primary active")
    cs = procs.start("coordinator", "--bind", standby, "--others", primary, *(["--keys", ks] if ks else []),
                     name="standby")
    wait_for(lambda: _status(standby, ks), 15, what="the standby up")
    for _ in range(12):   # 3 s: three times takeover_s
        assert _status(standby, ks)["mode"] == "standby", procs.log(cs)
        assert _status(primary, kp)["mode"] == "active"
        time.sleep(0.25)
    # it says why: in `swarm status` and in its log
    st = _status(standby, ks)
    (other,) = st["others"]
    assert other["address"] == primary and other["state"] == "handshake failed" and other["error"], other
    assert f"mode standby  {primary}: handshake failed (" in format_table(status_document(st, PeerRates()))
    log = procs.log(cs)
    assert f"cannot talk to coordinator {primary}: the handshake fails ({other['error']})" in log
    assert "but not taking over: cannot tell whether" in log
    # and says it for certain where it can: a close in the handshake (what libzmq reports of a
    # mechanism mismatch when the other side saw it first) is looked into by reading the
    # other's greeting (its "most likely it runs with --keys" was right only by chance)
    why = {"other keys": "it closed the connection in the CURVE handshake: most likely it runs with another "
                         "coordinator key pair",
           "no keys": "it runs with --keys and this coordinator without them"}
    if case in why:
        assert other["error"] == why[case], other
    else:
        assert other["error"].startswith("it refused this coordinator's key (ZAP status"), other
    if case != "key not authorized":   # there only the standby is refused: the primary gets in
        (theirs,) = _status(primary, kp)["others"]
        assert theirs["state"] == "handshake failed"
        if case == "no keys":
            assert theirs["error"] == "it runs without --keys and this coordinator with them", theirs

    # once nothing listens there, the primary is down: the standby takes over (libzmq gives up
    # on an address after a refused key or a mechanism mismatch; the coordinator dials again)
    cp.kill()
    cp.wait()
    wait_for(lambda: _status(standby, ks)["mode"] == "active", 15, what="the standby taking over")
    assert _status(standby, ks)["others"][0]["state"] == "no answer"
    assert "nothing listens there" in procs.log(cs)


def test_an_active_coordinator_that_watches_none_is_the_one_left_active(procs):
    # the standby that had taken over stayed active beside it: two coordinators serving views
    primary, standby = sorted(f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    cs = procs.start("coordinator", "--bind", standby, "--others", primary, name="standby")
    wait_for(lambda: status(standby)["mode"] == "active", 15, what="the standby taking over")
    cp = procs.start("coordinator", "--bind", primary, name="alone")   # no --others: it never stands by
    wait_for(lambda: status(standby)["mode"] == "standby" and status(primary)["mode"] == "active", 15,
             what="the standby standing by for the coordinator that watches none")
    assert "watches no other coordinator (started without --others)" in procs.log(cs)
    wait_for(lambda: "this one was started without --others" in procs.log(cp), 5, what="its warning")
    assert cp.poll() is None and cs.poll() is None


def test_coordinators_that_report_one_address_elect_one():
    # hosts that each bind tcp://0.0.0.0:5555 all report that address: each found itself
    # the lowest, and both took over
    async def main() -> None:
        a, b = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
        ca = Coordinator(bind=a, others=[b], http_bind="")
        cb = Coordinator(bind=b, others=[a], http_bind="")
        await ca.start()
        try:
            await cb.start()
            ca.address = cb.address = "tcp://0.0.0.0:5555"
            await until(lambda: "active" in (ca.mode, cb.mode), 10, what="a takeover")
            for _ in range(20):   # 2 s: twice takeover_s
                assert (ca.mode, cb.mode).count("active") == 1
                await asyncio.sleep(0.1)
        finally:
            await cb.close()
            await ca.close()

    asyncio.run(main())


def test_a_standby_admitted_later_follows_the_active_primary(procs, tmp_path):
    # when the primary's authorized/ got the key, the standby took over in the moment between
    # the first handshake that succeeded and the primary's first answer (then stood down)
    primary, standby = sorted(f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    kp, ks = _key_folders(tmp_path, "key not authorized")
    procs.start("coordinator", "--bind", primary, "--others", standby, "--keys", kp, name="primary")
    wait_for(lambda: _status(primary, kp)["mode"] == "active", 15, what="the primary active")
    cs = procs.start("coordinator", "--bind", standby, "--others", primary, "--keys", ks, name="standby")
    wait_for(lambda: _status(standby, ks)["others"][0]["state"] == "handshake failed", 15,
             what="the standby refused by the primary")
    shutil.copy(tmp_path / "k1b" / "authorized" / "coordinator.key", tmp_path / "k1" / "authorized")
    wait_for(lambda: _status(standby, ks)["others"][0]["state"] == "active", 15, what="the primary's answer")
    log = procs.log(cs)
    assert "the handshake succeeds, so its failed handshakes no longer hold this one back" in log
    assert ": taking over at epoch" not in log and _status(standby, ks)["mode"] == "standby"


def _seen_as(c: Coordinator, now: float) -> dict:
    """What another coordinator's watch loop holds about ``c`` once it has answered."""
    b = c.brief()
    return {"seen": now, "epoch": b["epoch"], "mode": b["mode"], "name": b["coordinator"], "token": b["token"],
            "watches": 1, "members": b["members"], "handshake": "", "silent": "", "after_silent": "",
            "dialing_at": 0.0, "connected_at": 0.0, "redial_at": 0.0}


@contextlib.contextmanager
def two_active():
    """Two coordinators of this process, not started, both active: the lower address and
    the higher. :func:`decide_both` has each weigh the other as its watch loop would."""
    lower, higher = Coordinator(http_bind=""), Coordinator(http_bind="")
    try:
        lower.address, higher.address = "tcp://127.0.0.1:5001", "tcp://127.0.0.1:5002"
        lower.mode = higher.mode = "active"
        yield lower, higher
    finally:
        lower._shutdown()
        higher._shutdown()


def decide_both(lower: Coordinator, higher: Coordinator, now: float) -> None:
    lower._others = {higher.address: _seen_as(higher, now)}
    higher._others = {lower.address: _seen_as(lower, now)}
    lower._decide(now)
    higher._decide(now)


@pytest.mark.parametrize("epochs, stays", [((1, 1001), "higher"), ((1001, 1), "lower"), ((5, 5), "lower")])
def test_of_two_active_coordinators_the_newer_epoch_stays(epochs, stays):
    # the active one raised its epoch to the other's before comparing them: a tie every
    # time, so the lower address stayed active, also with the older view
    with two_active() as (lower, higher):
        lower.table.epoch, higher.table.epoch = epochs
        decide_both(lower, higher, time.monotonic())
        assert (lower.mode, higher.mode) == (("active", "standby") if stays == "lower" else ("standby", "active"))
        # the one that stands by follows the newer epoch, so that a takeover of its fences above it
        assert lower.table.epoch == higher.table.epoch == max(epochs)


def test_a_frozen_active_coordinator_that_comes_back_stands_by_for_the_newer_view(procs):
    # the lower address, frozen while the other took over and moved on to epoch 1001, stayed
    # active with no members when it thawed, and the other stood by ("A has a newer view")
    lower, higher = sorted(f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    ca = procs.start("coordinator", "--bind", lower, "--others", higher, name="lower")
    wait_for(lambda: status(lower)["mode"] == "active", 15, what="the lower address active")

    async def main() -> None:
        b = Coordinator(bind=higher, others=[lower], http_bind="")
        ctx = zmq.asyncio.Context()
        peer = ctx.socket(zmq.DEALER)
        peer.setsockopt(zmq.LINGER, 0)
        await b.start()
        try:
            await until(lambda: b.mode == "standby" and [o["state"] for o in b.status()["others"]] == ["active"], 10,
                        what="the higher address standing by")
            freeze(ca.pid)
            await until(lambda: b.mode == "active", 10, what="the takeover")
            peer.connect(higher)   # a peer that saw epoch 1000 from before a restart
            await peer.send_multipart(wire.encode("join", "p0", body={"addr": "tcp://127.0.0.1:40001", "rank": -1,
                                                                       "inc": 1, "last_epoch": 1000}))
            await until(lambda: b.table.view.epoch > 1000, 5, what="the view above epoch 1000")
            os.kill(ca.pid, signal.SIGCONT)
            deadline = time.monotonic() + 10
            while (await query_status(lower, 1.0))["mode"] != "standby":
                assert time.monotonic() < deadline, "the thawed coordinator did not stand by"
                await asyncio.sleep(0.1)
            for _ in range(10):   # twice the 0.5 s it took: it stays so
                assert b.mode == "active" and (await query_status(lower, 1.0))["mode"] == "standby"
                await asyncio.sleep(0.1)
            assert [m.id for m in b.table.view.members] == ["p0"]
        finally:
            peer.close(0)
            ctx.term()
            await b.close()

    run_frozen(main(), ca.pid)
    assert "has a newer view (epoch 100" in procs.log(ca)
