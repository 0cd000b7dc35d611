"""The runner goes on past what one step or round cannot do, reports the relay's traffic
per gradient, and a run that starts in a used folder starts its acked.bin and tb/ afresh.

Peers are threads of this process; the coordinator is a real process on loopback.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import numpy as np
import pytest
# a coordinator process for in-process peers (tests/ is on the path)
from experiment.test_runner import ONE, coordinator  # noqa: F401 - a fixture
from swarmtest import status, wait_for

from swarm.errors import GossipError
from swarm.experiment import load_spec
from swarm.experiment.runner import run_peer

# two peers relaying gradients (no averaging); a turn is two updates, in one message
GRADIENTS = ["peers=2", "dqn.learning_starts=100", "dqn.batch_size=16", "dqn.train_every=2",
             "dqn.updates_per_train=2", "eval.every=0", "gossip.codec=identity", "gossip.exchange=gradients",
             "gossip.sync=async", "gossip.average=false", "gossip.round_timeout_s=5"]


def _two(spec, addr: str, run_dir: Path, stop: threading.Event) -> tuple[dict, dict, list]:
    """Peers 0 and 1 in threads of their own: their summaries, what each raised, the threads."""
    out: dict[int, dict] = {}
    errors: dict[int, BaseException] = {}

    def run(r: int) -> None:
        try:
            out[r] = run_peer(spec, r, addr, run_dir, stop=stop, tensorboard=False, join_timeout=20)
        except BaseException as e:   # else only printed, and the test's out[r] says KeyError
            errors[r] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    return out, errors, threads


def _ended(threads: list[threading.Thread], errors: dict) -> None:
    """Both threads ended and neither raised (the first error is raised again here)."""
    assert not any(t.is_alive() for t in threads)
    for e in errors.values():
        raise e


def test_a_gradient_that_apply_gradient_refuses_is_counted_and_the_peer_trains_on(coordinator, tmp_path,
                                                                                     monkeypatch, caplog):
    """Before the fix, a neighbour's gradient that the agent's apply_gradient refused
    (SwarmError) ended the peer with reason "error", the rest of that turn's gradients
    lost. (The relay now refuses the known cause, entries past MAX_GRAD, on arrival: here
    peer1's relay hands out one NaN gradient instead of a neighbour's.)"""
    from swarm.gossip import GradientRelay

    take, spoiled = GradientRelay.take, []

    def spoiling_take(self, before=None):
        got = take(self, before)
        if got and self.link.id == "peer1" and not spoiled:
            spoiled.append(got[0])
            got[0] = np.full_like(got[0], np.nan)
        return got

    monkeypatch.setattr(GradientRelay, "take", spoiling_take)
    caplog.set_level(logging.WARNING, logger="swarm.experiment")
    spec = load_spec(None, GRADIENTS + ["budget.env_steps=600"])
    stop = threading.Event()
    out, errors, threads = _two(spec, coordinator, tmp_path, stop)
    try:
        for t in threads:
            t.join(30)   # 60 s in all: within pytest's timeout (120 s), so that the finally runs in time
    finally:
        stop.set()   # a peer still running past the deadline ends ("stopped", not "budget")
        for t in threads:
            t.join(30)
    _ended(threads, errors)
    assert spoiled, "no gradient reached peer1"
    assert [out[r]["reason"] for r in (0, 1)] == ["budget", "budget"], out
    assert out[1]["relay"]["refused"] == 1 and out[0]["relay"]["refused"] == 0, out[1]["relay"]
    assert out[1]["relay"]["applied"] > 0
    assert json.loads((tmp_path / "peer1" / "summary.json").read_text())["relay"]["refused"] == 1
    assert any("peer1" in r.getMessage() and "refused" in r.getMessage() for r in caplog.records), caplog.text


def test_a_gossip_round_that_raises_gossip_error_is_skipped_as_a_timeout_is(coordinator, tmp_path, monkeypatch,
                                                                             caplog):
    """Before the fix, a GossipError from gossip.round() (its own parameters NaN or Inf, or
    a round still running) ended the peer with reason "error"; a round that timed out was
    logged and skipped."""
    from swarm.gossip import Gossip

    real, raised = Gossip.round, []

    async def failing_round(self):
        if not raised:
            raised.append(self.t)
            raise GossipError("params hold NaN or Inf; round 3 not run (nothing sent, x unchanged)")
        return await real(self)

    monkeypatch.setattr(Gossip, "round", failing_round)
    caplog.set_level(logging.WARNING, logger="swarm.experiment")
    spec = load_spec(None, ONE)
    s = run_peer(spec, 0, coordinator, tmp_path, tensorboard=False, join_timeout=10)
    assert raised and s["reason"] == "budget" and s["env_steps"] == 200, s
    assert s["rounds"] == 200 // spec.gossip.interval - 1, s   # the one that raised is skipped
    assert any("params hold NaN or Inf" in r.getMessage() for r in caplog.records), caplog.text


def test_the_heartbeats_codec_ratio_counts_gradients_not_messages(coordinator, tmp_path):
    """Before the fix, the dense size was counted one vector per relay message: with the
    identity codec (no compression) and a turn's two updates in one message the ratio
    showed ~2 (and a pass, which carries no vector, counted as one)."""
    spec = load_spec(None, GRADIENTS + ["budget.env_steps=1000000"])
    stop = threading.Event()
    out, errors, threads = _two(spec, coordinator, tmp_path, stop)
    try:
        def figures():
            rows = [m.get("stats") or {} for m in status(coordinator, 0.5)["members"]]
            ok = [s for s in rows if (s.get("env_steps") or 0) >= 400 and s.get("codec_ratio") is not None]
            return ok if len(ok) == 2 else None
        rows = wait_for(figures, timeout=90, what="two peers reporting codec ratios past learning_starts")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    _ended(threads, errors)
    for s in rows:
        assert s["codec_ratio"] == pytest.approx(1.0, abs=0.01), s
    for r in (0, 1):
        relay = out[r]["relay"]
        assert relay["vectors_out"] > relay["sent"] - relay["passed"] > 0, relay   # two updates a message


def _plant_old_results(peer: Path) -> None:
    """What an earlier run left in the folder: acknowledged ids, and a TensorBoard event file."""
    (peer / "tb").mkdir(parents=True, exist_ok=True)
    (peer / "tb" / "events.out.tfevents.1700000000.old-host.1.0").write_bytes(b"an older run's events")
    (peer / "acked.bin").write_bytes(np.arange(5, dtype=np.int64).tobytes())


def test_a_fresh_start_into_a_used_folder_drops_its_acked_ids_and_event_files(coordinator, tmp_path):
    """Before the fix, a fresh start appended to the old run's acked.bin (scripts/chaos.py then
    counted its ids as samples lost) and kept tb/'s old event files (TensorBoard showed both
    runs at the same steps)."""
    pytest.importorskip("tensorboard")   # the plots extra: without it, no event files
    peer = tmp_path / "peer0"
    _plant_old_results(peer)
    s = run_peer(load_spec(None, ONE), 0, coordinator, tmp_path, tensorboard=True, join_timeout=10)
    assert s["reason"] == "budget", s
    assert not (peer / "acked.bin").exists()
    events = [p.name for p in (peer / "tb").iterdir()]
    assert events and "events.out.tfevents.1700000000.old-host.1.0" not in events, events   # only its own


def test_a_new_run_resumed_into_a_used_folder_drops_them_and_a_restart_keeps_them(coordinator, tmp_path):
    """Before the fix, a run resumed from another folder into a used one (--new-run) kept the
    old run's acked.bin and event files too. A restart into its own folder goes on with them."""
    old, x = tmp_path / "old", tmp_path / "x"
    run_peer(load_spec(None, ONE), 0, coordinator, old, tensorboard=False, join_timeout=10)
    run_peer(load_spec(None, ONE), 0, coordinator, x, tensorboard=False, join_timeout=10)
    _plant_old_results(x / "peer0")
    more = load_spec(None, ONE + ["budget.env_steps=300"])
    s = run_peer(more, 0, coordinator, x, tensorboard=False, join_timeout=10, resume_from=old, new_run=True)
    assert s["reason"] == "budget" and s["env_steps"] == 300, s
    assert not (x / "peer0" / "acked.bin").exists() and not list((x / "peer0" / "tb").iterdir())
    # its own run, restarted into its folder: what it wrote stays
    _plant_old_results(x / "peer0")
    s = run_peer(load_spec(None, ONE + ["budget.env_steps=400"]), 0, coordinator, x, tensorboard=False,
                 join_timeout=10, resume_from=x)
    assert s["reason"] == "budget" and s["env_steps"] == 400, s
    assert (x / "peer0" / "acked.bin").stat().st_size == 40
    assert [p.name for p in (x / "peer0" / "tb").iterdir()] == ["events.out.tfevents.1700000000.old-host.1.0"]
