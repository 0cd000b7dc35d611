"""Scale benchmark: one coordinator with 1,000 members; 256 in-process peers; 16 vs 4 peer processes.

(a) A real ``swarm coordinator`` process and 1,000 simulated members: a few
    worker processes each hold hundreds of DEALER sockets that speak the wire
    protocol (join, heartbeat at 4 Hz with the figures peers send, probe_ack,
    re-join). A controller member joins and leaves every ``--churn-s``; each
    change bumps the epoch, and every worker stamps when each of its members
    receives the new view. View propagation = receipt time − the time the
    change was sent (CLOCK_MONOTONIC is shared by processes). Coordinator CPU
    comes from /proc/<pid>/stat (all its threads) over a quiet window of
    heartbeats only, and over the churn window. Anchor in the same run: raw
    pyzmq, the controller's ROUTER fanning one message out to the same 1,000
    members, of the size the coordinator sent them on a change (the mean of the
    view messages the members received in the churn window, ``view_msg_bytes``:
    the change alone to members that held the view, not the whole view,
    ``view_full_bytes``); the floor any coordinator in Python+ZeroMQ meets;
    ``view_p99_vs_anchor``: swarm's view p99 / the anchor's p99.
(b) 256 peers in one process on swarm.gossip.sim's SimHub gossiping d = 1e5
    on a ring and a torus: rounds/s (whole-swarm rounds) and memory per peer
    (RSS growth / peers). Anchor: a bare numpy exact-gossip step on the same
    256×d matrix with W applied sparsely (each row: the peer and its 2 or 4
    neighbours, weighted), warmed up and timed over at least 0.2 s
    (``inproc_<topology>_vs_numpy``: swarm's rounds/s / numpy's; null unless
    ``inproc_<topology>_ok``, every round of every peer went through).
(c) 16 peer processes (real Peers over ZeroMQ + a coordinator) gossiping
    d = 1e5 on a ring (bounded staleness 1) on this machine's cores, against 4
    (``procs16_vs_4_peer_rounds``: peer-rounds/s of 16 / of 4; null, like
    ``procs<n>_rounds_per_s``, unless all ``procs<n>_peers`` of both finished:
    ``procs<n>_finished``).

Targets (issue 8): view p99 ≤ 100 ms with coordinator CPU ≤ 25 % of a core at
1,000 members; 256 in-process peers run. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np
import zmq

from swarm.checks import finite_arg
from swarm.scripting import run_script

ROOT = Path(__file__).resolve().parents[1]
HZ = os.sysconf("SC_CLK_TCK")
#: how long (a) waits for the view to hold every member (start-up of the simulating
#: workers on busy cores is most of it; the time it took is reported)
FORM_S = 90.0
#: the longest --quiet-s and --churn-s (a day): time.sleep refuses much longer waits
MAX_WAIT_S = 86_400.0


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds per thread of a process, by thread name (libzmq's IO thread is ZMQbg/IO/0)."""
    out: dict[str, float] = {}
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (t / "comm").read_text().strip()
            f = (t / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        key = "zmq_io" if name.startswith("ZMQbg/IO") else "python" if t.name == str(pid) else "other"
        out[key] = out.get(key, 0.0) + (int(f[11]) + int(f[12])) / HZ
    return out


def pct(a: list[float], q: float) -> float | None:
    """The q-th percentile, None (null in the JSON line) for no values."""
    return float(np.percentile(np.asarray(a), q)) if a else None


def fmt_ms(x: float | None) -> str:
    """A latency for the tables: '-' when there is none."""
    return f"{x:8.1f}" if x is not None else f"{'-':>8}"


def fmt_num(x: float | None, width: int, digits: int) -> str:
    """A figure for the tables, right-aligned: '-' when there is none."""
    return f"{x:{width}.{digits}f}" if x is not None else f"{'-':>{width}}"


def rnd(x: float | None, digits: int = 2) -> float | None:
    return None if x is None else round(x, digits)


# =================================================================== (a) coordinator

def _header(frames: list[bytes]) -> dict:
    return msgpack.unpackb(frames[0], raw=False, strict_map_key=False)


def _peek(frame: bytes) -> dict:
    """The header's keys up to ``body`` only: a view's member list (tens of kB at
    1,000 members) is not decoded, so the simulated members stay cheap."""
    u = msgpack.Unpacker(raw=False)
    u.feed(frame)
    out = {}
    for _ in range(u.read_map_header()):
        k = u.unpack()
        if k == "body":
            break
        out[k] = u.unpack()
    return out


def worker(args: argparse.Namespace) -> None:
    """Members ``first .. first+count-1``: join, heartbeat, stamp every new view."""
    from swarm import wire
    from swarm.peer.peer import HEARTBEAT_STATS_S

    stats_s = HEARTBEAT_STATS_S if args.stats_s is None else args.stats_s
    ctx = zmq.Context(io_threads=1)
    ids = [f"m{i:05d}" for i in range(args.first, args.first + args.count)]
    inc = [random.getrandbits(62) for _ in ids]
    socks = []
    for _ in ids:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 100)
        s.connect(args.coord)
        socks.append(s)
    idx = {s: k for k, s in enumerate(socks)}
    epoch = [0] * len(ids)
    seen: dict[int, list[float]] = {}     # epoch -> receipt times
    sizes: dict[int, list[int]] = {}      # epoch -> bytes of the view messages that brought it
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)

    dropped = [0]

    def send(k: int, frames: list) -> None:
        try:   # like a peer: nothing queues for a coordinator that cannot take it now
            socks[k].send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            dropped[0] += 1

    def join(k: int) -> None:
        send(k, wire.encode("join", ids[k], body={
            "addr": f"tcp://127.0.0.1:{10000 + args.first + k}", "rank": args.first + k, "inc": inc[k],
            "last_epoch": epoch[k]}))

    for k in range(len(ids)):
        join(k)
    period = 1.0 / args.hz
    rng = random.Random(args.first)
    offset = sorted((rng.random() * period, k) for k in range(len(ids)))
    lap, p = time.monotonic(), 0
    steps = [0] * len(ids)
    stats_at = [0.0] * len(ids)
    sent = with_stats = 0
    end = time.monotonic() + args.duration
    stop, stop_checked = Path(args.stop), 0.0
    views = 0
    while True:
        now = time.monotonic()
        if now > end:
            break
        if now - stop_checked > 0.5:    # the parent has measured what it needs
            stop_checked = now
            if stop.exists():
                break
        # heartbeats that are due, in a batch (one wake-up per few ms, not one per member)
        while now >= lap + offset[p][0]:
            k = offset[p][1]
            steps[k] += 25
            body = {"inc": inc[k], "linked": epoch[k]}
            if now - stats_at[k] >= stats_s:
                # as swarm.peer does: the figures once a second, bare liveness beats between;
                # the figures are those a peer under the experiment runner sends
                stats_at[k] = now
                with_stats += 1
                st = steps[k]
                body["stats"] = {
                    "msgs_in": st, "msgs_out": st, "bytes_in": 900 * st, "bytes_out": 900 * st,
                    "dropped_out": 0, "malformed": 0, "nbrs": [ids[k - 1], ids[(k + 1) % len(ids)]],
                    "env_steps": st, "episodes": st // 200, "mean_return": 0.5 * (st % 400), "rounds": st // 25,
                    "gossip_bytes_out": 40_000 * st, "gossip_bytes_in": 40_000 * st, "disagreement": 1e-3,
                    "eval_return": None, "buffer_size": min(st, 100_000), "budget": 10_000_000, "done": False,
                    "codec_ratio": 0.0102, "staleness": st % 2, "last_error": ""}
            send(k, wire.encode("heartbeat", ids[k], epoch=epoch[k], body=body))
            sent += 1
            p += 1
            if p == len(offset):
                # a starved worker does not burst to catch up (a peer's timer does not
                # either): beats more than a period late are skipped, and the achieved
                # rate is measured at the coordinator
                p, lap = 0, max(lap + period, now - period)
        wait = lap + offset[p][0] - time.monotonic()
        for s, _ in poller.poll(max(0, min(5.0, wait * 1000))):
            k = idx[s]
            while True:
                try:
                    frames = s.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                t_recv = time.monotonic()
                h = _peek(frames[0])
                t = h.get("t")
                if t == "view":
                    e = h["epoch"]   # the coordinator sends a view under its own epoch
                    views += 1
                    if e > epoch[k]:
                        epoch[k] = e
                        seen.setdefault(e, []).append(t_recv)
                        sizes.setdefault(e, []).append(sum(len(f) for f in frames))
                elif t == "probe":
                    h = _header(frames)
                    send(k, wire.encode("probe_ack", ids[k], epoch=epoch[k],
                                        body={"nonce": h["body"]["nonce"], "inc": inc[k]}))
                elif t == "rejoin":
                    join(k)
    for s in socks:
        s.close(0)
    ctx.term()
    Path(args.out).write_text(json.dumps({"seen": {str(e): ts for e, ts in seen.items()},
                                          "sizes": {str(e): b for e, b in sizes.items()}, "views": views,
                                          "members": len(ids), "dropped": dropped[0],
                                          "sent": sent, "with_stats": with_stats}))


