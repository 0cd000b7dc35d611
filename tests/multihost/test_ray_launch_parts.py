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
from swarm.errors import ConfigError, SwarmError
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
    _coordinator_ended(run)
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
    assert (code, summaries) == (1, {0: {"rank": 0}})   # the coordinator crashed: the run counts it
    rows = _screen(out.getvalue())
    said = [r for r in rows if "the coordinator exited" in r]
    assert len(said) == 1 and said[0].startswith("swarm launch: the coordinator exited with code -9"), rows
    assert any(r.startswith("[") for r in rows), rows    # the progress line is there too


# Failures: an actor Ray cannot start, IPv6 addresses, a crashed coordinator, a `peers`
# given by hand, a failed peer's row.


class RayError(Exception):
    pass


class RayActorError(RayError):
    pass


class _ClusterRay(_FakeRay):
    """_FakeRay with Ray's error classes and two nodes, n0 and n1 (``ips``), 2 CPUs each,
    whose actors start: ``where`` answers, except for actor ``where_fail`` (Ray cannot place
    it), and ``ray.wait`` hands back one peer's run at a time, a summary or, for the ranks
    in ``run_fail``, a RayActorError (its worker died)."""

    class GetTimeoutError(RayError):
        pass

    DIED = "The actor died unexpectedly before finishing this task.\n\tclass_name: PeerActor\n\tpid: 4242"

    def __init__(self, ips=("127.0.0.1", "127.0.0.1"), where_fail=None, run_fail=()):
        super().__init__()
        self.exceptions = types.SimpleNamespace(RayError=RayError, RayActorError=RayActorError,
                                                GetTimeoutError=self.GetTimeoutError)
        self.ips, self.where_fail, self.run_fail = ips, where_fail, set(run_fail)
        self.started = 0

    def nodes(self) -> list[dict]:
        return [{"NodeID": f"n{i}", "NodeManagerAddress": ip, "Alive": True,
                 "Resources": {"CPU": 2.0, **({"node:__internal_head__": 1.0} if i == 0 else {})}}
                for i, ip in enumerate(self.ips)]

    def remote(self, cls):
        fake = self

        class Actor:
            def __init__(self):
                idx = fake.started
                fake.started += 1
                self.where = types.SimpleNamespace(remote=lambda: ("where", idx))
                self.run = types.SimpleNamespace(remote=lambda *a: fake.runs.append(a) or ("run", a[1]))

        class Options:
            def options(self, **kw):
                return types.SimpleNamespace(remote=Actor)
        return Options()

    def get(self, ref, timeout=None):
        if isinstance(ref, list):
            return [self.get(r, timeout) for r in ref]
        what, i = ref
        if what == "where":
            if i == self.where_fail:
                raise RayActorError(f"The actor {i} died: ActorUnschedulableError: node n{i} is gone\n\tmore")
            return {"node": f"n{i}", "ip": "127.0.0.1", "pid": 1000 + i}
        if i in self.run_fail:
            raise RayActorError(self.DIED)
        return {"rank": i, "id": f"peer{i}", "reason": "budget", "env_steps": 300}

    def wait(self, pending, num_returns, timeout):
        return pending[:1], pending[1:]


def _use(monkeypatch, ray: _FakeRay) -> _FakeRay:
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.util", ray.util)
    monkeypatch.setitem(sys.modules, "ray.util.scheduling_strategies", ray.util.scheduling_strategies)
    return ray


def _coordinator_ended(run: Path) -> None:
    """The launch's coordinator is gone (killed here if not, and the test fails)."""
    coordinator = json.loads((run / "pids.json").read_text())["children"]["coordinator"]
    try:
        assert not Path(f"/proc/{coordinator}").exists(), "the coordinator outlived the launch"
    finally:
        if Path(f"/proc/{coordinator}").exists():
            os.kill(coordinator, signal.SIGKILL)


