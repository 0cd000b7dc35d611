"""Valid but extreme settings of `swarm run` (review 44):

- a ``dqn.hidden`` whose networks cannot fit in memory is refused before anything starts,
  naming the key and the bytes (launch._check_memory): it passed every check, and then
  every peer died allocating its network;
- a codec whose stable step is far below ``gossip.step_size`` is warned of up front, with
  the number to set (Spec.warnings): only each peer's log said so, with advice the spec
  refuses (gamma='auto');
- returns.png of a run in which no episode finished labels the peers' evaluation dots,
  and says "nothing logged" only when there are no evaluations either
  (launch._returns_figure);
- a resume of a run that ended before its first checkpoint says so, not that ``peers``
  must match (launch.run_experiment).

Runs are real `swarm run` subprocesses in a temporary folder, ended by their handle.
"""

from __future__ import annotations

import io
import os
import resource
import shutil
import subprocess
import sys

import pytest
from experiment.test_memory_cgroup import fake_host
from experiment.test_run import finish
from swarmtest import ROOT, reaped

from swarm.errors import ConfigError
from swarm.experiment import launch, load_spec
from swarm.experiment.launch import _check_memory, run_experiment

SHORT = ["budget.env_steps=300", "dqn.learning_starts=50", "dqn.batch_size=32", "eval.every=150"]


