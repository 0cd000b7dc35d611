"""`swarm run` end to end: real coordinator and peer processes on loopback.

Each test runs `swarm run` as a subprocess in its own folder and ends it by its
handle; the children it started are checked (by the pids it records) to be gone.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from swarmtest import ROOT, alive, children_of, freeze, reaped, wait_for

from swarm.errors import ConfigError, SwarmError
from swarm.experiment import forkserver, load_spec
from swarm.experiment.checkpoint import load_policy
from swarm.experiment.launch import run_experiment

# Small and fast: 2 peers, learning from step 100, one gossip round every 10 steps.
TINY = ["peers=2", "budget.env_steps=600", "dqn.learning_starts=100", "dqn.batch_size=32",
        "eval.every=300", "eval.episodes=1", "buffer.capacity=2000"]
LONG = ["peers=2", "budget.env_steps=200000", "dqn.learning_starts=100", "eval.every=0"]


def swarm_run(cwd: Path, sets: list[str]) -> subprocess.Popen:
    args = [sys.executable, "-m", "swarm.cli", "run"]
    for s in sets:
        args += ["--set", s]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    return subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(p: subprocess.Popen, timeout: float) -> str:
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGINT)    # let it end its children
        try:
            out, _ = p.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        pytest.fail(f"swarm run did not finish within {timeout} s:\n{out}")
    return out


def run_dir_of(cwd: Path) -> Path:
    dirs = list((cwd / "runs").glob("cartpole-ring-*"))
    assert len(dirs) == 1, dirs
    return dirs[0]


def recorded_pids(run_dir: Path) -> dict[str, int]:
    return json.loads((run_dir / "pids.json").read_text())["children"]


def training(cwd: Path, peers: int) -> Path | None:
    """The run folder once every peer has finished an episode, else None."""
    dirs = list((cwd / "runs").glob("cartpole-ring-*"))
    if not dirs:
        return None
    d = dirs[0]
    for r in range(peers):
        rows = (d / f"peer{r}" / "metrics.csv")
        if not rows.exists() or len(rows.read_text().splitlines()) < 2:
            return None
    return d


def test_a_run_folder_that_cannot_be_made_is_a_clean_error(tmp_path):
    """runs/ that is a file: a SwarmError (`swarm: error: ...`, exit 2) before anything starts."""
    (tmp_path / "runs").write_text("")
    with pytest.raises(SwarmError, match="cannot create the run folder .*runs/cartpole-ring-.*: Not a directory"):
        run_experiment(None, ["gossip.codec=identity"], runs_root=tmp_path / "runs")


def test_resume_needs_a_run_folder(tmp_path):
    with pytest.raises(ConfigError, match="no such folder"):
        run_experiment(None, [], runs_root=tmp_path / "runs", resume=tmp_path / "nothing")
    with pytest.raises(ConfigError, match="has no config.json; is it a run folder"):
        run_experiment(None, [], runs_root=tmp_path / "runs", resume=tmp_path)
    assert not (tmp_path / "runs").exists()


def run_together(*argvs: list[str], timeout: float, **kw) -> list[subprocess.CompletedProcess]:
    """Run the commands at the same time, each to its end (output captured as text); any
    still running after ``timeout`` s, or when this fails, is killed by its handle."""
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
             for argv in argvs]
    deadline = time.monotonic() + timeout
    try:
        outs = [p.communicate(timeout=max(0.1, deadline - time.monotonic())) for p in procs]
        return [subprocess.CompletedProcess(p.args, p.returncode, *o) for p, o in zip(procs, outs)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[Path, int, str]:
    """One `swarm run` of TINY for the tests that read different outputs of it: the folder
    it ran in, its exit code and its output. A test that changes the run folder changes a
    copy of it."""
    cwd = tmp_path_factory.mktemp("tiny-run")
    p = swarm_run(cwd, TINY)
    out = finish(p, 75)
    return cwd, p.returncode, out


def test_tiny_run_writes_the_run_folder(tiny_run):
    tmp_path, returncode, out = tiny_run
    assert returncode == 0, out
    d = run_dir_of(tmp_path)

    spec = load_spec(d / "config.json")
    assert spec.peers == 2 and spec.budget.env_steps == 600
    for name, pid in recorded_pids(d).items():
        assert not alive(pid), f"{name} (pid {pid}) outlived swarm run"

    for r in range(2):
        pd = d / f"peer{r}"
        rows = list(csv.DictReader(open(pd / "metrics.csv")))
        assert rows, f"peer{r} logged no episode"
        for row in rows:
            for k in ("env_steps", "episode_return", "mean_return", "epsilon", "bytes_out"):
                assert math.isfinite(float(row[k])), (k, row)
        losses = [float(row["loss"]) for row in rows if row["loss"]]
        assert losses and all(math.isfinite(v) for v in losses)
        assert int(rows[-1]["env_steps"]) <= 600
        # gossip happened, with the other peer
        rounds = list(csv.DictReader(open(pd / "rounds.csv")))
        assert len(rounds) == 600 // spec.gossip.interval
        assert any(int(x["participants"]) == 1 for x in rounds)
        # a round with a neighbour sends something (the peer that finishes last is alone at the end)
        assert all(int(x["bytes_out"]) > 0 for x in rounds if int(x["participants"]) + int(x["missing"]))
        assert sum(int(x["bytes_in"]) for x in rounds) > 0
        summary = json.loads((pd / "summary.json").read_text())
        assert summary["env_steps"] == 600 and summary["reason"] == "budget"
        assert summary["gossip_bytes_out"] > 0

        import torch
        ck = torch.load(pd / "checkpoint.pt", weights_only=False)
        assert ck["rank"] == r and ck["env_steps"] == 600
        assert torch.isfinite(ck["params"]).all() and ck["params"].numel() > 1000
        assert {"q", "target", "optimizer"} <= set(ck["agent"])
        if importlib.util.find_spec("tensorboard"):   # the plots extra: without it, no event files
            assert list((pd / "tb").glob("events.out.tfevents.*")), "no TensorBoard event file"
        # best.pt holds the parameters of the highest greedy evaluation, and says which
        evals = [(float(e["eval_return"]), int(e["env_steps"])) for e in csv.DictReader(open(pd / "evals.csv"))]
        assert [s for _, s in evals] == [300, 600]
        top = max(v for v, _ in evals)
        first_top = min(s for v, s in evals if v == top)
        assert (summary["best_eval_return"], summary["best_eval_at"]) == (top, first_top), summary
        best = torch.load(pd / "best.pt", weights_only=False)
        assert (best["eval_return"], best["env_steps"], best["rank"]) == (top, first_top, r)
        assert torch.isfinite(best["params"]).all() and best["params"].shape == ck["params"].shape
        if first_top == 300:   # 300 more steps of training changed the parameters since
            assert not torch.equal(best["params"], ck["params"])
        agent, loaded_spec, meta = load_policy(pd / "best.pt")
        assert loaded_spec == spec and meta["eval_return"] == top
        assert np.array_equal(agent.parameters(), best["params"].numpy())

    for png in ("returns.png", "bytes_per_round.png", "consensus.png"):
        f = d / "plots" / png
        assert f.stat().st_size > 5000 and f.read_bytes()[:4] == b"\x89PNG"
    assert "peer0" in out and "peer1" in out and f"plots: {d.relative_to(tmp_path) / 'plots'}" in out
    assert "best eval" in out and f"swarm eval {d.relative_to(tmp_path)}" in out
    # the last progress line is drawn from the peers' final summaries, not a stale heartbeat
    last = [line for line in out.splitlines() if line.startswith("[")][-1]
    assert "100%  steps 1200/1200" in last and "peers 0/2" in last, last

    # `swarm eval` plays each peer's best.pt again, on fresh episodes; and refuses a file that is
    # not a checkpoint (the two at once: each is mostly the start-up of Python and torch)
    ev, bad = run_together([sys.executable, "-m", "swarm.cli", "eval", str(d), "--episodes", "2"],
                           [sys.executable, "-m", "swarm.cli", "eval", str(d / "config.json")], cwd=tmp_path,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert ev.returncode == 0, ev.stderr
    rows = [line.split() for line in ev.stdout.splitlines()[1:]]
    assert [Path(r[0]).parent.name for r in rows] == ["peer0", "peer1"]
    assert all(1 <= float(r[3]) <= 500 for r in rows), ev.stdout
    assert bad.returncode == 2 and "not a checkpoint" in bad.stderr, bad.stderr


@pytest.mark.parametrize("per_turn,ride", [(1, True), (2, False)])
def test_gradient_exchange_relays_every_gradient(tmp_path, per_turn, ride):
    """gossip.exchange = gradients: each peer applies its own gradients and the others',
    all in one order, so that their copies stay the same (with parameter averaging off).
    With dqn.updates_per_train = 2 each turn is two updates, and the others wait for
    both. Replay goes with the gradient messages (buffer.ride) or in the rounds."""
    # a long turn timeout: a turn that gave up waiting would apply a gradient out of order.
    # A round every 7 steps: the last at step 595, and turns after it (597, 600)
    p = swarm_run(tmp_path, TINY + ["peers=3", "gossip.exchange=gradients", "gossip.sync=async", "dqn.train_every=3",
                                    "gossip.average=false", "gossip.round_timeout_s=30", "gossip.interval=7",
                                    f"dqn.updates_per_train={per_turn}", f"buffer.ride={str(ride).lower()}"])
    out = finish(p, 90)
    assert p.returncode == 0, out
    d = run_dir_of(tmp_path)
    summaries = [json.loads((d / f"peer{r}" / "summary.json").read_text()) for r in range(3)]
    published = [s["relay"]["published"] for s in summaries]
    # 500 learning steps, a turn every 3 steps
    assert all(160 * per_turn <= n <= 167 * per_turn for n in published), published
    import torch
    complete = 0
    finals = []
    for r, s in enumerate(summaries):
        relay = s["relay"]
        # no turn waited out its timeout: one that did applied a gradient out of order
        # (a gradient lost at the start did that, before relay.ready)
        assert relay["rejected"] == 0 and relay["overflow"] == 0 and relay["wait_timeouts"] == 0, relay
        others = sum(published) - published[r]
        # A peer that reaches its budget first misses what the others publish after it;
        # the last one to finish gets all but the few that were still queued when its
        # neighbours closed their sockets (linger 0). Exact delivery is tested on the
        # in-memory hub (tests/gossip/test_relay.py).
        assert others // 2 <= relay["received"] <= others, (r, relay, published)
        complete += relay["received"] >= others - 25
        ck = torch.load(d / f"peer{r}" / "checkpoint.pt", weights_only=False)
        # every update it took was its own or one it received (what arrives after its last
        # step is received but not applied) ...
        if not relay["resynced"]:
            assert ck["agent"]["updates"] == published[r] + relay["applied"], relay
        else:
            # ... unless it took a neighbour's copy, with that copy's count. Seen once, in a
            # full suite beside a CPU burner: every peer had sent its last turn again at a
            # view that a member left (relay.resent = 1 each, 0 in a quiet run), so the
            # others' turns went on without peer1's, which then came late, and peer1 took
            # peer2's copy. The digests below still find the copies the same.
            assert relay["resyncs"] == len(relay["resynced"]) and relay["resent"] > 0, relay
            assert "out of step" in (d / "logs" / f"peer{r}.log").read_text()
        finals.append(ck["agent"]["updates"])
        assert relay["applied"] <= relay["received"]
        # without averaging the relay is all the gossip traffic: the summary counts its turns to
        # the end (it had the relay's total as of the last round, and missed the turns after it)
        assert s["gossip_bytes_out"] == relay["bytes_out"] > 0 and s["gossip_bytes_in"] == relay["bytes_in"]
        # what the process sent counts the relay's own sockets too (headers and riders included)
        assert s["bytes_out"] >= relay["direct_bytes_out"] > relay["bytes_out"] // 2
        assert s["bytes_out"] >= s["gossip_bytes_out"] + relay["rider_bytes_out"]
        # the training thread sent and took the gradients itself (GradientRelay direct)
        assert relay["direct_out"] > 0 and relay["direct_in"] > 0, relay
        with open(d / f"peer{r}" / "rounds.csv") as f:
            rounds = list(csv.DictReader(f))
        assert len(rounds) == s["rounds"] > 0 and s["rounds_ok"] == 0
        assert all(row["disagreement"] == "" for row in rounds)
        assert sum(int(row["shared_items"]) for row in rounds) > 0
        replay = s["replay_sharing"]
        assert replay["stored"] > 0 and replay["dropped_messages"] == 0, replay
        # riding: one rider a turn from each of the two neighbours, and no pushes of its own
        assert (relay["riders_in"] > 0 and relay["rider_bytes_out"] > 0) == ride, relay
    assert complete >= 1, [s["relay"] for s in summaries]
    # The same parameters after the same number of updates, on every peer (up to the
    # end, where a peer that stopped first may have taken its last gradient with it).
    digests = [s["relay"]["digests"] for s in summaries]
    common = [u for u in digests[0] if all(u in g for g in digests) and int(u) <= min(finals) - 10]
    assert len(common) >= 3, (finals, [sorted(g) for g in digests])
    for u in common:
        assert len({g[u] for g in digests}) == 1, (u, [g[u] for g in digests])
    assert "parameters differ" not in out
    for log in (d / "logs").glob("peer*.log"):   # the heartbeat figures, the relay's among them
        assert "stats callback failed" not in log.read_text(), log


def test_copies_that_differ_are_reported():
    # a peer out of step with the relay's turns has its gradients applied late, and the
    # copies then differ for good without averaging: summary.json showed it, nothing said it
    from swarm.experiment.launch import _first_divergence

    def rows(*per_peer: dict[str, str]) -> list[dict]:
        return [{"relay": {"digests": d}} for d in per_peer]

    same = {"100": "a", "200": "b", "300": "c", "400": "d"}
    assert _first_divergence(rows(same, dict(same), dict(same))) is None
    assert _first_divergence(rows(same, {**same, "200": "x", "300": "y"}, dict(same))) == 200
    # the last two counts they share may differ at the end (a peer took its last gradients with it)
    assert _first_divergence(rows(same, {**same, "300": "y", "400": "z"})) is None
    assert _first_divergence(rows(same, {"100": "a", "200": "b"})) is None      # nothing before the end
    assert _first_divergence(rows(same, {})) is None and _first_divergence([{"reason": "crashed"}, {}]) is None


def test_only_the_solver_rank_ends_a_run_when_solved(tmp_path):
    """eval.solver = 1: every evaluation counts as solved here (solve_return 0), but only
    peer 1's ends the run; peer 0 evaluates too and is ended by the launcher."""
    p = swarm_run(tmp_path, TINY + ["budget.stop_when_solved=true", "eval.solve_return=0", "eval.solver=1",
                                    "budget.env_steps=3000"])
    out = finish(p, 90)
    assert p.returncode == 0, out
    d = run_dir_of(tmp_path)
    peer0, peer1 = [json.loads((d / f"peer{r}" / "summary.json").read_text()) for r in range(2)]
    assert peer1["reason"] == "solved" and peer1["solved_at"] == 300, peer1
    assert peer0["reason"] != "solved" and "solved_at" not in peer0, peer0
    with open(d / "peer0" / "evals.csv") as f:
        assert [float(r["eval_return"]) > 0 for r in csv.DictReader(f)][:1] == [True]   # it did evaluate


