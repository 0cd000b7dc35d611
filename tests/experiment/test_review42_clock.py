"""`swarm run` and its peers under OS limits and clock steps (review 42).

A peer that runs out of file descriptors while it waits for the others to join goes on
waiting (the status check it makes meanwhile counts as no answer). The run's time
(``budget.max_seconds``) is elapsed time: a step of the wall clock (NTP, a VM resumed)
neither ends it early nor lengthens it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from swarmtest import ROOT, reap_run, wait_for
# the helpers of the other `swarm run` tests (tests/ is on the path; experiment/ is a namespace package)
from experiment.test_run import LONG, recorded_pids, training

from swarm.errors import ConfigError
from swarm.experiment import load_spec
from swarm.experiment.runner import SPEC_POLL_S, run_peer

resource = pytest.importorskip("resource")

#: what a peer logs the first time its status check finds no file descriptor left
OUT_OF_FDS = "out of file descriptors"


def test_a_peer_out_of_fds_while_it_waits_for_the_others_waits_on(procs, tmp_path):
    """The join wait's status check built a fresh event loop (and zmq context) each time;
    with the fds spent by links to the members that joined meanwhile (a ring of 40
    under ``ulimit -n 64``), that raised EMFILE out of the peer, and `swarm run` then
    ended every peer. Now the check counts as no answer, logged once, and it waits on."""
    if not hasattr(resource, "prlimit"):
        pytest.skip("no prlimit to lower a running process's fd limit")
    from swarm.peer import SyncPeer

    spec = tmp_path / "spec.toml"
    spec.write_text('name = "tight"\npeers = 30\n[budget]\nenv_steps = 300\n[gossip]\ntopology = "full"\n'
                    "[eval]\nevery = 0\n")
    coord = procs.coordinator(None)
    peer = procs.start("-v", "peer", "--spec", str(spec), "--rank", "0", "--coordinator", coord.addr,
                       "--run-dir", str(tmp_path / "run"), name="peer0")
    members: list = []
    try:
        # admitted, and its status client made (it logs this line next): under the limit
        # below, a fresh event loop or zmq context cannot be made
        wait_for(lambda: "joined; waiting for" in procs.log(peer), 60, what="peer0 admitted and waiting")
        # a few fds more than it holds now: the links to the members below take them all
        open_now = len(os.listdir(f"/proc/{peer.pid}/fd"))
        resource.prlimit(peer.pid, resource.RLIMIT_NOFILE,
                         (open_now + 8, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        for i in range(4):
            members.append(SyncPeer(coordinators=[coord.addr], id=f"m{i}", topology="ring",
                                    join_timeout_s=20).start())
        wait_for(lambda: peer.poll() is not None or OUT_OF_FDS in procs.log(peer), 60,
                 what="peer0's status check out of fds")
        assert peer.poll() is None, procs.log(peer)
        time.sleep(2 * SPEC_POLL_S)   # two checks more, each out of fds too
        assert peer.poll() is None, procs.log(peer)
        assert procs.log(peer).count(OUT_OF_FDS) == 1, procs.log(peer)
    finally:
        for m in members:
            m.close()
    peer.send_signal(signal.SIGTERM)
    assert peer.wait(30) == 0, procs.log(peer)
    assert "stopped while waiting for the others to join" in procs.log(peer), procs.log(peer)


# ---------------------------------------------------------------- the run's time on a stepped wall clock

_STEPPED = """
import os, time
_file = os.environ.get("SWARM_TEST_WALL_STEP")
if _file:
    _time, _time_ns, _mono = time.time, time.time_ns, time.monotonic
    _seen = [-1.0, 0.0]   # (when read, seconds)

    def _step():
        if _mono() - _seen[0] > 0.02:
            _seen[0] = _mono()
            try:
                with open(_file) as f:
                    _seen[1] = float(f.read() or 0)
            except (OSError, ValueError):
                pass
        return _seen[1]

    time.time = lambda: _time() + _step()
    time.time_ns = lambda: _time_ns() + int(_step() * 1e9)
