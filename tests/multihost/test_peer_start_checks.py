"""What `swarm peer` checks before it joins, and what it leaves alone until it is in
(docs/multihost.md): a second start of a live rank changes nothing in that peer's
folder; a `--replace` takes the dead member's rank, not the launcher's; a launcher's
number of processes below the spec's `peers`, and a `--coordinator` or `--bind`
address that cannot work, stop it at start with one line."""

from __future__ import annotations

import json
import signal

import pytest
from swarmtest import free_port, status, wait_for

from swarm import cli
from swarm.errors import SwarmError
from swarm.experiment import load_spec
from swarm.experiment.runner import run_peer
from swarm.experiment.spec import save_resolved

#: every variable a peer reads its rank, its launcher's size or its coordinator from
LAUNCHER_VARS = ("SWARM_RANK", "SLURM_PROCID", "RANK", "TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "SLURM_NPROCS",
                 "WORLD_SIZE", "SWARM_COORDINATOR", "MASTER_ADDR", "SWARM_COORDINATOR_PORT")


@pytest.fixture
def clean_env(monkeypatch):
    for key in LAUNCHER_VARS:
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def coordinator(procs) -> str:
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs.start("coordinator", "--bind", addr, name="coordinator")
    wait_for(lambda: status(addr, 0.5), 15, what="coordinator")
    return addr


def alive(addr: str) -> dict[str, int]:
    """id -> rank of the live members in the table of the coordinator at ``addr``."""
    return {m["id"]: m["rank"] for m in status(addr, 0.5)["members"] if m["state"] == "alive"}


# ---------------------------------------------------------------- a second start of a live rank

def test_a_second_start_of_a_live_rank_changes_nothing_in_its_folder(procs, tmp_path):
    """The second process was refused by the coordinator, but it had already recorded a
    new run in peer0/run.json and removed resumed.json and summary.json: a later
    `--replace peer0 --resume RUN` then took peer0's checkpoints for another run's and
    trained from step 0. Once admitted, a fresh start still records its run at once."""
    addr = coordinator(procs)
    live = procs.start("peer", "--id", "peer0", "--rank", "0", "--coordinator", addr, name="live")
    wait_for(lambda: alive(addr) == {"peer0": 0}, 20, what="the live peer0")
    run = tmp_path / "run"
    out = run / "peer0"
    out.mkdir(parents=True)
    records = {"run.json": json.dumps({"run": "0123456789abcdef", "continues": []}) + "\n",
               "resumed.json": json.dumps({"checkpoint": "elsewhere", "run": "0123456789abcdef"}) + "\n",
               "summary.json": json.dumps({"reason": "budget", "env_steps": 100}) + "\n"}
    for name, text in records.items():
        (out / name).write_text(text)
    spec = load_spec(None, ["peers=1", "budget.env_steps=60", "dqn.learning_starts=20", "dqn.batch_size=8",
                            "dqn.hidden=[16]", "eval.every=0"])

    with pytest.raises(SwarmError, match="already alive"):
        run_peer(spec, 0, addr, run, tensorboard=False, join_timeout=10)
    assert {p.name: p.read_text() for p in out.iterdir()} == records   # nothing new, nothing gone, no .tmp

    live.send_signal(signal.SIGTERM)   # it leaves: rank 0 and the id are free
    assert live.wait(15) == 0, procs.log(live)
    wait_for(lambda: "peer0" not in alive(addr), 10, what="peer0 gone")
    s = run_peer(spec, 0, addr, run, tensorboard=False, join_timeout=10)
    assert s["reason"] == "budget", s
    assert json.loads((out / "run.json").read_text())["run"] != "0123456789abcdef"
    assert not (out / "resumed.json").exists()
    assert json.loads((out / "summary.json").read_text())["env_steps"] == 60
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


# ---------------------------------------------------------------- --replace and the launcher's rank

@pytest.mark.parametrize("replace", [["--replace", "b"], ["--set", "peer.replace=true", "--set", "peer.id=b"]],
                         ids=["flag", "config"])
