"""Spec keys that load but do nothing in a run: `swarm run` says so before it starts.

``gossip.interval`` or ``eval.every`` above the budget, and ``buffer.replicas`` without
sharing, stay allowed (scripts/compare_runs.py's isolated baseline, smoke runs), but each
gets a one-line warning naming the key, its value and what follows, on `swarm run`'s
output and in the run folder's ``warnings.txt``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from swarmtest import ROOT

from swarm.experiment import load_spec

SHORT = ["budget.env_steps=200", "dqn.learning_starts=100", "dqn.batch_size=32", "buffer.capacity=1000"]


@pytest.mark.parametrize("overrides, key, said", [
    (["gossip.interval=201", "eval.every=100"], "gossip.interval = 201",
     "above budget.env_steps = 200: no gossip round runs, so the peers never average their parameters or "
     "share transitions; each trains alone"),
    (["gossip.interval=201", "eval.every=100", "buffer.sharing=false"], "gossip.interval = 201",
     "never average their parameters; each trains alone"),
    (["gossip.interval=201", "eval.every=100", "gossip.exchange=gradients", "gossip.sync=async",
      "dqn.learning_starts=150", "dqn.train_every=4"], "gossip.interval = 201",
     "never average their parameters (their gradients are still relayed)"),
    (["gossip.interval=201", "eval.every=100", "gossip.exchange=gradients", "gossip.sync=async",
      "gossip.average=false", "buffer.replicas=1", "dqn.learning_starts=150", "dqn.train_every=4"],
     "gossip.interval = 201",
     "never replicate transitions (their gradients are still relayed)"),
    (["buffer.sharing=false", "buffer.replicas=1", "eval.every=100"], "buffer.replicas = 1",
     "with buffer.sharing = false: nothing is replicated"),
    (["eval.every=201"], "eval.every = 201",
     "above budget.env_steps = 200: no greedy evaluation runs, so no peer writes best.pt"),
    # peers with the same phase (rank % train_every) applied each other's gradients in
    # different orders: the copies parted at every turn (found by a straggler review)
    (["eval.every=100", "gossip.exchange=gradients", "gossip.sync=async", "peers=3", "dqn.train_every=2"],
     "dqn.train_every = 2", "with gossip.exchange = gradients and peers = 3: peers share turns"),
])
def test_a_setting_that_does_nothing_is_warned_of_by_key_value_and_consequence(overrides, key, said):
    warned = load_spec(None, SHORT + overrides).warnings()
    assert len(warned) == 1, warned
    assert warned[0].startswith(key) and said in warned[0], warned[0]
    assert "\n" not in warned[0]


@pytest.mark.parametrize("overrides", [
    [],                                                       # the default spec
    SHORT + ["gossip.interval=200", "eval.every=200"],        # one round and one evaluation, at the last step
    SHORT + ["eval.every=0"],                                 # evaluations off, as asked
    SHORT + ["peers=1", "gossip.interval=201", "eval.every=0"],   # one peer has nobody to gossip with
    # gradients without averaging or replication: a round has nothing to do, whenever it comes
    SHORT + ["gossip.interval=201", "eval.every=0", "gossip.exchange=gradients", "gossip.sync=async",
             "gossip.average=false", "dqn.learning_starts=150", "dqn.train_every=4"],
])
def test_a_spec_whose_settings_all_take_effect_has_no_warning(overrides):
    assert load_spec(None, overrides).warnings() == []


def test_the_isolated_baseline_of_compare_runs_is_warned_of_only_for_its_interval():
    """scripts/compare_runs.py's "isolated" variant: no sharing, gossip.interval = steps + 1."""
    warned = load_spec(None, ["budget.env_steps=500", "eval.every=500", "buffer.sharing=false",
                              "gossip.interval=501"]).warnings()
    assert warned == ["gossip.interval = 501 is above budget.env_steps = 500: no gossip round runs, so the peers "
                      "never average their parameters; each trains alone"]


def test_swarm_run_prints_the_warnings_before_it_starts_and_keeps_them_in_the_run_folder(tmp_path):
    sets = ["peers=2", *SHORT, "gossip.interval=300", "buffer.sharing=false", "buffer.replicas=1", "eval.every=1000"]
    args = [sys.executable, "-m", "swarm.cli", "run", *(x for s in sets for x in ("--set", s))]
    p = subprocess.run(args, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stderr.splitlines()
    warned = [line for line in lines if line.startswith("swarm run: warning: ")]
    assert [w.split(": ")[2].split(" = ")[0] for w in warned] == ["gossip.interval", "buffer.replicas", "eval.every"]
    assert "gossip.interval = 300 is above budget.env_steps = 200" in warned[0]
    assert "eval.every = 1000 is above budget.env_steps = 200" in warned[2]
    # before the first progress line, i.e. before the peers ran
    first_progress = next(i for i, line in enumerate(lines) if line.startswith("["))
    assert lines.index(warned[-1]) < first_progress
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert (run_dir / "warnings.txt").read_text().splitlines() == [w[len("swarm run: warning: "):] for w in warned]
    # what the warnings said came true: no round, no evaluation, no best.pt
    rows = json.loads((run_dir / "summary.json").read_text())
    assert [(r["reason"], r["rounds"], r.get("eval_return")) for r in rows] == [("budget", 0, None)] * 2, rows
    assert not list(run_dir.glob("peer*/best.pt"))
