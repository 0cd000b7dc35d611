"""What the ckpt folder keeps of the incremental checkpoints, and how often a failing one is logged.

Each increment holds every row written since its full checkpoint, so a newer one holds all
that an older one does: only the newest and the one before it (the fall-back for a damaged
newest one) are kept, and the newest finite one when training diverged since. A checkpoint
that fails for lack of space deletes the fall-back too, so that the next one has room. A
checkpoint failure is logged the first time, then at most once a minute with a count.
"""

from __future__ import annotations

import errno
import json
import os

from experiment.test_checkpoint_fallback import _poison
from swarmtest import Clock

from swarm.buffer import ReplayBuffer
from swarm.experiment.checkpoint import Checkpointer, committed, load_newest
from swarm.rl import DQNAgent, dqn_schema
from swarm.rl.hparams import DQNConfig
from swarm.rl.train import run_agent


def _agent(capacity: int = 3000) -> DQNAgent:
    buf = ReplayBuffer(dqn_schema((4,)), capacity, seed=0, peer_id="peer0")
    return DQNAgent((4,), 2, buf, DQNConfig(learning_starts=20, batch_size=8, hidden=[16]), seed=0)


def _after_full(tmp_path, steps: int = 60, **kw):
    """An agent trained ``steps`` steps, its Checkpointer in ``tmp_path/ckpt`` (``kw``: its
    options) and the full checkpoint it has just taken: (agent, root, ck, full)."""
    agent = _agent()
    root = tmp_path / "ckpt"
    ck = Checkpointer(root, agent, agent.buffer, lambda: {"env_steps": agent.steps}, **kw)
    run_agent("CartPole-v1", agent, steps, seed=0)
    return agent, root, ck, ck.full(background=False)