def test_ctrl_c_leaves_no_child(tmp_path):
    with reaped(swarm_run(tmp_path, LONG)) as p:
        d = wait_for(lambda: training(tmp_path, 2), timeout=45, what="both peers training")
        pids = recorded_pids(d)
        if forkserver.enabled():
            assert set(pids) == {"coordinator", "peer0", "peer1", "forkserver"}
            # the launcher's children, and the fork server's (the peers), are exactly those it lists
            assert sorted(children_of(p.pid)) == sorted([pids["coordinator"], pids["forkserver"]])
            assert sorted(children_of(pids["forkserver"])) == sorted([pids["peer0"], pids["peer1"]])
        else:   # no pidfds here: every peer is a fresh interpreter, the launcher's child
            assert set(pids) == {"coordinator", "peer0", "peer1"}
            assert sorted(children_of(p.pid)) == sorted(pids.values())
        p.send_signal(signal.SIGINT)
        out = finish(p, 40)
    assert p.returncode == 130, out
    assert "interrupted" in out
    for name, pid in pids.items():
        assert not alive(pid), f"{name} (pid {pid}) outlived Ctrl-C"
    # the peers ended cleanly: they wrote their results on the way out
    for r in range(2):
        summary = json.loads((d / f"peer{r}" / "summary.json").read_text())
        assert summary["reason"] == "stopped" and 0 < summary["env_steps"] < 200000
        assert (d / f"peer{r}" / "checkpoint.pt").exists()


