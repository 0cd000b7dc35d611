"""Checkpoints that a failure or a neighbour's items got in the way of, and what a resume
keeps of them: the final checkpoint after a failed background one, an increment that items
arriving meanwhile made larger than the buffer, a resume whose spec changes the replay
buffer's settings, and the gossip bytes a checkpoint records with gradient exchange.

The runner's tests run peers as threads of this process; the coordinator is a real
process on loopback.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
# a coordinator process for in-process peers (tests/ is on the path)
from experiment.test_runner import ONE, coordinator  # noqa: F401 - a fixture
from experiment.test_runner_review39 import GRADIENTS, _ended, _two

from swarm.buffer import ReplayBuffer, persist
from swarm.errors import ConfigError
from swarm.experiment import load_spec
from swarm.experiment import runner as runner_mod
from swarm.experiment.checkpoint import Checkpointer, committed, load_newest
from swarm.experiment.runner import run_peer
from swarm.rl import DQNAgent, dqn_schema
from swarm.rl.hparams import DQNConfig
from swarm.rl.train import run_agent


def _agent(capacity: int = 300) -> DQNAgent:
    buf = ReplayBuffer(dqn_schema((4,)), capacity, seed=0, peer_id="peer0")
    return DQNAgent((4,), 2, buf, DQNConfig(learning_starts=20, batch_size=8, hidden=[16]), seed=0)


def _failing_once(monkeypatch) -> list[int]:
    """The next buffer snapshot fails as a full disk would; those after it are written."""
    write, calls = persist.Snapshot._write_columns, []

    def flaky(self, tmp):
        calls.append(1)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        return write(self, tmp)

    monkeypatch.setattr(persist.Snapshot, "_write_columns", flaky)
    return calls


@pytest.mark.parametrize("finish", ["close", "full"])
def test_a_failed_background_full_checkpoint_does_not_stop_the_next_one(tmp_path, monkeypatch, finish):
    """Before the fix close() (and full()) raised the error of the background full checkpoint
    in flight and never wrote the new one: a stop while the disk was briefly full kept only
    the older checkpoint, and a restart lost every step since it."""
    agent = _agent()
    steps = [0]
    ck = Checkpointer(tmp_path / "ckpt", agent, agent.buffer, lambda: {"env_steps": steps[0]})
    run_agent("CartPole-v1", agent, 50, on_step=lambda i: steps.__setitem__(0, i.step))
    assert ck.full(background=False) == "full-000001"
    calls = _failing_once(monkeypatch)
    run_agent("CartPole-v1", agent, 50, seed=1, on_step=lambda i: steps.__setitem__(0, 50 + i.step))
    ck.full(background=True)   # as step() starts one at its cadence; its write fails
    name = ck.close() if finish == "close" else ck.full(background=False)
    assert name == "full-000003" and len(calls) == 2
    assert ck.failures == 1 and "No space left" in ck.last_error
    assert [p.name for p in committed(tmp_path / "ckpt")] == ["full-000003"]
    r, skipped = load_newest(tmp_path / "ckpt")
    assert skipped == [] and r.counters["env_steps"] == 100
    assert not [p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith(".tmp-")]


def test_items_arriving_while_an_increment_is_prepared_make_it_a_full_checkpoint(tmp_path):
    """Before the fix the increment's check against capacity was taken before the buffer was
    read: items a neighbour's federation inserted in between took it past capacity,
    take_incremental raised, and the due checkpoint failed (and the next waited a whole
    interval) instead of becoming a full one."""
    agent = _agent(capacity=100)
    buf, steps, arriving = agent.buffer, [0], [False]
    schema = dqn_schema((4,))

    def counters():
        if arriving[0]:   # a neighbour's items, landing while the increment is prepared
            buf.add({k: np.zeros((10, *shape), dt) for k, (dt, shape) in schema.items()})
        return {"env_steps": steps[0]}

    ck = Checkpointer(tmp_path / "ckpt", agent, buf, counters, incremental_every_steps=10)
    run_agent("CartPole-v1", agent, 30, on_step=lambda i: steps.__setitem__(0, i.step))
    assert ck.full(background=False) == "full-000001"
    run_agent("CartPole-v1", agent, 95, seed=1, on_step=lambda i: steps.__setitem__(0, 30 + i.step))
    assert buf.total_added - 30 <= buf.capacity   # an increment is due, and fits when checked
    arriving[0] = True
    assert ck.step(steps[0] + 100) == "full-000002"
    assert ck.failures == 0, ck.last_error
    r, skipped = load_newest(tmp_path / "ckpt")
    assert skipped == [] and r.path.name == "full-000002"


@pytest.mark.parametrize("change", ["buffer.prioritized=false", "buffer.alpha=0.2", "buffer.eps=0.001",
                                    "buffer.decay=0.5"])
def test_a_resume_whose_spec_changes_the_buffers_settings_is_refused(coordinator, tmp_path, change):
    """Before the fix a resume trained with the checkpoint's replay-buffer settings (sampler,
    alpha, eps, decay) without a word, while config.json and the spec's digest said the
    new ones."""
    one = ONE + ["buffer.capacity=1000"]
    first = run_peer(load_spec(None, one), 0, coordinator, tmp_path / "a", tensorboard=False, join_timeout=10)
    assert first["reason"] == "budget"
    before = sorted(p.name for p in (tmp_path / "a" / "peer0" / "ckpt").iterdir())
    key = change.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key.replace('.', '[.]')} = .*resume with .* or start a new run"):
        run_peer(load_spec(None, one + ["budget.env_steps=300", change]), 0, coordinator, tmp_path / "b",
                 tensorboard=False, join_timeout=10, resume_from=tmp_path / "a")
    assert sorted(p.name for p in (tmp_path / "a" / "peer0" / "ckpt").iterdir()) == before
    assert not committed(tmp_path / "b" / "peer0" / "ckpt")


def test_a_resume_with_the_checkpoints_buffer_settings_goes_on(coordinator, tmp_path):
    """The check refuses only a change: the same settings (prioritized off here) resume."""
    one = ONE + ["buffer.capacity=1000", "buffer.prioritized=false", "buffer.alpha=0.3"]
    run_peer(load_spec(None, one), 0, coordinator, tmp_path / "a", tensorboard=False, join_timeout=10)
    s = run_peer(load_spec(None, one + ["budget.env_steps=300"]), 0, coordinator, tmp_path / "b",
                 tensorboard=False, join_timeout=10, resume_from=tmp_path / "a")
    assert s["reason"] == "budget" and s["env_steps"] == 300 and "resumed_from" in s, s


def test_each_checkpoint_counts_the_relays_gossip_bytes_up_to_it(coordinator, tmp_path, monkeypatch):
    """Before the fix a checkpoint recorded the gossip bytes as of the last gossip round: with
    gradient exchange the relay sends between rounds too, so a resume lost the old process's
    relay traffic since then (here no round is run at all: every checkpoint said 0)."""
    relays: dict[str, object] = {}
    seen: list[tuple[str, int, int]] = []   # (peer, relay's bytes out just before, counters' gossip bytes)

    import swarm.gossip   # noqa: PLC0415 - run_peer imports the relay from it when it builds one

    class Relay(swarm.gossip.GradientRelay):
        def __init__(self, peer, *a, **kw):
            super().__init__(peer, *a, **kw)
            relays[peer.id] = self

    class Watched(Checkpointer):
        def __init__(self, root, agent, buf, counters, **kw):
            who = root.parent.name

            def watched():
                sent = relays[who].stats.bytes_out   # only grows: the counters must hold it at least
                c = counters()
                seen.append((who, sent, c["gossip_bytes_out"]))
                return c

            super().__init__(root, agent, buf, watched, **kw)

    monkeypatch.setattr(swarm.gossip, "GradientRelay", Relay)
    monkeypatch.setattr(runner_mod, "Checkpointer", Watched)
    spec = load_spec(None, GRADIENTS + ["budget.env_steps=600", "gossip.interval=100000",
                                        "checkpoint.incremental_every_steps=150"])
    stop = threading.Event()
    out, errors, threads = _two(spec, coordinator, tmp_path, stop)
    try:
        for t in threads:
            t.join(30)   # 60 s in all: within pytest's timeout, so that the finally runs in time
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    _ended(threads, errors)
    assert [out[r]["reason"] for r in (0, 1)] == ["budget", "budget"], out
    sending = [s for s in seen if s[1] > 0]
    assert sending, seen   # checkpoints were taken after the relay sent
    assert all(c >= sent for _, sent, c in sending), seen
    for r in (0, 1):   # and the final one holds the process's total
        m = json.loads((committed(tmp_path / f"peer{r}" / "ckpt")[0] / "manifest.json").read_text())
        assert m["counters"]["gossip_bytes_out"] == out[r]["gossip_bytes_out"] > 0