def _bytes(path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _names(root) -> list[str]:
    return [p.name for p in committed(root)]


def _no_space(calls: list[int]):
    """An ``os.fsync`` that fails as a full disk does (ENOSPC), counting its calls."""
    def fsync(fd):
        calls.append(fd)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return fsync


def test_only_the_newest_increment_and_its_fallback_are_kept_so_the_disk_stays_linear(tmp_path):
    """Increments 1..k-1 all stayed until the next full checkpoint, although increment k
    holds every row they hold: the folder grew quadratically (rv8: 140 MB against a full
    checkpoint's 4.3 MB). Now it holds the full one and the newest two increments."""
    agent, root, ck, full = _after_full(tmp_path, 100)
    full_bytes = _bytes(root / full)
    incs = []
    for i in range(8):
        run_agent("CartPole-v1", agent, 100, seed=1 + i)
        incs.append(ck.incremental())
        assert _names(root) == [*incs[-2:][::-1], full]
        assert sorted(p.name for p in root.iterdir()) == sorted(_names(root))   # no .tmp- left either
        assert _bytes(root) <= full_bytes + _bytes(root / incs[-1]) + _bytes(root / incs[-2:][0])
    assert _bytes(root) < 3 * full_bytes

    # the newest loads; torn, its fall-back does; both torn, the full one
    assert load_newest(root)[0].path == root / incs[-1]
    (root / incs[-1] / "state.pt").write_bytes(b"torn")
    r, skipped = load_newest(root)
    assert r.path == root / incs[-2] and len(skipped) == 1 and r.counters["env_steps"] == 800
    (root / incs[-2] / "state.pt").write_bytes(b"torn")
    assert load_newest(root)[0].path == root / full

    # the next full checkpoint prunes the rest, as before; its increments start over
    assert ck.full(background=False) == "full-000002" and _names(root) == ["full-000002"]
    run_agent("CartPole-v1", agent, 50, seed=20)
    inc = ck.incremental()
    assert _names(root) == [inc, "full-000002"]


def test_increments_holding_nan_keep_the_newest_finite_increment_to_fall_back_to(tmp_path):
    """Training diverged after increment 2: the NaN increments after it push it out of
    the newest two, but it stays, so that a resume passes over them to it, not to the
    older full checkpoint."""
    agent, root, ck, full = _after_full(tmp_path)
    good = []
    for i in range(2):
        run_agent("CartPole-v1", agent, 20, seed=1 + i)
        good.append(ck.incremental())
    _poison(agent, "target")
    bad = [ck.incremental() for _ in range(3)]
    assert _names(root) == [bad[2], bad[1], good[1], full]
    assert [json.loads((root / n / "manifest.json").read_text())["finite"] for n in _names(root)] == \
        [False, False, True, True]
    r, skipped = load_newest(root)
    assert r.path == root / good[1] and len(skipped) == 2 and all("NaN or infinite" in s for s in skipped)


def test_a_checkpoint_that_finds_the_disk_full_deletes_the_superseded_increment(tmp_path, monkeypatch):
    """A disk filled by superseded increments blocked every later checkpoint: only a
    committed full one deleted them, and it had no room. Now a checkpoint failing with
    ENOSPC deletes the increments older than the newest committed one (the newest stays,
    loadable), and the next one goes ahead."""
    agent, root, ck, full = _after_full(tmp_path, incremental_every_steps=1)
    incs = []
    for i in range(3):
        run_agent("CartPole-v1", agent, 20, seed=1 + i)
        incs.append(ck.incremental())
    assert _names(root) == [incs[2], incs[1], full]

    calls: list[int] = []
    with monkeypatch.context() as m:
        m.setattr(os, "fsync", _no_space(calls))
        assert ck.step(agent.steps + 1) is None
    assert calls and ck.failures == 1 and "No space left on device" in ck.last_error
    assert sorted(p.name for p in root.iterdir()) == [full, incs[2]]   # the fall-back gave its room
    assert load_newest(root)[0].path == root / incs[2]

    run_agent("CartPole-v1", agent, 20, seed=9)
    done = ck.step(agent.steps + 1)
    assert done is not None and _names(root) == [done, incs[2], full] and ck.failures == 1
    assert load_newest(root)[0].path == root / done

    # a full checkpoint failing so: the same
    with monkeypatch.context() as m:
        m.setattr(os, "fsync", _no_space(calls))
        ck.step(agent.steps + 2)   # an increment, failing: the one before `done` goes
        assert _names(root) == [done, full]
        ck.full_every_steps = 1
        ck.step(agent.steps + 3)
    assert ck.failures == 3 and _names(root) == [done, full]
    ck.full_every_steps = 0
    new = ck.full(background=False)
    assert _names(root) == [new]


def test_a_failing_checkpoint_is_logged_once_then_once_a_minute_with_a_count(tmp_path, monkeypatch, caplog):
    """Every failed checkpoint logged an ERROR line: with a small interval, several a
    second per peer for as long as the disk stayed full. Now the first is logged, then
    at most one a minute saying how many failed meanwhile; the count stays exact."""
    clock = Clock()
    agent, root, ck, full = _after_full(tmp_path, incremental_every_steps=1, clock=clock)
    caplog.set_level("INFO", logger="swarm.experiment")
    calls: list[int] = []
    monkeypatch.setattr(os, "fsync", _no_space(calls))

    def errors() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]

    for i in range(5):
        clock.t += 10
        assert ck.step(agent.steps + 1 + i) is None
    assert ck.failures == 5 and len(errors()) == 1
    assert errors()[0].startswith("checkpoint failed: ") and f"the newest checkpoint stays {full}" in errors()[0]
    assert "more failed" not in errors()[0]

    clock.t += 25   # 65 s after the first one logged
    ck.step(agent.steps + 10)
    assert ck.failures == 6 and len(errors()) == 2 and "(4 more failed since the last one logged)" in errors()[1]
    clock.t += 1
    ck.step(agent.steps + 11)
    assert ck.failures == 7 and len(errors()) == 2

    monkeypatch.undo()
    assert ck.step(agent.steps + 12) is not None and ck.failures == 7