def _swarm_run(cwd, *sets: str, limit_as: int | None = None) -> tuple[int, str]:
    """`swarm run --set S ...` in ``cwd`` to its end: its exit code and output (stdout and
    stderr). ``limit_as`` caps its address space (and its children's), so that a run that
    does start cannot take the host's memory."""
    def cap() -> None:
        if limit_as is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))

    args = [sys.executable, "-m", "swarm.cli", "run", *(x for s in sets for x in ("--set", s))]
    with reaped(subprocess.Popen(args, cwd=cwd, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, preexec_fn=cap)) as p:
        out = finish(p, 120)
    return p.returncode, out


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The folder of a real two-peer run of 5 env steps, evaluated at its last: no episode
    ends (a CartPole episode lasts at least 8 steps). Tests change copies of it."""
    cwd = tmp_path_factory.mktemp("tiny")
    code, out = _swarm_run(cwd, "peers=2", "budget.env_steps=5", "dqn.learning_starts=1", "dqn.batch_size=1",
                           "eval.every=5", "eval.episodes=1")
    assert code == 0, out[-3000:]
    (run_dir,) = (cwd / "runs").iterdir()
    return run_dir


# ---------------------------------------------------------------- 1. networks that cannot fit


@pytest.mark.parametrize("obs, hidden, actions", [(4, [64, 64], 2), (6, [7], 3), (8, [300, 20, 5], 4)])
def test_the_parameter_count_is_the_q_networks(obs, hidden, actions):
    from swarm.rl.dqn import QNetwork

    net = QNetwork(obs, actions, hidden)
    assert launch._q_parameters(obs, hidden, actions) == sum(p.numel() for p in net.parameters())


def test_swarm_run_refuses_a_dqn_hidden_that_cannot_fit_before_anything_starts(tmp_path):
    """Two layers of 65536 (each width within dqn.hidden's limit) are 4.3e9 parameters,
    17 GB a copy: before the fix the run folder was made and each peer died with torch's
    "can't allocate 17179869184 bytes" (exit 1). The address space cap keeps a run that
    does start from taking this host's memory."""
    code, out = _swarm_run(tmp_path, "peers=2", *SHORT, "dqn.hidden=[65536,65536]", limit_as=12 * 10**9)
    assert code == 2, out[-3000:]
    assert out.startswith("swarm: error: dqn.hidden = [65536, 65536]: a Q-network of 4,295,491,586 "
                               "parameters takes 17.2 GB a copy (float32), and each peer holds "), out
    assert "more than the " in out and " of memory this host has available; lower dqn.hidden or peers" in out, out
    assert not (tmp_path / "runs").exists()


def test_the_networks_are_counted_with_the_buffers_and_named_when_they_are_most(tmp_path, monkeypatch):
    """On a host with 50 MB available: two peers of hidden [1024, 1024] (1,056,770
    parameters, 4.23 MB a copy; 6 copies in the agent, 3 in the gossip engine and one per
    neighbour) need 84.8 MB; one peer (no gossip) 25.4 MB, which fits."""
    fake_host(tmp_path, monkeypatch, None, available_kb=50_000_000 // 1024)
    net = ["dqn.hidden=[1024,1024]", "buffer.capacity=1000", *SHORT]
    with pytest.raises(ConfigError) as e:
        _check_memory(load_spec(None, ["peers=2", *net]))
    assert str(e.value) == (
        "dqn.hidden = [1024, 1024]: a Q-network of 1,056,770 parameters takes 4.23 MB a copy (float32), and each "
        "peer holds 10 copies (online and target networks, gradient, Adam's two moments and its scratch, and "
        "gossip's copies of its own parameters and its neighbours'): 84.8 MB for the 2 peers with their replay "
        "buffers, more than the 50 MB of memory this host has available; lower dqn.hidden or peers")
    _check_memory(load_spec(None, ["peers=1", *net]))   # passes
    with pytest.raises(ConfigError) as e:   # and one of twice the width does not
        _check_memory(load_spec(None, ["peers=1", "dqn.hidden=[2048,2048]", "buffer.capacity=1000", *SHORT]))
    assert str(e.value).startswith("dqn.hidden = [2048, 2048]: a Q-network of 4,210,690 parameters takes 16.8 MB "
                                   "a copy (float32), and the peer holds 6 copies (online and target networks, "
                                   "gradient, Adam's two moments and its scratch): 101 MB with its replay buffer, "
                                   "more than the 50 MB of memory"), str(e.value)
    # buffers that fit alone, and do not with the networks: the buffer's message, which counts them
    with pytest.raises(ConfigError) as e:
        _check_memory(load_spec(None, ["peers=2", "dqn.hidden=[512,512]", "buffer.capacity=200000", *SHORT]))
    assert str(e.value).startswith("buffer.capacity = 200000: the replay buffers of the 2 peers would take about "
                                   "47.2 MB (23.6 MB each, 118 bytes a transition of CartPole-v1), and their "
                                   "Q-networks another 21.3 MB, more than the 50 MB"), str(e.value)


# ---------------------------------------------------------------- 2. a step size the codec diverges at


def test_a_step_size_far_above_the_codecs_stable_step_is_warned_of_with_the_number_to_set():
    from swarm.gossip import suggested_gamma

    assert 0.3 > 2 * suggested_gamma("topk:0.01")    # what makes the engine warn in each peer's log
    warned = load_spec(None, ["gossip.codec=topk:0.01"]).warnings()
    assert warned == ["gossip.step_size = 0.3 is far above the stable step for gossip.codec = 'topk:0.01' "
                      "(about 0.02): the peers' parameters are expected to diverge rather than average; set "
                      "gossip.step_size = 0.02"]
    # following it, or a step the codec takes, or nothing to average: no warning
    assert load_spec(None, ["gossip.codec=topk:0.01", "gossip.step_size=0.02"]).warnings() == []
    assert load_spec(None, ["gossip.codec=topk:0.2"]).warnings() == []
    assert load_spec(None, ["gossip.codec=topk:0.01", "peers=1"]).warnings() == []


# ---------------------------------------------------------------- 3. returns.png with no episode finished


def test_the_returns_plot_of_a_run_in_which_no_episode_ended_labels_its_evaluations(tiny_run, tmp_path):
    """metrics.csv is a header only (a row per finished episode), while evals.csv has the
    evaluation at step 5. Before the fix the plot drew each peer's dots unlabelled, under
    "nothing logged"."""
    pytest.importorskip("matplotlib")
    run_dir = shutil.copytree(tiny_run, tmp_path / "run")
    peers = [run_dir / "peer0", run_dir / "peer1"]
    assert all(len((d / "metrics.csv").read_text().splitlines()) == 1 for d in peers)
    assert all(len((d / "evals.csv").read_text().splitlines()) == 2 for d in peers)
    ax = launch._returns_figure(peers).axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["peer0 eval", "peer1 eval"]
    assert [t.get_text() for t in ax.texts] == []
    # with no evaluations either, the plot says that nothing was logged
    for d in peers:
        shutil.copyfile(d / "metrics.csv", d / "evals.csv")   # a header only
    ax = launch._returns_figure(peers).axes[0]
    assert ax.get_legend() is None and [t.get_text() for t in ax.texts] == ["nothing logged"]


# ---------------------------------------------------------------- 4. a resume with no checkpoint


def test_a_resume_of_a_run_that_ended_before_its_first_checkpoint_says_so(tiny_run, tmp_path):
    """A run killed before its first full checkpoint (checkpoint.full_every_s, 300 s by
    default) leaves config.json and its peer folders, and no checkpoint: before the fix
    the resume said "peers = 2 must match that run", which it did."""
    old = shutil.copytree(tiny_run, tmp_path / "old")
    for r in range(2):
        shutil.rmtree(old / f"peer{r}" / "ckpt", ignore_errors=True)
        (old / f"peer{r}" / "checkpoint.pt").unlink()
    with pytest.raises(ConfigError) as e:
        run_experiment(None, [], resume=old, runs_root=tmp_path / "runs", stream=io.StringIO())
    assert str(e.value) == (
        f"resume: no peer of {old} has a checkpoint (ckpt/ or checkpoint.pt): that run ended before its first "
        "one (checkpoint.full_every_s = 300 and checkpoint.full_every_steps = 0 in its config.json), so there "
        f"is nothing to resume; start it again with swarm run {old / 'config.json'} (a lower "
        "checkpoint.full_every_s or a checkpoint.full_every_steps makes the first checkpoint come sooner)")
    assert not (tmp_path / "runs").exists()


def test_a_resume_with_more_peers_than_the_run_had_says_they_must_match(tiny_run, tmp_path):
    with pytest.raises(ConfigError) as e:
        run_experiment(None, ["peers=3"], resume=tiny_run, runs_root=tmp_path / "runs", stream=io.StringIO())
    assert str(e.value) == (f"resume: {tiny_run} has no checkpoint for peer(s) [2]: that run had peers = 2, and "
                            "peers = 3 must match it")
    assert not (tmp_path / "runs").exists()