def test_child_crash_is_reported(tmp_path):
    # One peer is enough to crash; the launcher must still end the coordinator.
    with reaped(swarm_run(tmp_path, ["peers=1"] + LONG[1:])) as p:
        d = wait_for(lambda: training(tmp_path, 1), timeout=45, what="the peer training")
        pids = recorded_pids(d)
        os.kill(pids["peer0"], signal.SIGKILL)   # as the OOM killer would
        out = finish(p, 40)
    assert p.returncode == 1, out
    assert f"peer0 (pid {pids['peer0']}) exited with signal 9" in out
    assert "last lines of" in out
    for name, pid in pids.items():
        assert not alive(pid), f"{name} (pid {pid}) outlived the crash"


class _Exited:
    """A stand-in for a Popen whose process has exited (killed, unless told otherwise)."""

    pid = 0

    def __init__(self, returncode: int = -9) -> None:
        self.returncode = returncode

    def poll(self):
        return self.returncode


def test_no_peer_restart_once_the_runs_time_is_up(tmp_path):
    """budget.max_seconds limits the whole run: past it a crashed peer stays down."""
    import io

    from swarm.experiment.launch import Launch, _Child, _restart_crashed

    spec = load_spec(None, ["peers=2", "restart_dead=true", "budget.max_seconds=5"])
    launch = Launch(tmp_path, deadline=time.monotonic() - 1.0)
    coord = _Child("coordinator", _Exited(), tmp_path / "c.log", ended_by_us=True)
    peers = [_Child(f"peer{r}", _Exited(), tmp_path / f"p{r}.log") for r in range(2)]
    pending = {1: time.monotonic()}          # one crash already waiting for its restart
    out = io.StringIO()
    assert _restart_crashed(launch, spec, coord, peers, "tcp://127.0.0.1:9", pending, out) is coord
    assert pending == {} and launch.restarts == {} and launch.children == []


