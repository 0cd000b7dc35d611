"""A checkpoint hashes the replay buffer without holding its lock.

Full and incremental checkpoints record a digest of the whole buffer. Hashing a
large buffer takes about a millisecond per MB; it is done chunk by chunk from the
copies a snapshot reads anyway (copy-on-write, as ``persist.save`` does), so inserts
and samples from the training threads go on meanwhile. The digest still describes
the buffer at the checkpoint's moment, and has the value :func:`persist.digest`
gives for that state (old checkpoints keep loading: loading checks it).
"""

from __future__ import annotations

import hashlib
import json
import threading

import numpy as np
import pytest

from swarm.buffer import ReplayBuffer, persist
from swarm.buffer.persist import digest, save, take_incremental
from swarm.errors import ReplayError
from swarm.experiment.checkpoint import Checkpointer, load_checkpoint
from swarm.rl import DQNAgent, dqn_schema
from swarm.rl.hparams import DQNConfig

WAIT_S = 30.0      # deadline for what must happen in any case (the hash being reached, threads ending)
INSERT_S = 5.0     # deadline for the insert while the hash is held: on a lock held over the hash it never ends
MARK = 1234.5      # the reward of the rows in the chunk whose hashing the tests hold
_REAL_BLAKE2B = hashlib.blake2b


def _rows(n: int, reward: float = 1.0, obs: float = 0.5) -> dict[str, np.ndarray]:
    return {"obs": np.full((n, 4), obs, np.float32), "action": np.zeros(n, np.int64),
            "reward": np.full(n, reward, np.float32), "next_obs": np.full((n, 4), obs, np.float32),
            "done": np.zeros(n, np.float32)}


def _setup(tmp_path, monkeypatch):
    """A buffer of 4 chunks of 16 rows holding 50 items, the rewards of slots 32..47 (chunk 2) MARK."""
    monkeypatch.setattr(persist, "_CHUNK", 16)
    buf = ReplayBuffer(dqn_schema((4,)), 64, seed=0, peer_id="peer0")
    agent = DQNAgent((4,), 2, buf, DQNConfig(learning_starts=20, batch_size=8, hidden=[16]), seed=0)
    ck = Checkpointer(tmp_path / "ckpt", agent, buf, lambda: {"env_steps": agent.steps})
    buf.add(_rows(32))
    buf.add(_rows(16, reward=MARK))
    buf.add(_rows(2))
    return buf, ck


class _HeldHash:
    """Replaces hashlib.blake2b: once armed, the first hash fed MARK rewards waits for ``release``."""

    def __init__(self) -> None:
        self.armed, self.held, self.release = threading.Event(), threading.Event(), threading.Event()
        self._mark = np.full(4, MARK, np.float32).tobytes()

    def __call__(self, data=b"", **kw):
        outer = self

        class Hash:
            def __init__(self) -> None:
                self._h = _REAL_BLAKE2B(**kw)

            def update(self, chunk) -> None:
                if outer.armed.is_set() and not outer.held.is_set() and outer._mark in bytes(memoryview(chunk)):
                    outer.held.set()
                    outer.release.wait(WAIT_S)
                self._h.update(chunk)

            def hexdigest(self) -> str:
                return self._h.hexdigest()

        h = Hash()
        h.update(data)
        return h


def _checkpoint_while_hash_held(buf, take, hold: _HeldHash) -> tuple[dict, bool]:
    """Run ``take`` on a thread; while its hash of the MARK chunk is held, insert 3 items (into
    chunk 3, not yet read) and update 3 priorities from another thread. Returns what ``take``
    returned or raised, and whether the insert ended while the hash was held."""
    out: dict[str, object] = {}
    inserted = threading.Event()

    def run_take():
        try:
            out["name"] = take()
        except BaseException as e:   # re-raised by the test
            out["error"] = e

    def insert():
        buf.add(_rows(3, reward=7.0, obs=9.0))
        buf.update_priorities(np.arange(10, 13), np.array([3.0, 4.0, 5.0]))
        inserted.set()

    writer = threading.Thread(target=run_take, name="test-checkpoint")
    other = threading.Thread(target=insert, name="test-insert")
    hold.armed.set()
    writer.start()
    try:
        assert hold.held.wait(WAIT_S), f"the checkpoint never hashed the buffer's chunk 2: {out}"
        other.start()
        went_on = inserted.wait(INSERT_S)
    finally:
        hold.release.set()
        writer.join(WAIT_S)
        if other.ident is not None:
            other.join(WAIT_S)
    assert not writer.is_alive() and not other.is_alive()
    return out, went_on


