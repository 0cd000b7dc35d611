"""`swarm run`'s launcher against what comes at a bad moment: a fork answer that comes
after the launcher gave up, a child's end reported in the same read as its fork, a peer
that ends between two polls, a metrics.csv cut short, a peer whose updates go NaN."""

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

import pytest
from experiment.test_runner import coordinator  # noqa: F401 - a fixture
from swarmtest import ROOT, children_of, free_port, freeze, proc_stat, status, wait_for

from swarm.experiment import forkserver
from swarm.experiment import launch as launch_mod
from swarm.experiment.forkserver import ForkServer
from swarm.experiment.launch import Launch, _Child, _Interrupt, _Progress, _supervise, summarize
from swarm.experiment.runner import EPISODE_FIELDS
from swarm.experiment.spec import Spec

needs_pidfds = pytest.mark.skipif(not forkserver.enabled(), reason="no pidfds here (Linux 5.3 and later)")


@pytest.fixture
def server(tmp_path):
    """A fork server; every child it still holds is killed by its pid at teardown (safe: the
    server keeps a child's pid until it is told to reap it)."""
    s = ForkServer(tmp_path / "forkserver.log", dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT)))
    try:
        yield s
    finally:
        if proc_stat(s.pid) is not None:
            os.kill(s.pid, signal.SIGCONT)   # a test that failed while it was frozen
        for pid in children_of(s.pid):
            os.kill(pid, signal.SIGKILL)
        s.close()


# -- the fork server ----------------------------------------------------------------------


@needs_pidfds
def test_a_fork_given_up_is_cancelled_though_no_one_collects_its_answer(server, tmp_path, monkeypatch):
    """The first fork's answer misses ANSWER_S (the server still imports: frozen here) and
    the launcher starts that peer afresh. The child the server forks later is ended by the
    server itself: a run whose peers are all Popens never reads the late answer, and the
    child ran beside its replacement until the run ended."""
    monkeypatch.setattr(forkserver, "ANSWER_S", 0.5)
    freeze(server.pid)
    try:
        env = dict(os.environ, SWARM_PARENT_PID=str(server.pid))
        argv = ["coordinator", "--bind", f"tcp://127.0.0.1:{free_port()}"]   # runs until it is ended
        assert server.fork(argv, env, tmp_path / "late.log", "late") is None
    finally:
        os.kill(server.pid, signal.SIGCONT)
    # the answer is written once the child is forked; nothing here reads it (no collect)
    wait_for(lambda: forkserver._readable(server.proc.stdout.fileno(), 0), timeout=60,
             what="the server's late answer")
    wait_for(lambda: children_of(server.pid) == [], timeout=10, what="the late child ended")
    # the launcher reaps it whenever it next takes in what the server said
    wait_for(lambda: (server.collect(0.1), children_of(server.pid, zombies=True))[1] == [], timeout=10,
             what="the late child reaped")


@needs_pidfds
def test_an_exit_reported_in_the_same_read_as_its_fork_is_kept(server, tmp_path, monkeypatch):
    """A peer that fails at once (a ConfigError, exit 2): the launcher, descheduled after its
    request, reads the {"pid"} answer and the {"exit"} line together. Its code is 2, at once,
    not LOST after REPORT_S (which restart_dead took for a crash to restart)."""
    monkeypatch.setattr(forkserver, "REPORT_S", 1.0)
    real = forkserver._readable
    held = []

    def ended() -> bool:
        return any((proc_stat(pid) or ["?"])[0] == "Z" for pid in children_of(server.pid, zombies=True))

    def late_reader(fd: int, timeout: float) -> bool:
        if not held:   # the first look at the server's answers: once the child has ended and been told of
            held.append(fd)
            wait_for(ended, timeout=60, what="the forked child ended")
            time.sleep(0.5)
        return real(fd, timeout)

    monkeypatch.setattr(forkserver, "_readable", late_reader)
    p = server.fork(["run", "--set", "peers=zero"], dict(os.environ), tmp_path / "bad.log", "bad")
    monkeypatch.setattr(forkserver, "_readable", real)
    assert p is not None
    assert p.wait(30) == 2 and p.lost == ""
    assert "swarm: error:" in (tmp_path / "bad.log").read_text()


# -- the supervise loop -------------------------------------------------------------------


