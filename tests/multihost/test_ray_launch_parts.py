"""`swarm launch --ray`'s parts that run without Ray: -v from the command line to the
coordinator and the peers, and its messages beside its progress line. A stand-in for
the `ray` module answers the few calls launch_ray makes; the coordinator is a real one."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest

from swarm import cli
from swarm.errors import SwarmError
from swarm.experiment import ray_launch
from swarm.experiment.launch import _Child
from swarm.experiment.spec import load_spec


class _FakeRay(types.ModuleType):
    """The calls launch_ray makes to Ray, on one node (this host, 127.0.0.1), already
    initialised. Its actors record what they are asked to run; ``ray.get`` of where they
    are says they did not start, which ends the launch there."""

    class GetTimeoutError(Exception):
        pass

    def __init__(self) -> None:
        super().__init__("ray")
        self.exceptions = types.SimpleNamespace(GetTimeoutError=self.GetTimeoutError)
        self.util = types.ModuleType("ray.util")
        self.util.get_node_ip_address = lambda: "127.0.0.1"
        strategies = types.ModuleType("ray.util.scheduling_strategies")
        strategies.NodeAffinitySchedulingStrategy = lambda node_id, soft: (node_id, soft)
        self.util.scheduling_strategies = strategies
        self.runs: list[tuple] = []       # the arguments of each actor's run.remote
        self.killed = 0

    def is_initialized(self) -> bool:
        return True

    def nodes(self) -> list[dict]:
        return [{"NodeID": "n0", "NodeManagerAddress": "127.0.0.1", "Alive": True,
                 "Resources": {"CPU": 2.0, "node:__internal_head__": 1.0}}]

    def remote(self, cls):
        runs = self.runs

        class Actor:
            def __init__(self):
                self.run = types.SimpleNamespace(remote=lambda *a: runs.append(a) or object())
                self.where = types.SimpleNamespace(remote=lambda: object())

        class Options:
            def options(self, **kw):
                return types.SimpleNamespace(remote=Actor)
        return Options()

    def get(self, refs, timeout=None):
        raise self.GetTimeoutError()

    def kill(self, actor, no_restart=True):
        self.killed += 1


@pytest.fixture
def fake_ray(monkeypatch) -> _FakeRay:
    ray = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.util", ray.util)
    monkeypatch.setitem(sys.modules, "ray.util.scheduling_strategies", ray.util.scheduling_strategies)
    return ray


def test_launch_v_before_and_after_the_command_reaches_launch_ray(monkeypatch):
    """`swarm launch -v` did not hand its -v on to launch_ray (`swarm run` did)."""
    seen: list[dict] = []
    monkeypatch.setattr(ray_launch, "launch_ray", lambda spec, overrides, address, **kw: seen.append(kw) or 0)
    assert cli.main(["-v", "launch", "--ray", "auto", "s.toml", "-v"]) == 0
    assert seen[0]["verbose"] == 2


def test_launch_ray_gives_v_to_its_coordinator_and_its_peers(fake_ray, tmp_path):
    """launch_ray started its coordinator without -v and gave its peer actors none, so
    `swarm launch --ray -v` logged nothing more than without it."""
    with pytest.raises(SwarmError, match="did not start"):
        ray_launch.launch_ray(None, [], host="127.0.0.1", runs_root=tmp_path / "runs", stream=io.StringIO(),
                              verbose=1)
    (run,) = (tmp_path / "runs").iterdir()
    coordinator = json.loads((run / "pids.json").read_text())["children"]["coordinator"]
    try:
        assert not Path(f"/proc/{coordinator}").exists(), "the coordinator outlived the launch"
    finally:
        if Path(f"/proc/{coordinator}").exists():
            os.kill(coordinator, signal.SIGKILL)
    assert " swarm.coordinator INFO coordinator listening on " in (run / "logs" / "coordinator.log").read_text()
    assert len(fake_ray.runs) == 1 and fake_ray.killed == 1
    spec, rank, addr, run_dir, host, verbose = fake_ray.runs[0]
    assert (rank, run_dir, host, verbose) == (0, str(run), "127.0.0.1", 1)


def test_launch_ray_warns_of_settings_that_do_nothing_as_swarm_run_does(fake_ray, tmp_path):
    out = io.StringIO()
    with pytest.raises(SwarmError, match="did not start"):
        ray_launch.launch_ray(None, ["budget.env_steps=500"], host="127.0.0.1", runs_root=tmp_path / "runs",
                              stream=out)
    (run,) = (tmp_path / "runs").iterdir()
    coordinator = json.loads((run / "pids.json").read_text())["children"]["coordinator"]
    if Path(f"/proc/{coordinator}").exists():
        os.kill(coordinator, signal.SIGKILL)
    said = [line for line in out.getvalue().splitlines() if "warning" in line]
    assert said == ["swarm launch: warning: eval.every = 1000 is above budget.env_steps = 500: no greedy "
                    "evaluation runs, so no peer writes best.pt (swarm eval has nothing to play) and the "
                    "summary's eval columns stay empty"]
    assert (run / "warnings.txt").read_text() == said[0].removeprefix("swarm launch: warning: ") + "\n"


@pytest.mark.parametrize("verbose, lines", [(0, None), (1, ["INFO one"]), (2, ["INFO one", "DEBUG two"])])
def test_a_peer_actor_logs_to_its_log_file_with_v(tmp_path, verbose, lines):
    logger = logging.getLogger("swarm")
    before = list(logger.handlers), logger.level, logger.propagate
    with ray_launch._peer_log(tmp_path, 3, verbose):
        logging.getLogger("swarm.experiment.runner").info("one")
        logging.getLogger("swarm.peer").debug("two")
    assert (list(logger.handlers), logger.level, logger.propagate) == before   # as it was
    log = tmp_path / "logs" / "peer3.log"
    if lines is None:
        assert not log.exists()
    else:
        got = [" ".join(line.split()[3:5]) for line in log.read_text().splitlines()]
        assert got == lines


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _screen(text: str) -> list[str]:
    """The rows a terminal shows after ``text`` (``\\r`` goes back to the row's start)."""
    rows, row, col = [], [], 0
    for ch in text:
        if ch == "\n":
            rows.append("".join(row).rstrip())
            row, col = [], 0
        elif ch == "\r":
            col = 0
        else:
            row[col:col + 1] = [ch]
            col += 1
    return rows + ["".join(row).rstrip()]


def test_a_message_starts_on_a_line_of_its_own_not_after_the_progress_line(tmp_path):
    """On a terminal, `swarm launch --ray`'s message that its coordinator exited came at the
    end of the progress line drawn before it. Here the coordinator (a stand-in process) is
    killed once the line is drawn; then the one peer finishes."""
    coord = _Child("coordinator", subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]),
                   tmp_path / "coordinator.log")
    ref = object()
    waits = []

    def wait(pending, num_returns, timeout):
        waits.append(len(waits))
        if len(waits) == 2:   # the progress line is on the screen: the coordinator dies
            coord.proc.kill()
            coord.proc.wait()
        return ([ref], []) if len(waits) == 3 else ([], pending)

    ray = types.SimpleNamespace(wait=wait, get=lambda r: {"rank": 0})
    out = _Terminal()
    try:
        code, summaries = ray_launch._supervise(ray, load_spec(None, ["peers=1"]), [], {ref: 0}, coord,
                                                "tcp://127.0.0.1:9", out)
    finally:
        if coord.proc.poll() is None:
            coord.proc.kill()
            coord.proc.wait()
    assert (code, summaries) == (0, {0: {"rank": 0}})
    rows = _screen(out.getvalue())
    said = [r for r in rows if "the coordinator exited" in r]
    assert len(said) == 1 and said[0].startswith("swarm launch: the coordinator exited with code -9"), rows
    assert any(r.startswith("[") for r in rows), rows    # the progress line is there too
