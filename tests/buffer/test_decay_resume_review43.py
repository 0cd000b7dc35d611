"""With age decay, a restored buffer does not count the pause since its snapshot as age.

Before, a buffer saved at t and restored at t + pause aged every restored item by the
pause: against the resumed process's new transitions each restored priority was
scaled by exp(-decay·pause), so after a pause of an hour (decay 0.01) the restored
replay was never sampled again (a share of 0.904 of a batch at once, 0.000 after
3600 s). Now the restored buffer's time runs from where the snapshot stopped, so
sampling after a resume is what it was at the save, while the origin times it hands
out and takes in stay the clock's. Also: the `buffer.decay` help says that decay makes
runs depend on the machine's speed (the same seed does not reproduce a run).
"""

from __future__ import annotations

import json
import subprocess
import time

import numpy as np
import pytest
from swarmtest import ROOT, SWARM, Clock

from swarm.buffer import ReplayBuffer
from swarm.buffer.persist import digest, load_incremental, save_incremental
from swarm.errors import ReplayError

SCHEMA = {"x": ("float32", (2,))}
DECAY = 0.01


def items(n: int, start: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.tile(np.arange(start, start + n, dtype=np.float32)[:, None], (1, 2))}


def filled(clock, seconds: int = 10, per_s: int = 100, decay: float = DECAY) -> ReplayBuffer:
    """A decaying buffer that took ``per_s`` items a second for ``seconds`` s of ``clock``,
    with sampling and priority updates between (so that priorities differ)."""
    buf = ReplayBuffer(SCHEMA, 5000, decay=decay, seed=0, clock=clock, first_seq=0)
    rng = np.random.default_rng(1)
    t0 = clock()
    for k in range(seconds):
        clock.t = t0 + k
        buf.add(items(per_s, k * per_s))
        s = buf.sample(32)
        buf.update_priorities(s.indices, rng.random(32) * 3)
    clock.t = t0 + seconds
    return buf


