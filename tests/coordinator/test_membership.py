"""Membership with real processes on loopback: join, topologies, leave, crash, freeze."""

from __future__ import annotations

import os
import signal
import time

import pytest
import zmq
from swarmtest import free_port, freeze, status, wait_for

from swarm import wire
from swarm.gossip.topology import neighbours as topo_neighbours
from swarm.gossip.topology import within


def start_swarm(procs, n: int, topology: str = "ring", extra: tuple[str, ...] = (), edges=None):
    addr = f"tcp://127.0.0.1:{free_port()}"
    coord = procs.coordinator(addr)
    peers = {}
    if edges:
        extra = (*extra, "--set", f"peer.edges={edges}")
    for i in range(n):
        peers[f"p{i}"] = procs.start("peer", "--coordinator", addr, "--id", f"p{i}",
                                     "--topology", topology, *extra, name=f"p{i}")
    settled(addr, n, topology, edges=edges)
    return addr, coord, peers


def settled(addr: str, n: int, topology: str = "ring", timeout: float = 20.0, edges=None) -> dict:
    """Wait until the view has n members, each linked at the current epoch and
    reporting exactly the neighbours its topology gives it."""

    def ok():
        st = status(addr)
        view = [m[0] for m in st["view"]["members"]]
        if len(view) != n:
            return False
        rows = {r["id"]: r for r in st["members"] if r["state"] == "alive"}
        for pos, pid in enumerate(view):
            r = rows.get(pid)
            if r is None or r["linked_epoch"] != st["epoch"]:
                return False
            want = {view[j] for j in topo_neighbours(topology, n, pos, edges=edges)}
            if set(r["neighbours"]) != want:
                return False
        return st

    return wait_for(ok, timeout, what=f"{n} peers linked as a {topology}")


@pytest.mark.parametrize("topology", ["ring", "grid"])
def test_eight_peers_form_topology(procs, topology):
    addr, _, _ = start_swarm(procs, 8, topology)
    st = status(addr)
    assert sorted(m[2] for m in st["view"]["members"]) == list(range(8))   # ranks 0..7, no gaps
    degrees = sorted(len(r["neighbours"]) for r in st["members"])
    if topology == "ring":
        assert degrees == [2] * 8
    else:   # 3 columns, rows of 3, 3, 2: one centre peer has 4 neighbours
        assert degrees == [2, 2, 2, 2, 2, 3, 3, 4]


def test_custom_topology_links_the_edges_given(procs):
    edges = [[0, 1], [1, 2], [2, 3], [3, 0], [0, 2]]
    addr, _, peers = start_swarm(procs, 4, "custom", edges=edges)
    st = status(addr)
    degrees = sorted(len(r["neighbours"]) for r in st["members"])
    assert degrees == [2, 2, 3, 3]
    # the views of 1-3 members while the others were joining were taken, not refused
    assert not any("malformed" in procs.log(p) for p in peers.values())
    # one leaves: the three left link the edges among their positions
    peers["p3"].send_signal(signal.SIGTERM)
    assert peers["p3"].wait(5) == 0
    settled(addr, 3, "custom", edges=within(edges, 3))


@pytest.mark.parametrize("args, message", [
    (("--topology", "foo"), "peer.topology = 'foo': unknown; choose one of ring"),
    (("--topology", "custom"), "peer.edges: topology = custom needs an edge list"),
    (("--rank", "-5"), "peer.rank = -5: must be in -1..2147483647"),
    (("--resume", "x"), "--resume is used with --spec"),
])
def test_bad_peer_settings_are_refused_at_start(procs, args, message):
    p = procs.start("peer", "--coordinator", f"tcp://127.0.0.1:{free_port()}", *args, name="bad")
    assert p.wait(20) == 2
    log = procs.log(p)
    assert message in log and "Traceback" not in log


def test_graceful_leave_relinks(procs):
    addr, _, peers = start_swarm(procs, 4)
    e0 = status(addr)["epoch"]
    peers["p2"].send_signal(signal.SIGTERM)
    assert peers["p2"].wait(5) == 0
    st = settled(addr, 3)
    assert st["epoch"] > e0
    row = next(r for r in st["members"] if r["id"] == "p2")
    assert row["state"] == "dead" and row["cause"] == "left"
    assert "leaving" in procs.log(peers["p2"])


def test_kill9_detected_and_relinked(procs):
    addr, _, peers = start_swarm(procs, 6)
    peers["p3"].kill()
    peers["p3"].wait()
    # settled's deadline decides: how fast the death is found is scripts/bench_failover.py's
    # to measure, as a time limit in a unit test fails on a loaded machine alone
    st = settled(addr, 5, timeout=5)
    row = next(r for r in st["members"] if r["id"] == "p3")
    assert row["state"] == "dead"


def test_sigstop_detected_then_rejoins(procs):
    addr, _, peers = start_swarm(procs, 5)
    pid = peers["p1"].pid
    freeze(pid)
    try:
        st = settled(addr, 4, timeout=5)   # its deadline is the check (see test_kill9_detected_and_relinked)
        assert next(r for r in st["members"] if r["id"] == "p1")["state"] == "dead"
    finally:
        os.kill(pid, signal.SIGCONT)
    # thawed, it notices it was dropped and joins again
    settled(addr, 5, timeout=10)


def test_duplicate_id_refused(procs):
    addr, _, peers = start_swarm(procs, 2)
    dup = procs.start("peer", "--coordinator", addr, "--id", "p0", name="dup")
    assert dup.wait(10) == 2
    assert "already alive" in procs.log(dup)
    st = settled(addr, 2)
    assert {m[0] for m in st["view"]["members"]} == {"p0", "p1"}
    assert peers["p0"].poll() is None


