"""Review 46: large items (image observations) in snapshots, increments and the federation.

Rows of frames are tens of kB, so a 4 MiB chunk of a snapshot holds a few dozen rows
and a message of the federation a few thousand items: what is copied per chunk, held
per increment and gathered per message is what costs memory and CPU. Every figure
here is counted in bytes (tracemalloc, which numpy reports its arrays to), not time.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import logging
import threading
import time
import tracemalloc

import numpy as np
import pytest

from buffer.test_persist_increment_chunks import chunks_traced
from swarmtest import linked_pair, on_small_disk, until

from swarm.buffer import Federation, ReplayBuffer, persist
from swarm.buffer.persist import digest
from swarm.errors import PeerTimeout, ReplayError

FRAMES = {"obs": ("uint8", (84, 84)), "action": ("int64", ())}
CHUNK_BYTES = 4 * (84 * 84 + 8 + 36)   # 4 rows of frames a chunk: many chunks on a small buffer
SLACK = 16 << 10                        # what a step allocates besides the copies: dicts, headers


def frames(n: int, start: int) -> dict[str, np.ndarray]:
    k = np.arange(start, start + n)
    f = np.broadcast_to((k % 251).astype(np.uint8)[:, None, None], (n, 84, 84)).copy()
    return {"obs": f, "action": k}


class SteppedLock:
    """The buffer's reentrant lock, calling ``between`` after each outermost hold (its own
    holds are not followed by another call), and recording what was allocated from the
    end of one call to the next: the peak of traced memory above where it stood then.
    With a reader that takes the lock once per chunk, that is what the reader allocates
    per chunk, outside the rows that ``between``'s writes set aside."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0
        self._busy = False
        self._mark: int | None = None
        self.between = None
        self.allocated: list[int] = []

    def __enter__(self) -> "SteppedLock":
        self._lock.acquire()
        self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        outer = self._depth == 0
        self._lock.release()
        if not outer or self._busy or self.between is None:
            return
        self._busy = True
        try:
            if self._mark is not None:
                self.allocated.append(tracemalloc.get_traced_memory()[1] - self._mark)
            self.between()
        finally:
            self._busy = False
            self._mark = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()


@pytest.fixture
def traced(monkeypatch):
    with chunks_traced(monkeypatch, CHUNK_BYTES):
        yield


def _written_over(buf: ReplayBuffer, per_step: int, most: int) -> SteppedLock:
    """``buf`` with its lock replaced by a SteppedLock that adds ``per_step`` items of frames
    after each hold, up to ``most`` items in all (the ring head ahead of a reader's cursor)."""
    lock = SteppedLock()
    added = [0]

    def add():
        if added[0] < most:
            buf.add(frames(per_step, 10_000 + added[0]))
            added[0] += per_step

    lock.between = add
    buf._lock = lock
    return lock


# ------------------------------------------------- 1. copy-on-write rows, copied once

def test_a_save_while_frames_are_added_copies_each_set_aside_row_once(tmp_path, traced):
    """Before: every row set aside for the save was concatenated and sorted again at every
    chunk, until the chunk that read it: at 271 chunks of a 1 GB buffer of frames, 27 GiB
    of copies and 20x the time. Now each chunk takes the rows filed under it: a chunk's
    step allocates its own copy, whatever is set aside for later chunks."""
    buf = ReplayBuffer(FRAMES, 256, seed=0, peer_id="a")
    buf.add(frames(384, 0))              # the ring's head at slot 128, ahead of the save's cursor
    want = digest(buf)
    lock = _written_over(buf, per_step=2, most=128)   # 128 rows (0.9 MB) set aside as it reads
    snap = persist.Snapshot(buf, tmp_path / "s", digest=True)
    snap.run().wait()
    lock.between = None
    buf._lock = threading.RLock()
    steps = lock.allocated[2:]   # past the save's claim and its first chunk, which opens the files
    assert len(steps) >= 62 and digest(buf) != want        # 64 chunks, each after writes
    assert max(steps) <= CHUNK_BYTES + SLACK, f"a chunk's step allocated {max(steps)} bytes: {steps}"
    assert snap.digest == want and digest(ReplayBuffer.load(tmp_path / "s")) == want


# ----------------------------------------- 2. increments written and read chunk by chunk

