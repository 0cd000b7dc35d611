"""swarm across real network boundaries: one network namespace per host.

The module builds a small LAN out of Linux network namespaces: a bridge in a
namespace of its own, a coordinator host (10.213.0.1) and four peer hosts
(10.213.0.10-13), each joined to the bridge by a veth pair whose host end is
``eth0``. Every process runs inside its host's namespace through
``ip netns exec``, so all swarm traffic crosses veths and the bridge, and
nothing is reachable from (or reaches) the machine's own network.

Three tests share the LAN and its coordinator:

* ``swarm peer`` processes form a ring; one host's link goes down; the
  coordinator declares it dead and the others re-link; the link comes back and
  the host re-joins.
* gossip hosts (``gossip_host.py``) reach consensus across the namespaces; one is
  cut off mid-run and the survivors keep gossiping and agree.
* one host's egress is shaped with ``tc ... tbf rate 100mbit``: dense gossip of
  a 1 MB vector makes that host fall behind (fewer rounds in the same time),
  int8-compressed gossip keeps it in step.

Skipped, with the reason, where namespaces cannot be made (not root, no
iproute2, no permission in a container). Everything made here is deleted in a
``finally``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from swarmtest import wait_for as _wait_for

ROOT = Path(__file__).resolve().parents[2]
HOST_SCRIPT = Path(__file__).with_name("gossip_host.py")
SUBNET = "10.213.0"
COORD_ADDR = f"{SUBNET}.1"
COORD_PORT = 5555
COORD = f"tcp://{COORD_ADDR}:{COORD_PORT}"
N_HOSTS = 4

pytestmark = pytest.mark.timeout(240)


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=30)


def _netns_unusable() -> str | None:
    """Why this machine cannot run the test, or None. Tries the real thing."""
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    if shutil.which("tc") is None:
        return "`tc` (iproute2) is not installed"
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"swprobe{uuid.uuid4().hex[:6]}"
    try:
        r = _run("ip", "netns", "add", probe, check=False)
        if r.returncode != 0:
            return f"`ip netns add` failed: {r.stderr.strip()}"
        for argv in (("ip", "-n", probe, "link", "add", "br0", "type", "bridge"),
                     ("ip", "-n", probe, "link", "add", "a0", "type", "veth", "peer", "name", "b0"),
                     ("tc", "-n", probe, "qdisc", "add", "dev", "a0", "root", "tbf", "rate", "100mbit",
                      "burst", "32kbit", "latency", "50ms")):
            r = _run(*argv, check=False)
            if r.returncode != 0:
                return f"`{' '.join(argv)}` failed: {r.stderr.strip()}"
    finally:
        _run("ip", "netns", "del", probe, check=False)
    return None


class Lab:
    """Network namespaces on one bridge, and the processes started inside them.

    Namespace names carry a random tag so that concurrent runs never collide;
    ``close`` ends every process by its handle and deletes every namespace
    (which deletes the veths and the bridge inside them).
    """

    def __init__(self, tmp: Path) -> None:
        self.tag = uuid.uuid4().hex[:6]
        self.tmp = tmp
        self.namespaces: list[str] = []
        self.procs: list[subprocess.Popen] = []
        self.bridge_ns = self._netns("br")
        self.ip("link", "add", "br0", "type", "bridge", ns=self.bridge_ns)
        self.ip("link", "set", "br0", "up", ns=self.bridge_ns)
        self.hosts: dict[str, tuple[str, str]] = {}   # host name -> (namespace, address)

    def _netns(self, name: str) -> str:
        ns = f"sw{self.tag}-{name}"
        _run("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        self.ip("link", "set", "lo", "up", ns=ns)
        return ns

    def ip(self, *args: str, ns: str) -> str:
        return _run("ip", "-n", ns, *args).stdout

    def tc(self, *args: str, host: str) -> str:
        return _run("tc", "-n", self.hosts[host][0], *args).stdout

    def add_host(self, name: str, addr: str) -> None:
        """A namespace with ``eth0`` = ``addr``/24, its veth peer on the bridge."""
        ns = self._netns(name)
        port = f"v{len(self.hosts)}"
        # Both ends are created straight inside their namespaces: nothing ever
        # appears in the machine's own namespace.
        _run("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port,
             "netns", self.bridge_ns)
        self.ip("link", "set", port, "master", "br0", ns=self.bridge_ns)
        self.ip("link", "set", port, "up", ns=self.bridge_ns)
        self.ip("addr", "add", f"{addr}/24", "dev", "eth0", ns=ns)
        self.ip("link", "set", "eth0", "up", ns=ns)
        self.hosts[name] = (ns, addr)

    def link(self, host: str, up: bool) -> None:
        """Set the host side of ``host``'s link up or down."""
        self.ip("link", "set", "eth0", "up" if up else "down", ns=self.hosts[host][0])

    def start(self, host: str, argv: list[str], name: str) -> subprocess.Popen:
        """Run ``argv`` inside ``host``'s namespace (``ip netns exec`` execs it, so
        the handle's pid is the program's own)."""
        log = open(self.tmp / f"{name}.log", "w")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        p = subprocess.Popen(["ip", "netns", "exec", self.hosts[host][0], *argv], stdout=log,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT, env=env)
        log.close()
        p.log_path = self.tmp / f"{name}.log"  # type: ignore[attr-defined]
        self.procs.append(p)
        return p

    def swarm(self, host: str, *args: str, name: str) -> subprocess.Popen:
        return self.start(host, [sys.executable, "-m", "swarm.cli", *args], name)

    def status(self) -> dict:
        """`swarm status --json`, run inside the coordinator's namespace."""
        r = subprocess.run(["ip", "netns", "exec", self.hosts["coord"][0], sys.executable, "-m", "swarm.cli",
                            "status", "--coordinator", COORD, "--json", "--timeout", "2"],
                           capture_output=True, text=True, cwd=ROOT, timeout=30)
        if r.returncode != 0:
            raise AssertionError(f"swarm status failed: {r.stderr.strip()}")
        return json.loads(r.stdout)

    def end(self, procs: list[subprocess.Popen], grace: float = 5.0) -> None:
        """SIGTERM each (still running) process, then SIGKILL what is left after ``grace``."""
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        for p in procs:
            try:
                p.wait(max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def close(self) -> None:
        try:
            self.end(self.procs, grace=3.0)
        finally:
            for ns in reversed(self.namespaces):
                _run("ip", "netns", "del", ns, check=False)
            self.namespaces.clear()


def _log(p: subprocess.Popen) -> str:
    try:
        return Path(p.log_path).read_text()[-3000:]  # type: ignore[attr-defined]
    except OSError:
        return "(no log)"


def wait_for(pred, timeout: float, what: str, interval: float = 0.1):
    return _wait_for(pred, timeout, interval, what)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The LAN: a coordinator host and four peer hosts on one bridge, a coordinator running."""
    why = _netns_unusable()
    if why:
        pytest.skip(f"cannot create network namespaces here: {why}")
    lab = Lab(tmp_path_factory.mktemp("netns"))
    try:
        lab.add_host("coord", COORD_ADDR)
        for i in range(N_HOSTS):
            lab.add_host(f"h{i}", f"{SUBNET}.{10 + i}")
        coord = lab.swarm("coord", "coordinator", "--bind", COORD, name="coordinator")
        wait_for(lambda: lab.status(), 30, "the coordinator to answer inside its namespace")
        lab.coordinator = coord  # type: ignore[attr-defined]
        yield lab
        assert coord.poll() is None, f"the coordinator died:\n{_log(coord)}"
    finally:
        lab.close()


def _alive(st: dict) -> dict[str, dict]:
    return {m["id"]: m for m in st["members"] if m["state"] == "alive"}


def _view_ids(st: dict) -> list[str]:
    return sorted(m[0] if isinstance(m, list) else m["id"] for m in st["view"]["members"])


def _ring_ok(st: dict, ids: list[str]) -> bool:
    """The view holds exactly ``ids`` (ordered by rank), each linked at the current
    epoch with its two ring neighbours."""
    if _view_ids(st) != sorted(ids):
        return False
    rows = _alive(st)
    n = len(ids)
    for i, pid in enumerate(ids):
        row = rows.get(pid)
        if row is None or row["linked_epoch"] != st["epoch"]:
            return False
        want = {ids[(i - 1) % n], ids[(i + 1) % n]} - {pid}
        if set(row["neighbours"]) != want:
            return False
    return True


def test_peers_form_a_ring_across_hosts_and_relink_when_one_is_cut_off(lab: Lab):
    ids = [f"cli{i}" for i in range(N_HOSTS)]
    peers = [lab.swarm(f"h{i}", "peer", "--coordinator", COORD, "--bind", f"tcp://{SUBNET}.{10 + i}:*",
                       "--id", ids[i], "--rank", str(i), "--topology", "ring", name=f"cli{i}")
             for i in range(N_HOSTS)]
    try:
        st = wait_for(lambda: _ring_ok(s := lab.status(), ids) and s, 30, "a linked 4-ring")
        rows = _alive(st)
        for i, pid in enumerate(ids):
            # each peer advertises its own host's address: links cross the bridge
            assert rows[pid]["addr"].startswith(f"tcp://{SUBNET}.{10 + i}:"), rows[pid]
        epoch = st["epoch"]

        lab.link("h3", up=False)
        t_cut = time.monotonic()
        st = wait_for(lambda: _ring_ok(s := lab.status(), ids[:3]) and s, 20, "the 3 survivors to re-link")
        relink_s = time.monotonic() - t_cut
        assert st["epoch"] > epoch
        assert {m["id"]: m["state"] for m in st["members"]}["cli3"] == "dead"
        assert all(p.poll() is None for p in peers[:3]), "a survivor exited"

        # The host comes back: its peer is told to re-join, and the ring closes again.
        lab.link("h3", up=True)
        t_up = time.monotonic()
        wait_for(lambda: _ring_ok(lab.status(), ids), 30, "the returning host to re-join the ring")
        print(f"\nnetns ring: cut-off detected and re-linked in {relink_s:.2f} s, "
              f"re-joined {time.monotonic() - t_up:.2f} s after the link came back")
    finally:
        lab.link("h3", up=True)
        lab.end(peers)
    # SIGTERM makes a peer leave cleanly and exit 0
    assert [p.returncode for p in peers] == [0] * N_HOSTS, [_log(p) for p in peers]


def _rounds(path: Path) -> list[dict]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:   # a line still being written
            pass
    return out


def _start_hosts(lab: Lab, hosts: list[int], prefix: str, out: Path, **opts) -> list[subprocess.Popen]:
    # The coordinator is shared by the module: the previous test's peers must be out
    # of its table first, or a new host's rank is still held by one of them.
    wait_for(lambda: not _alive(lab.status()), 20, "the previous test's peers to leave the table")
    args = [f"--{k.replace('_', '-')}={v}" for k, v in opts.items()]
    return [lab.start(f"h{i}", [sys.executable, str(HOST_SCRIPT), "--coordinator", COORD,
                                "--bind", f"tcp://{SUBNET}.{10 + i}:*", "--id", f"{prefix}{i}",
                                "--rank", str(i), "--n", str(len(hosts)), "--out", str(out), *args],
                      name=f"{prefix}{i}")
            for i in hosts]


def _go(procs: list[subprocess.Popen], ids: list[str], out: Path) -> float:
    """Wait until every host is linked and ready, then start them together."""
    def ready() -> bool:
        for p in procs:
            assert p.poll() is None, f"a gossip host exited early:\n{_log(p)}"
        return all((out / f"{i}.ready").exists() for i in ids)

    wait_for(ready, 60, "gossip hosts to join and link")
    (out / "go").write_text("")
    return time.time()


def _stop(lab: Lab, procs: list[subprocess.Popen], out: Path, timeout: float = 15.0) -> None:
    (out / "stop").write_text("")
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.01, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    lab.end(procs, grace=2.0)


def test_gossip_reaches_consensus_across_hosts_and_survives_a_cut(lab: Lab, tmp_path: Path):
    ids = [f"g{i}" for i in range(N_HOSTS)]
    procs = _start_hosts(lab, list(range(N_HOSTS)), "g", tmp_path, d=1000, sync="lockstep", pace=0.02)
    try:
        _go(procs, ids, tmp_path)
        # 4-ring, exact gossip: the consensus error shrinks by ρ = 1/3 per round
        wait_for(lambda: all(len(r := _rounds(tmp_path / f"{i}.rounds.jsonl")) >= 15 and r[-1]["err"] < 1e-3
                             for i in ids), 30, "consensus among the 4 hosts")
        before = {i: _rounds(tmp_path / f"{i}.rounds.jsonl") for i in ids}
        for i in ids:
            # every round averaged with both ring neighbours on other hosts, bytes crossed
            assert all(len(r["p"]) == 2 and r["out"] > 0 for r in before[i][1:15]), before[i][:15]

        lab.link("h3", up=False)
        st = wait_for(lambda: _ring_ok(s := lab.status(), ids[:3]) and s, 20, "the survivors to re-link")
        assert {m["id"]: m["state"] for m in st["members"]}["g3"] == "dead"
        n_at_cut = {i: len(_rounds(tmp_path / f"{i}.rounds.jsonl")) for i in ids[:3]}

        def survivors_go_on() -> bool:
            for i in ids[:3]:
                after = [r for r in _rounds(tmp_path / f"{i}.rounds.jsonl")[n_at_cut[i]:]
                         if r["epoch"] >= st["epoch"]]
                others = set(ids[:3]) - {i}
                if sum(r["ok"] and set(r["p"]) == others for r in after) < 10:
                    return False
            return True

        wait_for(survivors_go_on, 30, "10 rounds among the survivors after the cut")
        _stop(lab, procs[:3], tmp_path)
        assert [p.returncode for p in procs[:3]] == [0, 0, 0], [_log(p) for p in procs[:3]]
        xs = np.stack([np.load(tmp_path / f"{i}.npy") for i in ids[:3]])
        spread = float(np.abs(xs - xs.mean(axis=0)).max())
        assert spread < 1e-4 * float(np.abs(xs).mean()), f"survivors disagree by {spread}"
    finally:
        lab.link("h3", up=True)
        lab.end(procs, grace=2.0)


#: seconds each shaped run gossips, and the warm-up left out of the rates (queues fill:
#: the shaped host's rounds settle to their rate within its first second)
SHAPED_RUN_S = 5.5
WARMUP_S = 1.5


def _shaped_run(lab: Lab, out: Path, prefix: str, codec: str, gamma: float) -> dict:
    """Three hosts on a ring, h0's egress shaped; async gossip of a 1 MB vector at a
    paced ~15 rounds/s. Returns rounds/s per host in the window after warm-up."""
    out.mkdir()
    ids = [f"{prefix}{i}" for i in range(3)]
    procs = _start_hosts(lab, [0, 1, 2], prefix, out, d=250_000, codec=codec, gamma=gamma, sync="async",
                         pace=0.06, link_timeout=2.0)
    try:
        t0 = _go(procs, ids, out)
        time.sleep(SHAPED_RUN_S)
        _stop(lab, procs, out)
    finally:
        lab.end(procs, grace=2.0)
    lo, hi = t0 + WARMUP_S, t0 + SHAPED_RUN_S
    fig: dict = {"codec": codec, "gamma": gamma}
    for i in ids:
        rs = [r for r in _rounds(out / f"{i}.rounds.jsonl") if lo <= r["t"] < hi]
        assert rs, f"{i} ran no round in the window:\n{_log(procs[ids.index(i)])}"
        fig[i] = {"rounds_per_s": len(rs) / (hi - lo),
                  "mb_out_per_s": sum(r["out"] for r in rs) / (hi - lo) / 1e6,
                  "dropped": sum(r["drop"] for r in rs)}
    # how many rounds behind its neighbours' copies of the shaped host are
    seen = [r["st"][ids[0]] for i in ids[1:] for r in _rounds(out / f"{i}.rounds.jsonl")
            if lo <= r["t"] < hi and ids[0] in r["st"]]
    fig["staleness_of_shaped"] = statistics.mean(seen) if seen else None
    # views seen during the run: more than one means somebody was declared dead (the
    # window ends before the stop, when the hosts leave and the view changes anyway)
    fig["views"] = len({r["epoch"] for i in ids for r in _rounds(out / f"{i}.rounds.jsonl") if r["t"] < hi})
    return fig


def test_shaped_link_compressed_gossip_keeps_pace_dense_falls_behind(lab: Lab, tmp_path: Path):
    lab.tc("qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "100mbit", "burst", "32kbit",
           "latency", "50ms", host="h0")
    try:
        dense = _shaped_run(lab, tmp_path / "dense", "d", "identity", 1.0)
        comp = _shaped_run(lab, tmp_path / "int8", "q", "int8", 0.6)   # γ per docs/gossip.md
        shaped_stats = lab.tc("-s", "qdisc", "show", "dev", "eth0", host="h0")
    finally:
        lab.tc("qdisc", "del", "dev", "eth0", "root", host="h0")

    def ratio(fig: dict, p: str) -> float:
        others = statistics.mean(fig[f"{p}{i}"]["rounds_per_s"] for i in (1, 2))
        return fig[f"{p}0"]["rounds_per_s"] / others

    print(f"\nshaped link (h0 egress, tbf 100mbit), async gossip, d = 250000:\n"
          f"  dense: {json.dumps(dense)}\n  int8:  {json.dumps(comp)}\n"
          f"  shaped host's rounds/s relative to the others: dense {ratio(dense, 'd'):.2f}, "
          f"int8 {ratio(comp, 'q'):.2f}\n{shaped_stats}")
    # A congested link is slow, not dead: the coordinator kept the shaped host.
    assert dense["views"] == 1 and comp["views"] == 1, (dense, comp)
    # The link really is shaped: the dense host cannot send faster than 100 Mbit/s.
    assert dense["d0"]["mb_out_per_s"] < 100e6 / 8 / 1e6 * 1.25, dense
    # Dense gossip needs ~2 MB per round from h0 (at most ~6 rounds/s through the
    # link): it falls behind the unshaped hosts, and its neighbours mix copies of
    # it that are many rounds old. (Thresholds leave room for a loaded machine,
    # which slows the unshaped hosts and so narrows the gap.)
    assert ratio(dense, "d") < 0.7, dense
    assert dense["staleness_of_shaped"] > 5, dense
    # int8 needs ~0.5 MB per round: h0 keeps the others' pace, its copies stay fresh.
    assert ratio(comp, "q") > 0.85, comp
    assert comp["staleness_of_shaped"] < 5, comp
    assert comp["q0"]["rounds_per_s"] > 1.5 * dense["d0"]["rounds_per_s"], (dense, comp)
