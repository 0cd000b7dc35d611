"""Review 47: ``~`` in the path keys of a config (a file, ``--set``, the Python API), which
looked for a folder named ``~`` in the current one; a gauge on ``/metrics`` that says
which coordinator is active (a standby's page read as an empty swarm); and a hypercube
swarm's "needs n to be a power of two" warning, logged by every peer of a healthy start
while its peers joined. Real processes, files and sockets on loopback; each process is
ended by its handle."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import urllib.request
from pathlib import Path

from coordinator.test_ha_review45 import primary_and_standby
from swarmtest import ROOT, SWARM, free_port, status, wait_for

from swarm import Coordinator, Peer
from swarm.cli import query_status

# ------------------------------------------------------------ 1. ~ in a config's path keys


def _home_with_keys(tmp_path: Path) -> dict[str, str]:
    """An environment whose HOME is a fresh folder holding ``~/swarm-keys`` (the pairs
    coordinator and peer), made by `swarm keys generate` given the ``~`` itself."""
    home = tmp_path / "home"
    home.mkdir()
    env = dict(os.environ, HOME=str(home), PYTHONUNBUFFERED="1")
    env.pop("SWARM_COORDINATOR", None)
    subprocess.run([*SWARM, "keys", "generate", "~/swarm-keys", "--names", "coordinator,peer"], cwd=ROOT,
                   env=env, check=True, capture_output=True, timeout=60)
    assert (home / "swarm-keys" / "peer.key_secret").exists()
    return env


def test_a_tilde_in_keys_dir_of_a_config_file_and_of_set_is_the_home_folder(procs, tmp_path):
    env = _home_with_keys(tmp_path)
    keys = str(Path(env["HOME"]) / "swarm-keys")
    conf = tmp_path / "coord.toml"
    conf.write_text('[coordinator]\nkeys_dir = "~/swarm-keys"\nhttp_bind = ""\n')
    addr = f"tcp://127.0.0.1:{free_port()}"
    coord = procs.start("coordinator", "--config", str(conf), "--bind", addr, name="coord", env=env)

    def answers() -> dict:
        return asyncio.run(query_status(addr, 1.0, keys, "peer"))

    # a process that stopped ends the wait at once: its log says why
    wait_for(lambda: coord.poll() is not None or answers(), 30, what="the keyed coordinator")
    assert coord.poll() is None, procs.log(coord)
    peer = procs.start("peer", "--coordinator", addr, "--id", "p1", "--set", "peer.keys_dir=~/swarm-keys",
                       name="peer", env=env)

    wait_for(lambda: peer.poll() is not None or [m[0] for m in answers()["view"]["members"]] == ["p1"], 30,
             what="the peer with keys_dir = ~/swarm-keys in the view")
    assert peer.poll() is None, procs.log(peer)


def test_a_tilde_in_keys_dir_given_to_the_python_api_is_the_home_folder(tmp_path, monkeypatch):
    env = _home_with_keys(tmp_path)
    monkeypatch.setenv("HOME", env["HOME"])

    async def main() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*", http_bind="", keys_dir="~/swarm-keys") as coord:
            assert coord.config.keys_dir == f"{env['HOME']}/swarm-keys"
            async with Peer(coordinators=[coord.address], id="p1", keys_dir="~/swarm-keys") as peer:
                assert peer.config.keys_dir == f"{env['HOME']}/swarm-keys"
                await peer.wait_view(lambda v: v.ids == ["p1"], timeout=20)

    asyncio.run(main())


# ------------------------------------------------------------ 2. which coordinator is active

def _active_gauge(addr: str) -> list[str]:
    """The swarm_coordinator_active lines of the /metrics of the coordinator at ``addr``."""
    text = urllib.request.urlopen(status(addr)["http"] + "metrics", timeout=5).read().decode()
    return [ln for ln in text.splitlines() if "swarm_coordinator_active" in ln]


def test_metrics_say_which_coordinator_is_active(procs):
    primary, standby, _, _ = primary_and_standby(procs)
    head = ["# HELP swarm_coordinator_active 1 on the active coordinator, 0 on a standby (whose member "
            "metrics are empty until it takes over)", "# TYPE swarm_coordinator_active gauge"]
    assert _active_gauge(primary) == [*head, 'swarm_coordinator_active{run=""} 1']
    assert _active_gauge(standby) == [*head, 'swarm_coordinator_active{run=""} 0']


# ------------------------------------------------------------ 3. a hypercube's peers joining

SHAPE = re.compile(r"needs n to be a power of two")


async def _hypercube(n: int, **kw) -> tuple[list[Peer], Coordinator]:
    """A coordinator and ``n`` hypercube peers, started one after another, each waiting for
    the view to list it (so the others see every size from 1 to ``n``)."""
    coord = Coordinator(bind="tcp://127.0.0.1:*", http_bind="")
    await coord.start()
    peers: list[Peer] = []
    try:
        for r in range(n):
            peers.append(Peer(coordinators=[coord.address], id=f"h{r}", rank=r, topology="hypercube", **kw))
            await peers[-1].start()
            for p in peers:
                await p.wait_view(lambda v: len(v.members) == r + 1, timeout=20)
    except BaseException:
        await _close(peers, coord)
        raise
    return peers, coord


async def _close(peers: list[Peer], coord: Coordinator) -> None:
    for p in peers:
        await p.close()
    await coord.close()


def test_a_healthy_hypercube_start_logs_no_warning_of_its_shape(caplog):
    # each peer saw a view of 3 on the way to 4: a warning on every peer of a healthy run
    async def main() -> None:
        peers, coord = await _hypercube(4, join_timeout_s=20)
        try:
            for p in peers:
                await p.wait_linked(timeout=20)
            assert all(len(p.neighbours()) == 2 for p in peers)
        finally:
            await _close(peers, coord)

    with caplog.at_level(logging.INFO, logger="swarm.peer"):
        asyncio.run(main())
    shape = [r for r in caplog.records if SHAPE.search(r.getMessage())]
    assert shape, "no view of 3 was seen: the test did not test the start"
    assert [r.getMessage() for r in shape if r.levelno >= logging.WARNING] == []


def test_a_hypercube_of_three_that_stays_so_warns_once(caplog):
    async def main() -> None:
        peers, coord = await _hypercube(3, join_timeout_s=1.0)
        try:
            def warned() -> list[logging.LogRecord]:
                return [r for r in caplog.records if r.levelno == logging.WARNING and SHAPE.search(r.getMessage())]
            while len({r.getMessage().split(":")[0] for r in warned()}) < 3:   # "peer hN: ..." of each
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.5)   # past join_timeout_s again: still once each
            assert sorted(r.getMessage().split(":")[0] for r in warned()) == ["peer h0", "peer h1", "peer h2"]
            assert all(p.neighbours() == [] for p in peers)
        finally:
            await _close(peers, coord)

    with caplog.at_level(logging.INFO, logger="swarm.peer"):
        asyncio.run(asyncio.wait_for(main(), 60))