def test_an_actor_ray_cannot_start_is_an_error_that_names_its_peer_and_node(monkeypatch, tmp_path):
    """A RayActorError from an actor's where() (it could not be placed, its node was lost)
    came out as a raw traceback; now a SwarmError, and the clean-up is as before."""
    ray = _use(monkeypatch, _ClusterRay(where_fail=1))
    with pytest.raises(SwarmError) as e:
        ray_launch.launch_ray(None, [], host="127.0.0.1", runs_root=tmp_path / "runs", stream=io.StringIO())
    assert str(e.value) == ("peer1's actor on Ray node n1 (127.0.0.1) did not start: RayActorError: "
                            "The actor 1 died: ActorUnschedulableError: node n1 is gone")
    (run,) = (tmp_path / "runs").iterdir()
    _coordinator_ended(run)
    assert ray.killed == 2 and not (run / "placement.json").exists()


@pytest.mark.parametrize("host", ["::1", "[::1]", "fe80::1%eth0"])
def test_an_ipv6_host_is_refused_before_anything_is_made(fake_ray, tmp_path, host):
    with pytest.raises(SwarmError) as e:
        ray_launch.launch_ray(None, [], host=host, runs_root=tmp_path / "runs", stream=io.StringIO())
    assert str(e.value) == (f"--host {host!r} is an IPv6 address: swarm connects over IPv4 only; give a "
                            "host name or an IPv4 address")
    assert not (tmp_path / "runs").exists() and fake_ray.runs == []


@pytest.mark.parametrize("ips, driver, named", [
    (("::1", "::1"), "::1", "this node's Ray address '::1'"),
    (("127.0.0.1", "fe80::2"), "127.0.0.1", "Ray node n1's address 'fe80::2'"),
])
def test_ipv6_node_addresses_are_refused_before_anything_is_made(monkeypatch, tmp_path, ips, driver, named):
    """Without --host the coordinator binds the driver's node address and each peer its own
    node's: an IPv6 one failed in a socket.gaierror traceback (the driver's), leaving a run
    folder with only config.json, or went on to peers that cannot bind."""
    ray = _use(monkeypatch, _ClusterRay(ips=ips))
    ray.util.get_node_ip_address = lambda: driver
    with pytest.raises(SwarmError) as e:
        ray_launch.launch_ray(None, [], runs_root=tmp_path / "runs", stream=io.StringIO())
    assert str(e.value).startswith(f"{named} is an IPv6 address: swarm connects over IPv4 only; ")
    assert not (tmp_path / "runs").exists() and ray.runs == []


def test_a_coordinator_crash_makes_the_exit_code_1(tmp_path):
    """The peers go on without it, as before, but the run counts it (swarm run exits 1 too)."""
    coord = _Child("coordinator", subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]),
                   tmp_path / "coordinator.log")
    coord.proc.wait()
    ref = object()
    ray = types.SimpleNamespace(wait=lambda pending, num_returns, timeout: ([ref], []),
                                get=lambda r: {"rank": 0})
    out = io.StringIO()
    code, summaries = ray_launch._supervise(ray, load_spec(None, ["peers=1"]), [], {ref: 0}, coord,
                                            "tcp://127.0.0.1:9", out)
    assert (code, summaries) == (1, {0: {"rank": 0}})
    assert "swarm launch: the coordinator exited with code 3; peers keep training" in out.getvalue()
    given_up: dict = {}
    ray_launch._supervise(ray, load_spec(None, ["peers=1"]), [], {ref: 0}, coord, "tcp://127.0.0.1:9",
                          io.StringIO(), given_up)
    assert given_up == {}   # reported once: it is marked as seen
    coord.ended_by_us = False
    ray_launch._supervise(ray, load_spec(None, ["peers=1"]), [], {ref: 0}, coord, "tcp://127.0.0.1:9",
                          io.StringIO(), given_up)
    assert given_up == {"coordinator": "exited with code 3"}


@pytest.mark.parametrize("where", ["set", "file"])
def test_a_peers_given_by_hand_that_the_cluster_does_not_make_is_refused(fake_ray, tmp_path, where):
    """`--set peers=5` (or peers = 5 in the spec file) was silently replaced by nodes ×
    --per-node."""
    spec = tmp_path / "spec.toml"
    spec.write_text("peers = 5\n" if where == "file" else "seed = 1\n")
    sets = ["peers=5"] if where == "set" else []
    with pytest.raises(ConfigError) as e:
        ray_launch.launch_ray(spec, sets, per_node=2, host="127.0.0.1", runs_root=tmp_path / "runs",
                              stream=io.StringIO())
    said = "--set peers=5" if where == "set" else str(spec)
    assert str(e.value) == (f"peers = 5 ({said}) but the Ray cluster takes 2 peers (1 node(s) × --per-node 2): "
                            "swarm launch --ray sets peers itself; leave it out of the spec and --set, or make "
                            "--per-node agree")
    assert not (tmp_path / "runs").exists() and fake_ray.runs == []


