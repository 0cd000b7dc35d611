"""bench_scale's anchors do the work swarm does, and its failures are null, not numbers.

The script is loaded as a module (``load_script``) and its parts are run with small
inputs: the anchors' functions directly, and ``main`` with the expensive parts (the
coordinator and its simulated members, the in-process swarm, the peer processes)
stood in by fakes that return what the real ones would, so the JSON assembly is
checked in seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import zmq

from test_scripts import load_script


@pytest.fixture
def bs():
    return load_script("bench_scale")


def run_main(bs, monkeypatch, capsys, *args: str) -> dict:
    """bench_scale's main with ``args``; its last stdout line, parsed (NaN and Infinity refused)."""
    monkeypatch.setattr("sys.argv", ["bench_scale.py", *args])
    bs.main()
    lines = capsys.readouterr().out.strip().splitlines()

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in the last line: {lines[-1][:500]}")

    return json.loads(lines[-1], parse_constant=refuse)


# ---------------------------------------------------------------- (a) the fan-out anchor's size

def fake_part_a(view_bytes: int, msg_bytes: int | None, p99: float | None) -> dict:
    """What bench_coordinator returns after a run (1,000 members, 8 changes)."""
    return {"members": 1000, "formed_s": 2.0, "view_bytes": view_bytes, "msg_bytes": msg_bytes,
            "p50": None if p99 is None else p99 / 2, "p99": p99, "max": p99,
            "receipts": 0 if p99 is None else 8000, "epochs": 8, "changes": 8, "per_change": [],
            "hb_rate": 4000.0, "threads": {"python": 0.05, "zmq_io": 0.06}, "stats_share": 0.25,
            "hb_dropped": 0, "quiet_cpu": 0.12, "churn_cpu": 0.15, "false_changes": 0, "views": 8000}


def test_the_fanout_anchor_sends_the_size_of_the_view_messages_the_members_got(bs, monkeypatch, capsys):
    """The anchor sent every member a message the size of the whole view (33.6 kB at
    1,000 members), while on a change the coordinator sends members that hold the view
    only the change (~100 B): the anchor did far more work than swarm."""
    sizes = []

    def anchor(tmp, n_workers, per, size, rounds=10):
        sizes.append(size)
        return [float(ms) for ms in range(1, 101)]   # p99: 99.01 ms

    monkeypatch.setattr(bs, "bench_coordinator", lambda *a, **k: fake_part_a(33_600, 108, 50.0))
    monkeypatch.setattr(bs, "raw_fanout_anchor", anchor)
    out = run_main(bs, monkeypatch, capsys, "--quick", "--skip", "b,c", "--members", "1000")
    assert sizes == [108], sizes
    assert out["view_msg_bytes"] == out["anchor_msg_bytes"] == 108 and out["view_full_bytes"] == 33_600
    assert out["view_p99_vs_anchor"] == round(50.0 / float(np.percentile(np.arange(1, 101), 99)), 3)


def test_no_view_receipts_mean_no_anchor_and_a_null_ratio(bs, monkeypatch, capsys):
    monkeypatch.setattr(bs, "bench_coordinator", lambda *a, **k: fake_part_a(33_600, None, None))
    monkeypatch.setattr(bs, "raw_fanout_anchor", lambda *a, **k: pytest.fail("an anchor with no size to send"))
    out = run_main(bs, monkeypatch, capsys, "--quick", "--skip", "b,c")
    assert out["view_p99_vs_anchor"] is None and out["anchor_fanout_p99_ms"] is None
    assert out["view_msg_bytes"] is None


def test_anchor_message_bytes_is_the_mean_of_what_the_members_got(bs):
    assert bs.anchor_message_bytes([100, 110, 120]) == 110
    assert bs.anchor_message_bytes([108] * 999 + [33_600]) == round((108 * 999 + 33_600) / 1000)
    assert bs.anchor_message_bytes([]) is None


