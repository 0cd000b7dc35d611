"""Review 48, the scripts against this session's changes: `learning_bound.py --env
module:EnvId` died with Gymnasium's traceback (it read the threshold by the whole text);
`chaos.py` read checkpoints with torch's full unpickler; `suggested_gamma` took any
topology name (a misspelt time-varying graph got ~3x the step); the custom-simulator
example divided by --gossip-every 0. Real processes and files; each ended by its handle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_scripts import SCRIPTS, load_script

from swarm.errors import ConfigError
from swarm.gossip import suggested_gamma
from swarm.gossip.topology import TOPOLOGIES

ROOT = Path(__file__).resolve().parents[1]
MODULE = """
import gymnasium
CARTPOLE = "gymnasium.envs.classic_control.cartpole:CartPoleEnv"
gymnasium.register(id="MyCart-v0", entry_point=CARTPOLE, max_episode_steps=200, reward_threshold=190.0)
gymnasium.register(id="NoThr-v0", entry_point=CARTPOLE, max_episode_steps=200)
"""


def _learning_bound(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "myenvs48.py").write_text(MODULE)
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{tmp_path}")
    return subprocess.run([sys.executable, str(SCRIPTS / "learning_bound.py"), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=100)


def test_learning_bound_reads_the_threshold_of_a_module_env(tmp_path):
    res = _learning_bound(tmp_path, "--env", "myenvs48:MyCart-v0", "--actors", "1", "--seeds", "0",
                          "--max-steps", "300", "--eval-every", "150", "--eval-episodes", "1",
                          "--set", "learning_starts=100")
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout.strip().splitlines()[-1])["solve_at"] == 190.0


def test_learning_bound_asks_for_solve_at_for_a_module_env_without_a_threshold(tmp_path):
    res = _learning_bound(tmp_path, "--env", "myenvs48:NoThr-v0", "--max-steps", "300")
    assert res.returncode == 2 and "--solve-at" in res.stderr and "Traceback" not in res.stderr, res.stderr[-2000:]


class _Plants:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_chaos_reads_checkpoints_without_running_their_code(tmp_path):
    chaos = load_script("chaos")
    (tmp_path / "peer0").mkdir()
    (tmp_path / "peer1").mkdir()
    torch.save({"params": torch.tensor([1.0, float("nan")])}, tmp_path / "peer0" / "checkpoint.pt")
    torch.save({"params": torch.zeros(2)}, tmp_path / "peer1" / "checkpoint.pt")
    assert chaos.nan_params(tmp_path) == 1
    planted = tmp_path / "pwned"
    torch.save({"params": torch.zeros(2), "x": _Plants(planted)}, tmp_path / "peer1" / "checkpoint.pt")
    with pytest.raises(Exception, match="GLOBAL|global"):
        chaos.nan_params(tmp_path)
    assert not planted.exists()


def test_suggested_gamma_refuses_an_unknown_topology():
    with pytest.raises(ConfigError, match="unknown topology 'one-peer-exponential'"):
        suggested_gamma("identity", 0.7, 0.9, "one-peer-exponential")
    for topology in (*TOPOLOGIES, None):
        assert 0 < suggested_gamma("ef+topk:0.1", 0.7, 0.9, topology) <= 1


def test_the_example_refuses_a_count_below_one():
    # one process (each imports torch): --gossip-every 0 divided by zero at its first step
    res = subprocess.run([sys.executable, str(ROOT / "examples" / "custom_simulator.py"), "--gossip-every", "0"],
                         capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert res.returncode == 2 and "--gossip-every must be >= 1" in res.stderr, res.stderr[-2000:]