@pytest.mark.parametrize("own_checkpoint", [False, True])
def test_a_resumed_runs_peer_restarts_from_the_newest_checkpoint(tmp_path, monkeypatch, own_checkpoint):
    """In a run resumed from an old one, a peer that crashed before its first checkpoint
    in the new folder restarts from the old run's checkpoint, not from step 0."""
    import io

    from swarm.experiment import launch as launch_mod
    from swarm.experiment.launch import Launch, _Child, _restart_crashed

    old, new = tmp_path / "old", tmp_path / "new"
    (old / "peer1" / "ckpt" / "full-000002").mkdir(parents=True)
    (old / "peer1" / "ckpt" / "full-000002" / "manifest.json").write_text("{}")
    if own_checkpoint:
        (new / "peer1" / "ckpt" / "full-000003").mkdir(parents=True)
        (new / "peer1" / "ckpt" / "full-000003" / "manifest.json").write_text("{}")
    spec = load_spec(None, ["peers=2", "restart_dead=true"])
    launch = Launch(new, resumed=old)
    started = []
    monkeypatch.setattr(launch_mod, "_status", lambda addr: {"members": [{"id": "peer1", "state": "dead"}]})
    monkeypatch.setattr(Launch, "start", lambda self, name, args, env=None, fork=False: started.append((name, args)) or "new")
    coord = _Child("coordinator", _Exited(), tmp_path / "c.log", ended_by_us=True)
    peers = [_Child("peer0", _Exited(), tmp_path / "p0.log", ended_by_us=True),   # only peer1 crashed
             _Child("peer1", _Exited(), tmp_path / "p1.log")]
    _restart_crashed(launch, spec, coord, peers, "tcp://127.0.0.1:9", {1: time.monotonic()}, io.StringIO())
    [(name, args)] = started
    assert name == "peer1" and args[args.index("--replace") + 1] == "peer1", args
    assert args[args.index("--resume-from") + 1] == str(new if own_checkpoint else old), args