class CoordinatorExited(RuntimeError):
    """The coordinator process of (a) ended while the bench needed it."""


def log_tail(path: str, lines: int = 15) -> str:
    """The last ``lines`` lines of a log, or why there are none."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        return f"(no log: {e.strerror})"
    return "\n".join(text.splitlines()[-lines:]) or "(empty)"


class Controller:
    """One extra member that joins and leaves on command, and asks for status.

    Given the coordinator's process and log, a wait for status ends as soon as that
    process exits, with its exit code and the end of its log (the log is in a
    temporary folder, removed as the error leaves the run)."""

    def __init__(self, coord: str, proc: subprocess.Popen | None = None, log: str | None = None) -> None:
        from swarm import wire

        self.wire = wire
        self.ctx = zmq.Context()
        self.coord = coord
        self.proc = proc
        self.log = log
        self.inc = 1
        self.sock: zmq.Socket | None = None

    def _log_end(self) -> str:
        return f"; the end of its log:\n{log_tail(self.log)}" if self.log else ""

    def _new(self) -> zmq.Socket:
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(self.coord)
        return s

    def status(self, timeout: float = 10.0) -> dict:
        s = self._new()
        try:
            s.send_multipart(self.wire.encode("status", "bench-ctl-status"))
            deadline = time.monotonic() + timeout
            while not s.poll(int(min(0.2, max(0.0, deadline - time.monotonic())) * 1000)):
                if self.proc is not None and self.proc.poll() is not None:
                    raise CoordinatorExited(f"the coordinator exited with code {self.proc.returncode}"
                                            + self._log_end())
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"the coordinator did not answer status within {timeout:g} s"
                                       + self._log_end())
            return _header(s.recv_multipart())["body"]
        finally:
            s.close(0)

    def join(self) -> float:
        self.inc += 1
        self.sock = self._new()
        time.sleep(0.05)   # connected before the clock starts
        t = time.monotonic()
        self.sock.send_multipart(self.wire.encode("join", "churn", body={
            "addr": "tcp://127.0.0.1:9", "rank": -1, "inc": self.inc, "last_epoch": 0}))
        return t

    def leave(self) -> float:
        t = time.monotonic()
        self.sock.send_multipart(self.wire.encode("leave", "churn", body={"inc": self.inc}))
        time.sleep(0.05)
        self.sock.close(0)
        self.sock = None
        return t


def raw_fanout_anchor(tmp: str, n_workers: int, per: int, size: int, rounds: int = 10) -> list[float]:
    """Raw pyzmq floor: a ROUTER sends one ``size``-byte message to each of n DEALERs in
    worker processes; latency from the first send to each receipt. The workers write
    their receipts into the folder ``tmp``."""
    port = free_port()
    code = r"""
