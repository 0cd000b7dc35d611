"""`swarm peer --spec` processes started by hand, one per "host", as docs/multihost.md
shows: failover to a standby coordinator, a replacement for a killed peer, and the
mistakes a user makes (another spec, a rank that is not in the id, a bad run folder)."""

from __future__ import annotations

import json
import signal

import pytest
from swarmtest import free_port, status, wait_for

from swarm.experiment import load_spec
from swarm.experiment.checkpoint import latest
from swarm.experiment.spec import save_resolved

# two small peers that train until told to stop
SMALL = ["peers=2", "budget.env_steps=1000000", "dqn.learning_starts=50", "dqn.batch_size=16", "dqn.hidden=[32]",
         "eval.every=0", "checkpoint.full_every_s=0", "checkpoint.full_every_steps=200"]


def spec_file(tmp_path, name: str = "spec.json", *more: str):
    return str(save_resolved(load_spec(None, [*SMALL, *more]), tmp_path / name))


def alive(addr: str) -> dict[str, int]:
    """id -> rank of the live members in the table of the coordinator at ``addr``."""
    return {m["id"]: m["rank"] for m in status(addr, 0.5)["members"] if m["state"] == "alive"}


def start_peers(procs, spec: str, coordinators: str, run, ranks=(0, 1)) -> dict[int, object]:
    return {r: procs.start("peer", "--spec", spec, "--rank", str(r), "--coordinator", coordinators,
                           "--run-dir", str(run), name=f"peer{r}") for r in ranks}


def stop_and_check(procs, peers: dict) -> None:
    for p in peers.values():
        p.send_signal(signal.SIGTERM)
    for p in peers.values():
        assert p.wait(30) == 0, procs.log(p)
        assert "Traceback" not in procs.log(p)


def test_spec_peers_fail_over_to_the_standby(procs, tmp_path):
    # `--coordinator A,B` reached only A: after A died the run went on, but the
    # standby's table stayed empty and `swarm status` there showed no members
    primary, standby = sorted(f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    cp = procs.start("coordinator", "--bind", primary, "--others", standby, name="primary")
    procs.start("coordinator", "--bind", standby, "--others", primary, name="standby")
    wait_for(lambda: status(primary, 0.5)["mode"] == "active" and status(standby, 0.5)["mode"] == "standby",
             15, what="primary active, standby standing by")
    run = tmp_path / "run"
    peers = start_peers(procs, spec_file(tmp_path), f"{primary},{standby}", run)
    wait_for(lambda: (run / "peer1" / "rounds.csv").is_file() and alive(primary) == {"peer0": 0, "peer1": 1},
             60, what="both peers training")
    cp.kill()
    cp.wait()
    wait_for(lambda: alive(standby) == {"peer0": 0, "peer1": 1}, 15, what="both peers in the standby's table")
    assert all(p.poll() is None for p in peers.values())
    stop_and_check(procs, peers)
    for r in (0, 1):
        assert json.loads((run / f"peer{r}" / "summary.json").read_text())["reason"] == "stopped"


def test_replace_takes_the_rank_from_the_id(procs, tmp_path):
    # `--replace peer1` with --spec was refused: "--spec needs a rank", though the
    # id says it (a peer of an experiment is peer{RANK})
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs.start("coordinator", "--bind", addr, name="coordinator")
    wait_for(lambda: status(addr, 0.5), 15, what="coordinator")
    run = tmp_path / "run"
    spec = spec_file(tmp_path)
    peers = start_peers(procs, spec, addr, run)
    wait_for(lambda: latest(run / "peer1" / "ckpt") is not None, 90, what="a checkpoint of peer1")
    peers[1].kill()
    peers[1].wait()
    wait_for(lambda: alive(addr) == {"peer0": 0}, 10, what="peer1 declared dead")
    peers[1] = procs.start("peer", "--spec", spec, "--replace", "peer1", "--coordinator", addr,
                           "--run-dir", str(run), "--resume", str(run), name="replacement")
    wait_for(lambda: peers[1].poll() is None and alive(addr) == {"peer0": 0, "peer1": 1}, 60,
             what="the replacement in peer1's place")
    wait_for(lambda: (run / "peer1" / "resumed.json").is_file(), 30, what="the replacement resumed")
    stop_and_check(procs, peers)
    assert "bootstrap" in json.loads((run / "peer1" / "summary.json").read_text())


def test_a_peer_with_another_spec_is_refused_by_name(procs, tmp_path):
    # a peer with another network size trained alone, every gossip message to and
    # from it dropped as the wrong size, and nothing said so
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs.start("coordinator", "--bind", addr, name="coordinator")
    wait_for(lambda: status(addr, 0.5), 15, what="coordinator")
    run = tmp_path / "run"
    p0 = start_peers(procs, spec_file(tmp_path), addr, run, ranks=(0,))[0]
    wait_for(lambda: "spec" in status(addr, 0.5)["members"][0]["stats"], 60, what="peer0's spec digest")
    p1 = start_peers(procs, spec_file(tmp_path, "other.json", "dqn.hidden=[16]"), addr, run, ranks=(1,))[1]
    assert p1.wait(60) == 2
    log = procs.log(p1)
    assert "swarm: error: peer1: the spec differs at peer0 (dqn); every peer needs the same --spec" in log
    assert "Traceback" not in log
    # peer0 may have seen peer1's digest before peer1 left: then it says so too;
    # else it trains on alone, as after any peer's exit
    if p0.poll() is None:
        stop_and_check(procs, {0: p0})
    else:
        assert p0.returncode == 2 and "the spec differs at peer1 (dqn)" in procs.log(p0)


@pytest.mark.parametrize("args, message", [
    (("--replace", "peer1", "--rank", "0"), "--replace peer1 and --rank 0 disagree; drop --rank"),
    (("--replace", "worker1"), "--replace worker1: with --spec peer ids are peer{RANK}"),
    (("--id", "bob", "--rank", "0"), "--id bob: with --spec a peer's id is peer{RANK} (here peer0)"),
    (("--rank", "0", "--run-dir", "FILE"), "cannot create"),
])
def test_bad_spec_peer_arguments_are_refused_at_once(procs, tmp_path, args, message):
    # before: --id and a --replace id that is not peer{RANK} were dropped in silence,
    # and a run folder that cannot be made failed with a traceback after the join wait
    (tmp_path / "file").write_text("")
    args = tuple(str(tmp_path / "file") if a == "FILE" else a for a in args)
    p = procs.start("peer", "--spec", spec_file(tmp_path), "--coordinator", f"tcp://127.0.0.1:{free_port()}",
                    *args, name="bad")
    assert p.wait(20) == 2
    log = procs.log(p)
    assert message in log and "Traceback" not in log
    assert "no coordinator answered" not in log      # refused before it tried to join