def test_a_peer_that_keeps_crashing_is_left_down_and_the_run_fails(tmp_path, monkeypatch):
    """restart_dead: a peer that crashes again after MAX_RESTARTS restarts is not restarted;
    the launcher says so once, with its log's last lines, and the run's exit code is 1."""
    import io

    from swarm.experiment.launch import MAX_RESTARTS, Launch, _Child, _Interrupt, _Progress, _supervise

    spec = load_spec(None, ["peers=2", "restart_dead=true"])
    launch = Launch(tmp_path, restarts={"peer1": MAX_RESTARTS}, in_a_row={"peer1": MAX_RESTARTS})
    monkeypatch.setattr(Launch, "start", lambda *a, **k: pytest.fail("a peer was restarted"))
    (tmp_path / "p1.log").write_text("Traceback (most recent call last):\nRuntimeError: out of luck\n")
    coord = _Child("coordinator", _Exited(), tmp_path / "c.log", ended_by_us=True)
    peers = [_Child("peer0", _Exited(0), tmp_path / "p0.log"),      # spent its budget
             _Child("peer1", _Exited(), tmp_path / "p1.log")]
    out = io.StringIO()
    code = _supervise(launch, spec, coord, peers, "tcp://127.0.0.1:9", _Progress(spec, io.StringIO()),
                      _Interrupt(), out)
    assert code == 1, out.getvalue()
    said = out.getvalue()
    assert said.count(f"peer1 (pid 0) exited with signal 9 after {MAX_RESTARTS} restarts (the limit); "
                      "not restarting it again") == 1, said
    assert "RuntimeError: out of luck" in said and "peer0" not in said
    assert launch.given_up == {"peer1": f"crashed; not restarted after {MAX_RESTARTS} restarts"}
    assert launch.restarts == {"peer1": MAX_RESTARTS}