import sys, time, json, zmq
addr, n, rounds, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ctx = zmq.Context(); socks = []
for i in range(n):
    s = ctx.socket(zmq.DEALER); s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.IDENTITY, f"{out[-6:]}-{i}".encode()); s.connect(addr); socks.append(s)
for s in socks: s.send(b"hi")
poller = zmq.Poller(); [poller.register(s, zmq.POLLIN) for s in socks]
got = []; deadline = time.monotonic() + 60
while len(got) < n * rounds and time.monotonic() < deadline:
    for s, _ in poller.poll(100):
        while True:
            try: s.recv(zmq.NOBLOCK)
            except zmq.Again: break
            got.append(time.monotonic())
json.dump(got, open(out, "w")); [s.close(0) for s in socks]; ctx.term()
"""
    ctx = zmq.Context()
    r = ctx.socket(zmq.ROUTER)
    r.setsockopt(zmq.LINGER, 0)
    r.setsockopt(zmq.SNDHWM, 100_000)
    r.bind(f"tcp://127.0.0.1:{port}")
    outs = [os.path.join(tmp, f"anchor{w:02d}.json") for w in range(n_workers)]
    procs = []
    try:
        # into procs one by one: a signal while they start (SIGTERM as SystemExit) leaves
        # none of those started behind
        for o in outs:
            procs.append(subprocess.Popen([sys.executable, "-c", code, f"tcp://127.0.0.1:{port}", str(per),
                                           str(rounds), o]))
        routes = []
        while len(routes) < n_workers * per:
            if r.poll(30_000):
                routes.append(r.recv_multipart()[0])
            else:
                break
        payload = os.urandom(size)
        sends = []
        for _ in range(rounds):
            time.sleep(0.2)
            sends.append(time.monotonic())
            for route in routes:
                r.send_multipart([route, payload])
        for p in procs:
            p.wait(90)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        r.close(0)
        ctx.term()
    lat = []
    got = sorted(t for o in outs if Path(o).exists() for t in json.loads(Path(o).read_text()))
    for t in got:   # each receipt belongs to the latest send before it
        t0 = max(s for s in sends if s <= t)
        lat.append((t - t0) * 1000)
    return lat


def anchor_message_bytes(sizes: list[int]) -> int | None:
    """The size of the anchor's fan-out message: the mean size of the view messages
    that brought the timed changes to the members (None when none arrived).

    On a change the coordinator sends a member that held the previous view only the
    change (~100 bytes), and the whole view (tens of kB at 1,000 members) only to
    members that never had one; the anchor sends what the members were sent."""
    return round(sum(sizes) / len(sizes)) if sizes else None


def end_all(procs: list[subprocess.Popen], coord: subprocess.Popen) -> None:
    """Kill the workers still running, then stop the coordinator (killed if it hangs)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    coord.terminate()
    try:
        coord.wait(5)
    except subprocess.TimeoutExpired:
        coord.kill()
        coord.wait()


