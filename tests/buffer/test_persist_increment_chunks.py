"""An increment copies its rows chunk by chunk, as a full snapshot does.

Rows of 84x84 frames are ~14 kB: 100k rows written since the last full snapshot
made one 1.4 GB copy under the buffer's lock, and inserts and samples waited for
it. Each locked copy is now at most ``_CHUNK_BYTES``, and a write between two
copies first sets the old row aside, so the increment is still the state at the
moment it was taken (and agrees with its digest).

The lock is replaced by one that measures, with tracemalloc, what each hold
allocates (the copies made under it), and runs the test's inserts and priority
updates between holds: no timing, and the interleaving is the same on every run.
"""

from __future__ import annotations

import contextlib
import threading
import tracemalloc

import numpy as np
import pytest

from swarm.buffer import ReplayBuffer, persist
from swarm.buffer.persist import digest, load_incremental, take_incremental

CHUNK_BYTES = 64 << 10     # a few rows of frames a chunk on a small buffer
SLACK = 16 << 10           # what a hold allocates besides the copies: dicts, array headers, the meta
FRAMES = {"obs": ("uint8", (84, 84)), "next_obs": ("uint8", (84, 84)), "action": ("int64", ()),
          "reward": ("float32", ())}


def batch(n: int, start: int) -> dict[str, np.ndarray]:
    k = np.arange(start, start + n)
    f = np.broadcast_to((k % 251).astype(np.uint8)[:, None, None], (n, 84, 84)).copy()
    return {"obs": f, "next_obs": f[:, ::-1].copy(), "action": k, "reward": k.astype(np.float32)}


class MeasuredLock:
    """The buffer's reentrant lock, recording the bytes allocated during each outermost hold
    and calling ``between`` after each release (its own holds neither recorded nor followed
    by another call)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0
        self._start = 0
        self.holds: list[int] = []
        self.between = None     # called after a hold of the lock ends
        self._busy = False

    def __enter__(self) -> "MeasuredLock":
        self._lock.acquire()
        self._depth += 1
        if self._depth == 1:
            self._start = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        outer = self._depth == 0
        if outer and not self._busy:
            self.holds.append(tracemalloc.get_traced_memory()[1] - self._start)
        self._lock.release()
        if outer and self.between is not None and not self._busy:
            self._busy = True
            try:
                self.between()
            finally:
                self._busy = False


@contextlib.contextmanager
def chunks_traced(monkeypatch, chunk_bytes: int):
    """Snapshots read in chunks of ``chunk_bytes``, and Python's allocations traced, within."""
    monkeypatch.setattr(persist, "_CHUNK_BYTES", chunk_bytes)
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


@pytest.fixture
def measured(monkeypatch):
    with chunks_traced(monkeypatch, CHUNK_BYTES):
        yield


def _buffer(tmp_path, written: int, since: int) -> ReplayBuffer:
    """40 slots of frames: ``since`` items, a full snapshot at tmp_path/full, then up to ``written``."""
    buf = ReplayBuffer(FRAMES, 40, seed=0, peer_id="a")
    buf.add(batch(since, 0))
    buf.update_priorities(np.arange(max(0, since - 40), since), np.linspace(0.5, 2.0, min(40, since)))
    buf.save(tmp_path / "full")
    buf.add(batch(written - since, since))
    buf._lock = MeasuredLock()
    return buf


def _row_bytes(buf: ReplayBuffer) -> int:
    return sum(c[:1].nbytes for c in persist._columns(buf).values())


@pytest.mark.parametrize("want_digest", [False, True])
def test_each_locked_copy_of_an_increment_is_at_most_chunk_bytes(tmp_path, measured, want_digest):
    buf = _buffer(tmp_path, 70, 40)      # 30 rows since the full snapshot (11 kB of leaves besides)
    row = _row_bytes(buf)
    assert 30 * row > 6 * CHUNK_BYTES    # one copy of them would be many chunks' worth
    inc = take_incremental(buf, 40, digest=want_digest)
    assert inc.slots.size == 30 and buf._saver is None
    holds = buf._lock.holds
    assert max(holds) <= CHUNK_BYTES + SLACK, f"a hold of the lock copied {max(holds)} bytes: {holds}"
    if not want_digest:   # only the increment's rows are read (and every leaf), not the whole buffer
        assert sum(holds) < 34 * row, holds      # 30 rows, not the buffer's 40
    back = load_incremental(ReplayBuffer.load(tmp_path / "full"), _written(inc, tmp_path))
    buf._lock = threading.RLock()
    assert digest(back) == digest(buf)
    if want_digest:
        assert inc.digest == digest(buf)


