"""restart_dead in `swarm run` (swarm/experiment/launch.py): the coordinator gets the peers'
restart limit and is left down on an error that every start would meet again; the run then
ends, exit code 1. The launcher holds no log file of a child open (each restart held one
more until the run ended: EMFILE after about a thousand).

Real coordinator processes that fail at once (their address taken, a bad setting), stand-in
processes for the peers.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from swarmtest import free_port, reaped
# the helpers of the other `swarm run` tests (tests/ is on the path; experiment/ is a namespace package)
from experiment.test_run import _Exited

from swarm.experiment import load_spec
from swarm.experiment import launch as launch_mod
from swarm.experiment.launch import Launch, _Child, _Interrupt, _Progress, _restart_crashed, _supervise


def _spec():
    return load_spec(None, ["peers=2", "restart_dead=true"])


def open_logs(run_dir: Path) -> list[str]:
    """The files under ``run_dir/logs`` that this process holds open."""
    logs = str((run_dir / "logs").resolve()) + os.sep
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(logs):
                found.append(target)
    return found


@contextlib.contextmanager
def supervised(monkeypatch, tmp_path: Path, most_starts: int):
    """A Launch whose starts beyond ``most_starts`` fail the test (the old launcher started a
    failing coordinator again for ever), two stand-in peers (``sleep``) that run until the
    launcher ends them, and every process ended by its handle on the way out."""
    launch = Launch(tmp_path)
    real_start = Launch.start

    def start(self, name, args, env=None, fork=False):
        if len(self.children) >= most_starts:
            pytest.fail(f"a start too many: {[c.name for c in self.children]} and now {name}")
        return real_start(self, name, args, env, fork)

    monkeypatch.setattr(Launch, "start", start)
    monkeypatch.setattr(launch_mod, "_status", lambda addr: None)
    with contextlib.ExitStack() as stack:
        peers = [_Child(f"peer{r}", stack.enter_context(reaped(subprocess.Popen(["sleep", "120"]))),
                        tmp_path / f"p{r}.log") for r in range(2)]
        try:
            yield launch, peers
        finally:
            for c in launch.children:
                if c.proc.poll() is None:
                    c.proc.kill()
                    c.proc.wait()


def test_a_coordinator_that_keeps_crashing_is_left_down_after_the_limit(tmp_path, monkeypatch):
    """Another process took the coordinator's port after a crash: every start fails to bind.
    It was started again at every poll, without limit, each start leaving the launcher one
    more open log file. Now it is restarted MAX_RESTARTS times, then left down with a line and
    its log; the peers are ended (they write their results) and the exit code is 1."""
    monkeypatch.setattr(launch_mod, "MAX_RESTARTS", 2)
    spec = _spec()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        addr = f"tcp://127.0.0.1:{taken.getsockname()[1]}"
        with supervised(monkeypatch, tmp_path, most_starts=3) as (launch, peers):
            coord = launch.start("coordinator", launch_mod._coordinator_args(spec, addr))
            out = io.StringIO()
            code = _supervise(launch, spec, coord, peers, addr, _Progress(spec, io.StringIO()), _Interrupt(), out)
            said = out.getvalue()
            assert code == 1, said
            assert launch.restarts == {"coordinator": 2}, said
            assert launch.given_up == {"coordinator": "crashed; not restarted after 2 restarts"}, said
            assert "exited with code 2 after 2 restarts (the limit); not restarting it again" in said, said
            assert f"cannot bind {addr}" in said, said
            assert "the coordinator is down for good; ending the peers" in said, said
            assert all(p.ended_by_us and p.proc.poll() is not None for p in peers)
            # each start appended to the log; none of its files is still open here
            assert (tmp_path / "logs" / "coordinator.log").read_text().count("cannot bind") == 3
            assert open_logs(tmp_path) == []


def test_a_coordinator_whose_start_fails_on_a_config_error_is_not_restarted(tmp_path, monkeypatch):
    """A ConfigError (its note in the log) would end every start the same way: the
    coordinator is left down at once, as a peer is, and the run ends with exit code 1."""
    spec = _spec()
    addr = f"tcp://127.0.0.1:{free_port()}"
    monkeypatch.setattr(launch_mod, "_coordinator_args",
                        lambda spec, addr: ["coordinator", "--bind", addr, "--set", "coordinator.nope=1"])
    with supervised(monkeypatch, tmp_path, most_starts=1) as (launch, peers):
        coord = launch.start("coordinator", launch_mod._coordinator_args(spec, addr))
        out = io.StringIO()
        code = _supervise(launch, spec, coord, peers, addr, _Progress(spec, io.StringIO()), _Interrupt(), out)
        said = out.getvalue()
        assert code == 1, said
        assert launch.restarts == {} and launch.given_up == {"coordinator": "error; not restarted"}, said
        assert "exited with code 2 on an error that a restart would meet again; not restarting it" in said, said
        assert "unknown key coordinator.nope" in said, said
        assert all(p.ended_by_us and p.proc.poll() is not None for p in peers)


def test_a_peer_waiting_for_its_restart_stays_down_with_the_coordinator(tmp_path, monkeypatch):
    """A peer whose restart waits for the coordinator when the coordinator is left down is
    not restarted either (nothing could declare it dead): its row says why."""
    monkeypatch.setattr(Launch, "start", lambda *a, **k: pytest.fail("a process was started"))
    monkeypatch.setattr(launch_mod, "_status", lambda addr: None)
    launch = Launch(tmp_path, restarts={"coordinator": launch_mod.MAX_RESTARTS},
                    in_a_row={"coordinator": launch_mod.MAX_RESTARTS})
    coord = _Child("coordinator", _Exited(-9), tmp_path / "c.log")
    peers = [_Child(f"peer{r}", _Exited(-9), tmp_path / f"p{r}.log") for r in range(2)]
    pending = {0: 0.0}
    out = io.StringIO()
    assert _restart_crashed(launch, _spec(), coord, peers, "tcp://127.0.0.1:9", pending, out) is coord
    assert pending == {}
    assert launch.given_up == {
        "coordinator": f"crashed; not restarted after {launch_mod.MAX_RESTARTS} restarts",
        "peer0": "crashed; not restarted (the coordinator is down)",
        "peer1": "crashed; not restarted (the coordinator is down)"}, out.getvalue()


def test_a_coordinator_that_served_a_while_before_it_died_is_restarted_again(tmp_path, monkeypatch):
    """The limit is on restarts in a row: a coordinator killed now and then over a long run
    (scripts/chaos.py kills it every minute or so) was left down at the 21st kill, and the
    run ended with exit 1."""
    started = []
    monkeypatch.setattr(Launch, "start", lambda self, name, args, env=None, fork=False: started.append(name) or
                        _Child(name, _Exited(-9), tmp_path / "c.log"))
    launch = Launch(tmp_path, restarts={"coordinator": 50}, in_a_row={"coordinator": launch_mod.MAX_RESTARTS})
    served = _Child("coordinator", _Exited(-9), tmp_path / "c.log", started=time.time() - launch_mod.SERVED_S)
    out = io.StringIO()
    _restart_crashed(launch, _spec(), served, [], "tcp://127.0.0.1:9", {}, out)
    assert started == ["coordinator"] and launch.given_up == {}, out.getvalue()
    assert launch.restarts == {"coordinator": 51} and launch.in_a_row == {"coordinator": 1}
    quick = _Child("coordinator", _Exited(-9), tmp_path / "c.log")   # dead at once: in a row
    launch.in_a_row["coordinator"] = launch_mod.MAX_RESTARTS
    _restart_crashed(launch, _spec(), quick, [], "tcp://127.0.0.1:9", {}, out)
    assert started == ["coordinator"] and "coordinator" in launch.given_up


def test_a_restarted_peer_leaves_no_log_file_open(tmp_path):
    """Each start of a child (here one that fails at once) appends to its log, and the
    launcher keeps none of those files open."""
    launch = Launch(tmp_path)
    try:
        for _ in range(2):
            c = launch.start("peer0", ["no-such-command"])
            c.proc.wait(60)
            assert open_logs(tmp_path) == []
        assert (tmp_path / "logs" / "peer0.log").read_text().count("invalid choice") == 2
    finally:
        launch.close()
