"""`swarm eval`: plays saved policies, and refuses files and arguments it cannot use
with one line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from swarmtest import ROOT

from swarm.buffer import ReplayBuffer
from swarm.cli import main
from swarm.config import to_dict
from swarm.experiment.spec import Spec
from swarm.rl import DQNAgent, dqn_schema
from swarm.rl.train import make_env


def _entries() -> dict:
    """What the runner writes into a peer's best.pt, for an untrained agent."""
    spec = Spec()
    env = make_env(spec.env)
    try:
        agent = DQNAgent.for_env(env, ReplayBuffer(dqn_schema(env.observation_space.shape), 1), spec.dqn)
    finally:
        env.close()
    return {"agent": agent.state_dict(), "params": torch.from_numpy(agent.parameters().copy()),
            "rank": 0, "env_steps": 300, "spec": to_dict(spec), "eval_return": 12.5}


def _eval(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["eval", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


def test_eval_plays_policies_and_sizes_the_path_column(tmp_path, capsys):
    short = tmp_path / "best.pt"
    long = tmp_path / ("a-run-folder-with-a-rather-long-name-" * 2) / "peer0" / "best.pt"
    long.parent.mkdir(parents=True)
    torch.save(_entries(), short)
    torch.save(_entries(), long)
    rc, out, err = _eval(capsys, str(short), str(long), "--episodes", "1")
    assert rc == 0, err
    header, *rows = out.splitlines()
    assert [r.split()[0] for r in rows] == [str(short), str(long)]
    assert all(r.split()[1:3] == ["300", "12.5"] for r in rows)
    ends = {len(line) for line in out.splitlines()}
    assert len(ends) == 1, out   # every column lines up, however long the paths


@pytest.mark.parametrize("content,reason", [(b"hello\n", "KeyError: 101"), (b"just text\n", "KeyError"),
                                            (b"", "empty file")])
def test_a_file_that_is_no_torch_file_is_refused(tmp_path, capsys, content, reason):
    (tmp_path / "best.pt").write_bytes(content)
    rc, out, err = _eval(capsys, str(tmp_path / "best.pt"))
    assert rc == 2 and out == ""
    assert f"swarm: error: {tmp_path / 'best.pt'}: cannot be read as a checkpoint: {reason}" in err, err


def test_a_run_folder_with_a_text_best_pt_is_refused_by_the_command(tmp_path):
    (tmp_path / "run" / "peer0").mkdir(parents=True)
    (tmp_path / "run" / "peer0" / "best.pt").write_text("hello\n")
    p = subprocess.run([sys.executable, "-m", "swarm.cli", "eval", "run"], cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    bad = Path("run", "peer0", "best.pt")
    assert p.stderr.strip() == f"swarm: error: {bad}: cannot be read as a checkpoint: KeyError: 101"


@pytest.mark.parametrize("key,value,says", [
    ("agent", 3, "its agent is of type int, not the agent's state_dict"),
    ("spec", 3, "its spec is of type int, not a table"),
    ("env_steps", [1, 2], "its env_steps is of type list, not a whole number"),
    ("eval_return", "abc", "its eval_return is of type str, not a number"),
])
def test_a_checkpoint_with_entries_of_the_wrong_kind_is_refused(tmp_path, capsys, key, value, says):
    torch.save({**_entries(), key: value}, tmp_path / "best.pt")
    rc, out, err = _eval(capsys, str(tmp_path / "best.pt"), "--episodes", "1")
    assert rc == 2 and out == ""
    assert f"{tmp_path / 'best.pt'}: not a peer's checkpoint.pt or best.pt ({says})" in err, err


def test_an_agent_state_that_fits_no_dqn_agent_is_refused(tmp_path, capsys):
    ck = _entries()
    torch.save({**ck, "agent": {**ck["agent"], "q": 3}}, tmp_path / "best.pt")
    rc, out, err = _eval(capsys, str(tmp_path / "best.pt"), "--episodes", "1")
    assert rc == 2 and out == ""
    assert "best.pt: DQN checkpoint does not fit this network: q has int" in err, err
    assert "Traceback" not in err


def test_a_negative_seed_is_refused_before_anything_runs(tmp_path, capsys):
    torch.save(_entries(), tmp_path / "best.pt")
    rc, out, err = _eval(capsys, str(tmp_path / "best.pt"), "--episodes", "1", "--seed", "-1")
    assert rc == 2 and out == ""
    assert "swarm: error: --seed must be >= 0, got -1" in err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs a named pipe")
def test_a_path_that_is_neither_file_nor_folder_is_named_as_such(tmp_path, capsys):
    os.mkfifo(tmp_path / "pipe")
    rc, out, err = _eval(capsys, str(tmp_path / "pipe"))
    assert rc == 2 and f"{tmp_path / 'pipe'}: not a regular file or folder" in err, err
    rc, out, err = _eval(capsys, str(tmp_path / "missing.pt"))
    assert rc == 2 and f"{tmp_path / 'missing.pt'}: no such file or folder" in err, err