def bench_coordinator(tmp: str, members: int, workers: int, hz: float, churn: int, churn_s: float,
                      quiet_s: float, coord_set: list[str] = ()) -> dict:
    """Part (a); the coordinator's log and the workers' results go into the folder ``tmp``."""
    port = free_port()
    addr = f"tcp://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log_path = os.path.join(tmp, "coord.log")
    with open(log_path, "w") as log:
        coord = subprocess.Popen([sys.executable, "-m", "swarm.cli", "coordinator", "--bind", addr,
                                  *[x for kv in coord_set for x in ("--set", kv)]],
                                 stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    ctl = Controller(addr, coord, log_path)
    procs = []
    try:
        ctl.status(20.0)
        per = members // workers
        # an upper bound: the workers stop when the parent touches the stop file
        duration = FORM_S + 40.0 + quiet_s + churn * churn_s
        stop = os.path.join(tmp, "stop")
        outs = []
        t_start = time.monotonic()
        for w in range(workers):
            out = os.path.join(tmp, f"worker{w}.json")
            outs.append(out)
            procs.append(subprocess.Popen([sys.executable, __file__, "--worker", "--coord", addr,
                                           "--first", str(w * per), "--count", str(per), "--hz", str(hz),
                                           "--duration", str(duration), "--stop", stop, "--out", out],
                                          env=env, cwd=ROOT))
        st = {"view": {"members": []}, "epoch": -1}
        while True:
            try:
                st = ctl.status()
            except CoordinatorExited:
                raise
            except RuntimeError:   # too busy to answer within 10 s: not formed yet
                pass
            if len(st["view"]["members"]) >= per * workers:
                break
            if time.monotonic() - t_start > FORM_S:
                # the coordinator could not hold this many members here: say so, measure nothing
                causes: dict[str, int] = {}
                for r in st.get("members", []):
                    if r["state"] != "alive":
                        causes[r["cause"]] = causes.get(r["cause"], 0) + 1
                return {"members": per * workers, "formed": False, "alive": len(st["view"]["members"]),
                        "epoch": st["epoch"], "cpu": cpu_s(coord.pid) / (time.monotonic() - t_start),
                        "causes": causes}
            time.sleep(0.5)
        formed_s = time.monotonic() - t_start
        time.sleep(2.0)   # let the start-up views drain
        st0 = ctl.status()
        e_before = st0["epoch"]
        # the status round trips sit outside the CPU window; the heartbeat count
        # brackets it (a status reply takes ms, the window seconds)
        th0, c0, t0 = thread_cpu_s(coord.pid), cpu_s(coord.pid), time.monotonic()
        time.sleep(quiet_s)
        c1, th1, t1 = cpu_s(coord.pid), thread_cpu_s(coord.pid), time.monotonic()
        st1 = ctl.status()
        quiet_cpu = (c1 - c0) / (t1 - t0)
        threads = {k: (v - th0.get(k, 0.0)) / (t1 - t0) for k, v in th1.items()}
        hb_rate = (st1["heartbeats"] - st0["heartbeats"]) / (time.monotonic() - t0)
        e_quiet = st1["epoch"]
        changes = []
        c0, t0 = cpu_s(coord.pid), time.monotonic()
        for i in range(churn):
            changes.append(ctl.join() if i % 2 == 0 else ctl.leave())
            time.sleep(churn_s)
        churn_cpu = (cpu_s(coord.pid) - c0) / (time.monotonic() - t0)
        t_churn_end = time.monotonic()
        st = ctl.status()
        view_bytes = len(msgpack.packb(st["view"]))
        Path(stop).touch()
        t_stop = time.monotonic()
        for p in procs:
            try:
                p.wait(max(0.1, 30.0 - (time.monotonic() - t_stop)))
            except subprocess.TimeoutExpired:
                pass   # killed below; its receipts are lost and the count shows it
    finally:
        end_all(procs, coord)
    seen: dict[int, list[float]] = {}
    sizes: dict[int, list[int]] = {}
    views = sent = with_stats = dropped = 0
    for out in outs:
        if not Path(out).exists():
            continue
        d = json.loads(Path(out).read_text())
        views += d["views"]
        sent, with_stats, dropped = sent + d["sent"], with_stats + d["with_stats"], dropped + d["dropped"]
        for e, ts in d["seen"].items():
            seen.setdefault(int(e), []).extend(ts)
        for e, b in d["sizes"].items():
            sizes.setdefault(int(e), []).extend(b)
    lat = []
    msg_bytes: list[int] = []   # the view messages that carried the changes timed
    per_change = []
    # epochs of the churn window only (members closing at the end make more)
    changed = [e for e in seen if e > e_quiet and min(seen[e]) < t_churn_end]
    for e in sorted(changed):
        ts = seen[e]
        t_change = max((c for c in changes if c <= min(ts)), default=None)
        if t_change is None:
            continue
        ms = [(t - t_change) * 1000 for t in ts]
        lat += ms
        msg_bytes += sizes.get(e, [])
        per_change.append((e, len(ts), max(ms)))
    return {"members": per * workers, "formed_s": formed_s, "quiet_cpu": quiet_cpu, "churn_cpu": churn_cpu,
            "false_changes": e_quiet - e_before, "epochs": len(changed), "changes": len(changes),
            "p50": pct(lat, 50), "p99": pct(lat, 99), "max": max(lat) if lat else None,
            "receipts": len(lat), "per_change": per_change, "view_bytes": view_bytes,
            "msg_bytes": anchor_message_bytes(msg_bytes), "views": views,
            "hb_rate": hb_rate, "threads": threads, "stats_share": with_stats / max(1, sent),
            "hb_dropped": dropped}


# =================================================================== (b) in-process

def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def inproc(n: int, d: int, topology: str, rounds: int) -> dict:
    from swarm.gossip import Gossip
    from swarm.gossip.sim import SimHub, run_rounds

    r0 = rss_bytes()
    hub = SimHub(topology=topology)
    links = hub.add_many(n)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(d).astype(np.float32) for _ in range(n)]
    engines = [Gossip(l, x, topology=topology, round_timeout=60.0) for l, x in zip(links, xs)]
    await run_rounds(engines, 2)   # the first rounds send full state and allocate the copies
    mem = (rss_bytes() - r0) / n
    t = time.perf_counter()
    res = await run_rounds(engines, rounds)
    rps = rounds / (time.perf_counter() - t)
    ok = all(r.ok for rnd in res for r in rnd)
    await hub.close()
    return {"rounds_per_s": rps, "mem_per_peer": mem, "ok": ok}


#: untimed steps before the numpy anchor's clock starts, and the least time it is timed over
ANCHOR_WARMUP = 2
ANCHOR_MIN_S = 0.2


