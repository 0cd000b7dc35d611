"""run_peer with the gradient relay, failing at its start after the relay exists: the
error it raises reaches the caller, and the relay and its peer are closed."""

from __future__ import annotations

import threading

import pytest

from swarm.errors import ConfigError
from swarm.experiment import load_spec
from swarm.experiment.runner import run_peer


def test_a_relay_run_that_fails_at_its_start_raises_its_error_and_closes_its_peer(procs, tmp_path):
    """The summary's digests were first assigned after the point where this fails: the
    outer finally raised UnboundLocalError in place of the ConfigError (`swarm peer` exited
    1, and was restarted, where 2 says a restart would fail the same way), and the closes
    after it never ran: the peer's thread stayed, alive at its coordinator."""
    coord = procs.coordinator(None)
    spec = load_spec(None, ["peers=1", "budget.env_steps=200", "dqn.learning_starts=50", "dqn.batch_size=16",
                            "eval.every=0", "gossip.codec=identity", "gossip.exchange=gradients",
                            "gossip.average=false"])
    run_dir = tmp_path / "run"
    (run_dir / "peer0" / "metrics.csv").mkdir(parents=True)   # cannot be opened as a file
    before = set(threading.enumerate())
    with pytest.raises(ConfigError, match="metrics.csv"):
        run_peer(spec, 0, coord.addr, run_dir, tensorboard=False, join_timeout=10)
    assert [t.name for t in set(threading.enumerate()) - before if t.is_alive()] == []
    assert (run_dir / "peer0" / "summary.json").is_file()