def test_replace_takes_the_dead_members_rank_not_the_launchers(procs, tmp_path, replace):
    """`swarm peer --replace b` in an sbatch shell (SLURM_PROCID=0) asked for rank 0 and
    was refused: "rank 0 is held by peer 'a'". Review 45: with peer.replace in the config
    (`--set`, `--config`) it still took the launcher's rank (here refused; a free one
    moved the member to another place in the ring)."""
    addr = coordinator(procs)
    procs.start("peer", "--id", "a", "--rank", "0", "--coordinator", addr, name="a")
    b = procs.start("peer", "--id", "b", "--rank", "1", "--coordinator", addr, name="b")
    wait_for(lambda: alive(addr) == {"a": 0, "b": 1}, 20, what="a and b")
    b.kill()
    b.wait()
    wait_for(lambda: alive(addr) == {"a": 0}, 10, what="b declared dead")
    r = procs.start("peer", *replace, "--coordinator", addr, name="replacement",
                    env={"SLURM_PROCID": "0", "SLURM_NTASKS": "1"})
    wait_for(lambda: r.poll() is not None or alive(addr) == {"a": 0, "b": 1}, 20, what="b back in its place")
    assert r.poll() is None, procs.log(r)
    # the coordinator's table shows b before the replacement printed its first line
    wait_for(lambda: "rank 1" in procs.log(r) or r.poll() is not None, 10, what="the replacement's first line")
    assert "rank 1" in procs.log(r), procs.log(r)


class _Called(Exception):
    """What the fake run_peer raises: how `swarm peer --spec` would have started the peer."""


@pytest.fixture
def spec_peer(clean_env, tmp_path):
    """`swarm peer --spec` in this process, up to the call of run_peer (a fake that raises
    _Called with its rank and peer config): returns a function of (args, env) that gives
    ("started", rank, replace) or ("error", stderr)."""
    import swarm.experiment.runner as runner

    def fake_run_peer(spec, rank, coords, run_dir, **kw):
        raise _Called(rank, kw["peer_config"].replace)

    clean_env.setattr(runner, "run_peer", fake_run_peer)
    clean_env.setattr(runner, "stop_on_signals", lambda: None)   # no handlers left in pytest

    def start(args: list[str], env: dict[str, str], peers: int = 4) -> tuple:
        spec = save_resolved(load_spec(None, [f"peers={peers}"]), tmp_path / f"spec{peers}.json")
        for key, value in env.items():
            clean_env.setenv(key, value)
        try:
            code = cli.main(["peer", "--spec", str(spec), "--coordinator", "tcp://127.0.0.1:9",
                             "--run-dir", str(tmp_path / "run"), *args])
        except _Called as c:
            return ("started", *c.args)
        finally:
            for key in env:
                clean_env.delenv(key)
        return ("error", code)

    return start


def _error(capsys) -> str:
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("swarm: error:")]
    assert len(lines) == 1, lines
    return lines[0]


