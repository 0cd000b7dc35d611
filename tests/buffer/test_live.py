"""The federation between live peers: a real coordinator and real Peers over ZeroMQ on loopback.

The survivors run in the test's event loop, so their buffers can be queried
directly; the peer that gets killed is a separate process (live_replica.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from swarmtest import until

from swarm.buffer import Federation, ReplayBuffer
from swarm.coordinator import Coordinator
from swarm.peer import Peer

HERE = Path(__file__).parent
SCHEMA = {"obs": ("float32", (4,)), "action": ("int64", ())}


def batch(start: int, n: int) -> dict[str, np.ndarray]:
    a = np.arange(start, start + n)
    return {"obs": np.tile(a[:, None], (1, 4)).astype(np.float32), "action": a}


def test_share_and_pull_between_live_peers():
    async def main():
        async with Coordinator(bind="tcp://127.0.0.1:*") as coord:
            peers = [Peer(coordinators=[coord.address], id=f"p{i}", rank=i, topology="ring") for i in range(3)]
            for p in peers:
                await p.start()
            try:
                for p in peers:
                    await p.wait_view(lambda v: len(v.members) == 3, timeout=10.0)
                    await p.wait_linked(10.0)
                bufs = [ReplayBuffer(SCHEMA, 1000, first_seq=0, peer_id=p.id, seed=i) for i, p in enumerate(peers)]
                feds = [Federation(b, p, share=1.0, seed=i) for i, (b, p) in enumerate(zip(bufs, peers))]

                # push: everything p0 adds reaches both ring neighbours, ids and origin times intact
                idx = bufs[0].add(batch(0, 50), times=123.0)
                assert await feds[0].flush() == 100          # 50 items to each of 2 neighbours
                for b in bufs[1:]:
                    await until(lambda b=b: len(b) == 50, 10.0, f"p0's items on {b.peer_id}")
                    assert sorted(b.ids()) == [("p0", s) for s in range(50)]
                    s = b.sample(50)
                    assert (s.origin_times == 123.0).all()
                    np.testing.assert_array_equal(np.sort(s.batch["action"]), np.sort(np.unique(s.batch["action"])))
                assert len(bufs[0]) == 50 and idx.size == 50

                # dedupe: the same items pushed again are dropped by id on arrival
                await feds[0]._send_items("p1", "buf.push", bufs[0].items(idx), {"rid": 0, "ack": False})
                await until(lambda: feds[1].stats.duplicates == 50, 10.0, "duplicates counted on p1")
                assert len(bufs[1]) == 50

                # pull: p2 asks p1 for items p1 made itself (p1 does not share them)
                feds[1].share = 0.0
                bufs[1].add(batch(1000, 40))
                await feds[1].flush()
                got = await feds[2].pull("p1", 500, timeout=5.0)
                assert got > 0
                p1_ids = {i for i in bufs[2].ids() if i[0] == "p1"}
                assert len(p1_ids) == got and p1_ids <= set(bufs[1].ids())
                assert all(0 <= s < 40 for _, s in p1_ids)
            finally:
                for p in peers:
                    await p.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_acknowledged_items_survive_a_sigkilled_peer(tmp_path):
    """replicas=1: every item the victim saw acknowledged is on a surviving neighbour after kill -9."""
    out = tmp_path / "acked.json"

    async def main():
        async with Coordinator(bind="tcp://127.0.0.1:*") as coord:
            peers = [Peer(coordinators=[coord.address], id=f"s{i}", rank=i, topology="ring") for i in range(2)]
            for p in peers:
                await p.start()
            bufs = [ReplayBuffer(SCHEMA, 100_000, peer_id=p.id, seed=i) for i, p in enumerate(peers)]
            feds = [Federation(b, p, share=0.0, replicas=1) for b, p in zip(bufs, peers)]
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            log = open(tmp_path / "victim.log", "w")
            victim = subprocess.Popen([sys.executable, str(HERE / "live_replica.py"), coord.address,
                                       "victim", "3", str(out)], stdout=log, stderr=subprocess.STDOUT, env=env)
            try:
                for p in peers:
                    await p.wait_view(lambda v: len(v.members) == 3, timeout=20.0)

                def acked():
                    if victim.poll() is not None:
                        raise AssertionError(f"victim exited early:\n{(tmp_path / 'victim.log').read_text()}")
                    return out.exists() and len(json.loads(out.read_text())) >= 200

                await until(acked, 30.0, "200 acknowledged items in the victim")
                os.kill(victim.pid, signal.SIGKILL)
                await asyncio.get_running_loop().run_in_executor(None, victim.wait, 5)
                acknowledged = json.loads(out.read_text())
                # the survivors notice: the view drops the victim
                for p in peers:
                    await p.wait_view(lambda v: "victim" not in v.ids, timeout=10.0)
                held = {s for b in bufs for o, s in b.ids() if o == "victim"}
                lost = sorted(set(acknowledged) - held)
                assert not lost, f"{len(lost)} acknowledged items lost, e.g. {lost[:10]}"
                assert len(acknowledged) >= 200 and len(held) >= len(acknowledged)
                # and what survives is the victim's data, not just its ids
                for b in bufs:
                    it = b.items(np.arange(b.total_added))
                    mine = np.array([it.peers[o] == "victim" for o in it.origins], dtype=bool)
                    np.testing.assert_array_equal(it.fields["action"][mine], it.seqs[mine])
            finally:
                if victim.poll() is None:
                    victim.kill()
                victim.wait(5)
                log.close()
                for p in peers:
                    await p.close()

    asyncio.run(asyncio.wait_for(main(), 90))


def test_a_restarted_holder_without_replicas_of_its_own_gets_its_copies_back():
    """b holds a's replicas (b itself replicates nothing), closes and comes back empty under the
    same id before a flushes again: b's first flush says buf.resync, and a replicates again."""
    async def main():
        async with Coordinator(bind="tcp://127.0.0.1:*") as coord:
            a = Peer(coordinators=[coord.address], id="a", rank=0, topology="ring")
            b = Peer(coordinators=[coord.address], id="b", rank=1, topology="ring")
            b2 = None
            for p in (a, b):
                await p.start()
            try:
                for p in (a, b):
                    await p.wait_view(lambda v: len(v.members) == 2, timeout=10.0)
                    await p.wait_linked(10.0)
                ba = ReplayBuffer(SCHEMA, 1000, peer_id="a", seed=0)
                fa = Federation(ba, a, share=0.0, replicas=1)
                bb = ReplayBuffer(SCHEMA, 1000, peer_id="b", seed=1)
                Federation(bb, b, share=0.0)
                ba.add(batch(0, 30))
                await fa.flush()
                acked = []
                await until(lambda: acked.extend(fa.take_acknowledged()) or len(acked) == 30, 10.0,
                            "b's acks of a's 30 items")
                assert len(bb) == 30
                await b.close()                # b's process ends; a does not flush meanwhile
                b2 = Peer(coordinators=[coord.address], id="b", rank=1, topology="ring")
                await b2.start()
                await b2.wait_view(lambda v: len(v.members) == 2, timeout=10.0)
                await b2.wait_linked(10.0)
                assert a.neighbours() == ["b"]  # to a, b never left
                bb2 = ReplayBuffer(SCHEMA, 1000, peer_id="b", seed=2)
                fb2 = Federation(bb2, b2, share=0.0)
                await fb2.flush()
                await until(lambda: fa.stats.rereplicated == 30, 10.0, "b's buf.resync at a")
                await fa.flush()
                await until(lambda: len(bb2) == 30, 10.0, "a's items on the restarted b")
                assert set(acked) <= set(bb2.ids())
            finally:
                for p in (a, b, b2):
                    if p is not None:
                        await p.close()

    asyncio.run(asyncio.wait_for(main(), 60))


