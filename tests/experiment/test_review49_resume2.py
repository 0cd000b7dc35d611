"""Resume and start-up after the forty-ninth session's second review: a Ctrl-Z while the
peers wait for each other, a resume interrupted before its peers recorded what they
continue, the refusal of another seed given as a numpy number, and the warning of a
fallback to the run a resume continues."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from swarmtest import wait_for
# a coordinator process for in-process peers (tests/ is on the path)
from experiment.test_runner import coordinator  # noqa: F401 - a fixture

from swarm.errors import ConfigError
from swarm.experiment import launch, load_spec, run_experiment, runner, save_resolved
from swarm.experiment.checkpoint import Lineage, latest, read_lineage, write_lineage
from swarm.experiment.runner import RESUMED_FROM, check_resume_kept, run_peer

ONE = ["peers=1", "dqn.learning_starts=50", "dqn.batch_size=16", "eval.every=0", "gossip.codec=identity",
       "gossip.step_size=1.0", "checkpoint.incremental_every_steps=50"]


def test_the_wait_for_the_others_does_not_count_the_time_the_run_was_stopped(coordinator, tmp_path,
                                                                             monkeypatch, caplog):
    """Ctrl-Z stops the whole run: a peer continued after more than its join_timeout of
    waiting for the others (none could join meanwhile) failed with "1 of the spec's 2
    peers joined within 60 s ... start the others", and `swarm run` ended every peer.
    The stop is played on runner's clock: every reading jumps 100 s while it waits."""
    offset = [0.0]
    readings = [0]

    def monotonic() -> float:
        readings[0] += 1
        return time.monotonic() + offset[0]

    clock = SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("_")})
    clock.monotonic = monotonic
    monkeypatch.setattr(runner, "time", clock)
    caplog.set_level(logging.INFO, logger="swarm")
    stop = threading.Event()
    result: dict = {}

    def peer() -> None:
        try:
            result["summary"] = run_peer(load_spec(None, ONE + ["peers=2", "budget.env_steps=300"]), 0, coordinator,
                                         tmp_path / "run", stop=stop, tensorboard=False, join_timeout=20)
        except Exception as e:   # noqa: BLE001 - the assertion below names it
            result["error"] = e

    t = threading.Thread(target=peer)
    t.start()
    try:
        wait_for(lambda: "joined; waiting for 2 peers" in caplog.text or not t.is_alive(), 60,
                 what="peer0 joined and waiting")
        assert t.is_alive(), result
        time.sleep(1.0)   # its deadline is set just after that line: the stop comes after it
        offset[0] += 100.0   # stopped 100 s (> join_timeout), then continued
        seen = readings[0]
        # a few looks more, each 0.25 s: without the fix the first one raised
        wait_for(lambda: readings[0] > seen + 40 or not t.is_alive(), 30, what="peer0 looking on")
        assert "error" not in result, result
        assert t.is_alive()
    finally:
        stop.set()
        t.join(60)
    assert "error" not in result, result
    assert result["summary"]["reason"] == "stopped", result


def test_a_resume_interrupted_before_its_peers_started_resumes_from_the_run_it_continues(tmp_path, monkeypatch):
    """`swarm run --resume A`, Ctrl-C while it waits for its coordinator: no peer wrote
    run.json, and `swarm run --resume B` said "no peer of B has a checkpoint ... start it
    again with swarm run B/config.json" (from step 0, A's training dropped). B now names A
    (resumed_from.json) before it starts anything, and B's resume goes on from A's
    checkpoints."""
    monkeypatch.chdir(tmp_path)
    a = run_experiment(None, ONE + ["budget.env_steps=200"], runs_root=tmp_path / "runs", stream=io.StringIO())
    assert a.exit_code == 0
    assert latest(a.run_dir / "peer0" / "ckpt") is not None

    wait = launch._wait_coordinator

    def ctrl_c(*args, **kw):
        os.kill(os.getpid(), signal.SIGINT)   # Ctrl-C, to the launcher's own handler
        return wait(*args, **kw)

    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):   # exit 130: a script's loop stops
        m.setattr(launch, "_wait_coordinator", ctrl_c)
        run_experiment(None, ["budget.env_steps=400"], resume=a.run_dir, runs_root=tmp_path / "runs",
                       stream=io.StringIO())
    b, = (d for d in (tmp_path / "runs").iterdir() if d != a.run_dir)
    assert not (b / "peer0" / "run.json").exists()
    assert json.loads((b / RESUMED_FROM).read_text())["resumed_from"] == str(a.run_dir.resolve())

    c = run_experiment(None, None, resume=b, runs_root=tmp_path / "runs", stream=io.StringIO())
    assert c.exit_code == 0
    resumed = json.loads((c.run_dir / "peer0" / "resumed.json").read_text())
    assert Path(resumed["checkpoint"]).resolve().is_relative_to(a.run_dir.resolve()), resumed
    assert c.summary[0]["env_steps"] == 400, c.summary


@pytest.mark.parametrize("key", ["seed", "dqn.hidden"])
def test_a_numpy_seed_or_width_that_differs_is_a_config_error(tmp_path, key):
    """A Spec changed in code keeps numpy's numbers; the refusal's message wrote them with
    json.dumps and raised TypeError ("int64 is not JSON serializable") instead."""
    base = load_spec(None, ONE)
    save_resolved(base, tmp_path)
    if key == "seed":
        spec, was, now = dataclasses.replace(base, seed=np.int64(7)), f"seed = {base.seed}", "seed = 7"
    else:
        spec = dataclasses.replace(base, dqn=dataclasses.replace(base.dqn))
        spec.dqn.hidden = [np.int64(base.dqn.hidden[0] + 1)]
        was, now = f"dqn.hidden = {json.dumps(list(base.dqn.hidden))}", f"dqn.hidden = [{base.dqn.hidden[0] + 1}]"
    with pytest.raises(ConfigError) as e:
        check_resume_kept(tmp_path, spec, [0])
    assert was in str(e.value) and now in str(e.value), e.value


def test_a_resume_of_a_folder_with_no_checkpoint_says_it_has_none(coordinator, tmp_path, caplog):
    """B, resumed from A and ended before its first checkpoint: its peer0 holds only
    run.json. A resume of B goes on from A's checkpoint with a warning that said B's
    checkpoints "can[not] be read (or all hold NaN)", as if some were damaged."""
    a, b = tmp_path / "a", tmp_path / "b"
    run_peer(load_spec(None, ONE + ["budget.env_steps=200"]), 0, coordinator, a, tensorboard=False, join_timeout=10)
    (b / "peer0").mkdir(parents=True)
    write_lineage(b / "peer0", Lineage.new(((str((a / "peer0").resolve()), read_lineage(a / "peer0").id),)))
    with caplog.at_level(logging.WARNING, logger="swarm"):
        s = run_peer(load_spec(None, ONE + ["budget.env_steps=300"]), 0, coordinator, tmp_path / "c",
                     tensorboard=False, join_timeout=10, resume_from=b)
    assert s["reason"] == "budget" and s["env_steps"] == 300, s
    said = [r.getMessage() for r in caplog.records if "resuming from the run it continues" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert f"{b / 'peer0'} has no checkpoint" in said[0] and "can be read" not in said[0], said
