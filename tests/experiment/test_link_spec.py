"""What `swarm peer --spec` takes from the spec besides what it trains.

- The spec's ``link`` section (``link.timeout_s``, ``link.max_message_mb``) sets the
  peers' links as ``peer.link_timeout_s`` and ``peer.max_message_mb`` do for `swarm
  peer`: before, a `swarm run` user (whose peers' large messages outlast the 300 ms
  ZMTP timeout, closing the link and losing the message) could not raise it at all.
- A resume that changes ``seed`` is refused by `swarm peer --resume` and by ``run_peer``
  as by `swarm run --resume`, before anything is written.

Real `swarm run`, `swarm peer` and coordinator processes on loopback, each ended by its
handle; ``run_peer`` in this process beside a real coordinator.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from experiment.test_run import finish
from experiment.test_runner import ONE, coordinator  # noqa: F401 - a fixture
from swarmtest import ROOT, free_port, reaped

from swarm import cli
from swarm.config import PeerConfig
from swarm.errors import ConfigError
from swarm.experiment import load_spec
from swarm.experiment.runner import run_peer


def _swarm(cwd: Path, *args: str, timeout: float = 120) -> tuple[int, str]:
    """Run `swarm ARGS` in ``cwd`` to its end; its exit code and output."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    with reaped(subprocess.Popen([sys.executable, "-m", "swarm.cli", *args], cwd=cwd, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)) as p:
        out = finish(p, timeout)
    return p.returncode, out


def _sets(*sets: str) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """The folder of a one-peer `swarm run` (-v: its peer's INFO lines in logs/) with the
    links' timeout at 2.5 s and their largest message at 64 MiB."""
    cwd = tmp_path_factory.mktemp("run")
    code, out = _swarm(cwd, "run", "-v", *_sets(*ONE, "link.timeout_s=2.5", "link.max_message_mb=64"))
    assert code == 0, out
    (run_dir,) = (cwd / "runs").iterdir()
    return run_dir


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


# ---------------------------------------------------------------- 1. the links' settings


def test_swarm_run_gives_its_peers_the_specs_link_settings(finished_run):
    """Before the fix `--set link.timeout_s=2.5` was "unknown key link" (no spec key reached
    a peer's links). The peer process logs the settings its Peer's sockets were made with."""
    assert json.loads((finished_run / "config.json").read_text())["link"] == {"timeout_s": 2.5,
                                                                              "max_message_mb": 64}
    log = (finished_run / "logs" / "peer0.log").read_text()
    assert "links time out after 2.5 s, messages up to 64 MiB" in log, log


def test_run_peer_without_a_peer_config_takes_the_specs_link_settings(coordinator, tmp_path,  # noqa: F811
                                                                       caplog):
    spec = load_spec(None, ONE + ["budget.env_steps=60", "dqn.learning_starts=20", "link.timeout_s=1.5",
                                  "link.max_message_mb=32"])
    with caplog.at_level(logging.INFO, logger="swarm.experiment"):
        s = run_peer(spec, 0, coordinator, tmp_path, tensorboard=False, join_timeout=30)
    assert s["reason"] == "budget", s
    assert "links time out after 1.5 s, messages up to 32 MiB" in caplog.text, caplog.text


def test_swarm_peer_takes_the_specs_link_settings_unless_this_host_sets_its_own(tmp_path):
    spec_file = tmp_path / "spec.toml"
    spec_file.write_text("[link]\ntimeout_s = 2.5\nmax_message_mb = 64\n")
    spec = load_spec(spec_file)

    def peer_config(*args: str) -> PeerConfig:
        return cli._peer_config(cli.parse_args(["peer", "--spec", str(spec_file), "--rank", "0", *args]), spec)

    cfg = peer_config()
    assert (cfg.link_timeout_s, cfg.max_message_mb) == (2.5, 64)
    cfg = peer_config("--set", "peer.link_timeout_s=4")
    assert (cfg.link_timeout_s, cfg.max_message_mb) == (4.0, 64)
    host = tmp_path / "host.toml"
    host.write_text("[peer]\nmax_message_mb = 1024\n")
    cfg = peer_config("--config", str(host))
    assert (cfg.link_timeout_s, cfg.max_message_mb) == (2.5, 1024)
    # without --spec, nothing changes: PeerConfig's defaults
    plain = cli._peer_config(cli.parse_args(["peer"]), None)
    assert (plain.link_timeout_s, plain.max_message_mb) == (PeerConfig().link_timeout_s,
                                                            PeerConfig().max_message_mb)


@pytest.mark.parametrize("override, why", [
    ("link.timeout_s=0", r"link\.timeout_s = 0: must be in 0\.001\.\.6553 s \(libzmq's bounds"),
    ("link.timeout_s=6554", r"link\.timeout_s = 6554: must be in 0\.001\.\.6553 s"),
    ("link.timeout_s=fast", r"link\.timeout_s: expected a number, got 'fast'"),
    ("link.max_message_mb=0", r"link\.max_message_mb = 0: must be in 1\.\.1048576 \(1 TiB\)"),
    ("link.max_message_mb=1.5", r"link\.max_message_mb: expected an integer, got 1\.5"),
])
def test_bad_link_values_are_refused_naming_the_key(override, why):
    with pytest.raises(ConfigError, match=why):
        load_spec(None, [override])


def test_swarm_run_refuses_a_bad_link_timeout_before_it_makes_anything(tmp_path):
    code, out = _swarm(tmp_path, "run", "--set", "link.timeout_s=-1", timeout=60)
    assert code == 2 and "swarm: error: link.timeout_s = -1: must be in 0.001..6553 s" in out, out
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- 2. a resume's seed


def test_swarm_peer_refuses_to_resume_with_another_seed_and_changes_nothing(finished_run, tmp_path, procs):
    """Before the fix `swarm peer --resume` took a spec of another seed in silence (only `swarm
    run --resume` checked it): the peer went on from checkpoints its old seed made."""
    coord = procs.coordinator(None)
    changed = json.loads((finished_run / "config.json").read_text())
    changed.update(seed=7, budget={**changed["budget"], "env_steps": 400})
    spec_file = tmp_path / "seed7.json"
    spec_file.write_text(json.dumps(changed))
    before = _snapshot(finished_run)
    new = tmp_path / "new"
    code, out = _swarm(tmp_path, "peer", "--spec", str(spec_file), "--rank", "0", "--coordinator", coord.addr,
                       "--resume", str(finished_run), "--run-dir", str(new))
    assert code == 2, out
    errors = [line for line in out.splitlines() if line.startswith("swarm: error:")]
    assert len(errors) == 1 and "seed = 0" in errors[0] and "seed = 7" in errors[0], out
    assert str(finished_run) in errors[0], out
    assert not new.exists() and _snapshot(finished_run) == before


def test_run_peer_refuses_to_resume_with_another_seed_before_it_writes(finished_run, tmp_path):
    """The same check in run_peer itself, before it joins (no coordinator listens at the
    address) or writes anything."""
    spec = load_spec(finished_run / "config.json", ["seed=7"])
    before = _snapshot(finished_run)
    with pytest.raises(ConfigError, match=r"seed = 0 .* seed = 7"):
        run_peer(spec, 0, f"tcp://127.0.0.1:{free_port()}", tmp_path / "new", tensorboard=False,
                 join_timeout=5, resume_from=finished_run)
    assert not (tmp_path / "new").exists() and _snapshot(finished_run) == before