async def flush_until(fed: Federation, acked: list, pred, what: str, timeout: float = 20.0) -> None:
    """Flush ``fed`` (collecting what it acknowledged into ``acked``) until ``pred()``."""
    deadline = time.monotonic() + timeout
    while True:
        await fed.flush()
        acked.extend(fed.take_acknowledged())
        if pred():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}: {fed.stats}")
        await asyncio.sleep(0.05)


async def settle_acks(fed: Federation, acked: list) -> None:
    """A few flushes, apart: acks in flight land, nothing waiting for a neighbour goes."""
    for _ in range(3):
        await asyncio.sleep(0.2)
        await fed.flush()
        acked.extend(fed.take_acknowledged())


def test_replicas_wait_for_a_neighbour_that_joins_later():
    """replicas=2 on a ring of two: p0's items are held by its one neighbour and wait,
    counted as under-replicated; when p2 joins they go to it and count as acknowledged.
    Before, they were never acknowledged and never sent to p2."""
    async def main():
        async with Coordinator(bind="tcp://127.0.0.1:*") as coord:
            peers = [Peer(coordinators=[coord.address], id=f"p{i}", rank=i, topology="ring") for i in range(3)]
            started = []
            try:
                for p in peers[:2]:
                    await p.start()
                    started.append(p)
                for p in peers[:2]:
                    await p.wait_view(lambda v: len(v.members) == 2, timeout=10.0)
                    await p.wait_linked(10.0)
                bufs = [ReplayBuffer(SCHEMA, 1000, first_seq=0, peer_id=p.id, seed=i) for i, p in enumerate(peers)]
                fed = Federation(bufs[0], peers[0], share=0.0, replicas=2, ack_timeout=0.5)
                Federation(bufs[1], peers[1], share=0.0)
                acked: list = []
                bufs[0].add(batch(0, 50))
                await flush_until(fed, acked, lambda: len(bufs[1]) == 50, "p0's items on p1")
                await settle_acks(fed, acked)
                assert acked == [] and fed.stats.under_replicated == 50 and fed.stats.pushed == 50

                await peers[2].start()
                started.append(peers[2])
                Federation(bufs[2], peers[2], share=0.0)
                await until(lambda: peers[0].neighbours() == ["p1", "p2"], 10.0, "p2 in p0's view")
                await flush_until(fed, acked, lambda: len(acked) == 50, "p0's 50 items acknowledged")
                assert sorted(acked) == [("p0", s) for s in range(50)]
                assert sorted(bufs[2].ids()) == [("p0", s) for s in range(50)]
                assert fed.stats.under_replicated == 0
            finally:
                for p in started:
                    await p.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_replicas_wait_while_a_neighbour_is_killed_and_go_to_its_successor(tmp_path):
    """replicas=2 on a ring of three, the third peer a process: after kill -9 it leaves the
    view and p0's items wait on one holder (counted); a new process under the same id
    joins and they reach it and count as acknowledged. Before, items added while it was
    gone were never acknowledged nor sent to the new one."""
    async def main():
        async with Coordinator(bind="tcp://127.0.0.1:*") as coord:
            peers = [Peer(coordinators=[coord.address], id=f"p{i}", rank=i, topology="ring") for i in range(2)]
            procs: list[subprocess.Popen] = []
            logs = []

            def holder() -> subprocess.Popen:
                log = open(tmp_path / f"holder{len(procs)}.log", "w")
                logs.append(log)
                procs.append(subprocess.Popen([sys.executable, str(HERE / "live_holder.py"), coord.address, "h"],
                                              stdout=log, stderr=subprocess.STDOUT,
                                              env=dict(os.environ, PYTHONUNBUFFERED="1")))
                return procs[-1]

            try:
                for p in peers:
                    await p.start()
                victim = holder()
                for p in peers:
                    await p.wait_view(lambda v: len(v.members) == 3, timeout=20.0)
                bufs = [ReplayBuffer(SCHEMA, 1000, first_seq=0, peer_id=p.id, seed=i) for i, p in enumerate(peers)]
                fed = Federation(bufs[0], peers[0], share=0.0, replicas=2, ack_timeout=0.5)
                Federation(bufs[1], peers[1], share=0.0)
                acked: list = []
                bufs[0].add(batch(0, 20))
                await flush_until(fed, acked, lambda: len(acked) == 20, "20 items acknowledged by p1 and h")

                os.kill(victim.pid, signal.SIGKILL)
                await asyncio.get_running_loop().run_in_executor(None, victim.wait, 5)
                await peers[0].wait_view(lambda v: "h" not in v.ids, timeout=20.0)
                bufs[0].add(batch(20, 30))
                await flush_until(fed, acked, lambda: len(bufs[1]) == 50, "the new items on p1")
                await settle_acks(fed, acked)
                # h's copies of the first 20 may have died with it: they wait again too
                assert len(acked) == 20 and fed.stats.rereplicated == 20 and fed.stats.under_replicated == 50

                holder()                       # the same id again, empty
                await peers[0].wait_view(lambda v: "h" in v.ids, timeout=20.0)
                await flush_until(fed, acked, lambda: len(acked) == 50, "all 50 acknowledged, by the new h too")
                assert sorted(acked) == [("p0", s) for s in range(50)]
                assert fed.stats.under_replicated == 0
            finally:
                for proc in procs:
                    if proc.poll() is None:
                        proc.kill()
                    proc.wait(5)
                for log in logs:
                    log.close()
                for p in peers:
                    await p.close()

    asyncio.run(asyncio.wait_for(main(), 120))