def test_spec_replace_takes_the_rank_its_id_names_whatever_the_launcher_says(spec_peer):
    # the id names the rank; the launcher's variables (even a bad one) are not read
    assert spec_peer(["--replace", "peer2"], {"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) == ("started", 2, True)
    assert spec_peer(["--replace", "peer3"], {"SLURM_PROCID": "x"}) == ("started", 3, True)
    # review 45: the same with peer.replace in the config; it took the launcher's rank
    config = ["--set", "peer.replace=true", "--set", "peer.id=peer1"]
    assert spec_peer(config, {"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) == ("started", 1, True)


def test_spec_replace_in_the_config_without_an_id_takes_the_rank_given(spec_peer):
    # the id is peer{RANK} under --spec: a restart script sets peer.replace and the rank
    # only (the first fix of the review read the empty id: "peer.replace with peer.id = :")
    assert spec_peer(["--set", "peer.replace=true", "--rank", "2"], {}) == ("started", 2, True)
    assert spec_peer(["--set", "peer.replace=true"], {"SWARM_RANK": "3"}) == ("started", 3, True)


def test_spec_replace_in_the_config_is_named_as_given(spec_peer, capsys):
    assert spec_peer(["--set", "peer.replace=true", "--set", "peer.id=peer9"], {}) == ("error", 2)
    assert "peer.replace with peer.id = peer9: the spec has peers = 4, so ranks are 0..3" in _error(capsys)
    assert spec_peer(["--set", "peer.replace=true", "--set", "peer.id=alpha"], {}) == ("error", 2)
    assert "peer.replace with peer.id = alpha: with --spec peer ids are peer{RANK}" in _error(capsys)


# ---------------------------------------------------------------- the launcher's size and the spec's peers

@pytest.mark.parametrize("env, world, rank", [
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, "SLURM_NTASKS='2'", "SLURM_PROCID='1'"),
    ({"SLURM_PROCID": "0", "SLURM_NPROCS": "3"}, "SLURM_NPROCS='3'", "SLURM_PROCID='0'"),
    ({"RANK": "1", "WORLD_SIZE": "2"}, "WORLD_SIZE='2'", "RANK='1'"),
    # srun torchrun: the rank is torchrun's, and so is the number of processes
    ({"TORCHELASTIC_RUN_ID": "none", "RANK": "1", "WORLD_SIZE": "3", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"},
     "WORLD_SIZE='3'", "RANK='1'"),
])
def test_a_launcher_that_started_fewer_processes_than_peers_is_refused_at_start(spec_peer, capsys, env, world,
                                                                               rank):
    """srun with 2 tasks and a spec of peers = 4: each task waited 60 s for the two that
    never come, then failed. (More tasks than peers may be on purpose: below.)"""
    assert spec_peer([], env) == ("error", 2)
    err = _error(capsys)
    assert world in err and rank in err and "has peers = 4" in err, err


@pytest.mark.parametrize("args, env, rank", [
    ([], {"SLURM_PROCID": "3", "SLURM_NTASKS": "4"}, 3),
    ([], {"TORCHELASTIC_RUN_ID": "none", "RANK": "2", "WORLD_SIZE": "4", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"},
     2),
    ([], {"SWARM_RANK": "1", "SLURM_NTASKS": "2"}, 1),        # swarm's own variable: no launcher to compare
    (["--rank", "1"], {"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, 1),    # by hand in an allocation
    # srun --multi-prog: tasks 0-3 peers, 4-5 standby coordinators (a task of rank 4 is refused its rank)
    ([], {"SLURM_PROCID": "0", "SLURM_NTASKS": "6"}, 0),
])
def test_a_launcher_of_as_many_peers_or_a_rank_given_by_hand_starts(spec_peer, args, env, rank):
    assert spec_peer(args, env) == ("started", rank, False)


def test_a_launcher_size_that_is_not_a_number_is_named(spec_peer, capsys):
    assert spec_peer([], {"SLURM_PROCID": "0", "SLURM_NTASKS": "four"}) == ("error", 2)
    assert "SLURM_NTASKS='four' is not a number of processes" in _error(capsys)


# ---------------------------------------------------------------- addresses on the command line

@pytest.mark.parametrize("args, message", [
    (["--coordinator", "tcp://[::1]:5555"],
     "--coordinator 'tcp://[::1]:5555': 'tcp://[::1]:5555' is not tcp://HOST:PORT"),
    (["--coordinator", "tcp://127.0.0.1:5555,tcp://::1:5555"], "'tcp://::1:5555' is not tcp://HOST:PORT"),
    (["--coordinator", "127.0.0.1:5555"], "--coordinator '127.0.0.1:5555': '127.0.0.1:5555' is not"),
    (["--coordinator", "tcp://127.0.0.1:9", "--bind", "tcp://[::1]:*"], "--bind: 'tcp://[::1]:*' is not"),
    (["--coordinator", "tcp://127.0.0.1:9", "--bind", "tcp://127.0.0.1:70000"], "--bind: 'tcp://127.0.0.1:70000'"),
    (["--coordinator", "tcp://127.0.0.1:9", "--set", "peer.bind=nonsense"], "peer.bind: 'nonsense' is not"),
])
def test_a_bad_address_on_the_command_line_is_one_line_before_the_join(clean_env, capsys, tmp_path, args,
                                                                     message):
    """`--coordinator tcp://[::1]:5555` waited out the join timeout, then said that no
    coordinator answered; `--bind tcp://[::1]:*` said `cannot bind ...: No such device`."""
    base = ["peer", "--set", "peer.join_timeout_s=1", *args]
    assert cli.main([*base, "--id", "a"]) == 2
    err = _error(capsys)
    assert message in err and "no coordinator answered" not in err, err
    if "::1" in message:
        assert "IPv4 only" in err, err
    # with --spec: refused before the run folder is made
    spec = save_resolved(load_spec(None, ["peers=1"]), tmp_path / "spec.json")
    assert cli.main([*base, "--spec", str(spec), "--rank", "0", "--run-dir", str(tmp_path / "run")]) == 2
    assert message in _error(capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("bind", ["tcp://127.0.0.1:*", "tcp://0.0.0.0:*", "tcp://*:*", "tcp://127.0.0.1:0",
                                  "tcp://localhost:5555", "tcp://*:5555"])
def test_usual_bind_addresses_pass(bind):
    assert cli._bind_error(bind) == ""