class _Ends:
    """A child's handle whose ``poll`` gives ``codes`` in turn, then the last one for good."""

    pid = 4242

    def __init__(self, *codes: int | None) -> None:
        self._codes = list(codes)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self._codes:
            self.returncode = self._codes.pop(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        return self.poll()

    def send_signal(self, sig: int) -> None:
        pass

    def kill(self) -> None:
        pass


def supervise(tmp_path: Path, spec: Spec, peer: _Ends) -> tuple[int, Launch, str]:
    launch = Launch(tmp_path)
    coord = _Child("coordinator", _Ends(None), tmp_path / "coordinator.log")
    out = io.StringIO()
    code = _supervise(launch, spec, coord, [_Child("peer0", peer, tmp_path / "peer0.log")], "tcp://127.0.0.1:1",
                      _Progress(spec, out), _Interrupt(out), out)
    return code, launch, out.getvalue()


def test_the_last_peer_crashing_between_two_polls_is_a_crash(tmp_path, monkeypatch):
    """It runs when the crash check polls it and has ended when the live peers are counted:
    the run said nothing and exited 0."""
    monkeypatch.setattr(launch_mod, "POLL_S", 0.01)
    code, _, said = supervise(tmp_path, dataclasses.replace(Spec(), peers=1), _Ends(None, -signal.SIGSEGV))
    assert code == 1, said
    assert "peer0 (pid 4242) exited with signal 11" in said


def test_the_last_peer_crashing_between_two_polls_is_restarted(tmp_path, monkeypatch):
    """restart_dead: the same crash was not restarted (the run ended with it, exit 0)."""
    monkeypatch.setattr(launch_mod, "POLL_S", 0.01)
    monkeypatch.setattr(launch_mod, "_status", lambda addr: {"members": [{"id": "peer0", "state": "dead"}]})
    started = []

    def start(self, name, args, env=None, fork=False):
        started.append(name)
        return _Child(name, _Ends(0), tmp_path / f"{name}.log")   # the restart spends its budget

    monkeypatch.setattr(Launch, "start", start)
    spec = dataclasses.replace(Spec(), peers=1, restart_dead=True)
    code, launch, said = supervise(tmp_path, spec, _Ends(None, -signal.SIGSEGV))
    assert started == ["peer0"] and launch.restarts == {"peer0": 1}, said
    assert code == 0, said


# -- the summary --------------------------------------------------------------------------


WHOLE = "1.5,200,10,22.0,21.3,2,100,100,200,200,0.5,0.9,200"


@pytest.mark.parametrize("tail", ["1.9,2", "1.9,", "1.9", "1.9,300,11,21.0,21.2,3,1,1,300,300,0.5,0.9"])
def test_a_metrics_csv_cut_short_is_summarized_from_its_last_whole_row(tmp_path, tail):
    """A peer killed mid-flush (or on a full disk) without a summary.json: its last row is
    cut short. The summary (after every child ended) raised ValueError on it: no table, no
    summary.json, no plots."""
    (tmp_path / "peer0").mkdir()
    (tmp_path / "peer0" / "metrics.csv").write_text(",".join(EPISODE_FIELDS) + "\n" + WHOLE + "\n" + tail)
    [row] = summarize(tmp_path, dataclasses.replace(Spec(), peers=1))
    assert (row["env_steps"], row["final_mean_return"], row["rounds"], row["bytes_out"]) == (200, 21.3, 2, 200)


def test_a_metrics_csv_with_no_whole_row_or_figures_that_are_not_numbers_gives_zeros(tmp_path):
    (tmp_path / "peer0").mkdir()
    (tmp_path / "peer1").mkdir()
    (tmp_path / "peer0" / "metrics.csv").write_text(",".join(EPISODE_FIELDS) + "\n1.5,20")
    (tmp_path / "peer1" / "metrics.csv").write_text(",".join(EPISODE_FIELDS) + "\n1.5,nan,1,2,nan,inf,,,,,,,\n")
    rows = summarize(tmp_path, dataclasses.replace(Spec(), peers=2))
    for row in rows:
        assert (row["env_steps"], row["final_mean_return"], row["rounds"], row["bytes_out"]) == (0, None, 0, 0), row


# -- the peer -----------------------------------------------------------------------------




def test_updates_skipped_for_a_non_finite_loss_are_counted_and_warned_of(coordinator, tmp_path, monkeypatch, caplog):
    """Every update's loss is infinite: the agent skips them all (DQNAgent.skipped). The peer
    said so nowhere: metrics.csv had loss inf, and it ended "budget" with no notice."""
    from swarm.experiment import load_spec
    from swarm.experiment.runner import run_peer
    from swarm.rl import DQNAgent

    gradient = DQNAgent.gradient

    def diverged(self, batch, weights):
        _, td = gradient(self, batch, weights)
        return float("inf"), td

    monkeypatch.setattr(DQNAgent, "gradient", diverged)
    spec = load_spec(None, ["peers=1", "budget.env_steps=1000000", "dqn.learning_starts=50", "dqn.batch_size=16",
                            "eval.every=0", "gossip.codec=identity", "gossip.step_size=1.0"])
    stop = threading.Event()
    out = {}
    t = threading.Thread(target=lambda: out.update(run_peer(spec, 0, coordinator, tmp_path, stop=stop,
                                                            tensorboard=False, join_timeout=10)))
    caplog.set_level(logging.WARNING, logger="swarm.experiment")
    t.start()
    try:
        def skipped():
            beats = [m.get("stats") or {} for m in status(coordinator, 0.5)["members"]]
            return [s["skipped"] for s in beats if (s.get("skipped") or 0) > 0]
        wait_for(skipped, timeout=60, what="the heartbeat's count of skipped updates")
    finally:
        stop.set()
        t.join(60)
    assert not t.is_alive()
    assert out["reason"] == "stopped" and out["skipped"] > 0
    summary = json.loads((tmp_path / "peer0" / "summary.json").read_text())
    assert summary["skipped"] == out["skipped"] and summary["unusable"] == 0   # its items are all fine
    warned = [r for r in caplog.records if "not finite" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]


def test_the_summary_table_says_how_many_updates_a_peer_skipped():
    from swarm.experiment.launch import _table

    rows = [{"id": "peer0", "env_steps": 500, "reason": "budget", "skipped": 168},
            {"id": "peer1", "env_steps": 500, "reason": "budget", "skipped": 0}, {"id": "peer2"}]
    lines = _table(rows).splitlines()
    assert lines[2].endswith("budget (168 updates skipped: loss or gradient not finite)")
    assert lines[3].endswith("budget") and "skipped" not in lines[4]
