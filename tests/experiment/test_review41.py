"""A federation flush that raises after a gossip round's GossipError keeps the round's
error (swarm/experiment/runner.py); `swarm run --resume` refuses a changed replay-buffer
setting that the checkpoints' buffers keep, once, before it starts anything
(swarm/experiment/launch.py).

Peers are threads of this process beside a real coordinator process on loopback; `swarm
run` is a real subprocess, ended by its handle.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
# tests/ is on the path: a coordinator process for in-process peers, and a tiny `swarm run`
from experiment.test_run import finish, run_dir_of, tiny_run  # noqa: F401 - a fixture
from experiment.test_runner import ONE, coordinator  # noqa: F401 - a fixture
from swarmtest import ROOT, reaped

from swarm.errors import GossipError, ReplayError
from swarm.experiment import load_spec
from swarm.experiment.runner import run_peer


def test_a_flush_that_raises_after_a_failed_round_keeps_the_rounds_error(coordinator, tmp_path,  # noqa: F811
                                                                           monkeypatch, caplog):
    """Before the fix, when gossip.round() raised GossipError and the federation flush that
    still follows it raised too, only the flush's error went up: the round's GossipError was
    neither logged nor chained, so nothing told that the round had failed."""
    from swarm.buffer import Federation
    from swarm.gossip import Gossip

    async def failing_round(self):
        raise GossipError("params hold NaN or Inf; round not run (nothing sent, x unchanged)")

    async def failing_flush(self):
        raise ReplayError("flush: a stand-in failure")

    monkeypatch.setattr(Gossip, "round", failing_round)
    monkeypatch.setattr(Federation, "flush", failing_flush)
    caplog.set_level(logging.WARNING, logger="swarm.experiment")
    with pytest.raises(ReplayError, match="a stand-in failure") as e:
        run_peer(load_spec(None, ONE), 0, coordinator, tmp_path, tensorboard=False, join_timeout=10)
    assert isinstance(e.value.__context__, GossipError), repr(e.value.__context__)
    assert "params hold NaN or Inf" in str(e.value.__context__)
    assert any("params hold NaN or Inf" in r.getMessage() for r in caplog.records), caplog.text


@pytest.mark.parametrize("key", ["buffer.alpha=0.3", "buffer.prioritized=false", "buffer.eps=0.001",
                                 "buffer.decay=0.1", "buffer.capacity=3000"])
def test_resume_refuses_a_buffer_setting_the_checkpoints_keep_before_it_starts(tiny_run, tmp_path,  # noqa: F811
                                                                                key):
    """Before the fix, `swarm run --resume OLD --set buffer.alpha=0.3` (or capacity, prioritized,
    eps, decay: settings a restored replay buffer keeps) made the run folder and started the
    coordinator and every peer, and each peer then failed on its own with the same error."""
    ran_in, returncode, out = tiny_run
    assert returncode == 0, out
    old = run_dir_of(ran_in)
    args = [sys.executable, "-m", "swarm.cli", "run", "--resume", str(old), "--set", key]
    with reaped(subprocess.Popen(args, cwd=tmp_path, env=dict(os.environ, PYTHONUNBUFFERED="1",
                                                               PYTHONPATH=str(ROOT)),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)) as p:
        out = finish(p, 60)
    assert p.returncode == 2, out
    errors = [line for line in out.splitlines() if line.startswith("swarm: error:")]
    name = key.split("=")[0]
    assert len(errors) == 1 and f"{name} = " in errors[0] and str(old) in errors[0], out
    assert not (tmp_path / "runs").exists(), os.listdir(tmp_path / "runs")   # no run folder: nothing started


def test_resume_takes_a_changed_buffer_setting_when_no_checkpoint_holds_a_buffer(tiny_run, tmp_path):  # noqa: F811
    """Not a defect of its own: it keeps the fix above from refusing too much. A run folder
    whose peers left only checkpoint.pt (no ckpt/, so no replay buffer to restore): each
    peer starts a new buffer with the spec's settings, so the launcher lets the change through."""
    from swarm.experiment.runner import check_resume_kept

    ran_in, returncode, out = tiny_run
    assert returncode == 0, out
    old = Path(shutil.copytree(run_dir_of(ran_in), tmp_path / "old"))
    for r in range(2):
        shutil.rmtree(old / f"peer{r}" / "ckpt")
    check_resume_kept(old, load_spec(old / "config.json", ["buffer.alpha=0.3"]), range(2))
