"""`swarm launch --ray` on a local Ray cluster (its own temp dir, shut down at the end).

Skipped where Ray is not installed: it is the optional `ray` extra and not part of
the `test` extra, so CI does not download it.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[ray]')")

from swarm.cli import main as swarm_main, query_status  # noqa: E402
from swarm.experiment.ray_launch import launch_ray  # noqa: E402

pytestmark = pytest.mark.timeout(300)

# Small and quick: learning from step 100, no evaluation, sharing on (the default).
TINY = ["dqn.learning_starts=100", "dqn.batch_size=32", "eval.every=0", "buffer.capacity=2000"]


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance with 3 logical CPUs, in a short temp dir of its own
    (Ray's socket paths must stay under the 107-byte Unix limit)."""
    tmp = tempfile.mkdtemp(prefix="swray", dir="/tmp")
    ray.init(num_cpus=3, include_dashboard=False, _temp_dir=tmp, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_swarm_launch_ray_places_peers_that_gossip_over_zeromq(local_ray, tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sets = [a for s in [*TINY, "budget.env_steps=400"] for a in ("--set", s)]
    # the CLI on the Ray instance already running in this process; --host keeps it on loopback
    code = swarm_main(["launch", "--ray", "--per-node", "2", "--host", "127.0.0.1", *sets])
    assert code == 0
    (run,) = (tmp_path / "runs").iterdir()
    spec = json.loads((run / "config.json").read_text())
    assert spec["peers"] == 2                       # 1 node × --per-node 2
    placement = json.loads((run / "placement.json").read_text())
    assert placement["coordinator"].startswith("tcp://127.0.0.1:")
    pids = {p["pid"] for p in placement["peers"].values()}
    assert len(pids) == 2 and os.getpid() not in pids   # each peer in a Ray worker of its own
    rows = json.loads((run / "summary.json").read_text())
    assert [r["reason"] for r in rows] == ["budget", "budget"]
    for r in rows:
        assert r["env_steps"] == 400
        # parameters and replay went peer to peer, over ZeroMQ
        assert r["rounds_ok"] > 0 and r["gossip_bytes_in"] > 0 and r["bytes_out"] > r["gossip_bytes_out"] > 0
    assert "swarm coordinator on tcp://127.0.0.1:" in (run / "logs" / "coordinator.log").read_text()
    for pid in pids:   # the launcher ended its actors
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid), f"peer actor process {pid} outlived the launch"


def test_a_lost_peer_is_routed_around_by_the_coordinator_not_restarted_by_ray(local_ray, tmp_path: Path):
    """SIGKILL one peer's worker process mid-run: Ray does not restart it
    (max_restarts=0); the coordinator declares it dead, the two others re-link and
    finish their budget gossiping with each other; the launcher reports the loss."""
    runs = tmp_path / "runs"
    killed: dict = {}
    errors: list[BaseException] = []

    def kill_one() -> None:
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                found = list(runs.glob("*/placement.json"))
                if found:
                    placement = json.loads(found[0].read_text())
                    try:
                        st = asyncio.run(query_status(placement["coordinator"], timeout=1.0))
                    except Exception:  # the coordinator may be busy; ask again
                        st = None
                    rounds = {m["id"]: (m.get("stats") or {}).get("rounds", 0) for m in (st or {}).get("members", [])}
                    if len(rounds) == 3 and min(rounds.values()) >= 3:
                        killed["pid"] = placement["peers"]["peer2"]["pid"]
                        killed["t"] = time.time()
                        killed["coordinator"] = placement["coordinator"]
                        killed["rounds"] = rounds
                        os.kill(killed["pid"], signal.SIGKILL)
                        # the coordinator alone decides: peer2 dead, the ring re-linked
                        until = time.monotonic() + 20
                        while time.monotonic() < until:
                            st = asyncio.run(query_status(killed["coordinator"], timeout=1.0))
                            ids = sorted(m[0] if isinstance(m, list) else m["id"] for m in st["view"]["members"])
                            if ids == ["peer0", "peer1"]:
                                killed["relinked_after_s"] = time.time() - killed["t"]
                                return
                            time.sleep(0.1)
                        return
                time.sleep(0.2)
        except BaseException as e:  # surfaced by the test below
            errors.append(e)

    killer = threading.Thread(target=kill_one, daemon=True)
    killer.start()
    out = io.StringIO()
    code = launch_ray(None, [*TINY, "budget.env_steps=1500", "buffer.replicas=0"], per_node=3,
                      host="127.0.0.1", runs_root=runs, stream=out)
    killer.join(30)
    assert not killer.is_alive() and not errors, errors
    assert "pid" in killed, f"the peers never all ran 3 rounds:\n{out.getvalue()}"
    assert "relinked_after_s" in killed, "the coordinator did not drop the killed peer from the view"
    assert code == 1, out.getvalue()
    assert "peer2 failed" in out.getvalue()
    assert not _alive(killed["pid"])
    (run,) = runs.iterdir()
    rows = {r["id"]: r for r in json.loads((run / "summary.json").read_text())}
    assert rows["peer2"]["reason"].startswith("failed: ")     # what Ray said; not restarted: no second life
    for pid in ("peer0", "peer1"):
        assert rows[pid]["reason"] == "budget" and rows[pid]["env_steps"] == 1500
        with open(run / pid / "rounds.csv") as f:
            rounds = list(csv.DictReader(f))
        # the survivors went on gossiping with each other after the loss (each with
        # the other as its one neighbour, until the first of them is done)
        after = rounds[killed["rounds"][pid] + 1:]
        assert sum(int(r["participants"]) == 1 for r in after) >= 10, after
