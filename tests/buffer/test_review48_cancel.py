"""Review 48, cancellation: a pull its caller cut short (a cancel: ``asyncio.timeout``,
``wait_for``, a TaskGroup, ``SyncPeer.call``'s timeout, Ctrl-C) threw its answer away
without a trace, though the neighbour drew and sent the items; a pull did not notice its
peer closing (one without a deadline waited for ever, one after returned 0); and a Ctrl-C
during a foreground ``buf.save(path)`` became ``ReplayError("... failed: ")``. Real peers
on loopback, real files."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from swarmtest import linked_pair, start_sync_ring, until

from swarm.buffer import Federation, ReplayBuffer
from swarm.buffer.persist import Snapshot
from swarm.errors import PeerTimeout, ReplayError

SCHEMA = {"obs": ("float32", (256,))}   # 1 KiB an item
HELD = 2000


def holder(pid: str) -> ReplayBuffer:
    buf = ReplayBuffer(SCHEMA, 10_000, peer_id=pid)
    buf.add({"obs": np.ones((HELD, 256), np.float32)})
    return buf


def test_the_answer_to_a_pull_its_caller_cancelled_is_stored_and_counted_late():
    # Before: a stored 0, stats.late 0, nothing dropped or logged; b served 877.
    async def main() -> None:
        async with linked_pair() as (a, b):
            ba, bb = ReplayBuffer(SCHEMA, 10_000, peer_id="a"), holder("b")
            fa, fb = Federation(ba, a, share=0.0), Federation(bb, b, share=0.0)
            try:
                pull = asyncio.create_task(fa.pull("b", 1000, timeout=None))
                await asyncio.sleep(0)   # the request is out
                pull.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await pull
                await until(lambda: fb.stats.served > 0, what="b to serve the pull")
                await until(lambda: len(ba) > 0, what="the answer to be stored")
                assert len(ba) == fb.stats.served
                assert fa.stats.late == 1 and fa.stats.dropped_messages == 0 and not fa.stats.errors
            finally:
                fa.close()
                fb.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_the_answer_to_a_pull_a_sync_call_timed_out_is_stored(procs):
    peers = []
    try:
        start_sync_ring(procs, peers, 2, "q")
        pa, pb = peers

        async def make(sp, buf):
            return Federation(buf, sp.peer, share=0.0)
        ba = ReplayBuffer(SCHEMA, 10_000, peer_id="q0")
        fa, fb = pa.call(make(pa, ba)), pb.call(make(pb, holder("q1")))
        pa.call(pa.peer.wait_linked(timeout=10), timeout=15)
        pb.call_soon(time.sleep, 1.0)   # a busy neighbour: it answers after the call's deadline
        with pytest.raises(PeerTimeout):
            pa.call(fa.pull("q1", 1000, timeout=None), timeout=0.3)
        pa.call(until(lambda: len(ba) > 0, what="the answer to be stored"), timeout=15)
        assert len(ba) == fb.stats.served and fa.stats.late == 1
        pa.call_soon(fa.close)
        pb.call_soon(fb.close)
    finally:
        for sp in peers:
            sp.close()


def test_a_pull_waiting_when_its_peer_closes_raises_and_so_do_the_next_pull_and_flush():
    # b runs no federation: nothing answers. Before, the pull waited for ever, and one
    # after the close returned 0 as if b had nothing.
    async def main() -> None:
        async with linked_pair() as (a, b):
            fa = Federation(ReplayBuffer(SCHEMA, 100, peer_id="a"), a)
            try:
                pull = asyncio.create_task(fa.pull("b", 5, timeout=None))
                await asyncio.sleep(0.2)
                assert not pull.done()
                await a.close()
                done, _ = await asyncio.wait([pull], timeout=10)   # a guard against a hang only
                assert done, "the pull still waits after its peer closed"
                with pytest.raises(ReplayError, match="pull from 'b': peer 'a', under this federation, closed"):
                    pull.result()
                with pytest.raises(ReplayError, match="peer 'a', under this federation, closed"):
                    await fa.pull("b", 5, timeout=1)
                with pytest.raises(ReplayError, match="flush: peer 'a', under this federation, closed"):
                    await fa.flush()
            finally:
                fa.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_ctrl_c_during_a_foreground_save_is_raised_as_itself(tmp_path, monkeypatch):
    buf = ReplayBuffer({"obs": ("float32", (64,))}, 1000)
    buf.add({"obs": np.random.default_rng(0).random((500, 64), np.float32)})
    path = tmp_path / "snap"
    write = Snapshot._write_columns

    def interrupted(self, tmp):   # the columns are on disk, in the temporary directory
        write(self, tmp)
        assert any(tmp.iterdir())
        raise KeyboardInterrupt

    monkeypatch.setattr(Snapshot, "_write_columns", interrupted)
    with pytest.raises(KeyboardInterrupt):   # was ReplayError("snapshot to ... failed: ")
        buf.save(path)
    assert list(tmp_path.iterdir()) == []   # neither path nor path.tmp-*
    # a background save's thread still keeps what it caught, for wait()
    with pytest.raises(ReplayError, match="failed") as e:
        buf.save(path, background=True).wait(timeout=30)
    assert isinstance(e.value.__cause__, KeyboardInterrupt)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    buf.save(path)
    assert len(ReplayBuffer.load(path)) == 500
