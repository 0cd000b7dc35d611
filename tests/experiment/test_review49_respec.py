"""Review 49: what `swarm run --resume RUN` (``run_experiment(..., resume=RUN)``) admits.

A budget the checkpoints already reached, another ``dqn.hidden`` or fewer peers are refused
before anything starts, naming the key; a run resumed and killed before its first
checkpoint resumes from the run it continues; a best evaluation on another env does not
carry over (swarm/experiment/launch.py, runner.py; docs/rl.md "Resuming",
docs/reliability.md "Resume").

Real runs: two peers on loopback in this process (`run_experiment`), and one `swarm run`
subprocess whose processes are killed by their pids.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from swarmtest import ROOT, alive, wait_for
# in-process peers and a coordinator process for them (tests/ is on the path)
from experiment.test_resume_lineage import _killed, _peer
from experiment.test_runner import coordinator  # noqa: F401 - a fixture

from swarm.errors import ConfigError
from swarm.experiment import run_experiment
from swarm.experiment.checkpoint import latest

#: the old run: two peers, 300 env steps, a greedy evaluation every 100 (best.pt)
BASE = ["peers=2", "budget.env_steps=300", "dqn.learning_starts=100", "dqn.batch_size=32", "dqn.hidden=[16]",
        "eval.every=100", "eval.episodes=1", "buffer.capacity=2000"]
MODULE = "scaled_cartpole_review49"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """The folder of a finished run of BASE; the tests resume it and leave it as it is."""
    r = run_experiment(None, BASE, runs_root=tmp_path_factory.mktemp("base"), stream=io.StringIO())
    assert r.exit_code == 0 and [s["env_steps"] for s in r.summary] == [300, 300], r
    return r.run_dir


def _resume(base: Path, root: Path, sets: list[str]):
    return run_experiment(None, sets, resume=base, runs_root=root, stream=io.StringIO())


def _made(root: Path) -> list[Path]:
    return list(root.iterdir()) if root.exists() else []


def test_a_resume_with_a_budget_every_peer_reached_is_refused_before_anything_starts(base, tmp_path):
    """Before, it started a swarm that trained nothing, recorded a budget below the steps done,
    and exited 0 with reason "budget". An unchanged resume of the finished run is the same."""
    root = tmp_path / "runs"
    for budget in (200, 300):
        with pytest.raises(ConfigError, match="budget.env_steps") as e:
            _resume(base, root, [f"budget.env_steps={budget}"])
        assert "peer0 300" in str(e.value) and "raise budget.env_steps" in str(e.value), e.value
    assert _made(root) == []


def test_a_resume_with_another_network_is_refused_naming_dqn_hidden(base, tmp_path):
    """Before, the peers were started and each failed on loading ("114 parameters, the agent
    has 226"), leaving a run folder of a run that never trained."""
    root = tmp_path / "runs"
    with pytest.raises(ConfigError, match=r"dqn.hidden = \[16\] and this run asks for dqn.hidden = \[32\]"):
        _resume(base, root, ["dqn.hidden=[32]", "budget.env_steps=600"])
    assert _made(root) == []


def test_a_resume_with_fewer_peers_is_refused_like_one_with_more(base, tmp_path):
    """Before, peers=1 resumed peer0 alone and dropped peer1's training without a word, while
    peers=3 was refused with "peers = 3 must match it": now the rule holds both ways."""
    root = tmp_path / "runs"
    with pytest.raises(ConfigError, match=r"had peers = 2, and peers = 1 must match it") as e:
        _resume(base, root, ["peers=1", "budget.env_steps=400"])
    assert "peer(s) [1] would be left out" in str(e.value), e.value
    with pytest.raises(ConfigError, match=r"that run had peers = 2, and peers = 3 must match it"):
        _resume(base, root, ["peers=3", "budget.env_steps=400"])
    assert _made(root) == []


def test_a_resume_on_another_env_does_not_keep_the_old_envs_best(base, tmp_path, monkeypatch):
    """CartPole's returns scaled by 0.01 (same observations and actions, so the resume is
    admitted): the best evaluation and best.pt are this run's, not the old env's 9 or 10,
    which no evaluation on the new env could beat."""
    import torch

    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / f"{MODULE}.py").write_text(textwrap.dedent(f"""\
        import gymnasium as gym


        class Scaled(gym.RewardWrapper):
            def reward(self, r):
                return 0.01 * r


        def make(**kw):
            return Scaled(gym.make("CartPole-v1", **kw))


        gym.register("ScaledCartPole-v0", entry_point="{MODULE}:make", max_episode_steps=500, reward_threshold=4.75)
        """))
    monkeypatch.syspath_prepend(str(mods))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(mods), str(ROOT)]))   # the peers import it too
    env = f"{MODULE}:ScaledCartPole-v0"
    r = _resume(base, tmp_path / "runs", [f"env={env}", "budget.env_steps=500", "eval.solve_return=4.75"])
    assert r.exit_code == 0, r
    for s in r.summary:
        folder = r.run_dir / f"peer{s['rank']}"
        with open(folder / "evals.csv") as f:
            evals = [float(row["eval_return"]) for row in csv.DictReader(f)]
        assert evals and s["best_eval_return"] == max(evals), (s, evals)
        best = torch.load(folder / "best.pt", weights_only=True)
        assert best["spec"]["env"] == env and best["eval_return"] == max(evals), best["spec"]["env"]