def test_an_insert_goes_on_while_a_full_checkpoint_hashes_the_buffer(tmp_path, monkeypatch):
    buf, ck = _setup(tmp_path, monkeypatch)
    want = digest(buf)              # the state the checkpoint must hold: taken before the insert below
    hold = _HeldHash()
    monkeypatch.setattr(hashlib, "blake2b", hold)
    out, went_on = _checkpoint_while_hash_held(buf, lambda: ck.full(background=False), hold)
    assert went_on, "an insert waited for the full checkpoint's digest: the buffer's lock was held over the hash"
    assert "error" not in out, out.get("error")
    monkeypatch.setattr(hashlib, "blake2b", _REAL_BLAKE2B)
    r = load_checkpoint(tmp_path / "ckpt" / out["name"])   # its digests are checked against its manifest
    assert digest(r.buffer) == want and r.buffer.total_added == 50 and buf.total_added == 53
    assert r.manifest["digest"]["buffer"] == want


def test_an_insert_goes_on_while_an_incremental_checkpoint_hashes_the_buffer(tmp_path, monkeypatch):
    buf, ck = _setup(tmp_path, monkeypatch)
    ck.full(background=False)
    buf.add(_rows(5, reward=2.0))   # slots 50..54: the increment's rows
    want = digest(buf)
    hold = _HeldHash()
    monkeypatch.setattr(hashlib, "blake2b", hold)
    out, went_on = _checkpoint_while_hash_held(buf, ck.incremental, hold)
    assert went_on, "an insert waited for the increment's digest: the buffer's lock was held over the hash"
    assert "error" not in out, out.get("error")
    assert "-inc-" in out["name"]
    monkeypatch.setattr(hashlib, "blake2b", _REAL_BLAKE2B)
    r = load_checkpoint(tmp_path / "ckpt" / out["name"])   # the full one with the increment applied, checked
    assert digest(r.buffer) == want and r.buffer.total_added == 55 and buf.total_added == 58
    assert r.manifest["digest"]["buffer"] == want


def test_the_digest_keeps_its_value(tmp_path, monkeypatch):
    # Manifests written before the digest was taken chunk by chunk hold persist.digest's
    # value; the chunked one must give the same for the same state, or they stop loading.
    monkeypatch.setattr(persist, "_CHUNK", 7)   # chunks that do not divide the capacity
    # alpha 1 and no time passing: priorities computed exactly, the same on every platform
    buf = ReplayBuffer({"x": ("float32", (3,)), "k": ("int64", ())}, 40, first_seq=0, seed=1, alpha=1.0, decay=0.01,
                       clock=lambda: 100.0, peer_id="p")
    buf.add({"x": np.arange(75, dtype=np.float32).reshape(25, 3), "k": np.arange(25)})
    buf.update_priorities(np.arange(3, 9), np.array([0.5, 1.5, 2.5, 3.0, 0.25, 2.0]))
    want = digest(buf)
    # the value persist.digest gave for this state before this change (blake2b of its sorted JSON)
    assert hashlib.blake2b(json.dumps(want, sort_keys=True).encode(), digest_size=8).hexdigest() == GOLDEN
    assert save(buf, tmp_path / "snap", digest=True).digest == want
    assert save(buf, tmp_path / "snap2").digest is None       # only when asked for
    inc = take_incremental(buf, 20, digest=True)
    assert inc.digest == want and inc.slots.size == 5
    assert take_incremental(buf, 20).digest is None
    assert buf._saver is None


#: the digest test's buffer, as persist.digest hashed it before the digest was taken chunk by chunk
GOLDEN = "ea610c4b4ecdd58d"


def test_a_failed_hash_leaves_the_buffer_free_for_the_next_checkpoint(tmp_path, monkeypatch):
    buf, _ = _setup(tmp_path, monkeypatch)
    want = digest(buf)

    def broken(data=b"", **kw):
        raise MemoryError("no memory for the hash")

    monkeypatch.setattr(hashlib, "blake2b", broken)
    with pytest.raises(MemoryError):
        take_incremental(buf, 40, digest=True)
    monkeypatch.setattr(hashlib, "blake2b", _REAL_BLAKE2B)
    assert buf._saver is None and digest(buf) == want     # no reader left registered, nothing changed
    assert take_incremental(buf, 40, digest=True).digest == want
    # while a snapshot is being written, an increment's digest is refused, and the snapshot goes on
    snap = persist.Snapshot(buf, tmp_path / "snap", digest=True)
    try:
        with pytest.raises(ReplayError, match="already being written"):
            take_incremental(buf, 40, digest=True)
        assert buf._saver is snap
    finally:
        snap.run()
    assert snap.wait().digest == want and buf._saver is None