def _increment_of_frames(tmp_path) -> tuple[ReplayBuffer, int, int]:
    """256 slots of frames, a full snapshot at tmp_path/full, then 230 items more (90% of
    the ring changed since): the buffer, the snapshot's ``next`` and the increment's bytes."""
    buf = ReplayBuffer(FRAMES, 256, seed=0, peer_id="a")
    buf.add(frames(300, 0))
    since = buf.total_added
    buf.save(tmp_path / "full")
    buf.add(frames(230, 300))
    return buf, since, 230 * (84 * 84 + 8 + 28)


def _peak(fn) -> int:
    """The most memory ``fn()`` had allocated at once, above what was allocated before."""
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    fn()
    return tracemalloc.get_traced_memory()[1] - before


def test_an_increment_is_saved_a_chunk_at_a_time(tmp_path, traced):
    """Before: save_incremental gathered every changed row in memory before writing them:
    ~0.9x the buffer on top of it (5.6 GB for 100k slots of two 84x84x4 frames), where a
    full save holds a chunk. Now the rows go to their files as they are read."""
    buf, since, size = _increment_of_frames(tmp_path)
    assert size > 40 * CHUNK_BYTES
    peak = _peak(lambda: persist.save_incremental(buf, tmp_path / "inc", since))
    assert peak <= 4 * CHUNK_BYTES + 8 * SLACK, f"saving an increment of {size} bytes held {peak}"
    back = persist.load_incremental(ReplayBuffer.load(tmp_path / "full"), tmp_path / "inc")
    assert digest(back) == digest(buf)


def test_an_increment_is_loaded_a_chunk_at_a_time(tmp_path, traced):
    """Before: load_incremental read every column of the increment whole before applying
    it. Now they are mapped, checked, and applied a chunk at a time."""
    buf, since, size = _increment_of_frames(tmp_path)
    persist.save_incremental(buf, tmp_path / "inc", since)
    base = ReplayBuffer.load(tmp_path / "full")
    peak = _peak(lambda: persist.load_incremental(base, tmp_path / "inc"))
    assert peak <= 4 * CHUNK_BYTES + 8 * SLACK, f"loading an increment of {size} bytes held {peak}"
    assert digest(base) == digest(buf)


def test_a_checkpoints_increment_goes_to_disk_as_it_is_taken(tmp_path, traced):
    """The checkpointer takes its increment (with the buffer's digest) at one moment and
    writes it after: taken with the path it will be written to, it holds no rows in
    memory meanwhile, and it is the state at that moment although frames are added as
    it reads (copy-on-write, as a full snapshot)."""
    buf, since, size = _increment_of_frames(tmp_path)
    want = digest(buf)
    lock = _written_over(buf, per_step=2, most=40)
    inc = persist.take_incremental(buf, since, digest=True, path=tmp_path / "inc")
    lock.between = None
    buf._lock = threading.RLock()
    assert inc.digest == want != digest(buf)
    assert max(lock.allocated[2:]) <= CHUNK_BYTES + SLACK, lock.allocated
    assert inc.write(tmp_path / "inc") == 230
    back = persist.load_incremental(ReplayBuffer.load(tmp_path / "full"), tmp_path / "inc")
    assert digest(back) == want
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "inc"]   # no temporary directory left


def test_an_increment_taken_to_disk_and_never_written_leaves_no_files(tmp_path):
    buf, since, _ = _increment_of_frames(tmp_path)
    inc = persist.take_incremental(buf, since, path=tmp_path / "inc")
    assert len(list(tmp_path.iterdir())) == 2    # full, and the increment's rows beside "inc"
    del inc
    assert [p.name for p in tmp_path.iterdir()] == ["full"]


def test_an_increment_path_that_is_no_path_is_refused_before_anything_is_read(tmp_path):
    buf, since, _ = _increment_of_frames(tmp_path)
    with pytest.raises(ReplayError, match="path=5: give the directory"):
        persist.take_incremental(buf, since, path=5)
    assert buf._saver is None and [p.name for p in tmp_path.iterdir()] == ["full"]