def _resumed_then_killed(base: Path, cwd: Path) -> Path:
    """`swarm run --resume BASE` in ``cwd`` with no periodic checkpoint, every process of it
    stopped then killed by its pid once both peers have resumed: a run folder that continues
    BASE and holds no checkpoint of its own."""
    argv = [sys.executable, "-m", "swarm.cli", "run", "--resume", str(base), "--set", "budget.env_steps=100000",
            "--set", "checkpoint.full_every_s=0"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    with open(cwd / "out.txt", "w") as log:
        p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        def resumed() -> Path | None:
            runs = list((cwd / "runs").glob("cartpole-ring-*"))
            return runs[0] if runs and all((runs[0] / f"peer{r}" / "resumed.json").is_file() for r in (0, 1)) else None

        new = wait_for(resumed, timeout=120, what="both peers resumed")
        pids = [p.pid, *json.loads((new / "pids.json").read_text())["children"].values()]
        # all stopped first: none ends gracefully (a final checkpoint) as it sees another go
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                if pid == p.pid or alive(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, sig)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:   # it failed before: the launcher ends its children on SIGINT
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    assert all(latest(new / f"peer{r}" / "ckpt") is None for r in (0, 1)), "a checkpoint was written"
    return new


def test_a_resumed_run_killed_before_its_first_checkpoint_resumes_from_the_run_it_continues(base, tmp_path):
    """Before, `swarm run --resume NEW` said that NEW had nothing to resume and advised
    `swarm run NEW/config.json`, a start from step 0, though NEW's peers record (run.json)
    that they continue BASE, whose checkpoints load."""
    new = _resumed_then_killed(base, tmp_path)
    r = _resume(new, tmp_path / "again", ["budget.env_steps=400"])
    assert r.exit_code == 0 and [s["env_steps"] for s in r.summary] == [400, 400], r
    for rank in (0, 1):
        rec = json.loads((r.run_dir / f"peer{rank}" / "resumed.json").read_text())
        assert Path(rec["checkpoint"]).resolve() == latest(base / f"peer{rank}" / "ckpt").resolve(), rec
        assert rec["env_steps"] == 300 and rec["continues"] == str((base / f"peer{rank}").resolve()), rec


def test_swarm_peer_resumed_again_from_such_a_run_goes_on_with_its_own_checkpoints(coordinator, tmp_path,
                                                                                   monkeypatch):
    """`swarm peer --resume B --run-dir X`, B a run resumed from A and killed before its first
    checkpoint: X's peer resumes from A's checkpoint (before, an error: B has none), and the
    same command run again after X's peer was killed goes on with X's run, from X's newer
    checkpoints, as it does when B has checkpoints of its own."""
    a, b, x = tmp_path / "a", tmp_path / "b", tmp_path / "x"
    _peer(coordinator, a, 200)
    was = latest(a / "peer0" / "ckpt")
    _killed(coordinator, b, 260, monkeypatch, resume_from=a, sets=("checkpoint.incremental_every_steps=1000",))
    assert latest(b / "peer0" / "ckpt") is None
    s = _killed(coordinator, x, 330, monkeypatch, resume_from=b)
    assert s["resumed_from"] == str(was), s
    own = latest(x / "peer0" / "ckpt")
    assert own is not None
    s = _peer(coordinator, x, 400, resume_from=b)
    assert s["resumed_from"] == str(own) and s["env_steps"] == 400, s