def _written(inc: persist.Increment, tmp_path) -> str:
    path = tmp_path / "inc"
    inc.write(path)
    return path


@pytest.mark.parametrize("want_digest", [False, True])
@pytest.mark.parametrize("written, since", [(70, 50), (55, 30), (80, 40)],
                         ids=["one-run", "wrapping", "every-row"])
def test_an_increment_is_the_state_when_taken_while_inserts_and_updates_go_on(
        tmp_path, measured, want_digest, written, since):
    """Between the increment's locked copies items are inserted (over rows it has copied,
    rows it has not, and rows outside it) and priorities updated all over the buffer."""
    buf = _buffer(tmp_path, written, since)
    lock = buf._lock
    fired: list[int] = []

    def mutate():
        fired.append(len(lock.holds))
        k = len(fired)
        if k % 2:
            buf.add(batch(3, 1000 + 3 * k))
        else:
            s = buf.sample(8)
            buf.update_priorities(s.indices, np.full(8, 0.1 * k))
        if k == 1:    # rows of items far from the head too: the full snapshot's and the increment's first
            old = buf._ticket[buf._ticket >= 0]
            buf.update_priorities(np.sort(old)[[0, 1, -1]], np.array([7.0, 8.0, 9.0]))

    want = digest(buf)
    lock.holds.clear()
    lock.between = mutate
    inc = take_incremental(buf, since, digest=want_digest)
    lock.between = None
    # mutations between its copies, not only after the last
    assert len(fired) >= 3 and fired[0] < fired[-1] <= len(lock.holds), (fired, lock.holds)
    buf._lock = threading.RLock()
    assert digest(buf) != want and buf._saver is None
    back = load_incremental(ReplayBuffer.load(tmp_path / "full"), _written(inc, tmp_path))
    assert digest(back) == want
    assert back.total_added == written and inc.slots.size == written - since
    assert inc.digest == (want if want_digest else None)


def test_an_increment_while_a_full_snapshot_is_written_is_copied_whole(tmp_path):
    """The buffer has one copy-on-write reader: taken by the snapshot, the increment is copied
    in one hold of the lock (as before), and both are the state at their moments."""
    buf = ReplayBuffer(FRAMES, 40, seed=0, peer_id="a")
    buf.add(batch(30, 0))
    buf.save(tmp_path / "full")
    buf.add(batch(12, 30))
    snap = persist.Snapshot(buf, tmp_path / "snap")
    want = digest(buf)
    try:
        inc = take_incremental(buf, 30)
        buf.add(batch(5, 500))
        assert buf._saver is snap
    finally:
        snap.run()
    snap.wait()
    assert digest(ReplayBuffer.load(tmp_path / "snap")) == want
    back = load_incremental(ReplayBuffer.load(tmp_path / "full"), _written(inc, tmp_path))
    assert digest(back) == want


def test_a_failure_between_chunks_leaves_no_reader_registered(tmp_path, measured):
    buf = _buffer(tmp_path, 70, 40)
    lock = buf._lock
    want = digest(buf)

    def fail():
        if len(lock.holds) == 3:
            raise MemoryError("no memory for the next chunk")

    lock.holds.clear()
    lock.between = fail
    with pytest.raises(MemoryError):
        take_incremental(buf, 40)
    lock.between = None
    assert buf._saver is None and digest(buf) == want
    back = load_incremental(ReplayBuffer.load(tmp_path / "full"), _written(take_incremental(buf, 40), tmp_path))
    assert digest(back) == want
