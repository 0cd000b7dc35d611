"""Peers started as Slurm and torchrun start them (docs/multihost.md): srun and torchrun
are replaced by processes started here with the environment those launchers set, on
loopback. Checks the rank and coordinator each peer takes from it, and the errors for
an environment that names no valid rank."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from swarmtest import ROOT, free_port, status, wait_for

from swarm import cli
from swarm.experiment import load_spec
from swarm.experiment.spec import save_resolved

SMALL = ["peers=2", "budget.env_steps=300", "dqn.learning_starts=50", "dqn.batch_size=16", "dqn.hidden=[32]",
         "eval.every=0"]


def spec_file(tmp_path) -> str:
    return str(save_resolved(load_spec(None, SMALL), tmp_path / "spec.json"))


def coordinator(procs) -> str:
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs.start("coordinator", "--bind", addr, name="coordinator")
    wait_for(lambda: status(addr, 0.5), 15, what="coordinator")
    return addr


def finish(procs, peers: list, timeout: float = 120) -> None:
    """Wait until every peer exited; fail at the first that exits with an error."""
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in peers) and time.monotonic() < deadline:
        for p in peers:
            assert p.poll() in (None, 0), procs.log(p)
        time.sleep(0.2)
    for p in peers:
        assert p.poll() == 0, procs.log(p)
        assert "Traceback" not in procs.log(p)


def summaries(run: Path) -> dict[int, str]:
    return {r: json.loads((run / f"peer{r}" / "summary.json").read_text())["reason"] for r in (0, 1)}


def test_slurm_batch_script(procs, tmp_path):
    # the batch script of docs/multihost.md, srun being a loop over SLURM_PROCID
    addr = coordinator(procs)
    run = tmp_path / "runs" / "42"
    slurm = {"SWARM_COORDINATOR": addr, "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "localhost",
             "SLURM_JOB_ID": "42", "SLURM_SUBMIT_DIR": str(tmp_path)}
    peers = [procs.start("peer", "--spec", spec_file(tmp_path), "--bind", "tcp://127.0.0.1:*", "--run-dir", str(run),
                         name=f"task{r}", env={**slurm, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)})
             for r in (0, 1)]
    finish(procs, peers)
    assert summaries(run) == {0: "budget", 1: "budget"}


def torchrun_env(rank: int, port: int) -> dict[str, str]:
    """What torchrun sets for worker ``rank`` of 2 on one node with --master-addr 127.0.0.1."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
            "TORCHELASTIC_RUN_ID": "none", "SWARM_COORDINATOR_PORT": str(port)}


@pytest.mark.parametrize("under_srun", [False, True], ids=["torchrun", "srun-torchrun"])
def test_torchrun_workers(procs, tmp_path, under_srun):
    # Under `srun torchrun` both workers inherit SLURM_PROCID=0: both asked for rank 0,
    # the coordinator refused one and the other gave up after 60 s waiting for it.
    addr = coordinator(procs)
    port = int(addr.rsplit(":", 1)[1])
    srun = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "localhost"} if under_srun else {}
    run = tmp_path / "run"
    peers = [procs.start("peer", "--spec", spec_file(tmp_path), "--bind", "tcp://127.0.0.1:*", "--run-dir", str(run),
                         name=f"worker{r}", env={**srun, **torchrun_env(r, port)}) for r in (0, 1)]
    finish(procs, peers)
    assert summaries(run) == {0: "budget", 1: "budget"}


def test_swarm_variables_come_before_the_launchers(procs, tmp_path):
    # --rank > SWARM_RANK > SLURM_PROCID > RANK; SWARM_COORDINATOR > MASTER_ADDR (here a dead port)
    addr = coordinator(procs)
    launchers = {"SLURM_PROCID": "7", "RANK": "8", "MASTER_ADDR": "127.0.0.1",
                 "SWARM_COORDINATOR_PORT": str(free_port()), "SWARM_COORDINATOR": addr}
    procs.start("peer", "--id", "a", name="a", env={**launchers, "SWARM_RANK": "1"})
    procs.start("peer", "--id", "b", "--rank", "0", name="b", env={**launchers, "SWARM_RANK": "1"})
    procs.start("peer", "--id", "c", name="c", env=launchers)
    procs.start("peer", "--id", "d", name="d", env={"RANK": "4", "MASTER_ADDR": "127.0.0.1",
                                                    "SWARM_COORDINATOR_PORT": addr.rsplit(":", 1)[1]})
    want = {"a": 1, "b": 0, "c": 7, "d": 4}
    wait_for(lambda: {m["id"]: m["rank"] for m in status(addr, 0.5)["members"] if m["state"] == "alive"} == want,
             30, what=f"members {want}")