"""


class SteppedWallClock:
    """A wall clock that the test steps, as NTP or a resumed VM does, in the processes it
    starts with :attr:`env`: their ``sitecustomize`` adds the seconds :meth:`step` last
    wrote to ``time.time()`` and ``time.time_ns()``; the monotonic clock, which no step
    moves, is left as it is."""

    def __init__(self, tmp: Path) -> None:
        site = tmp / "stepped-clock"
        site.mkdir()
        (site / "sitecustomize.py").write_text(_STEPPED)
        self.file = tmp / "wall-step"
        self.file.write_text("0")
        self.env = {"PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "SWARM_TEST_WALL_STEP": str(self.file)}

    def step(self, seconds: float) -> None:
        """Step the wall clock of those processes to ``seconds`` off the real one; each
        sees it at its next read of the clock 20 ms on."""
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(repr(seconds))
        tmp.replace(self.file)
        time.sleep(0.1)


def test_a_wall_clock_step_forward_leaves_the_run_its_time(tmp_path):
    """budget.max_seconds was measured on the wall clock: a step of an hour 1 s into a run
    of 120 s made the launcher refuse to restart a crashed peer ("the run's time is up"),
    and a restarted peer would have stopped at once. The run's time is elapsed time now:
    the peer is restarted, and trains on."""
    clock = SteppedWallClock(tmp_path)
    args = [sys.executable, "-m", "swarm.cli", "run", "-v"]
    for s in LONG + ["restart_dead=true", "budget.max_seconds=120"]:
        args += ["--set", s]
    said = tmp_path / "swarm-run.out"
    with open(said, "w") as f:
        p = subprocess.Popen(args, cwd=tmp_path, env=dict(os.environ, PYTHONUNBUFFERED="1", **clock.env),
                             stdout=f, stderr=subprocess.STDOUT)
    try:
        d = wait_for(lambda: training(tmp_path, 2), timeout=60, what="both peers training")
        first = recorded_pids(d)["peer1"]
        clock.step(3600)
        os.kill(first, signal.SIGKILL)
        log = d / "logs" / "peer1.log"
        wait_for(lambda: "not restart" in said.read_text() or log.read_text().count("peer1 training: ") == 2,
                 timeout=90, what="peer1 restarted and training, or left down")
        assert "not restart" not in said.read_text(), said.read_text()
        restarted = recorded_pids(d)["peer1"]
        p.send_signal(signal.SIGINT)
        p.wait(60)
    finally:
        reap_run(p, tmp_path)   # what a failed test left of the run's children
    out = said.read_text()
    assert "the run's time is up" not in out, out
    assert f"peer1 (pid {first}) exited with signal 9; restarting it" in out, out
    rows = {r["id"]: r for r in json.loads((d / "summary.json").read_text())}
    assert restarted != first and rows["peer1"]["reason"] == "stopped", rows   # not "time limit"


def test_a_restarted_peer_gets_the_seconds_left_whatever_the_wall_clock_says(procs, tmp_path):
    """`swarm run` gave a restarted peer the run's deadline as a wall-clock time, which the
    peer turned into time left with its own wall clock: a step back of an hour gave it an
    hour more (up to its own max_seconds). It gets the run's end on the host's monotonic
    clock now: passed already, it trains not a step more after its first."""
    clock = SteppedWallClock(tmp_path)
    clock.step(-3600)
    spec = tmp_path / "spec.toml"
    spec.write_text("peers = 1\n[budget]\nenv_steps = 3000\nmax_seconds = 600\n[eval]\nevery = 0\n")
    coord = procs.coordinator(None)
    peer = procs.start("peer", "--spec", str(spec), "--rank", "0", "--coordinator", coord.addr, "--run-dir",
                       str(tmp_path / "run"), name="peer0",
                       env={**clock.env, "SWARM_RUN_ENDS": repr(time.monotonic()),
                            # what the launcher passed before (ignored now): the run's end on its wall
                            # clock, an hour on on the peer's
                            "SWARM_RUN_DEADLINE": repr(time.time())})
    assert peer.wait(120) == 0, procs.log(peer)
    summary = json.loads((tmp_path / "run" / "peer0" / "summary.json").read_text())
    assert summary["reason"] == "time limit" and summary["env_steps"] <= 1, summary


@pytest.mark.parametrize("left", ["soon", "nan"])
def test_a_run_end_that_is_no_number_is_refused_before_anything_is_written(tmp_path, monkeypatch, left):
    monkeypatch.setenv("SWARM_RUN_ENDS", left)
    spec = load_spec(None, ["peers=1", "budget.max_seconds=60"])
    with pytest.raises(ConfigError, match=f"SWARM_RUN_ENDS = '{left}': expected when the run's time ends on this "
                                          "host's monotonic clock, a number"):
        run_peer(spec, 0, "tcp://127.0.0.1:9", tmp_path / "run", join_timeout=1.0)
    assert not (tmp_path / "run").exists()