def continued(buf: ReplayBuffer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What the buffer does next: 100 new transitions, then a batch of 1000."""
    buf.add(items(100, 10_000))
    s = buf.sample(1000, beta=0.4)
    return s.indices, s.weights, buf.probabilities()


@pytest.mark.parametrize("pause", [600.0, 3600.0, 86400.0])
def test_a_resume_after_a_pause_samples_as_the_buffer_did_at_its_save(tmp_path, pause):
    live = filled(Clock(1000.0))
    live.save(tmp_path / "snap")
    old = np.arange(live.total_added)
    at_save = live.priorities(old)
    back = ReplayBuffer.load(tmp_path / "snap", clock=Clock(1010.0 + pause))
    # the restored items are as old as they were at the save, not older by the pause
    np.testing.assert_allclose(back.priorities(old), at_save, rtol=1e-12)
    got, want = continued(back), continued(live)
    assert np.array_equal(got[0], want[0]), \
        f"restored share of the batch {np.mean(got[0] < old.size):.3f}, at the save {np.mean(want[0] < old.size):.3f}"
    assert np.array_equal(got[1], want[1])
    np.testing.assert_allclose(got[2], want[2], rtol=1e-9)


def test_times_in_and_out_of_a_resumed_buffer_are_the_clocks(tmp_path):
    clock = Clock(1000.0)
    live = filled(clock)
    live.save(tmp_path / "snap")
    old = np.arange(live.total_added)
    was = live.items(old).times
    clock.t = 1010.0 + 3600.0
    back = ReplayBuffer.load(tmp_path / "snap", clock=clock)
    # a restored item's origin time moved on by the pause: neighbours age it from the save too
    np.testing.assert_array_equal(back.items(old).times, was + 3600.0)
    mine = back.add(items(1, 50_000))
    out = back.items(mine)
    assert out.times.tolist() == [clock.t]   # new items carry the clock's time, as a neighbour's do
    # an item a neighbour made now is as young as this buffer's own new item, and one made
    # before the pause is as old as it is by the clock
    theirs = ReplayBuffer(SCHEMA, 8, decay=DECAY, clock=clock, peer_id="other", first_seq=0)
    theirs.add(items(2, 60_000), times=np.array([clock.t, clock.t - 3000.0]))
    got = back.insert(theirs.items(np.arange(2)), priority_clip=np.inf)
    np.testing.assert_allclose(back.priorities(got), [1.0, np.exp(-DECAY * 3000.0)], rtol=1e-9)
    np.testing.assert_allclose(back.priorities(mine), [back.max_priority], rtol=1e-12)
    s = back.sample(200)
    np.testing.assert_array_equal(s.origin_times, back.items(s.indices).times)


def test_an_incremental_snapshot_resumes_from_its_own_moment(tmp_path):
    clock = Clock(1000.0)
    live = filled(clock)
    live.save(tmp_path / "full")
    since = live.total_added
    live.add(items(300, 20_000))       # 10 s more, and priority updates over the whole ring
    s = live.sample(64)
    live.update_priorities(s.indices, np.linspace(0.1, 5, 64))
    clock.t += 10.0
    save_incremental(live, tmp_path / "inc", since)
    resumed = Clock(clock.t + 7200.0)
    back = load_incremental(ReplayBuffer.load(tmp_path / "full", clock=resumed), tmp_path / "inc")
    got, want = continued(back), continued(live)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    np.testing.assert_allclose(got[2], want[2], rtol=1e-9)


def test_a_resumed_buffer_saved_and_resumed_again_keeps_its_ages(tmp_path):
    live = filled(Clock(1000.0))
    live.save(tmp_path / "one")
    clock = Clock(1010.0 + 3600.0)
    back = ReplayBuffer.load(tmp_path / "one", clock=clock)
    back.add(items(50, 30_000))
    clock.t += 5.0
    back.save(tmp_path / "two")
    live.add(items(50, 30_000))
    again = ReplayBuffer.load(tmp_path / "two", clock=Clock(clock.t + 86400.0))
    # the items live's clock made 5 s ago, the second save's moment
    np.testing.assert_allclose(again.priorities(np.arange(again.total_added)),
                               live.priorities(np.arange(live.total_added)) * np.exp(-DECAY * 5.0), rtol=1e-9)


def test_old_snapshots_and_a_save_in_the_future_restore_as_before(tmp_path):
    live = filled(Clock(1000.0))
    live.save(tmp_path / "snap")
    old = np.arange(live.total_added)
    aged = live.priorities(old) * np.exp(-DECAY * 600.0)   # today's behaviour: the pause counts as age
    meta_path = tmp_path / "snap" / "meta.json"
    meta = json.loads(meta_path.read_text())
    assert meta["saved_at"] == 1010.0
    for saved_at in (None, 1e9):   # written before saved_at was read; a clock set back since the save
        if saved_at is None:
            meta.pop("saved_at")
        else:
            meta["saved_at"] = saved_at
        meta_path.write_text(json.dumps(meta))
        clock = Clock(1610.0)
        back = ReplayBuffer.load(tmp_path / "snap", clock=clock)
        np.testing.assert_allclose(back.priorities(old), aged, rtol=1e-9)
        new = back.add(items(1, 40_000))
        assert back.items(new).times.tolist() == [1610.0]   # no shift back: the clock's own time


@pytest.mark.parametrize("bad", ["soon", [1], float("nan"), float("inf")])
def test_a_corrupt_saved_at_is_refused_by_name(tmp_path, bad):
    live = filled(Clock(1000.0))
    live.save(tmp_path / "full")
    since = live.total_added
    live.add(items(10, 20_000))
    save_incremental(live, tmp_path / "inc", since)
    for path in (tmp_path / "full", tmp_path / "inc"):
        meta = json.loads((path / "meta.json").read_text())
        meta["saved_at"] = bad
        (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ReplayError, match="meta.json is corrupt.*saved_at"):
        ReplayBuffer.load(tmp_path / "full")
    meta = json.loads((tmp_path / "full" / "meta.json").read_text())
    meta["saved_at"] = 1010.0
    (tmp_path / "full" / "meta.json").write_text(json.dumps(meta))
    base = ReplayBuffer.load(tmp_path / "full", clock=Clock(5000.0))
    before, p = digest(base), base.priorities(np.arange(since))
    with pytest.raises(ReplayError, match="meta.json is corrupt.*saved_at"):
        load_incremental(base, tmp_path / "inc")
    assert digest(base) == before   # nothing changed
    np.testing.assert_array_equal(base.priorities(np.arange(since)), p)


def test_a_checkpoint_restored_after_a_pause_passes_its_digests_and_samples_as_saved(tmp_path):
    """The path `swarm run --resume` takes: a checkpoint's buffer restored on the wall clock
    (load_checkpoint reads it with time.time and checks its digests). The live buffer's clock
    runs 4e5 s behind the wall clock, so the restore comes 4e5 s after the save by it."""
    from swarm.experiment.checkpoint import Checkpointer, load_checkpoint
    from swarm.rl import DQNAgent, dqn_schema
    from swarm.rl.hparams import DQNConfig

    decay, behind = 1e-4, 4e5    # exp(-decay·behind) = e^-40: the pause would bury the restored replay

    def clock() -> float:
        return time.time() - behind

    buf = ReplayBuffer(dqn_schema((4,)), 2000, decay=decay, seed=0, clock=clock, peer_id="peer0")
    agent = DQNAgent((4,), 2, buf, DQNConfig(learning_starts=20, batch_size=8, hidden=[16]), seed=0)
    rng = np.random.default_rng(0)

    def transitions(n: int) -> dict[str, np.ndarray]:
        return {"obs": rng.random((n, 4), dtype=np.float32), "action": rng.integers(0, 2, n),
                "reward": np.ones(n, np.float32), "next_obs": rng.random((n, 4), dtype=np.float32),
                "done": np.zeros(n, np.float32)}

    for _ in range(10):
        buf.add(transitions(100))
        s = buf.sample(32)
        buf.update_priorities(s.indices, rng.random(32))
    ck = Checkpointer(tmp_path / "ckpt", agent, buf, lambda: {"env_steps": 1000})
    name = ck.full(background=False)
    restored = load_checkpoint(tmp_path / "ckpt" / name)   # its digests match, or ConfigError
    new = transitions(100)
    for b in (buf, restored.buffer):
        b.add(new)
    old = np.arange(1000)
    share = restored.buffer.probabilities()[old].sum()
    # equal up to the seconds this test took between the save and the adds (e^(1e-4·s))
    assert share == pytest.approx(buf.probabilities()[old].sum(), rel=1e-2)
    assert share > 0.5


def test_the_decay_help_says_runs_then_depend_on_the_machines_speed():
    out = subprocess.run([*SWARM, "run", "--show"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("decay ="))
    start = at
    while lines[start - 1].startswith("#"):
        start -= 1
    help_text = " ".join(line.lstrip("# ") for line in lines[start:at])
    assert "wall-clock" in help_text and "same seed" in help_text, help_text
