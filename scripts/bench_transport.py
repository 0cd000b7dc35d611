"""Transport throughput: swarm peer→peer against raw pyzmq, in the same run.

    python scripts/bench_transport.py [--mb 40] [--n 30] [--small 100000]

(a) a 40 MB float32 delta sent N times from one process to another:
    raw pyzmq DEALER→ROUTER zero-copy, then two swarm Peers (with a coordinator),
    then the same Peers with CURVE encryption (max(2, N // 4) messages; the key
    pairs are made for the run in a temporary folder, removed at the end);
(b) small messages (one msgpack header, 16-byte body): raw pyzmq with the same
    drain loop, then swarm's receive loop with a handler per message.
Each leg is timed from the first send to the receiver's acknowledgement of the
last message. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import queue
import socket
import tempfile
import time

import numpy as np

from swarm.scripting import run_script


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------- raw pyzmq

def raw_receiver(port: int, n: int) -> None:
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.setsockopt(zmq.LINGER, 0)
    s.bind(f"tcp://127.0.0.1:{port}")
    got = 0
    route = None
    while got < n + 1:     # one warm-up message
        s.poll()
        while True:
            try:
                frames = s.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            route = frames[0].bytes
            got += 1
            if got == 1 or got == n + 1:
                s.send_multipart([route, b"ack"])
    time.sleep(0.2)
    s.close()
    ctx.term()


def raw_sender(port: int, n: int, payload: np.ndarray, out: "mp.Queue") -> None:
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, 8)
    s.connect(f"tcp://127.0.0.1:{port}")
    head = b"h" * 40
    s.send_multipart([head, payload], copy=False)
    s.recv()
    t0 = time.perf_counter()
    for _ in range(n):
        s.send_multipart([head, payload], copy=False)
    s.recv()
    out.put(time.perf_counter() - t0)
    s.close()
    ctx.term()


def run_raw(n: int, payload: np.ndarray) -> float:
    port = free_port()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    r = ctx.Process(target=raw_receiver, args=(port, n))
    s = ctx.Process(target=raw_sender, args=(port, n, payload, q))
    return _run_pair(r, s, q)


# ----------------------------------------------------------------- swarm

def coordinator_main(addr: str, keys: str = "") -> None:
    from swarm.coordinator import Coordinator

    async def main() -> None:
        async with Coordinator(bind=addr, keys_dir=keys) as c:
            await c.closed()
    asyncio.run(main())


def swarm_receiver(addr: str, n: int, keys: str = "") -> None:
    from swarm.peer import Peer

    async def main() -> None:
        p = Peer(id="recv", coordinators=[addr], join_timeout_s=20, keys_dir=keys)
        acks: asyncio.Queue = asyncio.Queue()   # whom to ack: after the first message, and after the last
        got = 0

        def on(msg) -> None:
            nonlocal got
            got += 1
            if got == 1 or got == n + 1:
                acks.put_nowait(msg.src)
        p.on("bench.data", on)   # before start: nothing may arrive unhandled
        async with p:
            for _ in range(2):
                src = await acks.get()
                # The sender's first message can come before the view that lists it (the
                # coordinator told the sender first), and a send to an id not in the view is
                # dropped. The wait is out here: the peer reads no message, views included,
                # while a handler runs.
                await p.wait_view(lambda v: v.member(src) is not None, timeout=20)
                if not await p.send(src, "bench.ack", timeout=5):
                    raise RuntimeError(f"the ack to {src} was dropped")
            await asyncio.sleep(0.2)
    asyncio.run(main())


def swarm_sender(addr: str, n: int, payload: np.ndarray, out: "mp.Queue", keys: str = "") -> None:
    from swarm.peer import Peer

    async def main() -> None:
        p = Peer(id="send", coordinators=[addr], join_timeout_s=20, keys_dir=keys)
        acks: asyncio.Queue = asyncio.Queue()
        p.on("bench.ack", lambda m: acks.put_nowait(1))
        async with p:
            await p.wait_view(lambda v: v.member("recv") is not None, timeout=20)
            body = {"round": 0}
            assert await p.send("recv", "bench.data", body, [payload], timeout=10)
            await asyncio.wait_for(acks.get(), 120)   # the receiver's ack; a lost one is an error, not a hang
            t0 = time.perf_counter()
            for _ in range(n):
                if not await p.send("recv", "bench.data", body, [payload], timeout=10):
                    raise RuntimeError("send dropped")
            await asyncio.wait_for(acks.get(), 120)   # the receiver's ack; a lost one is an error, not a hang
            out.put(time.perf_counter() - t0)
    asyncio.run(main())


def run_swarm(n: int, payload: np.ndarray, keys: str = "") -> float:
    addr = f"tcp://127.0.0.1:{free_port()}"
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    c = ctx.Process(target=coordinator_main, args=(addr, keys))
    c.start()
    try:
        r = ctx.Process(target=swarm_receiver, args=(addr, n, keys))
        s = ctx.Process(target=swarm_sender, args=(addr, n, payload, q, keys))
        return _run_pair(r, s, q)
    finally:
        c.terminate()
        c.join(5)
        if c.is_alive():
            c.kill()
            c.join()


def _run_pair(r, s, q, timeout: float = 300) -> float:
    r.start()
    s.start()
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return q.get(timeout=1.0)
            except queue.Empty:
                # a child that died (its traceback is above) sends no result: stop now, not at the deadline
                dead = [(name, p.exitcode) for name, p in (("receiver", r), ("sender", s))
                        if p.exitcode not in (None, 0)]
                if dead:
                    raise SystemExit(f"the {dead[0][0]} process exited with code {dead[0][1]}")
                if time.monotonic() > deadline:
                    raise SystemExit(f"no result within {timeout:.0f} s")
    finally:
        for p in (s, r):
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=40.0, help="delta size in MB")
    ap.add_argument("--n", type=int, default=30, help="large messages per leg")
    ap.add_argument("--small", type=int, default=100_000, help="small messages per leg")
    ap.add_argument("--repeat", type=int, default=3, help="legs per side (best is kept)")
    args = ap.parse_args()
    from swarm.config import PeerConfig
    # what a swarm peer accepts (its max_message_mb), less room for the message's header
    most_mb = (PeerConfig().max_message_mb * 2**20 - 2**16) / 1e6
    # a chained comparison, so that nan and inf are refused too (int() of them raised)
    if not 4e-6 <= args.mb <= most_mb:
        ap.error(f"--mb must be in [4e-06, {most_mb:.1f}]: at least one float32, and at most what a "
                 f"swarm peer accepts (max_message_mb = {PeerConfig().max_message_mb} MiB, less the header)")
    for name in ("n", "small", "repeat"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")

    big = np.random.default_rng(0).standard_normal(int(args.mb * 1e6 / 4)).astype(np.float32)
    small = np.zeros(4, np.float32)
    rows = {}
    raw_b, sw_b, raw_s, sw_s, curve_b = [], [], [], [], []
    from swarm.transport import generate_keys
    with tempfile.TemporaryDirectory(prefix="swarm-keys-") as keys:   # private keys: never left behind
        generate_keys(keys, ["coordinator", "peer"])
        for _ in range(args.repeat):   # interleaved, so that drift hits both sides
            raw_b.append(run_raw(args.n, big))
            sw_b.append(run_swarm(args.n, big))
            curve_b.append(run_swarm(max(2, args.n // 4), big, keys))
            raw_s.append(run_raw(args.small, small))
            sw_s.append(run_swarm(args.small, small))
    gbps = lambda t: args.n * big.nbytes / min(t) / 1e9
    rate = lambda t: args.small / min(t)
    rows["raw_gbps"], rows["swarm_gbps"] = gbps(raw_b), gbps(sw_b)
    rows["raw_small_msgs_per_s"], rows["swarm_small_msgs_per_s"] = rate(raw_s), rate(sw_s)
    rows["curve_gbps"] = max(2, args.n // 4) * big.nbytes / min(curve_b) / 1e9
    rows["curve_ratio"] = rows["curve_gbps"] / rows["raw_gbps"]
    rows["transport_ratio"] = rows["swarm_gbps"] / rows["raw_gbps"]
    rows["small_ratio"] = rows["swarm_small_msgs_per_s"] / rows["raw_small_msgs_per_s"]
    print(f"{'leg':<28}{'raw pyzmq':>14}{'swarm':>14}{'ratio':>8}")
    print(f"{f'{args.mb:g} MB delta (GB/s)':<28}{rows['raw_gbps']:>14.2f}{rows['swarm_gbps']:>14.2f}"
          f"{rows['transport_ratio']:>8.2f}")
    print(f"{'  with CURVE (GB/s)':<28}{'':>14}{rows['curve_gbps']:>14.2f}{rows['curve_ratio']:>8.2f}")
    print(f"{'small messages (msg/s)':<28}{rows['raw_small_msgs_per_s']:>14,.0f}"
          f"{rows['swarm_small_msgs_per_s']:>14,.0f}{rows['small_ratio']:>8.2f}")
    rows.update(mb=args.mb, n=args.n, small=args.small, repeat=args.repeat, cpus=os.cpu_count())
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows.items()}))


if __name__ == "__main__":
    run_script(main, "bench_transport")
