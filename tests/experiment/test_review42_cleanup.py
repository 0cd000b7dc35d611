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


def test_a_start_out_of_file_descriptors_is_no_configuration_error(tmp_path):
    """_at_start took EMFILE (no fd left for metrics.csv under a low ulimit -n) for a full
    or read-only disk: a ConfigError, which `swarm run` never restarts."""
    import errno

    from swarm.experiment.runner import _at_start

    def out_of_fds() -> None:
        raise OSError(errno.EMFILE, "Too many open files", str(tmp_path / "metrics.csv"))
    with pytest.raises(OSError) as e:
        _at_start(tmp_path, out_of_fds)
    assert type(e.value) is OSError and e.value.errno == errno.EMFILE
    with pytest.raises(ConfigError, match="make room on its disk"):   # a full disk stays one
        _at_start(tmp_path, lambda: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device")))