@pytest.mark.parametrize("sets", [[], ["peers=2"]])
def test_a_peers_left_out_or_that_agrees_goes_on(fake_ray, tmp_path, sets):
    out = io.StringIO()
    with pytest.raises(SwarmError, match="did not start"):   # the stand-in's actors never start
        ray_launch.launch_ray(None, sets, per_node=2, host="127.0.0.1", runs_root=tmp_path / "runs", stream=out)
    (run,) = (tmp_path / "runs").iterdir()
    _coordinator_ended(run)
    assert json.loads((run / "config.json").read_text())["peers"] == 2 and len(fake_ray.runs) == 2
    assert "peers = " not in out.getvalue()


def test_a_spec_made_in_code_whose_peers_differs_gets_a_warning(fake_ray, tmp_path):
    """Its peers may be the default or set on purpose (no telling): one line says it changes."""
    out = io.StringIO()
    with pytest.raises(SwarmError, match="did not start"):
        ray_launch.launch_ray(load_spec(None, ["peers=5"]), [], per_node=2, host="127.0.0.1",
                              runs_root=tmp_path / "runs", stream=out)
    (run,) = (tmp_path / "runs").iterdir()
    _coordinator_ended(run)
    said = [line for line in out.getvalue().splitlines() if "peers = " in line]
    assert said == ["swarm launch: warning: the spec's peers = 5 becomes 2 (1 Ray node(s) × --per-node 2)"]


def test_a_failed_peers_row_says_what_ray_reported(monkeypatch, tmp_path):
    """Its row said "no summary (crashed, or a full disk?)", and "the others go on" came
    after the last peer too. 2 nodes × 2: peer1 and peer3 (the last) fail."""
    _use(monkeypatch, _ClusterRay(run_fail={1, 3}))
    out = io.StringIO()
    code = ray_launch.launch_ray(None, ["budget.env_steps=300"], per_node=2, host="127.0.0.1",
                                 runs_root=tmp_path / "runs", stream=out)
    (run,) = (tmp_path / "runs").iterdir()
    _coordinator_ended(run)
    assert code == 1
    died = "failed: RayActorError: The actor died unexpectedly before finishing this task."
    rows = json.loads((run / "summary.json").read_text())
    assert [(r["id"], r["reason"]) for r in rows] == [("peer0", "budget"), ("peer1", died), ("peer2", "budget"),
                                                      ("peer3", died)]
    lines = out.getvalue().splitlines()
    fails = [i for i, line in enumerate(lines) if line.startswith("swarm launch: peer")]
    assert [lines[i].split(":")[1] for i in fails] == [" peer1 failed", " peer3 failed"]
    goes_on = [i for i, line in enumerate(lines) if "the others go on" in line]
    assert len(goes_on) == 1 and fails[0] < goes_on[0] < fails[1], lines   # after peer1's, not peer3's
    assert any(line.startswith("peer3") and line.endswith(died) for line in lines)   # the table


def test_a_failure_is_told_by_the_peers_own_error_not_rays_wrapper():
    """Ray hands a peer's own error back in a RayTaskError whose cause is that error."""
    class RayTaskError(RayError):
        def __init__(self, cause):
            super().__init__("ray::PeerActor.run() (pid=7, ip=10.0.0.2)\n  File ...\nPeerTimeout: ...")
            self.cause = cause

    wrapped = RayTaskError(ConfigError("peer0: 1 of the spec's 2 peers joined within 60 s\nstart the others"))
    assert ray_launch._why(wrapped) == "ConfigError: peer0: 1 of the spec's 2 peers joined within 60 s"
    assert ray_launch._why(RayActorError("x" * 300)) == "RayActorError: " + "x" * 197 + "..."