def test_a_peer_whose_start_fails_for_good_is_not_restarted(tmp_path, monkeypatch):
    """Exit code 2 is every `swarm: error:`: a refused takeover is worth a restart, a resume
    from checkpoints that cannot be read is not (each start would fail the same way)."""
    import io

    from swarm.experiment import launch as launch_mod
    from swarm.experiment.launch import Launch, _Child, _restart_crashed

    spec = load_spec(None, ["peers=2", "restart_dead=true"])
    launch = Launch(tmp_path / "new", resumed=tmp_path / "old")
    started = []
    monkeypatch.setattr(launch_mod, "_status", lambda addr: {"members": [{"id": "peer0", "state": "dead"}]})
    monkeypatch.setattr(Launch, "start", lambda self, name, args, env=None, fork=False: started.append(name) or "new")
    (tmp_path / "p0.log").write_text("swarm: error: peer0: no such member to take over\n")
    (tmp_path / "p1.log").write_text("swarm: error: resume: no checkpoint of peer1 in old/peer1 can be read: "
                                     "old/peer1/checkpoint.pt cannot be read (damaged?)\n")
    coord = _Child("coordinator", _Exited(), tmp_path / "c.log", ended_by_us=True)
    peers = [_Child(f"peer{r}", _Exited(2), tmp_path / f"p{r}.log") for r in range(2)]
    out = io.StringIO()
    pending: dict[int, float] = {}
    _restart_crashed(launch, spec, coord, peers, "tcp://127.0.0.1:9", pending, out)
    assert started == ["peer0"] and pending == {}
    assert launch.given_up == {"peer1": "error; not restarted"} and launch.restarts == {"peer0": 1}
    said = out.getvalue()
    assert ("peer1 (pid 0) exited with code 2 on an error that a restart would meet again; "
            "not restarting it") in said, said
    assert "resume: no checkpoint of peer1" in said


def test_a_peer_that_cannot_resume_is_left_down_at_once(tmp_path):
    """`swarm run --resume` with restart_dead from a run whose checkpoints do not load: each
    peer fails at its start and is not started again; the run ends with exit code 1 and the
    summary says why each peer ended."""
    from swarm.experiment.spec import save_resolved

    old = tmp_path / "old"
    save_resolved(load_spec(None, TINY), old)
    for r in range(2):
        (old / f"peer{r}").mkdir()
        (old / f"peer{r}" / "checkpoint.pt").write_bytes(b"torn")
    args = [sys.executable, "-m", "swarm.cli", "run", "--resume", str(old), "--set", "restart_dead=true"]
    with reaped(subprocess.Popen(args, cwd=tmp_path, env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT)),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)) as p:
        out = finish(p, 60)
    assert p.returncode == 1, out
    d = run_dir_of(tmp_path)
    for r in range(2):
        assert any(line.startswith(f"swarm run: peer{r} (pid ") and "exited with code 2 on an error that a "
                   "restart would meet again" in line for line in out.splitlines()), out
        assert f"swarm: error: resume: no checkpoint of peer{r} in" in out
    assert "restarting it once" not in out
    assert json.loads((d / "restarts.json").read_text()) == {}
    rows = json.loads((d / "summary.json").read_text())
    assert [(row["reason"], row["restarts"]) for row in rows] == [("error; not restarted", 0)] * 2, rows
    for name, pid in recorded_pids(d).items():
        assert not alive(pid), f"{name} (pid {pid}) outlived swarm run"


