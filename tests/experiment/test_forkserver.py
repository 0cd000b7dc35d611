"""The fork server that starts `swarm run`'s peers: real processes, forked from a server
that imported torch once; each is watched and signalled by its handle (a pidfd)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from swarmtest import ROOT, alive, children_of, free_port, freeze, proc_stat, reaped, wait_for

from swarm.experiment import forkserver
from swarm.experiment.forkserver import LOST, ForkServer
from swarm.errors import ConfigError
from swarm.experiment.launch import Launch, run_experiment

pytestmark = pytest.mark.skipif(not forkserver.enabled(), reason="no pidfds here (Linux 5.3 and later)")


@pytest.fixture
def server(tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    s = ForkServer(tmp_path / "forkserver.log", env)
    forked = []
    real_fork = s.fork

    def fork(*args, **kwargs):
        p = real_fork(*args, **kwargs)
        if p is not None:
            forked.append(p)
        return p

    s.fork = fork
    try:
        yield s
    finally:
        for p in forked:
            p.kill()
        s.close()


def coordinator(server: ForkServer, tmp_path: Path, name: str = "c") -> tuple[object, Path]:
    """A `swarm coordinator` forked by ``server``: it runs until it is ended (or orphaned)."""
    log = tmp_path / f"{name}.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1", SWARM_PARENT_PID=str(server.pid))
    p = server.fork(["coordinator", "--bind", f"tcp://127.0.0.1:{free_port()}"], env, log)
    assert p is not None, (tmp_path / "forkserver.log").read_text()
    wait_for(lambda: "swarm coordinator on" in log.read_text(), timeout=30, what="the coordinator's first line")
    return p, log


def test_a_forked_command_runs_as_the_cli_would(server, tmp_path):
    """`swarm run --show` forked: its output is in its log, its exit code is the CLI's."""
    log = tmp_path / "show.log"
    p = server.fork(["run", "--show", "--set", "peers=3"], dict(os.environ), log)
    assert p.wait(60) == 0
    assert "peers = 3" in log.read_text()
    bad = server.fork(["run", "--set", "peers=zero"], dict(os.environ), tmp_path / "bad.log")
    assert bad.wait(60) == 2
    assert "swarm: error:" in (tmp_path / "bad.log").read_text()
    # each was reaped once its end was taken: the server holds no zombie
    wait_for(lambda: children_of(server.pid, zombies=True) == [], timeout=10, what="the server's children reaped")


def test_a_forked_process_is_the_servers_child_in_a_session_of_its_own(server, tmp_path):
    p, log = coordinator(server, tmp_path)
    fields = proc_stat(p.pid)
    assert int(fields[1]) == server.pid                    # its parent: the server
    assert int(fields[3]) == p.pid                         # its own session: Ctrl-C reaches only swarm run
    assert Path(f"/proc/{p.pid}/fd/0").resolve() == Path(os.devnull)
    assert p.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(0.2)
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0                                 # a coordinator ends cleanly on SIGTERM
    p.send_signal(signal.SIGKILL)                          # ended and reaped: nothing is signalled
    assert p.returncode == 0


def test_a_killed_child_reports_its_signal(server, tmp_path):
    p, _ = coordinator(server, tmp_path)
    p.kill()
    assert p.wait(30) == -signal.SIGKILL
    wait_for(lambda: children_of(server.pid, zombies=True) == [], timeout=10, what="the killed child reaped")


def test_when_the_server_dies_its_children_end_and_say_so(server, tmp_path):
    """A SIGKILLed server: its children (watching it as their parent) stop; their end is
    known by pidfd, how they ended is not (``lost``), and nothing is left."""
    p, log = coordinator(server, tmp_path)
    os.kill(server.pid, signal.SIGKILL)
    assert p.wait(30) == LOST and p.lost == "the fork server that started it died first"
    assert proc_stat(p.pid) is None or proc_stat(p.pid)[0] == "Z"   # (a zombie where pid 1 does not reap)
    assert "is gone; stopping" in log.read_text()
    assert server.fork(["run", "--show"], dict(os.environ), tmp_path / "x.log") is None


