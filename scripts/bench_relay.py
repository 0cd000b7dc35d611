"""Receive cost of a relayed gradient, against raw pyzmq, in the same run.

    python scripts/bench_relay.py [--n 2000] [--every-ms 2] [--d 4610]

One process publishes a compressed gradient (``ef+topk:0.15:values=fp16`` of a
``--d``-vector, two thirds zeros like a DQN gradient) every ``--every-ms`` ms; the
other receives. Measured: the receiving process's CPU time per message, while
messages come one by one (the relay's regime: a peer waits for each gradient at
its turn, so nothing is batched).

* raw: a DEALER sends the same three frames (a msgpack header, index codes,
  fp16 values) to a ROUTER; the receiver polls, receives, unpacks the header and
  views the frames as arrays.
* swarm: two ``SyncPeer``s on a ring (and a coordinator), a ``GradientRelay`` on
  each; the receiver's relay checks and decodes every gradient on the peer's
  event-loop thread as it comes, and its training thread takes them every 10 ms.
* direct: the same with ``GradientRelay(direct=True)``: the training thread
  receives, checks and decodes the gradients itself on its own socket, every
  10 ms, what has come since (as `swarm run`'s peers do between env steps).

The gap between swarm and raw is what a relaying peer's event-loop thread costs
per gradient on top of moving the bytes; direct takes the loop out of the way.
Each receiver's clock stops at the last message it got, so a leg that lost some
does not count the rest of its window, spent waiting, as CPU per message. A ratio
is null in the JSON line (and ``ok`` false, ``received`` says which leg) unless
both of its legs got every message; the script then says so on stderr, before
the JSON line, and exits 1.
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import queue
import socket
import sys
import time

import numpy as np

from swarm.scripting import run_script

CODEC = "ef+topk:0.15:values=fp16"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gradient(d: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    g = rng.standard_normal(d).astype(np.float32)
    g[rng.random(d) < 2 / 3] = 0.0
    return g


def _result(out: "mp.Queue", n: int, cpu: float, wall: float) -> None:
    out.put({"n": n, "cpu_us_per_msg": 1e6 * cpu / max(n, 1), "wall_s": wall})


# ----------------------------------------------------------------- raw pyzmq

def raw_receiver(port: int, n: int, out: "mp.Queue", window: float) -> None:
    import msgpack
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.setsockopt(zmq.LINGER, 0)
    s.bind(f"tcp://127.0.0.1:{port}")
    s.recv_multipart()                     # the sender's hello: it starts the clock
    cpu0, t0, got = time.process_time(), time.monotonic(), 0
    cpu, wall = 0.0, 0.0                   # at the last arrival (see swarm_peer)
    while got < n and time.monotonic() - t0 < window:
        if not s.poll(1000):
            continue
        frames = s.recv_multipart(copy=False)
        head = msgpack.unpackb(frames[1].buffer)
        codes = np.frombuffer(frames[2].buffer, np.uint8)
        vals = np.frombuffer(frames[3].buffer, np.float16)
        assert head["k"] == vals.size and codes.size >= vals.size
        got += 1
        cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
    _result(out, got, cpu, wall)
    s.close()
    ctx.term()


def raw_sender(port: int, n: int, d: int, every: float) -> None:
    import msgpack
    import zmq

    from swarm.compress import get_codec
    enc = get_codec(CODEC).encode(gradient(d))
    head = msgpack.packb({"t": "grad", "src": "a", "k": enc.meta["k"], "n": d, "c": 0})
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 1000)
    s.connect(f"tcp://127.0.0.1:{port}")
    s.send(b"hello")
    time.sleep(0.2)
    for _ in range(n):
        s.send_multipart([head, *enc.frames], copy=True)
        time.sleep(every)
    time.sleep(0.5)
    s.close()
    ctx.term()


# ----------------------------------------------------------------- swarm

def coordinator_main(addr: str) -> None:
    import asyncio

    from swarm.coordinator import Coordinator

    async def main() -> None:
        async with Coordinator(bind=addr) as c:
            await c.closed()
    asyncio.run(main())


def swarm_peer(rank: int, addr: str, n: int, d: int, every: float, out: "mp.Queue | None",
               ready: "mp.Event", direct: bool = False, window: float = 0.0) -> None:
    """The receiving peer (``out`` given) counts gradients for up to ``window`` s from
    when its relay is ready; the sending one publishes ``n`` of them."""
    import uvloop

    from swarm.gossip import GradientRelay
    from swarm.peer import SyncPeer
    sp = SyncPeer(coordinators=[addr], id=f"r{rank}", rank=rank, topology="ring", join_timeout_s=30,
                  loop_factory=uvloop.new_event_loop).start()   # the coordinator starts beside it
    try:
        sp.call(sp.peer.wait_view(lambda v: len(v.members) >= 2, timeout=30), timeout=35)
        sp.wait_linked(timeout=10)

        async def build() -> GradientRelay:
            return GradientRelay(sp.peer, d, codec=CODEC, topology="ring", direct=direct)
        relay = sp.call(build())
        if direct:
            relay.ready(timeout=30)
        if out is not None:
            ready.set()   # the receiver's relay handles gradients from now on
        elif not ready.wait(timeout=30):
            # (it slept 0.5 s for it: under load the receiver's relay came later, and the
            # peer dropped the first gradients as of a type nothing handled)
            raise SystemExit("the receiving peer's relay was not ready within 30 s")
        if out is None:          # the publisher
            g = gradient(d)
            for i in range(n):
                relay.publish(g, clock=i)
                time.sleep(every)
            time.sleep(1.0)
            relay.close()
            return
        cpu0, t0, got = time.process_time(), time.monotonic(), 0
        # the clock stops at the last arrival: after a lost message the loop waits out the
        # window, and its heartbeats and 10 ms turns were counted as CPU per message
        cpu, wall = 0.0, 0.0
        while got < n and time.monotonic() - t0 < window:
            taken = len(relay.take())
            if taken:
                got += taken
                cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
            time.sleep(0.01)
        _result(out, got, cpu, wall)
        relay.close()
    finally:
        sp.close()


#: the longest run of sends a leg takes (a day): the receive window and the leg's deadline grow with it
MAX_SENDS_S = 86_400.0
#: how long a receiver counts beyond the sends' own length (--n x --every-ms, doubled: a
#: sleep overshoots, more so on a busy machine): the sender may start after the receiver
RECEIVE_SLACK_S = 60.0
#: what a leg allows on top of its receive window: the processes' start, the peers'
#: joins and links, and the result's way back
STARTUP_S = 60.0


def windows(n: int, every: float) -> tuple[float, float]:
    """(how long the receiver counts, how long the leg waits for its result), in seconds,
    for ``n`` sends ``every`` s apart."""
    receive = 2 * n * every + RECEIVE_SLACK_S
    return receive, receive + STARTUP_S


def run(kind: str, n: int, d: int, every: float) -> dict:
    window, timeout = windows(n, every)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = []
    ok = False
    try:
        if kind == "raw":
            port = free_port()
            procs = [ctx.Process(target=raw_receiver, args=(port, n, out, window), name="raw receiver"),
                     ctx.Process(target=raw_sender, args=(port, n, d, every), name="raw sender")]
        else:
            addr = f"tcp://127.0.0.1:{free_port()}"
            direct, ready = kind == "direct", ctx.Event()
            procs = [ctx.Process(target=coordinator_main, args=(addr,), daemon=True, name="coordinator"),
                     ctx.Process(target=swarm_peer, args=(1, addr, n, d, every, out, ready, direct, window),
                                 name="receiving peer"),
                     ctx.Process(target=swarm_peer, args=(0, addr, n, d, every, None, ready, direct),
                                 name="sending peer")]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                res = out.get(timeout=1.0)
                break
            except queue.Empty:
                # a child that died (its traceback is above) sends no result: stop now, not at the deadline
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise SystemExit(f"{kind}: the {dead[0].name} process exited with code {dead[0].exitcode}")
                if time.monotonic() > deadline:
                    raise SystemExit(f"{kind}: no result within {timeout:.0f} s")
        print(f"{kind:<6} {res['n']} messages, {res['cpu_us_per_msg']:.1f} us of receiver CPU each", flush=True)
        ok = True
        return res
    finally:
        stop(procs, grace=10 if ok else 0)


def stop(procs: list, grace: float) -> None:
    """End a leg's processes, each by its handle: the peers get ``grace`` s to finish
    on their own (a stuck one is killed), then the coordinator, which serves until it
    is told to stop, gets a SIGTERM (waiting for it to exit cost 10 s a leg)."""
    peers = [p for p in procs if p.name != "coordinator"]
    for p in peers:
        p.join(timeout=grace)
    for p in procs:
        if not p.is_alive():
            continue
        if p in peers:
            p.kill()
        else:
            p.terminate()
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="gradients per leg")
    ap.add_argument("--every-ms", type=float, default=2.0, help="milliseconds between gradients")
    ap.add_argument("--d", type=int, default=4610, help="gradient length (the benchmark DQN's 4,610)")
    args = ap.parse_args()
    if args.n < 1:
        ap.error("--n must be >= 1")
    # written so that nan and inf are refused too (they failed in the sending child)
    if not (0 <= args.every_ms and args.n * args.every_ms / 1000 <= MAX_SENDS_S):
        ap.error(f"--every-ms must be >= 0, and the sends (--n x --every-ms: {args.n} x {args.every_ms:g} ms) "
                 f"must take at most a day ({MAX_SENDS_S:.0f} s)")
    if args.d < 1:
        ap.error("--d must be >= 1")
    every = args.every_ms / 1000.0
    legs = {kind: run(kind, args.n, args.d, every) for kind in ("raw", "swarm", "direct")}
    complete = {kind: leg["n"] == args.n for kind, leg in legs.items()}

    def over_raw(kind: str) -> float | None:
        # a leg short of messages gives no ratio, as bench_gossip gives none for a run that missed
        if not (complete[kind] and complete["raw"]):
            return None
        return round(legs[kind]["cpu_us_per_msg"] / legs["raw"]["cpu_us_per_msg"], 2)

    result = {"n": args.n, "every_ms": args.every_ms, "d": args.d, "codec": CODEC,
              **{f"{kind}_cpu_us_per_msg": round(leg["cpu_us_per_msg"], 1) for kind, leg in legs.items()},
              "swarm_over_raw": over_raw("swarm"), "direct_over_raw": over_raw("direct"),
              "ok": all(complete.values()),
              "received": {kind: leg["n"] for kind, leg in legs.items()}}
    if not result["ok"]:
        # before the JSON line, which stays the last line of stdout and stderr together
        short = ", ".join(f"{kind} {leg['n']}" for kind, leg in legs.items() if not complete[kind])
        print(f"bench_relay: not every message arrived (of {args.n}: {short}); "
              "its ratios are null (on a busy machine, try a larger --every-ms)", file=sys.stderr, flush=True)
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    run_script(main, "bench_relay")
