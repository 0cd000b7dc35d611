"""Local item ids of a fresh buffer: a process restarted under the same peer id must not
reuse the ids (origin, seq) its predecessor gave out, which neighbours still hold.

Before, every buffer numbered its items from 0, and neighbours dropped each new item of
a restarted peer whose id they held as a duplicate (counted, nothing else)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from fakelink import Hub
from swarm.buffer import Federation, ReplayBuffer
from swarm.errors import ReplayError
from experiment.test_runner import coordinator  # noqa: F401 - a fixture

SCHEMA = {"obs": ("float32", (3,))}


def items(n, value):
    return {"obs": np.full((n, 3), value, np.float32)}


def local_seqs(buf):
    return sorted(s for p, s in buf.ids() if p == buf.peer_id)


def test_a_peer_restarted_with_a_fresh_buffer_has_its_new_items_stored_by_its_neighbours():
    async def main():
        hub = Hub()
        a = ReplayBuffer(SCHEMA, 1000, peer_id="a")
        fa = Federation(a, hub.link("a", ["b"]))
        b = ReplayBuffer(SCHEMA, 1000, peer_id="b")
        fb = Federation(b, hub.link("b", ["a"]), share=1.0)
        b.add(items(100, 1.0))
        assert await fb.flush() == 100
        await hub.settle()
        assert fa.stats.stored == 100 and fa.stats.duplicates == 0
        fb.close()
        # "b" again, in a new process: a fresh buffer under the same id
        time.sleep(0.01)
        b2 = ReplayBuffer(SCHEMA, 1000, peer_id="b")
        fb2 = Federation(b2, hub.link("b", ["a"]), share=1.0)
        b2.add(items(100, 2.0))
        assert await fb2.flush() == 100
        await hub.settle()
        await hub.close()
        return a, fa, b, b2

    a, fa, b, b2 = asyncio.run(main())
    assert fa.stats.duplicates == 0 and fa.stats.stored == 200, fa.stats   # before: 100 dropped as duplicates
    assert min(local_seqs(b2)) > max(local_seqs(b))
    got = a.items(np.arange(a.total_added)).fields["obs"][:, 0]
    assert (got == 1.0).sum() == 100 and (got == 2.0).sum() == 100


def test_a_fresh_buffer_numbers_above_an_earlier_one_under_the_same_id():
    first = ReplayBuffer(SCHEMA, 64, peer_id="p")
    first.add(items(5000, 0.0))          # more items than the ring holds: seqs go on past it
    time.sleep(0.01)
    second = ReplayBuffer(SCHEMA, 64, peer_id="p")
    second.add(items(3, 0.0))
    assert min(local_seqs(second)) > first._next_seq - 1 >= max(local_seqs(first))


def test_first_seq_gives_the_same_ids_in_every_run():
    for _ in range(2):
        buf = ReplayBuffer(SCHEMA, 8, peer_id="p", first_seq=0)
        buf.add(items(3, 0.0))
        assert buf.ids() == [("p", 0), ("p", 1), ("p", 2)]
    buf = ReplayBuffer(SCHEMA, 8, peer_id="p", first_seq=1000)
    buf.add(items(2, 0.0))
    assert local_seqs(buf) == [1000, 1001]


@pytest.mark.parametrize("bad", [-1, 2**63, 1.5, True, "0"])
def test_a_bad_first_seq_is_a_clear_error(bad):
    with pytest.raises(ReplayError, match="first_seq must be an int"):
        ReplayBuffer(SCHEMA, 8, first_seq=bad)


def test_seqs_that_would_pass_int64_store_nothing():
    top = 2**63 - 1
    buf = ReplayBuffer(SCHEMA, 8, peer_id="p", first_seq=top - 1)
    with pytest.raises(ReplayError, match="local seqs would pass"):
        buf.add(items(3, 0.0))
    assert len(buf) == 0 and buf.total_added == 0 and buf._next_seq == top - 1
    buf.add(items(2, 0.0))               # the last two ids there are
    assert local_seqs(buf) == [top - 1, top]


def test_a_snapshot_goes_on_from_its_own_numbering(tmp_path):
    # load restores the counters as saved (digests equal); a process that restores an
    # older snapshot raises the floor itself (persist.resume_sequence, as swarm run does)
    buf = ReplayBuffer(SCHEMA, 8, peer_id="p", first_seq=0)
    buf.add(items(3, 0.0))
    buf.save(tmp_path / "s")
    back = ReplayBuffer.load(tmp_path / "s")
    back.add(items(1, 0.0))
    assert local_seqs(back) == [0, 1, 2, 3]


def test_swarm_peer_started_again_fresh_numbers_past_its_predecessor(coordinator, tmp_path):
    """`swarm run` restarts a peer that died before its first checkpoint, which the
    coordinator no longer knows, with neither --replace nor --resume-from: a fresh start
    under the same id (peer0). Before, only --replace and resumes raised the floor."""
    from swarm.experiment import load_spec
    from swarm.experiment.checkpoint import load_newest
    from swarm.experiment.runner import run_peer

    spec = load_spec(None, ["peers=1", "budget.env_steps=120", "dqn.learning_starts=50", "dqn.batch_size=16",
                            "eval.every=0", "gossip.codec=identity"])
    seqs = []
    for name in ("first", "second"):
        s = run_peer(spec, 0, coordinator, tmp_path / name, tensorboard=False, join_timeout=10)
        assert s["reason"] == "budget", s
        buf = load_newest(tmp_path / name / "peer0" / "ckpt")[0].buffer
        seqs.append([q for p, q in buf.ids() if p == "peer0"])
    assert seqs[0] and seqs[1] and min(seqs[1]) > max(seqs[0]), (max(seqs[0]), min(seqs[1]))