def mixing_rows(topology: str, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Row i of the mixing matrix W as (the positions j with w_ij > 0, i first; their
    float32 weights): 3 entries a row on a ring, 5 on a torus, never the n zeros."""
    from swarm.gossip import weights

    rows = []
    for i in range(n):
        w = weights(topology, n, i)
        cols = [i] + sorted(j for j in w if j != i)
        rows.append((np.array(cols, np.intp), np.array([w[j] for j in cols], np.float32)))
    return rows


def sparse_step(x: np.ndarray, y: np.ndarray, tmp: np.ndarray, rows: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """One exact-gossip step y ← W x, as each peer does it: row i weighs itself and its
    neighbours (``tmp`` is a scratch row of x's width)."""
    for i, (cols, w) in enumerate(rows):
        yi = y[i]
        np.multiply(x[cols[0]], w[0], out=yi)
        for j in range(1, len(cols)):
            np.multiply(x[cols[j]], w[j], out=tmp)
            yi += tmp


def numpy_anchor(n: int, d: int, topology: str, rounds: int) -> float:
    """Rounds/s of a bare numpy exact-gossip step X ← W X on the n×d matrix, with W
    applied sparsely (:func:`sparse_step`): per row, the weighted sum of the peer and
    its neighbours, the work a round of gossip does (a dense W @ X did n×n×d).

    Two steps run before the clock (the first pays for the output buffers' first
    page faults), then at least ``rounds`` steps and at least ANCHOR_MIN_S seconds:
    at --quick sizes 3 steps take about a millisecond, and 3 first steps timed alone
    made the ratio swing tenfold.
    """
    rows = mixing_rows(topology, n)
    x = np.random.default_rng(0).standard_normal((n, d)).astype(np.float32)
    y = np.empty_like(x)
    tmp = np.empty(d, np.float32)
    for _ in range(ANCHOR_WARMUP):
        sparse_step(x, y, tmp, rows)
        x, y = y, x
    done, t = 0, time.perf_counter()
    while done < rounds or time.perf_counter() - t < ANCHOR_MIN_S:
        sparse_step(x, y, tmp, rows)
        x, y = y, x
        done += 1
    return done / (time.perf_counter() - t)


# =================================================================== (c) peer processes

def gossip_peer(args: argparse.Namespace) -> None:
    """One real Peer process: join, gossip d floats on a ring, count rounds in the common window.

    Start-up (importing torch, joining, linking) takes each process a different
    time on busy cores, so the window is not fixed in advance: each peer touches
    ``<out>.ready`` once linked and keeps gossiping until the parent writes the
    start time into the ``go`` file, after all are ready (or the ready deadline
    passed). Whatever happens, the peer writes its result file, with an error
    if it failed, so the parent reports what it got.
    """
    import torch

    torch.set_num_threads(1)
    from swarm.errors import PeerTimeout
    from swarm.gossip import Gossip
    from swarm.peer import Peer

    res: dict = {"rounds": 0, "ok": 0, "late_s": 0.0, "error": ""}

    async def main() -> None:
        # its coordinator starts beside it: wait for it as long as for the others
        peer = Peer(coordinators=[args.coord], id=f"g{args.rank}", rank=args.rank, topology="ring",
                    join_timeout_s=args.ready_timeout)
        await peer.start()
        try:
            await peer.wait_view(lambda v: len(v.members) == args.n, timeout=args.ready_timeout)
            await peer.wait_linked(args.ready_timeout)
            x = np.full(args.d, float(args.rank), np.float32)
            g = Gossip(peer, x, topology="ring", sync=args.sync, round_timeout=2.0)
            for _ in range(3):
                await g.round()
            Path(args.out + ".ready").touch()
            go, deadline = Path(args.go), time.time() + 2 * args.ready_timeout
            while not go.exists():
                if time.time() > deadline:
                    raise PeerTimeout(f"no start signal within {2 * args.ready_timeout} s")
                await g.round()
            start = float(go.read_text())
            while time.time() < start:
                await g.round()
            res["late_s"] = round(time.time() - start, 2)
            while time.time() < start + args.window:
                r = await g.round()
                res["rounds"] += 1
                res["ok"] += int(r.ok)
            # keep gossiping a little so that neighbours finish their windows with partners
            tail = time.time() + 3.0
            while time.time() < tail:
                await g.round()
        finally:
            await peer.close()

    try:
        asyncio.run(main())
    except Exception as e:   # reported by the parent, not lost with the process
        res["error"] = f"{type(e).__name__}: {e}"[:300]
    Path(args.out).write_text(json.dumps(res))


def bench_processes(tmp: str, n: int, d: int, window: float, sync: str = "bounded") -> dict:
    """``n`` peer processes gossiping over one common window; never raises on slow or failed peers.
    The peers' results go into the folder ``tmp``."""
    # start-up is mostly importing torch, ~n CPU-seconds of it on 2 shared cores
    ready_timeout = 60.0 + 10.0 * n
    port = free_port()
    addr = f"tcp://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    coord = subprocess.Popen([sys.executable, "-m", "swarm.cli", "coordinator", "--bind", addr],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
    outs = [os.path.join(tmp, f"g{r}.json") for r in range(n)]
    go = os.path.join(tmp, "go")
    procs = []
    t_launch = time.monotonic()
    try:
        # into procs one by one: a signal while they start (SIGTERM as SystemExit) leaves
        # none of those started behind
        for r in range(n):
            procs.append(subprocess.Popen([sys.executable, __file__, "--gossip-peer", "--coord", addr, "--rank",
                                           str(r), "--n", str(n), "--d", str(d), "--go", go, "--window", str(window),
                                           "--sync", sync, "--ready-timeout", str(ready_timeout), "--out", outs[r]],
                                          env=env, cwd=ROOT))
        # the window opens when every peer is linked (or the ready deadline passed)
        while time.monotonic() - t_launch < ready_timeout:
            ready = sum(Path(o + ".ready").exists() for o in outs)
            if ready == n or all(p.poll() is not None for p in procs):
                break
            time.sleep(0.5)
        ready = sum(Path(o + ".ready").exists() for o in outs)
        ready_s = time.monotonic() - t_launch
        try:   # how far start-up got, for the report
            joined = len(Controller(addr).status(5.0)["view"]["members"])
        except Exception:
            joined = -1
        start = time.time() + 2.0
        Path(go + ".tmp").write_text(repr(start))
        os.replace(go + ".tmp", go)
        # a round waits at most 2 s, the tail is 3 s: what is not done by then is stuck
        deadline = time.monotonic() + (start - time.time()) + window + 3.0 + 30.0
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    finally:
        end_all(procs, coord)
    res = [json.loads(Path(o).read_text()) for o in outs if Path(o).exists()]
    return {"ready": ready, "ready_s": ready_s, "joined": joined, **peer_summary(n, res, window)}


def peer_summary(n: int, res: list[dict], window: float) -> dict:
    """What ``n`` peers' result files (``res``: those that exist) say about one window.

    ``rounds_per_s`` (per peer) is null unless all ``n`` peers finished: a mean over
    the peers that did hides those that did not, and none finishing is no figure, not
    0 rounds/s. ``finished`` says how many did; ``ok_share`` and ``late_s`` are over
    the peers that finished (null when none ran a round)."""
    done = [r for r in res if not r["error"]]
    errors = sorted({r["error"] for r in res if r["error"]})
    if len(res) < n:
        errors.append(f"{n - len(res)} of {n} peers wrote no result")
    rounds = [r["rounds"] for r in done]
    return {"peers": n, "finished": len(done), "errors": errors,
            "rounds_per_s": float(np.mean(rounds)) / window if len(done) == n else None,
            # of the rounds the finished peers ran, the share that went through
            "ok_share": sum(r["ok"] for r in done) / sum(rounds) if sum(rounds) else None,
            "late_s": max((r["late_s"] for r in done), default=None)}


# =================================================================== main

def inproc_part_b(topo: str, r: dict, anchor_rounds_per_s: float) -> dict:
    """The JSON keys of part (b) for one topology: swarm's rounds/s and its ratio to the
    numpy anchor are null unless every round of every peer went through (``r["ok"]``)."""
    ok = bool(r["ok"])
    rps = r["rounds_per_s"] if ok else None
    return {f"inproc_{topo}_ok": ok, f"inproc_{topo}_rounds_per_s": rnd(rps, 3),
            f"inproc_{topo}_mb_per_peer": round(r["mem_per_peer"] / 1e6, 3),
            f"numpy_{topo}_rounds_per_s": round(anchor_rounds_per_s, 3),
            f"inproc_{topo}_vs_numpy": rnd(rps / anchor_rounds_per_s if rps is not None and anchor_rounds_per_s
                                           else None, 4)}


def procs_ratio(legs: dict[int, dict | None]) -> float | None:
    """16 processes' peer-rounds/s over 4 processes': null unless every peer of both
    legs finished its window (a mean over the peers that finished, or 0 for none,
    made a failed leg look like a number) and both rates are above zero."""
    r4, r16 = legs.get(4), legs.get(16)
    if r4 is None or r16 is None or r4["rounds_per_s"] is None or r16["rounds_per_s"] is None:
        return None
    if r4["rounds_per_s"] <= 0:
        return None
    return round(16 * r16["rounds_per_s"] / (4 * r4["rounds_per_s"]), 3)


#: the options each internal mode needs (--stats-s is optional: a peer's HEARTBEAT_STATS_S)
INTERNAL_OPTIONS = {"--worker": ("coord", "first", "count", "hz", "duration", "stop", "out"),
                    "--gossip-peer": ("coord", "rank", "n", "d", "go", "window", "sync", "ready_timeout", "out")}


def check_internal(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, as a usage error, what an internal mode cannot run with. The parent passes
    good values; by hand, a missing option ended in a TypeError, --hz 0 in a division by
    zero, --count 0 in an IndexError, --duration nan never ended, and --rank >= --n
    waited for a view that could not form."""
    mode = "--worker" if args.worker else "--gossip-peer"
    missing = [f"--{k.replace('_', '-')}" for k in INTERNAL_OPTIONS[mode] if getattr(args, k) is None]
    if missing:
        ap.error(f"{mode} needs {', '.join(missing)}")

    def need(ok: bool, option: str, what: str) -> None:
        if not ok:
            ap.error(f"{mode}: {option} {getattr(args, option[2:].replace('-', '_'))} {what}")

    need(re.fullmatch(r"tcp://.+:\d+", args.coord) is not None, "--coord", "is not a tcp://HOST:PORT address")
    need(Path(args.out).parent.is_dir(), "--out", "is not in a folder that exists")
    if args.worker:
        need(args.first >= 0, "--first", "must be >= 0")
        need(args.count >= 1, "--count", "must be >= 1 (the members this worker simulates)")
        need(args.hz > 0, "--hz", "must be > 0 (heartbeats per second)")
        need(args.duration > 0, "--duration", "must be > 0 seconds")
        need(args.stats_s is None or args.stats_s >= 0, "--stats-s", "must be >= 0 seconds")
    else:
        from swarm.gossip import SYNC_MODES

        need(args.n >= 1, "--n", "must be >= 1 (the peers of the swarm)")
        need(0 <= args.rank < args.n, "--rank", f"must be in [0, --n) = [0, {args.n})")
        need(args.d >= 1, "--d", "must be >= 1 (the floats each peer gossips)")
        need(args.window > 0, "--window", "must be > 0 seconds")
        need(args.ready_timeout > 0, "--ready-timeout", "must be > 0 seconds")
        need(args.sync in SYNC_MODES, "--sync", f"is not one of {', '.join(SYNC_MODES)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    ap.add_argument("--members", type=int, default=None, help="members of (a) (default 1000; 200 with --quick)")
    ap.add_argument("--workers", type=int, default=4, help="processes simulating the members")
    ap.add_argument("--churn", type=int, default=None,
                    help="membership changes to time (default 20; 6 with --quick)")
    ap.add_argument("--churn-s", type=float, default=0.5, help="seconds between changes")
    ap.add_argument("--quiet-s", type=float, default=None,
                    help="seconds of (a)'s heartbeats-only CPU window (default 8; 3 with --quick)")
    ap.add_argument("--coord-set", action="append", default=None, metavar="KEY=VALUE",
                    help="coordinator settings for (a); default: ZMTP heartbeats at 1 s / 3 s, the "
                         "large-swarm setting of docs/wire.md (the 0.1 s default is for fast freeze "
                         "detection in small swarms and costs 10 pings/s per member)")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: a,b,c")
    # worker modes (internal)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    mode.add_argument("--gossip-peer", action="store_true", help=argparse.SUPPRESS)
    for a, t in (("--coord", str), ("--first", int), ("--count", int), ("--hz", finite_arg),
                 ("--duration", finite_arg), ("--stop", str), ("--out", str), ("--rank", int), ("--n", int),
                 ("--d", int), ("--go", str), ("--ready-timeout", finite_arg), ("--window", finite_arg),
                 ("--sync", str), ("--stats-s", finite_arg)):
        ap.add_argument(a, type=t, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker or args.gossip_peer:
        check_internal(ap, args)
    if args.worker:
        return worker(args)
    if args.gossip_peer:
        return gossip_peer(args)

    # an explicit flag wins over --quick's sizes
    members = args.members if args.members is not None else 200 if args.quick else 1000
    churn = args.churn if args.churn is not None else 6 if args.quick else 20
    quiet_s = args.quiet_s if args.quiet_s is not None else 3.0 if args.quick else 8.0
    if args.workers < 1:
        ap.error("--workers must be >= 1")
    if members < args.workers:
        ap.error(f"--members must be at least --workers ({args.workers}): each worker simulates members")
    if churn < 1:
        ap.error("--churn must be >= 1 (the view propagation is timed over the changes)")
    # chained comparisons, so that nan is refused too (it failed late, at time.sleep)
    if not 0 <= args.churn_s <= MAX_WAIT_S:
        ap.error(f"--churn-s must be a number of seconds in [0, {MAX_WAIT_S:.0f}] (a day)")
    if not 0 < quiet_s <= MAX_WAIT_S:
        ap.error("--quiet-s must be > 0 (the coordinator's CPU and heartbeat rate are measured over it) "
                 f"and at most {MAX_WAIT_S:.0f} (a day)")
    skip = set(filter(None, args.skip.split(",")))
    if skip - {"a", "b", "c"}:
        ap.error(f"--skip {args.skip}: the parts are a, b and c")
    out: dict = {}
    print(f"bench_scale on {os.cpu_count()} cores", flush=True)
    if "a" not in skip:
        coord_set = args.coord_set if args.coord_set is not None else [
            "coordinator.zmtp_heartbeat_s=1.0", "coordinator.zmtp_timeout_s=3.0"]
        try:
            with tempfile.TemporaryDirectory(prefix="bench_scale-") as tmp:
                a = bench_coordinator(tmp, members, args.workers, 4.0, churn, args.churn_s, quiet_s, coord_set)
        except CoordinatorExited as e:   # a bad --coord-set, a port taken: no traceback, the log says why
            sys.exit(f"bench_scale (a): {e}")
        out["coord_settings"] = coord_set
        if not a.get("formed", True):
            print(f"\n(a) coordinator, {a['members']} members: the view never held them all within {FORM_S:.0f} s "
                  f"({a['alive']} alive at epoch {a['epoch']}; coordinator at {a['cpu']:.0%} of a core; "
                  f"members lost by cause: {a.get('causes') or 'none'}; load average {os.getloadavg()[0]:.1f})")
            out.update(coord_members=a["members"], coord_formed=False, coord_alive=a["alive"],
                       coord_death_causes=a.get("causes", {}),
                       view_p99_ms=None, view_p99_vs_anchor=None, coord_cpu=round(a["cpu"], 4),
                       target_view_p99_met=False,
                       target_coord_cpu_met=False)
            a = None
    else:
        a = None
    if a is not None:
        # the anchor sends what the members were sent on a change (mostly the change
        # alone, not the whole view); with no receipts there is nothing to size it by
        anchor = []
        if a["msg_bytes"] is not None:
            with tempfile.TemporaryDirectory(prefix="bench_scale-") as tmp:
                anchor = raw_fanout_anchor(tmp, args.workers, members // args.workers, a["msg_bytes"])
        print(f"\n(a) coordinator, {a['members']} members heartbeating at 4 Hz "
              f"(view formed in {a['formed_s']:.1f} s, whole view {a['view_bytes'] / 1e3:.1f} kB, "
              "view message on a change "
              + ("-" if a["msg_bytes"] is None else f"{a['msg_bytes']} B on average; the anchor sends as many")
              + ")")
        print(f"{'':34} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
        print(f"{'view propagation (swarm)':34} {fmt_ms(a['p50'])} {fmt_ms(a['p99'])} {fmt_ms(a['max'])}   "
              f"{a['receipts']} receipts over {a['epochs']} epochs / {a['changes']} changes")
        print(f"{'anchor: raw pyzmq ROUTER fan-out':34} {fmt_ms(pct(anchor, 50))} {fmt_ms(pct(anchor, 99))} "
              f"{fmt_ms(max(anchor, default=None))}")
        anchor_p99 = pct(anchor, 99)
        # null when either side has no receipts (or the anchor's p99 rounds to 0 ms)
        view_vs_anchor = a["p99"] / anchor_p99 if a["p99"] is not None and anchor_p99 else None
        print("view propagation p99 / the anchor's p99: "
              + ("-" if view_vs_anchor is None else f"{view_vs_anchor:.2f}"))
        nominal = a["members"] * 4.0
        hb_ok = a["hb_rate"] >= 0.95 * nominal
        th = a["threads"]
        print(f"heartbeats received by the coordinator: {a['hb_rate']:.0f}/s (nominal {nominal:.0f}/s"
              + ("" if hb_ok else "; SHORT: the simulator was starved, so the CPU figure is flattered")
              + f"), {a['stats_share']:.0%} of them with the figures, {a['hb_dropped']} not sent (queue full)")
        print(f"coordinator CPU: {a['quiet_cpu']:.1%} of a core with heartbeats only "
              f"(Python thread {th.get('python', 0):.1%}, libzmq IO thread {th.get('zmq_io', 0):.1%}, "
              f"other {th.get('other', 0):.1%}), {a['churn_cpu']:.1%} with a change every {args.churn_s} s; "
              f"{a['quiet_cpu'] / max(a['hb_rate'], 1) * 1e6:.1f} µs of CPU per heartbeat; "
              f"false changes in the quiet window: {a['false_changes']}")
        out.update(coord_hb_per_s=round(a["hb_rate"], 1), coord_hb_nominal_per_s=nominal,
                   coord_hb_stats_share=round(a["stats_share"], 3),
                   coord_cpu_python=round(th.get("python", 0.0), 4), coord_cpu_zmq_io=round(th.get("zmq_io", 0.0), 4),
                   coord_cpu_us_per_hb=round(a["quiet_cpu"] / max(a["hb_rate"], 1) * 1e6, 2),
                   load_avg=[round(x, 2) for x in os.getloadavg()])
        out.update(coord_members=a["members"], view_p50_ms=rnd(a["p50"]), view_p99_ms=rnd(a["p99"]),
                   view_max_ms=rnd(a["max"]), view_full_bytes=a["view_bytes"], view_msg_bytes=a["msg_bytes"],
                   anchor_msg_bytes=a["msg_bytes"], anchor_fanout_p99_ms=rnd(anchor_p99),
                   view_p99_vs_anchor=rnd(view_vs_anchor, 3),
                   coord_cpu=round(a["quiet_cpu"], 4), coord_cpu_churn=round(a["churn_cpu"], 4),
                   coord_false_changes=a["false_changes"], view_formed_s=round(a["formed_s"], 2),
                   target_view_p99_met=a["p99"] is not None and a["p99"] <= 100.0,
                   target_coord_cpu_met=a["quiet_cpu"] <= 0.25 and hb_ok)
    if "b" not in skip:
        n, d = (64, 10_000) if args.quick else (256, 100_000)
        rounds = 3 if args.quick else 5
        print(f"\n(b) {n} in-process peers, d = {d}")
        print(f"{'topology':10} {'rounds/s':>9} {'numpy sparse W·X':>17} {'MB/peer':>8}  ok")
        for topo in ("ring", "torus"):
            r = asyncio.run(inproc(n, d, topo, rounds))
            anc = numpy_anchor(n, d, topo, rounds)
            print(f"{topo:10} {r['rounds_per_s']:9.2f} {anc:17.2f} {r['mem_per_peer'] / 1e6:8.2f}  {r['ok']}")
            out.update(inproc_part_b(topo, r, anc))
        # the headline figures: the ring's, null unless its rounds all went through;
        # inproc_ok: every topology's did
        out.update(inproc_peers=n, inproc_rounds_per_s=out["inproc_ring_rounds_per_s"],
                   inproc_ok=all(out[f"inproc_{topo}_ok"] for topo in ("ring", "torus")))
    if "c" not in skip:
        d = 10_000 if args.quick else 100_000
        window = 5.0 if args.quick else 10.0
        print(f"\n(c) peer processes on {os.cpu_count()} cores, d = {d}, ring, bounded staleness 1")
        print(f"{'processes':>9} {'rounds/s per peer':>18} {'peer-rounds/s':>14} {'ok share':>9}")
        legs: dict[int, dict | None] = {}
        for n in (4, 16):
            legs[n] = None
            out[f"procs{n}_peers"] = n
            try:
                with tempfile.TemporaryDirectory(prefix="bench_scale-") as tmp:
                    r = bench_processes(tmp, n, d, window)
            except Exception as e:   # report what (a) and (b) got rather than dying here
                print(f"{n:9d}  failed: {type(e).__name__}: {e}")
                out.update({f"procs{n}_error": f"{type(e).__name__}: {e}"[:300], f"procs{n}_finished": None,
                            f"procs{n}_rounds_per_s": None, f"procs{n}_ok_share": None})
                continue
            legs[n] = r
            rps = r["rounds_per_s"]   # null unless every peer finished
            note = "" if r["finished"] == n else (f"  ({r['finished']}/{n} finished; {r['ready']} linked and "
                                                         f"{r['joined']} in the view by the deadline)")
            print(f"{n:9d} {fmt_num(rps, 18, 2)} {fmt_num(None if rps is None else rps * n, 14, 1)} "
                  f"{fmt_num(r['ok_share'], 9, 2)}   ready after {r['ready_s']:.0f} s{note}")
            for e in r["errors"][:3]:
                print(f"{'':9}   error: {e}")
            out[f"procs{n}_rounds_per_s"] = rnd(rps, 3)
            out[f"procs{n}_finished"] = r["finished"]
            out[f"procs{n}_ok_share"] = rnd(r["ok_share"], 3)
        out["procs16_vs_4_peer_rounds"] = procs_ratio(legs)
        out["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out))


if __name__ == "__main__":
    run_script(main, "bench_scale")
