"""Failover: start-up time, crash and freeze re-link times, false deaths.

    python scripts/bench_failover.py [--sizes 8,16,32] [--faults 10] [--quiet-s 60]

Everything runs as real `swarm coordinator` / `swarm peer` processes on
loopback, started with the CLI exactly as a user would.

* start-up: from launching a coordinator and 8 peers until every peer has
  answered hellos from all its ring neighbours (the coordinator records when
  each peer reports ``linked`` for the current epoch);
* crash (SIGKILL) and freeze (SIGSTOP) of a random peer: the time from the
  fault until every survivor has re-linked in the view without it, i.e.
  ``max(linked_at of survivors) − t_fault``; the victim is then replaced by a
  fresh peer so that N stays constant;
* a quiet run of N peers for ``--quiet-s`` seconds: deaths the coordinator
  declared although nobody was harmed.

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
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

import numpy as np

from swarm.cli import query_status

SWARM = [sys.executable, "-m", "swarm.cli"]


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
        self.peers: dict[str, subprocess.Popen] = {}
        self.next_id = 0

    def _spawn(self, *args: str, name: str) -> subprocess.Popen:
        log = open(self.logdir / f"{name}.log", "w")
        return subprocess.Popen([*SWARM, *args], stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))

    def start_coordinator(self) -> None:
        self.coord = self._spawn("coordinator", "--bind", self.addr, name="coordinator")

    def add_peer(self) -> str:
        pid = f"p{self.next_id}"
        self.next_id += 1
        self.peers[pid] = self._spawn("peer", "--coordinator", self.addr, "--id", pid, name=pid)
        return pid

    def settled(self, n: int) -> dict | None:
        try:
            st = status(self.addr)
        except Exception:
            return None
        view = {m[0] for m in st["view"]["members"]}
        if len(view) != n:
            return None
        rows = [r for r in st["members"] if r["id"] in view]
        if all(r["linked_epoch"] == st["epoch"] for r in rows):
            return st
        return None

    def wait_settled(self, n: int, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.settled(n)
            if st:
                return st
            time.sleep(0.02)
        raise RuntimeError(f"swarm of {n} did not settle within {timeout} s (logs in {self.logdir})")

    def close(self) -> None:
        procs = list(self.peers.values()) + ([self.coord] if self.coord else [])
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


def fault_relink_ms(sw: Swarm, n: int, kind: str, rng: random.Random) -> float:
    victim = rng.choice(sorted(sw.peers))
    proc = sw.peers.pop(victim)
    before = status(sw.addr)["epoch"]
    t_fault = time.time()
    os.kill(proc.pid, signal.SIGKILL if kind == "crash" else signal.SIGSTOP)
    st = sw.wait_settled(n - 1, timeout=30)
    assert st["epoch"] > before and victim not in {m[0] for m in st["view"]["members"]}
    linked = max(r["linked_at"] for r in st["members"] if r["state"] == "alive")
    if kind == "freeze":
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    sw.add_peer()
    sw.wait_settled(n)
    time.sleep(0.3)
    return (linked - t_fault) * 1000


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs), q)) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,16,32", help="swarm sizes N")
    ap.add_argument("--faults", type=int, default=10, help="faults of each kind per size")
    ap.add_argument("--quiet-s", type=float, default=60.0, help="length of the quiet run")
    ap.add_argument("--quiet-n", type=int, default=16, help="peers in the quiet run")
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
    if args.quiet_s <= 0:
        ap.error("--quiet-s must be > 0")
    if args.quiet_n < 1:
        ap.error("--quiet-n must be >= 1")
    rng = random.Random(args.seed)
    out: dict = {"sizes": sizes, "faults": args.faults}
    with tempfile.TemporaryDirectory(prefix="swarm-failover-") as tmp:
        # start-up: coordinator + 8 peers launched together with the CLI
        sw = Swarm(Path(tmp))
        try:
            t0 = time.time()
            sw.start_coordinator()
            for _ in range(8):
                sw.add_peer()
            st = sw.wait_settled(8)
            out["startup_s"] = max(r["linked_at"] for r in st["members"]) - t0
        finally:
            sw.close()
        print(f"start-up, coordinator + 8 peers until all linked: {out['startup_s']:.2f} s")

        print(f"{'N':>4} {'fault':<7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
        for n in sizes:
            sw = Swarm(Path(tmp))
            try:
                sw.start_coordinator()
                for _ in range(n):
                    sw.add_peer()
                sw.wait_settled(n, timeout=120)
                for kind in ("crash", "freeze"):
                    xs = [fault_relink_ms(sw, n, kind, rng) for _ in range(args.faults)]
                    out[f"{kind}_{n}"] = {"p50_ms": pct(xs, 50), "p99_ms": pct(xs, 99), "max_ms": max(xs)}
                    print(f"{n:>4} {kind:<7} {pct(xs, 50):>8.1f} {pct(xs, 99):>8.1f} {max(xs):>8.1f}", flush=True)
            finally:
                sw.close()

        sw = Swarm(Path(tmp))
        try:
            sw.start_coordinator()
            for _ in range(args.quiet_n):
                sw.add_peer()
            st0 = sw.wait_settled(args.quiet_n, timeout=120)
            t_quiet = time.time()
            time.sleep(args.quiet_s)
            st = status(sw.addr)
            # every death the coordinator declared while nobody was harmed is false
            out["false_deaths"] = sum(1 for t, ev, _ in st["log"] if t >= t_quiet and ev not in ("join", "left"))
            out["quiet_epochs"] = st["epoch"] - st0["epoch"]
        finally:
            sw.close()
        print(f"quiet run: {args.quiet_n} peers for {args.quiet_s:.0f} s: "
              f"{out['false_deaths']} false deaths, {out['quiet_epochs']} view changes")

    key = 16 if 16 in sizes else sizes[0]
    out["crash_relink_p99_ms"] = out[f"crash_{key}"]["p99_ms"]
    out["freeze_relink_p99_ms"] = out[f"freeze_{key}"]["p99_ms"]
    out["targets"] = {"crash_relink_p99_ms": 100, "freeze_relink_p99_ms": 500, "false_deaths": 0, "startup_s": 3}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