def test_chaos_refuses_a_duration_that_leaves_no_time_for_faults(tmp_path, capsys):
    """scripts/chaos.py injects no fault in a run's last 25 s (--help says so): a --duration
    that leaves none after --warmup is refused before anything starts."""
    import importlib.util

    found = importlib.util.spec_from_file_location("chaos", ROOT / "scripts" / "chaos.py")
    chaos = importlib.util.module_from_spec(found)
    found.loader.exec_module(chaos)
    root = ["--root", str(tmp_path / "runs")]
    with pytest.raises(SystemExit) as e:
        chaos.parse_args(["--duration", "45"] + root)
    assert e.value.code == 2
    assert "--duration 45 leaves no time for faults" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()   # refused: nothing made
    assert chaos.parse_args(["--duration", "45", "--warmup", "10"] + root).duration == 45
    with pytest.raises(SystemExit):
        chaos.parse_args(["--help"])
    assert "no fault in its last 25 s" in " ".join(capsys.readouterr().out.split())


def _summaries(run_dir: Path, peers: int) -> list[dict]:
    return [json.loads((run_dir / f"peer{r}" / "summary.json").read_text()) for r in range(peers)]


def test_resume_continues_the_counters_and_the_best_evaluation(tiny_run, tmp_path):
    """`swarm run --resume`: the new folder's peers go on from the old run's counters
    (rounds, rounds that averaged, bytes) and keep its best evaluation and best.pt."""
    import torch

    ran_in, returncode, out = tiny_run
    assert returncode == 0, out
    (tmp_path / "old").mkdir()   # run_dir_of(tmp_path) finds the new run only
    first = Path(shutil.copytree(run_dir_of(ran_in), tmp_path / "old" / run_dir_of(ran_in).name))
    before = _summaries(first, 2)
    for r in range(2):   # a best no later evaluation can beat: the resumed run must keep it
        f = first / f"peer{r}" / "best.pt"
        best = torch.load(f, weights_only=False)
        torch.save(dict(best, eval_return=1000.0, env_steps=300), f)

    args = [sys.executable, "-m", "swarm.cli", "run", "--resume", str(first), "--set", "budget.env_steps=900"]
    q = subprocess.Popen(args, cwd=tmp_path, env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT)),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = finish(q, 75)
    assert q.returncode == 0, out
    d = run_dir_of(tmp_path)
    for r, (old, new) in enumerate(zip(before, _summaries(d, 2))):
        # >=: the 300 steps after the resume may all fall in one episode still running at the
        # end (a peer that balances the pole), which counts no new one; a reset count is lower
        assert new["env_steps"] == 900 and new["rounds"] == 90 and new["episodes"] >= old["episodes"], new
        assert new["rounds_ok"] > old["rounds_ok"], (old["rounds_ok"], new["rounds_ok"])
        for k in ("gossip_bytes_out", "gossip_bytes_in", "bytes_out", "bytes_in"):
            assert new[k] > old[k], (k, old[k], new[k])
        assert (new["best_eval_return"], new["best_eval_at"]) == (1000.0, 300), new
        assert torch.load(d / f"peer{r}" / "best.pt", weights_only=False)["eval_return"] == 1000.0
        with open(d / f"peer{r}" / "evals.csv") as f:
            assert [int(e["env_steps"]) for e in csv.DictReader(f)] == [900]
        with open(d / f"peer{r}" / "metrics.csv") as f:
            rows = list(csv.DictReader(f))
        # the byte columns go on from the old run's too, as the episode numbers do
        assert int(rows[0]["episode"]) == old["episodes"] + 1 and int(rows[0]["bytes_out"]) > old["bytes_out"]
    assert "1000.0 @ 300" in out, out