def test_a_child_it_cannot_watch_is_killed_and_no_more_forks_are_asked(server, tmp_path, monkeypatch):
    """pidfd_open refused after the fork (seccomp, no fds left): the child has no handle, so
    it is killed (not left training beside the fresh one the launcher starts instead)."""
    def refused(pid):
        raise OSError(38, "Function not implemented")

    with monkeypatch.context() as m:
        m.setattr(os, "pidfd_open", refused)
        assert server.fork(["run", "--show"], dict(os.environ), tmp_path / "x.log") is None
    assert not server.forking
    wait_for(lambda: (server.collect(0.1), children_of(server.pid, zombies=True))[1] == [], timeout=15,
             what="the unwatched child killed and reaped")
    assert server.fork(["run", "--show"], dict(os.environ), tmp_path / "y.log") is None


def test_an_unanswered_fork_is_given_up_and_its_late_child_killed(server, tmp_path, monkeypatch):
    """A server that does not answer within ANSWER_S (frozen here): fork gives up (the
    launcher starts the peer afresh); the child it forks once thawed is killed and reaped."""
    first, _ = coordinator(server, tmp_path)
    monkeypatch.setattr(forkserver, "ANSWER_S", 1.0)
    freeze(server.pid)
    try:
        assert server.fork(["run", "--show"], dict(os.environ), tmp_path / "x.log") is None
        assert not server.forking
        # a child that ends while the server cannot say how is ``lost`` after REPORT_S
        first.kill()
        assert first.wait(forkserver.REPORT_S + 20) == LOST and first.lost.startswith("its fork server did not say")
    finally:
        os.kill(server.pid, signal.SIGCONT)
    wait_for(lambda: (server.collect(0.1), children_of(server.pid, zombies=True))[1] == [], timeout=30,
             what="the late child killed and both reaped")
    assert server.alive and server.exits == {}


def test_launch_starts_a_fresh_interpreter_without_the_server(tmp_path, monkeypatch):
    """SWARM_FORKSERVER=0, or a server that is gone: Launch.start(fork=True) still starts
    the process, as ``python -m swarm.cli``."""
    for how in ("off", "dead"):
        monkeypatch.setenv("SWARM_FORKSERVER", "0" if how == "off" else "1")
        launch = Launch(tmp_path / how)
        try:
            launch.preload()
            if how == "dead":
                os.kill(launch.forks.pid, signal.SIGKILL)
                launch.forks.proc.wait()
            else:
                assert launch.forks is None
            c = launch.start("show", ["run", "--show"], fork=True)
            assert isinstance(c.proc, subprocess.Popen), how
            assert c.proc.wait(60) == 0
            assert "peers = " in c.log.read_text()
        finally:
            launch.close()


@pytest.mark.parametrize("value", ["off", "false", "2"])
def test_a_bad_swarm_forkserver_is_refused_before_anything_starts(value, tmp_path, monkeypatch):
    monkeypatch.setenv("SWARM_FORKSERVER", value)
    with pytest.raises(ConfigError, match=f"SWARM_FORKSERVER='{value}': use 1 .* or 0"):
        run_experiment(None, ["peers=1"], runs_root=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


def test_a_run_whose_fork_server_dies_ends_with_its_peers_results(tmp_path):
    """`swarm run` whose fork server is SIGKILLed mid-run: the peers stop and write their
    results, the run says how they ended is unknown, exits 1, and leaves no process."""
    args = [sys.executable, "-m", "swarm.cli", "run"]
    for s in ["peers=2", "budget.env_steps=200000", "dqn.learning_starts=100", "eval.every=0"]:
        args += ["--set", s]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    with reaped(subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)) as p:
        def training():
            for d in (tmp_path / "runs").glob("*"):
                if all((d / f"peer{r}" / "metrics.csv").exists() for r in range(2)):
                    return d
            return None

        d = wait_for(training, timeout=60, what="both peers training")
        pids = json.loads((d / "pids.json").read_text())["children"]
        os.kill(pids["forkserver"], signal.SIGKILL)
        out, _ = p.communicate(timeout=60)
    assert p.returncode == 1, out
    assert out.count("exited with an unknown status (the fork server that started it died first)") >= 2, out
    rows = json.loads((d / "summary.json").read_text())
    assert [r["reason"].split(",")[0] for r in rows] == ["launcher gone", "launcher gone"], rows
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids.values()):
        assert time.monotonic() < deadline, f"left running: {pids}"
        time.sleep(0.1)