def test_an_increment_that_fills_the_disk_fails_cleanly_and_keeps_the_earlier_one(tmp_path):
    """A real full disk, as the rows of an increment go to it chunk by chunk: the save
    raises ReplayError, leaves the earlier increment loadable and no temporary folder,
    and so does an increment taken to disk (the checkpointer's way)."""
    got = on_small_disk(tmp_path, "4m", """
        import json, os, sys
        import numpy as np
        from swarm.buffer import ReplayBuffer
        from swarm.buffer.persist import digest, load_incremental, save_incremental, take_incremental
        disk = sys.argv[1]
        buf = ReplayBuffer({"obs": ("uint8", (84, 84)), "action": ("int64", ())}, 400, seed=0)
        def frames(n, start):
            return {"obs": np.full((n, 84, 84), start % 251, np.uint8), "action": np.arange(start, start + n)}
        buf.add(frames(100, 0))
        buf.save(disk + "/full")                   # 2.8 MB: every slot
        buf.add(frames(20, 100))
        save_incremental(buf, disk + "/inc", 100)  # 0.15 MB
        want = digest(buf)
        buf.add(frames(280, 200))                  # 2 MB: the disk fills part way through
        out = {}
        for how in ("save", "take"):
            try:
                if how == "save":
                    save_incremental(buf, disk + "/inc", 100)
                else:
                    take_incremental(buf, 100, digest=True, path=disk + "/inc").write(disk + "/inc")
                out[how] = "saved"
            except Exception as e:
                out[how] = f"{type(e).__name__}: {e}"
        out["left"] = sorted(os.listdir(disk))
        back = load_incremental(ReplayBuffer.load(disk + "/full"), disk + "/inc")
        out["same"] = digest(back) == want
        print(json.dumps(out))
    """)
    for how in ("save", "take"):
        assert got[how].startswith("ReplayError: incremental snapshot to ") and "No space left" in got[how], got
    assert got["left"] == ["full", "inc"]     # no temporary folder left using the full disk
    assert got["same"]                        # the earlier increment, whole


# ---------------------------------------- 3. federation messages sized before they are gathered

ATARI = {"obs": ("uint8", (84, 84, 4))}     # 28,224 bytes an item, 28 more on the wire
MIB = 1 << 20


def atari(n: int, start: int = 0) -> dict[str, np.ndarray]:
    return {"obs": np.broadcast_to((np.arange(start, start + n) % 251).astype(np.uint8)[:, None, None, None],
                                   (n, 84, 84, 4)).copy()}