def test_a_simulated_member_records_the_size_of_each_view_message(bs, tmp_path):
    """The worker of part (a) writes, per epoch, the bytes of the view messages that
    brought it: what sizes the anchor. Here a ROUTER of the test's own plays the
    coordinator for two members."""
    from swarm import wire

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    stop, out = tmp_path / "stop", tmp_path / "worker.json"
    args = argparse.Namespace(coord=f"tcp://127.0.0.1:{port}", first=0, count=2, hz=4.0, duration=60.0,
                              stop=str(stop), out=str(out), stats_s=None)
    t = threading.Thread(target=bs.worker, args=(args,), daemon=True)
    t.start()
    try:
        routes = set()
        while len(routes) < 2:
            assert router.poll(20_000), "the simulated members did not join"
            frames = router.recv_multipart()
            if bs._peek(frames[1]).get("t") == "join":
                routes.add(frames[0])
        small = wire.encode("view", "coordinator", epoch=3, body={"joined": [["x", "tcp://127.0.0.1:9", 5]]})
        big = wire.encode("view", "coordinator", epoch=4, body={"members": [[f"m{i}", "tcp://h:1", i]
                                                                            for i in range(200)]})
        last = wire.encode("view", "coordinator", epoch=5, body={"left": ["x"]})
        nbytes = [sum(len(bytes(f)) for f in fr) for fr in (small, big, last)]
        for route in sorted(routes):
            router.send_multipart([route, *small])
            router.send_multipart([route, *big])
            router.send_multipart([route, *small])   # an old epoch again: not a new view
            router.send_multipart([route, *last])
        # Stopped only once both members beat at epoch 5: they took in all four (in
        # order). Stopped at once, a worker that looked at the stop file before its
        # first receive recorded nothing (seen in a fresh clone's run: sizes {}).
        caught_up = set()
        while len(caught_up) < 2:
            assert router.poll(20_000), "the simulated members stopped beating"
            frames = router.recv_multipart()
            h = bs._peek(frames[1])
            if h.get("t") == "heartbeat" and h.get("epoch") == 5:
                caught_up.add(frames[0])
    finally:
        stop.touch()
        t.join(30)
        router.close(0)
        ctx.term()
    assert not t.is_alive(), "the worker did not stop"
    res = json.loads(out.read_text())
    assert res["sizes"] == {"3": [nbytes[0]] * 2, "4": [nbytes[1]] * 2, "5": [nbytes[2]] * 2}, (res["sizes"], nbytes)
    assert sorted(res["seen"]) == ["3", "4", "5"] and res["views"] == 8


# ---------------------------------------------------------------- (b) the sparse numpy anchor

