"""A gossip round that raises still sends the replay pushes and records the acknowledged
ids; a ckpt folder that cannot be listed gets no checkpoint numbered from 1 again; a
state.pt that does not match its digest is refused before it is unpickled.

Peers are threads of this process; the coordinator is a real process on loopback.
"""

from __future__ import annotations

import csv
import logging
import os
import threading
from pathlib import Path

import numpy as np
import pytest
# tests/ is on the path: a small agent trained with a Checkpointer, and a coordinator
# process for in-process peers
from experiment.test_checkpoint_disk import _agent, _train, _unlistable
from experiment.test_runner import ONE, coordinator  # noqa: F401 - a fixture
from swarmtest import wait_for

from swarm.errors import ConfigError, GossipError
from swarm.experiment import load_spec
from swarm.experiment.checkpoint import Checkpointer, committed, load_checkpoint
from swarm.experiment.runner import run_peer

# two peers that replicate each other's transitions; async: a round never waits for the other
REPLICAS = ONE + ["peers=2", "buffer.replicas=1", "buffer.capacity=4000", "gossip.interval=20",
                  "gossip.sync=async"]


def _rounds_raise(monkeypatch, which) -> None:
    """gossip.round() raises GossipError at the calls (0, 1, ... per peer) that ``which`` picks."""
    from swarm.gossip import Gossip

    real, calls = Gossip.round, {}

    async def round_(self):
        n = calls[id(self)] = calls.get(id(self), -1) + 1
        if which(n):
            raise GossipError("params hold NaN or Inf; round not run (nothing sent, x unchanged)")
        return await real(self)

    monkeypatch.setattr(Gossip, "round", round_)


def _peer0_beside_peer1(coordinator, run_dir: Path, steps: int) -> tuple[dict, dict]:  # noqa: F811
    """peer0 runs ``steps`` env steps; peer1, until peer0 is done, acknowledges its items."""
    other: dict = {}
    stop = threading.Event()
    peer1 = threading.Thread(target=lambda: other.update(run_peer(
        load_spec(None, REPLICAS + ["budget.env_steps=1000000"]), 1, coordinator, run_dir, stop=stop,
        tensorboard=False, join_timeout=30)))
    peer1.start()
    try:
        mine = run_peer(load_spec(None, REPLICAS + [f"budget.env_steps={steps}"]), 0, coordinator, run_dir,
                        tensorboard=False, join_timeout=30)
    finally:
        stop.set()
        peer1.join(60)
    assert not peer1.is_alive() and other.get("reason") in ("budget", "stopped"), other
    return mine, other


def test_a_round_that_raises_still_pushes_and_records_the_acknowledged_ids(coordinator, tmp_path, monkeypatch,
                                                                           caplog):
    """Before the fix a GossipError from gossip.round() skipped that round's federation flush
    and take_acknowledged: with every round raising, nothing was ever pushed to a neighbour
    and no acknowledged id reached acked.bin."""
    _rounds_raise(monkeypatch, lambda n: True)
    caplog.set_level(logging.WARNING, logger="swarm.experiment")
    spec = load_spec(None, REPLICAS + ["budget.env_steps=1000000"])
    out: dict[int, dict] = {}
    stop = threading.Event()
    peers = [threading.Thread(target=lambda r=r: out.update({r: run_peer(
        spec, r, coordinator, tmp_path, stop=stop, tensorboard=False, join_timeout=30)})) for r in (0, 1)]
    for t in peers:
        t.start()
    acked = tmp_path / "peer0" / "acked.bin"
    try:   # however long the other takes to start, until peer1 has acknowledged some of peer0's items
        wait_for(lambda: acked.is_file() and acked.stat().st_size > 0, timeout=60, what="ids in peer0's acked.bin")
    finally:
        stop.set()
        for t in peers:
            t.join(60)
    assert not any(t.is_alive() for t in peers)
    s = out[0]
    assert s["reason"] == "stopped" and s["rounds"] == 0, s   # each round is skipped, as before
    assert s["replay_sharing"]["pushed"] > 0 and s["replay_sharing"]["acked"] > 0, s["replay_sharing"]
    ids = np.frombuffer(acked.read_bytes(), dtype=np.int64)
    assert len(ids) > 0 and len(set(ids.tolist())) == len(ids), ids
    assert any("round not run" in r.getMessage() for r in caplog.records), caplog.text


