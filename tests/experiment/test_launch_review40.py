"""`swarm run` (swarm/experiment/launch.py, swarm/experiment/forkserver.py) when a process
cannot be started again, or Ctrl-C comes while the first fork waits for the fork server:
a restart whose spawn fails (the python binary gone, a log that cannot be opened) is
reported like a process left down, and a Ctrl-C ends the wait for a frozen fork server.

Real processes throughout: stand-ins (``sh``, ``sleep``) for the children of the
supervise loop, and a real `swarm run` whose fork server is frozen with SIGSTOP.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from swarmtest import ROOT, alive, freeze, reaped, wait_for

from swarm.experiment import forkserver
from swarm.experiment import launch as launch_mod
from swarm.experiment.launch import Launch, _Child, _Interrupt, _Progress, _supervise
from swarm.experiment.spec import load_spec

ADDR = "tcp://127.0.0.1:9"


def _spec():
    return load_spec(None, ["peers=2", "restart_dead=true"])


def _no_python(monkeypatch, tmp_path: Path) -> None:
    """The python binary is gone (a venv removed under a long run): Popen raises."""
    monkeypatch.setattr(sys, "executable", str(tmp_path / "gone" / "python"))


def _log_is_a_folder(monkeypatch, tmp_path: Path) -> None:
    """The child's log cannot be opened (here a folder stands in its place)."""
    for name in ("coordinator", "peer0"):
        (tmp_path / "logs" / f"{name}.log").mkdir(parents=True)


@contextlib.contextmanager
def children(tmp_path: Path, *argvs: list[str]):
    """Stand-in children (``_Child``) running ``argvs``, each ended by its handle on the way out."""
    with contextlib.ExitStack() as stack:
        yield [_Child(f"c{i}", stack.enter_context(reaped(subprocess.Popen(argv))), tmp_path / f"c{i}.log")
               for i, argv in enumerate(argvs)]


@pytest.mark.parametrize("breakage", [_no_python, _log_is_a_folder])
def test_a_peer_whose_restart_cannot_be_spawned_is_left_down(tmp_path, monkeypatch, breakage):
    """An OSError of the restart's spawn (Popen, or opening its log) went out of
    _restart_crashed and _supervise: `swarm run` ended with a traceback, no summary and
    no word of which peer. Now the peer is left down with a line and the OSError in its
    reason, the others go on to their end, and the exit code is 1."""
    monkeypatch.setattr(launch_mod, "_status",
                        lambda addr: {"members": [{"id": "peer0", "state": "dead"}, {"id": "peer1", "state": "ok"}]})
    spec = _spec()
    launch = Launch(tmp_path)
    # the coordinator runs; peer0 has crashed (code 3), peer1 spent its budget (exit 0)
    with children(tmp_path, ["sleep", "120"], ["sh", "-c", "exit 3"], ["true"]) as (coord, peer0, peer1):
        coord.name, peer0.name, peer1.name = "coordinator", "peer0", "peer1"
        for c in (peer0, peer1):
            c.proc.wait(30)
        breakage(monkeypatch, tmp_path)
        out = io.StringIO()
        try:
            code = _supervise(launch, spec, coord, [peer0, peer1], ADDR, _Progress(spec, io.StringIO()),
                              _Interrupt(), out)
        finally:
            launch.close()
        said = out.getvalue()
        assert code == 1, said
        assert list(launch.given_up) == ["peer0"], said
        reason = launch.given_up["peer0"]
        assert reason.startswith("crashed; not restarted (its restart failed: "), reason
        assert ("No such file or directory" if breakage is _no_python else "Is a directory") in reason, reason
        assert "swarm run: cannot start peer0 again: " in said and "leaving it down" in said, said
        assert launch.restarts == {} and launch.children == [], said   # nothing was started
        assert coord.proc.poll() is None   # the caller (run_experiment) ends it, as for every run


@pytest.mark.parametrize("breakage", [_no_python, _log_is_a_folder])
def test_a_coordinator_whose_restart_cannot_be_spawned_ends_the_run(tmp_path, monkeypatch, breakage):
    """The same OSError at the coordinator's restart went out of _supervise too. Now the
    coordinator is left down, as after MAX_RESTARTS: the peers are ended (they write their
    results) and the exit code is 1."""
    monkeypatch.setattr(launch_mod, "_status", lambda addr: None)
    spec = _spec()
    launch = Launch(tmp_path)
    with children(tmp_path, ["sh", "-c", "exit 1"], ["sleep", "120"], ["sleep", "120"]) as (coord, *peers):
        coord.name = "coordinator"
        for r, c in enumerate(peers):
            c.name = f"peer{r}"
        coord.proc.wait(30)
        breakage(monkeypatch, tmp_path)
        out = io.StringIO()
        try:
            code = _supervise(launch, spec, coord, peers, ADDR, _Progress(spec, io.StringIO()), _Interrupt(), out)
        finally:
            launch.close()
        said = out.getvalue()
        assert code == 1, said
        assert launch.given_up["coordinator"].startswith("crashed; not restarted (its restart failed: "), said
        assert "swarm run: cannot start coordinator again: " in said, said
        assert "the coordinator is down for good; ending the peers" in said, said
        assert all(p.ended_by_us and p.proc.poll() is not None for p in peers), said
        assert launch.restarts == {}, said


def _run_dir(cwd: Path) -> Path | None:
    dirs = list((cwd / "runs").glob("*"))
    return dirs[0] if dirs else None


def _pids(run_dir: Path) -> dict[str, int]:
    try:
        return json.loads((run_dir / "pids.json").read_text())["children"]
    except (OSError, ValueError, KeyError):
        return {}


@pytest.mark.skipif(not forkserver.enabled(), reason="no pidfds here (Linux 5.3 and later): no fork server")
def test_ctrl_c_while_the_first_fork_waits_for_a_frozen_fork_server(tmp_path):
    """Ctrl-C while `swarm run` waited for the fork server's answer to the first fork
    (frozen here: a loaded machine's imports) did nothing until ANSWER_S (60 s) had
    passed; then peer0 was started all the same, as a fresh interpreter, and only then
    ended. Now the wait ends at the Ctrl-C, no peer is started, the fork server and the
    coordinator are ended, and the exit code is 130."""
    args = [sys.executable, "-m", "swarm.cli", "run", "--set", "peers=2", "--set", "eval.every=0"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    pids: dict[str, int] = {}
    p = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with reaped(p):
            # frozen as soon as it is listed: long before its imports end and it could answer
            d = wait_for(lambda: _run_dir(tmp_path) if "forkserver" in _pids(_run_dir(tmp_path)) else None,
                         timeout=60, interval=0.01, what="the fork server listed in pids.json")
            pids = _pids(d)
            freeze(pids["forkserver"])
            # peer0's log is made just before its fork is asked for: the launcher waits for the answer
            wait_for(lambda: (d / "logs" / "peer0.log").exists(), timeout=60, what="the first fork asked for")
            pids = _pids(d)
            p.send_signal(signal.SIGINT)
            out, _ = p.communicate(timeout=40)
            pids = _pids(d) or pids
        assert p.returncode == 130, out
        assert "interrupted" in out, out
        assert set(pids) == {"coordinator", "forkserver"}, (pids, out)   # no peer was started
        rows = json.loads((d / "summary.json").read_text())
        assert [r["reason"] for r in rows] == ["not started (interrupted)"] * 2, out
        wait_for(lambda: not any(alive(pid) for pid in pids.values()), timeout=10, what=f"{pids} ended")
    finally:
        for pid in pids.values():   # a test that failed: end what the run left (SIGCONT: frozen)
            if alive(pid):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
