"""Failover: start-up time, crash and freeze re-link times, false deaths, standby takeover.

    python scripts/bench_failover.py [--sizes 8,16,32] [--faults 10] [--quiet-s 60] [--standby-peers 8]

Everything runs as real `swarm coordinator` / `swarm peer` processes on
loopback, started with the CLI exactly as a user would.

* start-up: from launching a coordinator and 8 peers (``--startup-peers``)
  until every peer has answered hellos from all its ring neighbours (the
  coordinator records when each peer reports ``linked`` for the current epoch);
* crash (SIGKILL) and freeze (SIGSTOP) of a random peer: the time from the
  fault until every survivor has re-linked in the view without it, i.e.
  ``max(linked_at of survivors) − t_fault``; the victim is then replaced by a
  fresh peer so that N stays constant;
* a quiet run of N peers for ``--quiet-s`` seconds: deaths the coordinator
  declared although nobody was harmed (read from its log every QUIET_POLL_S s:
  ``false_deaths_exact`` is false if more entries came within one read than a
  status reply holds, and the count is then a floor);
* standby takeover: a primary and a standby coordinator (``--others`` each other)
  and ``--standby-peers`` peers given both addresses; the active one is killed
  (SIGKILL), ``--faults`` times, and the time from the kill until every peer has
  re-linked in a view of the other, at a higher epoch, is measured
  (``standby_takeover_s``, its p99). The killed one is started again at its
  address, stands by, and is the next takeover's standby.

Anchors, measured in the same run: what Python and ZeroMQ alone take.

* start-up: as many processes, launched together, that only import what a
  coordinator and a peer import (``startup_vs_anchor`` = start-up / that);
* crash and freeze: raw pyzmq noticing the same fault, ``--faults`` times each:
  a ROUTER with the coordinator's ZMTP heartbeat settings watches a DEALER in a
  process of its own, from the fault to the ROUTER's disconnect event
  (``crash_relink_vs_anchor``, ``freeze_relink_vs_anchor``: swarm's p99 / the
  anchor's p99; swarm adds declaring the death, publishing the view and every
  survivor linking to its new neighbours; a freeze is noticed 0.3-0.4 s after
  it, by where it falls between two heartbeats, so that ratio is near 1);
* standby takeover: its floor is ``coordinator.takeover_s`` (1 s), how long a
  standby waits without an answer from the active one before it takes over
  (``standby_takeover_vs_floor`` = the p99 / that; swarm adds noticing the
  silence, the peers trying the standby and its view reaching every peer).

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from swarm import transport
from swarm.cli import query_status
from swarm.config import CoordinatorConfig
from swarm.scripting import run_script

SWARM = [sys.executable, "-m", "swarm.cli"]
#: the longest quiet run (a day): time.sleep refuses much longer waits, and nan or inf would
#: only fail after every fault had been measured
MAX_QUIET_S = 86_400.0
#: how often the quiet run reads the coordinator's log: a status reply holds its last 50
#: entries only, and a false death and its rejoin are two
QUIET_POLL_S = 1.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status(addr: str) -> dict:
    return asyncio.run(query_status(addr, 2.0))


class Swarm:
    """A coordinator and N peer processes, each ended by its pid."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.addr = f"tcp://127.0.0.1:{free_port()}"
        self.coord: subprocess.Popen | None = None
        #: what peers are given as --coordinator (StandbySwarm: both addresses)
        self.coordinators = self.addr
        self.coord_name = "coordinator"   # its log's name
        #: coordinators other than ``coord`` that close() ends (StandbySwarm's standby), by log name
        self.spares: dict[str, subprocess.Popen] = {}
        self.peers: dict[str, subprocess.Popen] = {}
        #: peers crashed or frozen on purpose: still in ``peers`` (close() ends them) until reaped
        self.faulted: set[str] = set()
        self.next_id = 0
        self.last_status: dict | None = None   # the last status wait_settled saw, for its error

    def _spawn(self, *args: str, name: str) -> subprocess.Popen:
        with open(self.logdir / f"{name}.log", "w") as log:
            return subprocess.Popen([*SWARM, *args], stdout=log, stderr=subprocess.STDOUT,
                                    env=dict(os.environ, PYTHONUNBUFFERED="1"))

    def start_coordinator(self) -> None:
        self.coord = self._spawn("coordinator", "--bind", self.addr, name="coordinator")

    def add_peer(self) -> str:
        pid = f"p{self.next_id}"
        self.next_id += 1
        self.peers[pid] = self._spawn("peer", "--coordinator", self.coordinators, "--id", pid, name=pid)
        return pid

    def fault(self, victim: str, kind: str) -> None:
        """Crash (SIGKILL) or freeze (SIGSTOP) a peer. It stays in ``peers`` until remove():
        an error or a signal on the way must not leave a stopped process behind."""
        self.faulted.add(victim)
        os.kill(self.peers[victim].pid, signal.SIGKILL if kind == "crash" else signal.SIGSTOP)

    def remove(self, victim: str) -> None:
        """End a faulted peer (a stopped one too) and forget it once it is reaped."""
        proc = self.peers[victim]
        proc.kill()
        proc.wait()
        del self.peers[victim]
        self.faulted.discard(victim)

    def failure(self, what: str, lagging: list[str] | None = None) -> RuntimeError:
        """An error that carries the ends of the logs that say why (the logs are in a
        temporary folder, removed as the error leaves the run): the coordinator's, those
        of the peers that exited without being crashed on purpose, and of the first
        few ``lagging`` peers (not in the view, or not linked)."""
        parts = [what]
        named = ([(self.coord_name, self.coord)] if self.coord else []) + list(self.spares.items())
        exited = [name for name, p in sorted(self.peers.items()) if p.poll() is not None and name not in self.faulted]
        shown = [name for name in lagging or [] if name not in exited][:4]
        for name, p in named + [(name, self.peers[name]) for name in exited + shown]:
            rc = p.poll()
            state = "running" if rc is None else f"exited with code {rc}"
            parts.append(f"--- {name} ({state}), the end of its log:\n{log_tail(self.logdir / f'{name}.log')}")
        return RuntimeError("\n".join(parts))

    def status(self) -> dict:
        try:
            return status(self.addr)
        except Exception as e:
            raise self.failure(f"the coordinator did not answer status ({type(e).__name__}: {e})") from e

    def settled(self, n: int) -> dict | None:
        try:
            st = status(self.addr)
        except Exception:
            return None
        self.last_status = st
        view = {m[0] for m in st["view"]["members"]}
        if len(view) != n:
            return None
        rows = [r for r in st["members"] if r["id"] in view]
        if all(r["linked_epoch"] == st["epoch"] for r in rows):
            return st
        return None

    def wait_settled(self, n: int, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        self.last_status = None
        while time.monotonic() < deadline:
            st = self.settled(n)
            if st:
                return st
            # a process that exited will not settle: say so now, not at the deadline
            gone = [name for name, p in [("coordinator", self.coord), *self.peers.items()]
                    if p is not None and name not in self.faulted and p.poll() is not None]
            if gone:
                raise self.failure(f"swarm of {n}: {', '.join(gone)} exited")
            time.sleep(0.02)
        st = self.last_status
        if st is None:
            raise self.failure(f"swarm of {n} did not settle within {timeout} s: the coordinator never answered")
        view = {m[0] for m in st["view"]["members"]}
        linked = {r["id"] for r in st["members"] if r["id"] in view and r["linked_epoch"] == st["epoch"]}
        lagging = [name for name in sorted(self.peers) if name not in self.faulted and name not in linked]
        raise self.failure(f"swarm of {n} did not settle within {timeout} s: at epoch {st['epoch']}, "
                           f"{len(view)} in the view, not linked or not in it: {lagging}", lagging)

    def close(self) -> None:
        procs = list(self.peers.values()) + ([self.coord] if self.coord else []) + list(self.spares.values())
        for name, p in self.peers.items():
            if name in self.faulted and p.poll() is None:
                p.kill()   # crashed or stopped: nothing to end gracefully
        for p in procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    p.terminate()
                except ProcessLookupError:
                    pass
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class StandbySwarm(Swarm):
    """A primary and a standby coordinator, each watching the other, and peers given both.
    ``addr`` and ``coord`` are the active one's, ``spares`` holds the standby (``other``)."""

    def __init__(self, logdir: Path) -> None:
        super().__init__(logdir)
        # the lower address is the one that is active first
        self.addr, self.other = sorted([self.addr, f"tcp://127.0.0.1:{free_port()}"])
        self.coordinators = f"{self.addr},{self.other}"
        self.starts = 0

    def _start(self, addr: str, other: str) -> tuple[str, subprocess.Popen]:
        """A coordinator at ``addr`` watching ``other``, and its log's name."""
        self.starts += 1
        name = f"coordinator{self.starts}"
        return name, self._spawn("coordinator", "--bind", addr, "--others", other, name=name)

    def _wait_modes(self, timeout: float = 30.0) -> None:
        """Until ``addr`` answers as active and ``other`` as standby."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if status(self.addr)["mode"] == "active" and status(self.other)["mode"] == "standby":
                    return
            except Exception:
                pass   # not up yet
            gone = [p for p in (self.coord, *self.spares.values()) if p.poll() is not None]
            if gone:
                raise self.failure("a coordinator of the standby pair exited")
            time.sleep(0.05)
        raise self.failure(f"{self.addr} was not active with {self.other} standing by within {timeout} s")

    def start_coordinator(self) -> None:
        self.coord_name, self.coord = self._start(self.addr, self.other)
        self.spares = dict([self._start(self.other, self.addr)])
        self._wait_modes()

    def takeover_s(self, n: int) -> float:
        """Kill the active coordinator; seconds until every peer has re-linked in the
        standby's view (its own record of when each did), above the epoch before. The
        killed one is then started again at its address, as the next standby."""
        before = self.status()["epoch"]
        dead, t_fault = self.coord, time.time()
        os.kill(dead.pid, signal.SIGKILL)
        dead.wait()
        # the standby is the one read from now (wait_settled), and the one whose exit counts
        self.addr, self.other = self.other, self.addr
        ((self.coord_name, self.coord),) = self.spares.items()
        self.spares = {}
        deadline = time.monotonic() + 60
        while True:
            st = self.wait_settled(n, timeout=max(0.1, deadline - time.monotonic()))
            if st["mode"] == "active" and st["epoch"] > before:
                break
            if time.monotonic() >= deadline:
                raise self.failure(f"{self.addr} settled as {st['mode']} at epoch {st['epoch']} "
                                   f"(before the kill: {before}), not as the active one above it")
            time.sleep(0.02)
        linked = max(r["linked_at"] for r in st["members"] if r["state"] == "alive")
        self.spares = dict([self._start(self.other, self.addr)])
        self._wait_modes()
        return linked - t_fault


def log_tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a log, or why there are none."""
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"(no log: {e.strerror})"
    return "\n".join(text.splitlines()[-lines:]) or "(empty)"


def fault_relink_ms(sw: Swarm, n: int, kind: str, rng: random.Random) -> float:
    victim = rng.choice(sorted(set(sw.peers) - sw.faulted))
    before = sw.status()["epoch"]
    t_fault = time.time()
    sw.fault(victim, kind)
    st = sw.wait_settled(n - 1, timeout=30)
    if not (st["epoch"] > before and victim not in {m[0] for m in st["view"]["members"]}):
        raise sw.failure(f"the swarm settled at epoch {st['epoch']} (before the {kind}: {before}) "
                         f"with {victim} still in the view")
    linked = max(r["linked_at"] for r in st["members"] if r["state"] == "alive")
    sw.remove(victim)
    sw.add_peer()
    sw.wait_settled(n)
    time.sleep(0.3)
    return (linked - t_fault) * 1000


#: the anchor's DEALER, in a process of its own: it connects, says hello and waits
ANCHOR_DEALER = """
import sys, time, zmq
s = zmq.Context().socket(zmq.DEALER)
s.connect(sys.argv[1])
s.send(b"hello")
time.sleep(600)
"""


def quiet_deaths(sw: Swarm, seconds: float) -> tuple[int, bool, dict]:
    """Deaths the coordinator declares over the next ``seconds`` (its log's events other
    than joins and leaves), whether that count is exact, and the last status read.

    The log is read every QUIET_POLL_S and its entries gathered. A read whose oldest
    entry is new and came after the start may have lost entries between it and the
    read before (more than a status reply holds came in between): the count is a floor.
    """
    t0, end = time.time(), time.monotonic() + seconds
    seen: set[tuple] = set()
    exact = True
    while True:
        time.sleep(max(0.0, min(QUIET_POLL_S, end - time.monotonic())))
        st = sw.status()
        log = [tuple(x) for x in st["log"]]
        if log and log[0] not in seen and log[0][0] >= t0:
            exact = False
        seen.update(log)
        if time.monotonic() >= end:
            return sum(1 for t, ev, _ in seen if t >= t0 and ev not in ("join", "left")), exact, st


def detect_anchor_ms(kind: str) -> float:
    """Milliseconds from a crash (SIGKILL) or freeze (SIGSTOP) of a DEALER process until
    a ROUTER with the coordinator's ZMTP heartbeat settings reports the disconnect:
    what any coordinator on ZeroMQ waits before it can act."""
    cfg = CoordinatorConfig()   # the settings `swarm coordinator` runs with here
    ctx = zmq.Context()
    router = transport.router(ctx, heartbeat_s=cfg.zmtp_heartbeat_s, heartbeat_timeout_s=cfg.zmtp_timeout_s)
    monitor = router.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    child = None
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        child = subprocess.Popen([sys.executable, "-c", ANCHOR_DEALER, f"tcp://127.0.0.1:{port}"])
        if not router.poll(30_000):
            raise RuntimeError("anchor: the DEALER process did not connect within 30 s")
        router.recv_multipart()
        t_fault = time.monotonic()
        os.kill(child.pid, signal.SIGKILL if kind == "crash" else signal.SIGSTOP)
        if not monitor.poll(30_000):
            raise RuntimeError(f"anchor: the ROUTER saw no disconnect within 30 s of the {kind}")
        recv_monitor_message(monitor)
        return (time.monotonic() - t_fault) * 1000
    finally:
        if child is not None:
            child.kill()   # a stopped process too
            child.wait()
        router.disable_monitor()
        monitor.close(0)
        router.close(0)
        ctx.term()


def startup_anchor_s(n: int) -> float:
    """Seconds for n processes launched together that only import what a coordinator and a
    peer import (Python start-up and imports on these shared cores) until the last exits."""
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", "import swarm.cli, swarm.coordinator, swarm.peer"])
             for _ in range(n)]
    for p in procs:
        p.wait()
    return time.monotonic() - t0


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs), q)) if xs else float("nan")