def test_the_items_a_round_that_raises_pushes_are_logged_with_the_next_rounds_row(coordinator, tmp_path,
                                                                                 monkeypatch):
    """The pushes a raising round now sends would be missing from rounds.csv's shared_items,
    which has no row for that round: the next round's row counts them (as it did when they
    waited for its flush). Every other round raises; the last one does not."""
    _rounds_raise(monkeypatch, lambda n: n % 2 == 0)
    s, _ = _peer0_beside_peer1(coordinator, tmp_path, 400)
    assert s["reason"] == "budget" and s["rounds"] == 400 // 20 // 2, s
    with open(tmp_path / "peer0" / "rounds.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == s["rounds"]
    assert sum(int(r["shared_items"]) for r in rows) == s["replay_sharing"]["pushed"] > 0, rows


def test_a_ckpt_folder_that_cannot_be_listed_at_start_gets_no_checkpoint_numbered_from_1(tmp_path, monkeypatch,
                                                                                           caplog):
    """Before the fix the numbers started from 0 again: the next checkpoint was full-000001
    beside the full-000003 already there, which a restart took for the newest."""
    agent = _agent()
    root = tmp_path / "ckpt"
    ck = Checkpointer(root, agent, agent.buffer, lambda: {"env_steps": agent.steps})
    for _ in range(3):
        last = ck.full(background=False)
    assert last == "full-000003" and [p.name for p in committed(root)] == [last]

    _unlistable(monkeypatch, root)
    with caplog.at_level(logging.ERROR, "swarm.experiment"):
        ck = Checkpointer(root, agent, agent.buffer, lambda: {"env_steps": agent.steps}, full_every_steps=10)
        assert ck.failures == 1 and f"checkpoint folder {root}" in ck.last_error
        _train(agent, 30, ck)
    assert agent.steps == 30 and ck.failures >= 2, ck.failures
    assert f"checkpoint folder {root} cannot be listed (Permission denied)" in ck.last_error, ck.last_error
    monkeypatch.undo()
    assert sorted(p.name for p in root.iterdir()) == [last]   # nothing written beside it

    # readable again: the numbers go on from those there
    assert ck.full(background=False) == "full-000004"
    assert [p.name for p in committed(root)] == ["full-000004"]


class _Planted:
    """Unpickled, it makes the folder ``mark``: the trace of code a state.pt ran on load."""

    def __init__(self, mark: str) -> None:
        self.mark = mark

    def __reduce__(self):
        return os.mkdir, (self.mark,)


@pytest.mark.parametrize("where", ["its own", "its full one's"])
def test_a_state_pt_that_does_not_match_its_digest_is_refused_before_it_is_unpickled(tmp_path, where):
    """Before the fix state.pt (an increment's, and its full one's) was unpickled with
    torch.load(weights_only=False), running whatever it held, and only then compared with
    the digest in its manifest."""
    import torch

    agent = _agent()
    root = tmp_path / "ckpt"
    ck = Checkpointer(root, agent, agent.buffer, lambda: {"env_steps": agent.steps}, full_every_steps=10_000)
    _train(agent, 30, ck)
    full = root / ck.full(background=False)
    _train(agent, 10, ck, seed=1)
    inc = root / ck.incremental()
    mark = tmp_path / "ran"
    torch.save({"kind": "full", "planted": _Planted(str(mark))}, (inc if where == "its own" else full) / "state.pt")
    why = (f"checkpoint {inc} cannot be read (damaged?): state.pt: " if where == "its own"
           else f"checkpoint {inc}: its full checkpoint {full} cannot be read (damaged?): ")
    with pytest.raises(ConfigError) as e:
        load_checkpoint(inc)
    assert not mark.exists(), "the replaced state.pt was unpickled"
    assert str(e.value).startswith(why), e.value


class _Foreign:
    """A class of this test module: torch's restricted unpickler refuses it."""


@pytest.mark.parametrize("data", [b"\x00garbage" * 10, None], ids=["garbage", "foreign pickle"])
def test_a_state_pt_not_its_manifests_is_refused_in_one_short_line(tmp_path, recwarn, data):
    # The restricted load's own error became the checkpoint's: ~750 characters over
    # several lines advising weights_only=False, and torch's pickle warnings on stderr
    import pickle

    agent = _agent()
    ck = Checkpointer(tmp_path / "ckpt", agent, agent.buffer, lambda: {"env_steps": agent.steps})
    _train(agent, 25, ck)
    path = tmp_path / "ckpt" / ck.full(background=False)
    (path / "state.pt").write_bytes(data if data is not None else pickle.dumps({"agent": _Foreign()}))
    with pytest.raises(ConfigError) as e:
        load_checkpoint(path)
    text = str(e.value)
    assert "cannot be read (damaged?): state.pt: UnpicklingError: " in text and "weights_only" not in text and "\n" not in text and len(text) < 400, text
    assert not [w for w in recwarn if "pickle" in str(w.message).lower()], [str(w.message) for w in recwarn]