def test_a_restarted_peer_appends_to_its_files_and_keeps_its_best(tmp_path):
    """restart_dead: a peer killed with SIGKILL before its first checkpoint is reported,
    started again from step 0 with --replace, and continues its own CSV files without
    the dead process's rows (it trains those steps again); its best evaluation is the
    best of both processes."""
    import torch

    # evaluations every 200 steps, not 300: peer1 is killed sooner after its first, and its
    # new process logs three of them (200, 400, 600) in 600 steps, not 900
    sets = TINY + ["restart_dead=true", "budget.env_steps=600", "eval.every=200", "checkpoint.full_every_s=0"]
    with reaped(swarm_run(tmp_path, sets)) as p:
        def evaluated() -> tuple[Path, int, list[dict]] | None:
            """peer1 stopped (SIGSTOP) once its evaluations so far are in evals.csv and best.pt."""
            d = training(tmp_path, 2)
            if d is None or len((d / "peer1" / "evals.csv").read_text().splitlines()) < 2:
                return None
            pid = recorded_pids(d)["peer1"]
            freeze(pid)
            with open(d / "peer1" / "evals.csv") as f:
                rows = list(csv.DictReader(f))
            try:   # written just after the row: it may be missing or half written
                best = torch.load(d / "peer1" / "best.pt", weights_only=False)["eval_return"]
            except Exception:
                best = None
            if best == max(float(e["eval_return"]) for e in rows):
                return d, pid, rows
            os.kill(pid, signal.SIGCONT)
            return None

        d, pid, dead_evals = wait_for(evaluated, timeout=60, what="peer1's first evaluation")
        os.kill(pid, signal.SIGKILL)
        out = finish(p, 90)
    assert p.returncode == 0, out
    assert f"peer1 (pid {pid}) exited with signal {signal.SIGKILL}; restarting it" in out, out
    assert json.loads((d / "restarts.json").read_text()) == {"peer1": 1}
    for name, pid in recorded_pids(d).items():
        assert not alive(pid), f"{name} (pid {pid}) outlived swarm run"
    s = _summaries(d, 2)[1]
    assert s["reason"] == "budget" and s["env_steps"] == 600, s
    assert json.loads((d / "summary.json").read_text())[1]["restarts"] == 1
    with open(d / "peer1" / "evals.csv") as f:
        evals = list(csv.DictReader(f))
    # each env step once: the dead process's rows went, the new one logged from step 0
    assert [int(e["env_steps"]) for e in evals] == [200, 400, 600], evals
    with open(d / "peer1" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["episode"]) for r in rows] == list(range(1, s["episodes"] + 1)), rows
    # the first of the best in time: a later evaluation replaces it only by doing better
    top = max(float(e["eval_return"]) for e in dead_evals + evals)
    at = next(int(e["env_steps"]) for e in dead_evals + evals if float(e["eval_return"]) == top)
    assert (s["best_eval_return"], s["best_eval_at"]) == (top, at), (s, evals)
    assert torch.load(d / "peer1" / "best.pt", weights_only=False)["eval_return"] == top
    assert (d / "logs" / "peer1.log").read_text().count("swarm peer peer1:") == 2


def test_peers_stop_at_the_runs_deadline(tmp_path):
    """budget.max_seconds limits the whole run: each peer stops at the run's deadline,
    which its start-up (imports, joining) has already used part of."""
    limit = 6
    p = swarm_run(tmp_path, LONG + [f"budget.max_seconds={limit}"])
    out = finish(p, 60)
    assert p.returncode == 0, out
    for s in _summaries(run_dir_of(tmp_path), 2):
        assert s["reason"] == "time limit" and s["wall_s"] < limit, s


@pytest.mark.parametrize("name", ["cartpole-ring", "123", "1e5", "true"])
def test_the_coordinator_is_given_the_runs_name(name):
    """The status page's title and the `run` label of /metrics name the experiment."""
    from swarm.config import load_config
    from swarm.experiment.launch import _coordinator_args

    args = _coordinator_args(load_spec(None, [f'name="{name}"']), "tcp://127.0.0.1:9")
    assert args[:3] == ["coordinator", "--bind", "tcp://127.0.0.1:9"] and args[3] == "--set"
    assert load_config(None, [args[4]]).coordinator.run_name == name