@contextlib.contextmanager
def settled(sw: Any, n: int) -> Iterator[tuple[Any, dict[str, Any]]]:
    """``sw`` (a Swarm or StandbySwarm) with its coordinator and ``n`` peers started and
    settled, and the status it settled at; closed (every process it started ended) after."""
    try:
        sw.start_coordinator()
        for _ in range(n):
            sw.add_peer()
        yield sw, sw.wait_settled(n, timeout=120)
    finally:
        sw.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,16,32", help="swarm sizes N")
    ap.add_argument("--faults", type=int, default=10, help="faults of each kind per size")
    ap.add_argument("--quiet-s", type=float, default=60.0, help="length of the quiet run")
    ap.add_argument("--quiet-n", type=int, default=16, help="peers in the quiet run")
    ap.add_argument("--startup-peers", type=int, default=8, help="peers started with the coordinator "
                    "for the start-up time (its target, 3 s, is for 8)")
    ap.add_argument("--standby-peers", type=int, default=8, help="peers of the primary and standby "
                    "coordinators whose takeover is measured (--faults times)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes {args.sizes!r}: expected comma-separated whole numbers, e.g. 8,16,32")
    if min(sizes) < 2:
        ap.error("--sizes must be >= 2 (a fault needs a survivor to re-link)")
    if args.faults < 1:
        ap.error("--faults must be >= 1")
    if not 0 < args.quiet_s <= MAX_QUIET_S:   # also refuses nan
        ap.error(f"--quiet-s must be a number of seconds in (0, {MAX_QUIET_S:.0f}] (a day)")
    if args.quiet_n < 1:
        ap.error("--quiet-n must be >= 1")
    if args.startup_peers < 1:
        ap.error("--startup-peers must be >= 1")
    if args.standby_peers < 1:
        ap.error("--standby-peers must be >= 1")
    rng = random.Random(args.seed)
    out: dict = {"sizes": sizes, "faults": args.faults}
    with tempfile.TemporaryDirectory(prefix="swarm-failover-") as tmp:
        n0 = args.startup_peers
        out["startup_peers"] = n0
        out["startup_anchor_s"] = startup_anchor_s(n0 + 1)
        # start-up: coordinator + n0 peers launched together with the CLI
        sw = Swarm(Path(tmp))
        try:
            t0 = time.time()
            sw.start_coordinator()
            for _ in range(n0):
                sw.add_peer()
            st = sw.wait_settled(n0)
            out["startup_s"] = max(r["linked_at"] for r in st["members"]) - t0
        finally:
            sw.close()
        print(f"start-up, coordinator + {n0} peers until all linked: {out['startup_s']:.2f} s "
              f"(anchor: {n0 + 1} processes importing swarm: {out['startup_anchor_s']:.2f} s)")

        print(f"{'N':>4} {'fault':<7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
        for kind in ("crash", "freeze"):
            xs = [detect_anchor_ms(kind) for _ in range(args.faults)]
            out[f"anchor_{kind}"] = {"p50_ms": pct(xs, 50), "p99_ms": pct(xs, 99), "max_ms": max(xs)}
            print(f"{'raw':>4} {kind:<7} {pct(xs, 50):>8.1f} {pct(xs, 99):>8.1f} {max(xs):>8.1f}"
                  "   (anchor: a pyzmq ROUTER notices the fault)", flush=True)
        for n in sizes:
            with settled(Swarm(Path(tmp)), n) as (sw, _):
                for kind in ("crash", "freeze"):
                    xs = [fault_relink_ms(sw, n, kind, rng) for _ in range(args.faults)]
                    out[f"{kind}_{n}"] = {"p50_ms": pct(xs, 50), "p99_ms": pct(xs, 99), "max_ms": max(xs)}
                    print(f"{n:>4} {kind:<7} {pct(xs, 50):>8.1f} {pct(xs, 99):>8.1f} {max(xs):>8.1f}", flush=True)

        with settled(Swarm(Path(tmp)), args.quiet_n) as (sw, st0):
            # every death the coordinator declares while nobody is harmed is false
            out["false_deaths"], out["false_deaths_exact"], st = quiet_deaths(sw, args.quiet_s)
            out["quiet_epochs"] = st["epoch"] - st0["epoch"]
        print(f"quiet run: {args.quiet_n} peers for {args.quiet_s:g} s: "
              f"{'' if out['false_deaths_exact'] else 'at least '}{out['false_deaths']} false deaths, "
              f"{out['quiet_epochs']} view changes")

        ns = out["standby_peers"] = args.standby_peers
        out["standby_takeover_floor_s"] = CoordinatorConfig().takeover_s
        with settled(StandbySwarm(Path(tmp)), ns) as (sw, _):
            xs = [sw.takeover_s(ns) for _ in range(args.faults)]
        out["standby_takeover"] = {"p50_s": pct(xs, 50), "p99_s": pct(xs, 99), "max_s": max(xs)}
        print(f"standby takeover, {ns} peers, {args.faults} kills of the active coordinator: p50 {pct(xs, 50):.2f} s, "
              f"p99 {pct(xs, 99):.2f} s, max {max(xs):.2f} s "
              f"(floor: takeover_s = {out['standby_takeover_floor_s']:g} s)", flush=True)

    key = 16 if 16 in sizes else sizes[0]
    out["crash_relink_p99_ms"] = out[f"crash_{key}"]["p99_ms"]
    out["freeze_relink_p99_ms"] = out[f"freeze_{key}"]["p99_ms"]
    out["startup_vs_anchor"] = out["startup_s"] / out["startup_anchor_s"]
    out["standby_takeover_s"] = out["standby_takeover"]["p99_s"]
    out["standby_takeover_vs_floor"] = out["standby_takeover_s"] / out["standby_takeover_floor_s"]
    for kind in ("crash", "freeze"):
        out[f"{kind}_relink_vs_anchor"] = out[f"{kind}_relink_p99_ms"] / out[f"anchor_{kind}"]["p99_ms"]
    out["targets"] = {"crash_relink_p99_ms": 100, "freeze_relink_p99_ms": 500, "false_deaths": 0, "startup_s": 3}
    print(json.dumps(out))


if __name__ == "__main__":
    run_script(main, "bench_failover")