@pytest.mark.parametrize("env, message", [
    ({"SLURM_PROCID": "x"}, "SLURM_PROCID='x' is not an integer rank"),
    ({"RANK": "-1"}, "RANK=-1 must be >= 0"),
    ({"SWARM_RANK": "", "SLURM_PROCID": "2"},
     "SLURM_PROCID='2' gives rank = 2: the spec has peers = 2, so ranks are 0..1"),
    ({"TORCHELASTIC_RUN_ID": "none", "SLURM_PROCID": "0", "RANK": "2"},
     "RANK='2' gives rank = 2: the spec has peers = 2"),
    ({"SWARM_RANK": "1_0"}, "SWARM_RANK='1_0' is not an integer rank"),     # int() read it as 10
])
def test_a_bad_rank_from_the_environment_is_one_line(procs, tmp_path, env, message):
    p = procs.start("peer", "--spec", spec_file(tmp_path), "--coordinator", f"tcp://127.0.0.1:{free_port()}",
                    "--run-dir", str(tmp_path / "run"), name="bad", env=env)
    assert p.wait(30) == 2
    errors = [line for line in procs.log(p).splitlines() if line.startswith("swarm: error:")]
    assert len(errors) == 1 and message in errors[0], procs.log(p)
    assert "Traceback" not in procs.log(p)


@pytest.mark.parametrize("env, message", [
    ({"MASTER_ADDR": "::1"}, "MASTER_ADDR='::1' is an IPv6 address: swarm connects over IPv4 only"),
    ({"MASTER_ADDR": "fe80::1"}, "MASTER_ADDR='fe80::1' is an IPv6 address"),
    ({"MASTER_ADDR": "[::1]"}, "MASTER_ADDR='[::1]' is an IPv6 address"),
    ({"MASTER_ADDR": "head:29500"}, "MASTER_ADDR='head:29500' is not a host name or IPv4 address"),
    ({"MASTER_ADDR": "127.0.0.1", "SWARM_COORDINATOR_PORT": "abc"}, "SWARM_COORDINATOR_PORT='abc' is not a port"),
    ({"MASTER_ADDR": "127.0.0.1", "SWARM_COORDINATOR_PORT": "99999"}, "SWARM_COORDINATOR_PORT='99999' is not a port"),
    ({"MASTER_ADDR": "127.0.0.1", "SWARM_COORDINATOR_PORT": "0"}, "SWARM_COORDINATOR_PORT='0' is not a port"),
    ({"SWARM_COORDINATOR": "tcp://127.0.0.1:5555,nonsense"},
     "SWARM_COORDINATOR='tcp://127.0.0.1:5555,nonsense': 'nonsense' is not tcp://HOST:PORT"),
    ({"SWARM_COORDINATOR": "tcp://127.0.0.1:0"}, "SWARM_COORDINATOR='tcp://127.0.0.1:0': 'tcp://127.0.0.1:0' is not"),
])
def test_a_bad_coordinator_address_from_the_environment_names_its_variable(monkeypatch, capsys, env, message):
    # `tcp://::1:5555` was tried in vain (the transport does not enable IPv6), and a bad
    # port was reported as `cannot connect to tcp://127.0.0.1:abc`, naming no variable
    for key in ("SWARM_COORDINATOR", "MASTER_ADDR", "SWARM_COORDINATOR_PORT"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert cli.main(["status", "--timeout", "0.1"]) == 2
    assert message in capsys.readouterr().err
    assert cli.main(["peer", "--id", "a"]) == 2          # refused before anything starts
    assert message in capsys.readouterr().err


def test_the_coordinator_port_from_the_environment():
    assert cli.env_coordinator({"MASTER_ADDR": " head ", "SWARM_COORDINATOR_PORT": ""}) == ["tcp://head:5555"]
    assert cli.env_coordinator({"MASTER_ADDR": "10.0.0.1", "SWARM_COORDINATOR_PORT": "6000"}) == ["tcp://10.0.0.1:6000"]
    # MASTER_ADDR is not read when SWARM_COORDINATOR is set: a bad one does not matter then
    assert cli.env_coordinator({"SWARM_COORDINATOR": "tcp://a:1", "MASTER_ADDR": "::1"}) == ["tcp://a:1"]


def launcher_lines() -> list[str]:
    """Each `swarm peer` line that srun or torchrun starts in README.md and docs/multihost.md."""
    lines = []
    for doc in (ROOT / "README.md", ROOT / "docs" / "multihost.md"):
        for block in re.findall(r"^```[a-z]*\n(.*?)^```", doc.read_text(), re.S | re.M):
            lines += [f"{doc.name}: {line.strip()}" for line in re.sub(r"\\\n\s*", " ", block).splitlines()
                      if re.match(r"\s*(srun|torchrun)\b.*\bpeer\b", line)]
    return lines


def test_launcher_examples_bind_an_address_other_hosts_reach():
    # README's `srun ... swarm peer --coordinator ...` had no --bind: every peer bound
    # loopback and advertised it, so peers on other nodes could not link
    lines = launcher_lines()
    assert len(lines) >= 3, lines
    for line in lines:
        assert '--bind "tcp://0.0.0.0:*"' in line, line


def test_readme_peers_on_other_hosts_bind_an_address_those_hosts_reach():
    # the README's key and failover examples started `swarm peer` for HOST_A's
    # coordinator without --bind: loopback, which no other host reaches
    text = re.sub(r"\\\n\s*", " ", (ROOT / "README.md").read_text())
    lines = [line.strip() for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M)
             for line in block.splitlines() if re.match(r"\s*swarm peer\b.*tcp://HOST_", line)]
    assert len(lines) >= 3, lines
    for line in lines:
        assert '--bind "tcp://0.0.0.0:*"' in line, line