async def _peak_of(aw) -> tuple[object, int]:
    """What ``aw`` returns, and the most memory allocated at once while it ran, above
    what was allocated before (both peers and the coordinator run in this process: what
    the receiver does meanwhile counts too)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        got = await aw
        return got, tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_a_flush_of_frames_gathers_one_message_at_a_time(caplog):
    """Two real peers whose messages are at most 1 MiB (max_message_mb=1): 34 frames each.
    Before: the flush gathered all 300 items (8.5 MB) into one message, the wire refused
    it, and then halves of it, each gathered and kept until the flush ended (23 MB at
    the peak here); and every later message carried at most what the last halving left
    (18 items). Now the items per message come from the schema's bytes per item and the
    link's limit, and each message's items go once it is sent. The sender's link queues
    one message (data_hwm=1): the transport holds a queued message's arrays, without a
    copy, until it is written to the socket."""
    async def main():
        async with linked_pair(max_message_mb=1, data_hwm=1) as (a, b):
            bufa, bufb = ReplayBuffer(ATARI, 400, peer_id="a"), ReplayBuffer(ATARI, 400, peer_id="b")
            fa, fb = Federation(bufa, a, share=1.0), Federation(bufb, b, share=0.0)
            try:
                bufa.add(atari(300))
                with caplog.at_level(logging.WARNING, logger="swarm.buffer.federation"):
                    sent, peak = await _peak_of(fa.flush())
                await until(lambda: len(bufb) == 300, timeout=20, what="the 300 frames at b")
            finally:
                fa.close()
                fb.close()
        assert sent == 300 and fa.stats.unsendable == 0 and fa.stats.send_failures == 0
        # a message gathered, one in the link's queue (data_hwm=1), one being written to the
        # socket, and the receiver's copy as it stores one: 4 messages at most, not the batch
        assert peak <= 4 * MIB, f"a flush of 300 frames (8.5 MB) in 1 MiB messages held {peak} bytes at once"
        assert not [r for r in caplog.records if "refused" in r.getMessage()], caplog.text
        assert fb.stats.stored == 300
    asyncio.run(main())


def test_a_pull_answer_of_frames_is_gathered_at_the_size_that_goes(caplog):
    """Before: the serving peer drew and gathered min(n, max_items) items, which the wire
    refused (and then halves of them) while the whole gather stayed in memory: twice the
    answer sent. Now it draws what one message holds."""
    async def main():
        async with linked_pair(max_message_mb=1, data_hwm=1) as (a, b):
            bufa, bufb = ReplayBuffer(ATARI, 400, peer_id="a", seed=0), ReplayBuffer(ATARI, 400, peer_id="b")
            fa, fb = Federation(bufa, a, share=0.0, seed=0), Federation(bufb, b, share=0.0)
            try:
                bufa.add(atari(300))
                with caplog.at_level(logging.WARNING, logger="swarm.buffer.federation"):
                    got, peak = await _peak_of(fb.pull("a", 300, timeout=20))
            finally:
                fa.close()
                fb.close()
        assert 0 < got == len(bufb) == fa.stats.served <= MIB // (28224 + 28)
        # the answer gathered, encoded, and the receiver's copy as it stores it
        assert peak <= 3 * MIB, f"a pull answered with {got} frames held {peak} bytes at once"
        assert not [r for r in caplog.records if "refused" in r.getMessage()], caplog.text
    asyncio.run(main())


# --------------------------------------------------------- 4. pull answers after the timeout

SMALL = {"obs": ("float32", (4,))}


def test_a_pull_answer_that_comes_after_the_timeout_is_stored_and_counted(caplog):
    """Before: an answer that came after its pull's timeout was decoded and thrown away
    without a trace (the server had counted them served; 452 MB of frames on loopback).
    Now its items are stored as any answer's, counted in stats.late, and the first
    such answer is logged with what to do."""
    async def main():
        async with linked_pair() as (a, b):
            bufa, bufb = ReplayBuffer(SMALL, 100, peer_id="a", seed=0), ReplayBuffer(SMALL, 100, peer_id="b")
            fa, fb = Federation(bufa, a, share=0.0, seed=0), Federation(bufb, b, share=0.0)
            try:
                bufa.add({"obs": np.ones((50, 4), np.float32)})
                with caplog.at_level(logging.WARNING, logger="swarm.buffer.federation"):
                    with pytest.raises(PeerTimeout):
                        await fb.pull("a", 20, timeout=0)    # times out before any answer can come
                    await until(lambda: fb.stats.received, timeout=10, what="the late answer at b")
            finally:
                fa.close()
                fb.close()
        assert fb.stats.late == 1 and 0 < fb.stats.stored == len(bufb) == fa.stats.served
        assert fb.stats.dropped_messages == 0
        assert [r for r in caplog.records if "after its pull" in r.getMessage()], caplog.text
    asyncio.run(main())


def test_a_save_removes_the_temporary_folders_that_killed_saves_left(tmp_path):
    # an increment streams into <path>.tmp-PID-... for its whole read: a process killed then
    # left it (as large as the increment), and no later save, under another pid, removed it
    buf = ReplayBuffer(FRAMES, 40, seed=0, peer_id="a")
    buf.add({"obs": np.zeros((10, 84, 84), np.uint8), "action": np.arange(10)})
    buf.save(tmp_path / "full")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    long_ago = time.time() - 3600

    def folder(name: str, *, old: bool = True, snapshot: bool = False):
        d = tmp_path / name
        d.mkdir()
        (d / ("meta.json" if snapshot else "obs.npy")).write_bytes(b"x")
        if old:
            for f in (d / ("meta.json" if snapshot else "obs.npy"), d):
                os.utime(f, (long_ago, long_ago))
        return d

    for name in ("inc", "full"):
        folder(f"{name}.tmp-{dead.pid}-x1y2z3w4")                  # a dead process's: removed
        folder(f"{name}.tmp-{os.getpid()}-live1234")               # a live one's: left alone
        folder(f"{name}.tmp-{dead.pid}-12345", old=False)          # still being written (another pid namespace?)
        folder(f"{name}.tmp-{dead.pid}-best")                      # not a name a save gives
        folder(f"{name}.tmp-{dead.pid}-99999", snapshot=True)      # a finished snapshot of that name
    buf.add({"obs": np.zeros((5, 84, 84), np.uint8), "action": np.arange(5)})
    persist.save_incremental(buf, tmp_path / "inc", 10)
    buf.save(tmp_path / "full2")   # another path: its stale folders only
    left = sorted(p.name for p in tmp_path.iterdir() if ".tmp-" in p.name)
    assert left == sorted([f"full.tmp-{dead.pid}-x1y2z3w4", *(
        f"{n}.tmp-{pid}" for n in ("inc", "full")
        for pid in (f"{os.getpid()}-live1234", f"{dead.pid}-12345", f"{dead.pid}-best", f"{dead.pid}-99999"))]), left
    buf.save(tmp_path / "full")
    assert not (tmp_path / f"full.tmp-{dead.pid}-x1y2z3w4").exists()