@pytest.mark.parametrize("topology,n", [("ring", 7), ("torus", 12), ("grid", 10), ("ring", 2), ("torus", 1)])
def test_the_sparse_step_is_the_exact_gossip_step(bs, topology, n):
    from swarm.gossip import mixing_matrix

    x = np.random.default_rng(1).standard_normal((n, 33)).astype(np.float32)
    y, tmp = np.empty_like(x), np.empty(33, np.float32)
    bs.sparse_step(x, y, tmp, bs.mixing_rows(topology, n))
    np.testing.assert_allclose(y, mixing_matrix(topology, n) @ x, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("topology,per_row", [("ring", 3), ("torus", 5)])
def test_the_anchor_touches_only_the_nonzero_weights(bs, topology, per_row):
    rows = bs.mixing_rows(topology, 64)
    assert [len(cols) for cols, _ in rows] == [per_row] * 64
    assert all(cols[0] == i and (w > 0).all() for i, (cols, w) in enumerate(rows))


def test_numpy_anchor_does_not_multiply_the_dense_matrix(bs, monkeypatch):
    """numpy_anchor timed a dense W @ X (n × n × d multiply-adds) where gossip on a
    ring does 3 per float and row, on a torus 5."""
    def dense(*a, **k):
        raise AssertionError("the anchor multiplied the dense n x n mixing matrix")

    monkeypatch.setattr(np, "matmul", dense)
    monkeypatch.setattr(np, "dot", dense)
    monkeypatch.setattr(bs, "ANCHOR_MIN_S", 0.0)
    for topology in ("ring", "torus"):
        r = bs.numpy_anchor(16, 100, topology, 2)
        assert math.isfinite(r) and r > 0, r


# ---------------------------------------------------------------- (b) ok per topology

def test_part_b_reports_ok_per_topology_and_nulls_a_failed_ratio(bs, monkeypatch, capsys):
    """Only the ring's ok was reported; the torus's ratio was a number even when its
    rounds failed."""
    async def inproc(n, d, topology, rounds):
        return {"rounds_per_s": 4.0, "mem_per_peer": 2e6, "ok": topology == "ring"}

    monkeypatch.setattr(bs, "inproc", inproc)
    monkeypatch.setattr(bs, "numpy_anchor", lambda n, d, topology, rounds: 10.0)
    out = run_main(bs, monkeypatch, capsys, "--quick", "--skip", "a,c")
    assert out["inproc_ring_ok"] is True and out["inproc_torus_ok"] is False and out["inproc_ok"] is False
    assert out["inproc_ring_vs_numpy"] == 0.4 and out["inproc_ring_rounds_per_s"] == 4.0
    assert out["inproc_torus_vs_numpy"] is None and out["inproc_torus_rounds_per_s"] is None
    assert out["numpy_torus_rounds_per_s"] == 10.0 and out["inproc_torus_mb_per_peer"] == 2.0


def test_part_b_headline_is_null_when_the_ring_failed(bs, monkeypatch, capsys):
    async def inproc(n, d, topology, rounds):
        return {"rounds_per_s": 4.0, "mem_per_peer": 2e6, "ok": topology != "ring"}

    monkeypatch.setattr(bs, "inproc", inproc)
    monkeypatch.setattr(bs, "numpy_anchor", lambda n, d, topology, rounds: 10.0)
    out = run_main(bs, monkeypatch, capsys, "--quick", "--skip", "a,c")
    assert out["inproc_ring_ok"] is False and out["inproc_torus_ok"] is True
    assert out["inproc_rounds_per_s"] is None and out["inproc_ring_vs_numpy"] is None
    assert out["inproc_torus_vs_numpy"] == 0.4


# ---------------------------------------------------------------- (c) peer processes

class FakePeers:
    """Stands in for ``subprocess`` in bench_processes: a peer process writes the result
    its scenario gives it (or nothing) at once; the coordinator does nothing."""

    TimeoutExpired = subprocess.TimeoutExpired
    DEVNULL, PIPE, STDOUT = subprocess.DEVNULL, subprocess.PIPE, subprocess.STDOUT

    def __init__(self, scenario):
        self.scenario = scenario   # (n, rank) -> a result dict, or None for no result file

    def Popen(self, argv, **kwargs):   # noqa: N802 - the name subprocess has
        if "--gossip-peer" in argv:
            opt = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
            res = self.scenario(int(opt["--n"]), int(opt["--rank"]))
            if res is not None:
                Path(opt["--out"] + ".ready").touch()
                Path(opt["--out"]).write_text(json.dumps(res))
        return FakeProcess()


class FakeProcess:
    pid = 0
    returncode = 0

    def poll(self):
        return 0

    def wait(self, timeout=None):
        return 0

    def kill(self):
        pass

    def terminate(self):
        pass


class FakeController:
    def __init__(self, *a, **k):
        pass

    def status(self, timeout=10.0):
        return {"view": {"members": []}}


def fine(rounds: int = 100) -> dict:
    return {"rounds": rounds, "ok": rounds, "late_s": 0.1, "error": ""}


FAILED = {"rounds": 0, "ok": 0, "late_s": 0.0, "error": "PeerTimeout: no view"}

SCENARIOS = {
    # the auditor's cases: 3.2e11 and 4.0 came out of these
    "4 all failed, 16 fine": (lambda n, r: FAILED if n == 4 else fine(), 0, 16),
    "16: 4 of 16 finished": (lambda n, r: fine() if n == 4 or r < 4 else FAILED, 4, 4),
    "16: 12 wrote nothing": (lambda n, r: fine() if n == 4 or r < 4 else None, 4, 4),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_part_c_is_null_unless_every_peer_finished(bs, monkeypatch, capsys, name):
    scenario, finished4, finished16 = SCENARIOS[name]
    monkeypatch.setattr(bs, "subprocess", FakePeers(scenario))
    monkeypatch.setattr(bs, "Controller", FakeController)
    out = run_main(bs, monkeypatch, capsys, "--quick", "--skip", "a,b")
    assert out["procs16_vs_4_peer_rounds"] is None, out
    assert out["procs4_finished"] == finished4 and out["procs16_finished"] == finished16
    for n, finished in ((4, finished4), (16, finished16)):
        assert (out[f"procs{n}_rounds_per_s"] is None) == (finished < n), out


def test_part_c_ratio_when_every_peer_finished(bs, monkeypatch, capsys):
    # 4 processes: 100 rounds each in the 5 s window (20/s); 16: 50 each (10/s)
    monkeypatch.setattr(bs, "subprocess", FakePeers(lambda n, r: fine(100 if n == 4 else 50)))
    monkeypatch.setattr(bs, "Controller", FakeController)
    out = run_main(bs, monkeypatch, capsys, "--quick", "--skip", "a,b")
    assert out["procs4_rounds_per_s"] == 20.0 and out["procs16_rounds_per_s"] == 10.0
    assert out["procs16_vs_4_peer_rounds"] == 2.0   # 16 × 10 / (4 × 20)
    assert out["procs4_finished"] == 4 and out["procs16_finished"] == 16


def test_peer_summary(bs):
    s = bs.peer_summary(4, [fine(50), fine(50), FAILED], 5.0)
    assert s["finished"] == 2 and s["rounds_per_s"] is None and s["ok_share"] == 1.0
    assert "1 of 4 peers wrote no result" in s["errors"] and "PeerTimeout: no view" in s["errors"]
    none = bs.peer_summary(4, [FAILED] * 4, 5.0)
    assert none["rounds_per_s"] is None and none["ok_share"] is None and none["late_s"] is None
    assert bs.peer_summary(2, [fine(50), fine(30)], 5.0)["rounds_per_s"] == 8.0
