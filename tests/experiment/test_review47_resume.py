"""`swarm run --resume` goes on where the old run ended: a swarm that relays gradients
takes its turns in step from the first one after the resume, and a peer resumed from its
`checkpoint.pt` (no usable `ckpt/`) goes on with the old run's counters, as one resumed
from `ckpt/` does (swarm/experiment/runner.py, docs/reliability.md "Resume").

`swarm run` is a real subprocess (coordinator and peers on loopback), ended by its handle.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from swarmtest import ROOT, reaped

from swarm.experiment import load_spec

# the other `swarm run` tests' helpers (tests/ is on the path; experiment/ is a namespace package)
from experiment.test_run import finish

# Two peers taking turns (a turn every 2 env steps by rank, one update each), no
# averaging: the benchmark's SWARM setting, small. 300 steps, then a resume to 600.
RELAY = ["peers=2", "budget.env_steps=300", "dqn.learning_starts=100", "dqn.batch_size=32", "dqn.hidden=[32]",
         "eval.every=0", "buffer.capacity=2000", "gossip.exchange=gradients", "gossip.average=false",
         "dqn.train_every=2"]


def swarm(cwd: Path, *args: str, timeout: float = 120) -> str:
    """Run `swarm run ARGS` in ``cwd`` to its end (ended by its handle should it not);
    its output, after checking it exited 0."""
    argv = [sys.executable, "-m", "swarm.cli", "run", *args]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    with reaped(subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)) as p:
        out = finish(p, timeout)
    assert p.returncode == 0, out
    return out


def runs(cwd: Path) -> list[Path]:
    """The run folders under ``cwd``, oldest first (their names end in the start time)."""
    return sorted((cwd / "runs").glob("cartpole-ring-*"))


def summary(run: Path, rank: int) -> dict:
    return json.loads((run / f"peer{rank}" / "summary.json").read_text())


@pytest.fixture(scope="module")
def relay_run(tmp_path_factory) -> Path:
    """The folder of a finished two-peer gradient run of 300 env steps; tests resume copies of it."""
    cwd = tmp_path_factory.mktemp("relay-run")
    swarm(cwd, *(a for s in RELAY for a in ("--set", s)))
    (old,) = runs(cwd)
    return old


def copy_of(old: Path, tmp_path: Path) -> Path:
    """A copy of the run folder ``old`` under ``tmp_path``/runs, to change and resume."""
    (tmp_path / "runs").mkdir()
    return Path(shutil.copytree(old, tmp_path / "runs" / "old"))


def resume(src: Path, tmp_path: Path, steps: int) -> tuple[Path, str]:
    """`swarm run --resume SRC` to ``steps`` env steps, run in ``tmp_path``: the new run folder and the output."""
    out = swarm(tmp_path, "--resume", str(src), "--set", f"budget.env_steps={steps}")
    (new,) = runs(tmp_path)
    return new, out


def test_a_resumed_gradient_swarm_takes_its_turns_in_step(relay_run, tmp_path):
    """Both peers resume from the same copy at the same update count, so they go on in
    step: each takes every update of the 300 steps after the resume, none is late, none
    takes another's copy. Before the fix the relay's one turn of grace for a neighbour not
    heard from yet counted from learning_starts, long past at the resume: the peer ready
    first went on without the other, dropped its first gradients as late and took a copy
    ("swarm run: peer0 fell out of step with the relay's turns and took another peer's
    copy 1 time"), and the peers ended at different update counts."""
    old = [torch.load(relay_run / f"peer{r}" / "checkpoint.pt", weights_only=False)["agent"] for r in range(2)]
    assert old[0]["updates"] == old[1]["updates"] and old[0]["steps"] == old[1]["steps"] == 300
    # the same number of updates an env step after the resume as before it (from learning_starts)
    per_step = old[0]["updates"] // (300 - 100)
    new, out = resume(copy_of(relay_run, tmp_path), tmp_path, 600)
    assert "fell out of step" not in out, out
    for r in range(2):
        s = summary(new, r)
        assert s["env_steps"] == 600, s
        assert (s["relay"]["resyncs"], s["relay"]["late"], s["relay"]["resynced"]) == (0, 0, []), s["relay"]
        agent = torch.load(new / f"peer{r}" / "checkpoint.pt", weights_only=False)["agent"]
        assert (agent["steps"], agent["updates"]) == (600, old[r]["updates"] + 300 * per_step), r


def test_a_resume_from_checkpoint_pt_goes_on_with_the_old_runs_counters(relay_run, tmp_path):
    """With ckpt/ gone, each peer resumes from its checkpoint.pt (no buffer). Its figures go
    on from that run's: episodes, rounds and bytes are at least the old run's. Before the
    fix only the env steps went on: summary.json's episodes and rounds counted the new
    process's alone (rounds 30, as many as the old run's, where 30 + 30 were taken)."""
    src = copy_of(relay_run, tmp_path)
    for r in range(2):
        shutil.rmtree(src / f"peer{r}" / "ckpt")
    new, out = resume(src, tmp_path, 600)
    for r in range(2):
        was, now = summary(src, r), summary(new, r)
        assert now["resumed_from"] == str(src / f"peer{r}" / "checkpoint.pt"), now
        assert now["env_steps"] == 600, now
        # the new process's own episodes and rounds come on top
        assert now["episodes"] > was["episodes"] and now["rounds"] > was["rounds"], (was, now, out)
        interval = load_spec(new / "config.json").gossip.interval
        assert now["rounds"] == was["rounds"] + 300 // interval and now["bytes_out"] > was["bytes_out"], (was, now)


def test_an_old_checkpoint_pt_without_counters_still_resumes(relay_run, tmp_path):
    """A checkpoint.pt from before it held the run's counters loads as before: its counters
    start again from 0 (all but the env steps), and the peer's log says so."""
    src = copy_of(relay_run, tmp_path)
    for r in range(2):
        shutil.rmtree(src / f"peer{r}" / "ckpt")
        path = src / f"peer{r}" / "checkpoint.pt"
        ck = torch.load(path, weights_only=False)
        ck.pop("counters", None)
        torch.save(ck, path)
    new, _ = resume(src, tmp_path, 400)
    for r in range(2):
        now = summary(new, r)
        interval = load_spec(new / "config.json").gossip.interval
        assert now["env_steps"] == 400 and now["rounds"] == 100 // interval, now
        log = (new / "logs" / f"peer{r}.log").read_text()
        assert "holds no run counters (written before swarm saved them there)" in log, log