JUNK_ADDRS = ["nonsense", "tcp://h:abc", "tcp://h:0", "tcp://h:70000", "tcp://:5", "tcp://*:5",
              "ipc:///tmp/swarm-junk", "tcp://" + "a" * 10_000 + ":5", 5, None,
              # review 45: welcomed, and every neighbour failed to link (libzmq's connect()
              # refuses the first three; nothing answers at the others)
              "tcp://-x:5", "tcp://_:5", "tcp://.:5", "tcp://999.1.1.1:5", "tcp://1.2.3.4.5:5"]


def test_a_join_with_a_junk_addr_is_refused(procs):
    # a client that skips the peer.advertise check: its neighbours died of the address
    addr, _, peers = start_swarm(procs, 1)
    st0 = status(addr)
    d = zmq.Context.instance().socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.setsockopt(zmq.RCVTIMEO, 10_000)
    d.connect(addr)

    def join(pid: str, member_addr) -> wire.Message:
        body = {"rank": -1, "inc": 7, "last_epoch": 50, **({} if member_addr is None else {"addr": member_addr})}
        d.send_multipart(wire.encode("join", pid, body=body))
        while (msg := wire.decode(d.recv_multipart())).t == "view":
            pass
        return msg

    try:
        for i, junk in enumerate(JUNK_ADDRS):
            msg = join(f"junk{i}", junk)
            assert msg.t == "refuse", (junk, msg)
            assert "is not tcp://HOST:PORT with a port in 1..65535" in msg.body["reason"]
            assert len(msg.body["reason"]) < 300
        # refused before the table: no member, no epoch taken from last_epoch, and counted
        st = status(addr)
        assert [m[0] for m in st["view"]["members"]] == ["p0"]
        assert {r["id"] for r in st["members"]} == {"p0"}
        assert st["epoch"] == st0["epoch"] and st["malformed"] == len(JUNK_ADDRS)
        assert join("good", "tcp://127.0.0.1:9").t == "welcome"    # the coordinator still serves
        wait_for(lambda: len(status(addr)["view"]["members"]) == 2, 10, what="good in the view")
    finally:
        d.close(0)
    time.sleep(0.5)     # p0 goes on, with good (which does not answer) as its neighbour
    assert peers["p0"].poll() is None, procs.log(peers["p0"])


def test_no_coordinator_clear_error(procs):
    # a `< 8 s` limit on the exit failed on a loaded machine alone: the wait's deadline
    # decides whether the peer gives up (how fast is not a unit test's to measure)
    addr = f"tcp://127.0.0.1:{free_port()}"
    p = procs.start("peer", "--coordinator", addr, "--set", "peer.join_timeout_s=1.0", name="lonely")
    assert p.wait(20) == 2
    assert "no coordinator answered" in procs.log(p)


def test_status_json_lists_members(procs):
    addr, _, _ = start_swarm(procs, 3)
    import json
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "swarm.cli", "status", "--coordinator", addr, "--json"],
                         capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    st = json.loads(out.stdout)
    assert {r["id"] for r in st["members"]} == {"p0", "p1", "p2"}
    for r in st["members"]:
        assert {"addr", "rank", "state", "heartbeat_age_s", "neighbours"} <= set(r)
    table = subprocess.run([sys.executable, "-m", "swarm.cli", "status", "--coordinator", addr],
                           capture_output=True, text=True, timeout=20).stdout
    assert "p0" in table and "alive" in table
    # several addresses: the first that answers
    silent = f"tcp://127.0.0.1:{free_port()}"
    out = subprocess.run([sys.executable, "-m", "swarm.cli", "status", "--coordinator", f"{silent},{addr}",
                          "--json", "--timeout", "0.5"], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["coordinator"] == addr


@pytest.mark.parametrize("args, message", [
    (("--timeout", "-1"), "--timeout must be > 0"),
    (("--timeout", "nan"), "--timeout must be > 0"),
    (("--watch", "--interval", "0"), "--interval must be > 0"),
    (("--coordinator", "tcp://127.0.0.1:99999"), "with a port in 1..65535"),
    (("--watch", "--coordinator", "foo"), "--coordinator 'foo': 'foo' is not tcp://HOST:PORT"),
    (("--coordinator", "tcp://127.0.0.1:abc"), "is not tcp://HOST:PORT"),
])
def test_bad_status_arguments_are_refused(args, message):
    import subprocess
    import sys
    if "--coordinator" not in args:
        args = ("--coordinator", f"tcp://127.0.0.1:{free_port()}", *args)
    out = subprocess.run([sys.executable, "-m", "swarm.cli", "status", *args],
                         capture_output=True, text=True, timeout=20)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr


def test_replace_takes_over_a_dead_identity(procs):
    addr, _, peers = start_swarm(procs, 3)
    st = status(addr)
    rank = next(r["rank"] for r in st["members"] if r["id"] == "p1")
    # while p1 lives, a replacement is refused
    early = procs.start("peer", "--coordinator", addr, "--replace", "p1", name="early")
    assert early.wait(10) == 2 and "already alive" in procs.log(early)
    peers["p1"].kill()
    peers["p1"].wait()
    settled(addr, 2, timeout=5)
    procs.start("peer", "--coordinator", addr, "--replace", "p1", name="p1bis")
    st = settled(addr, 3)
    row = next(r for r in st["members"] if r["id"] == "p1" and r["state"] == "alive")
    assert row["rank"] == rank          # the same role: same rank, same place in the ring
