"""Thousands of random and mutated frames, and valid envelopes with lying
headers and bodies, at a live peer (with gossip and a federated buffer
attached) and at the coordinator: both stay up, keep serving a real peer, and
their memory stays bounded."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import numpy as np
import zmq
import zmq.asyncio
from swarmtest import free_port, status, wait_for

from swarm import wire
from swarm.peer import Peer

HERE = Path(__file__).parent
TYPES = sorted(wire.known_types() | {"gsp_delta", "gsp_full", "gsp_nack", "gsp_boot_req", "gsp_boot_ok", "gsp_boot",
                                     "buf.push", "buf.pull",
                                     "buf.items", "buf.ack"})
DTYPES = sorted(wire.DTYPES)


def rand_value(rng: random.Random, depth: int = 0):
    k = rng.randrange(8 if depth < 2 else 5)
    return [lambda: rng.randrange(-2**40, 2**40), lambda: rng.random() * 1e6, lambda: "x" * rng.randrange(50),
            lambda: None, lambda: rng.random() < 0.5,
            lambda: [rand_value(rng, depth + 1) for _ in range(rng.randrange(4))],
            lambda: {str(rng.randrange(9)): rand_value(rng, depth + 1) for _ in range(rng.randrange(4))},
            lambda: rng.randbytes(rng.randrange(20))][k]()


def rand_body(rng: random.Random) -> dict:
    keys = ["addr", "rank", "inc", "e", "id", "nonce", "round", "n", "meta", "codec", "ids", "seq", "epoch",
            "full", "k", "stats", "last_epoch", "want", "items", "ver"]
    return {rng.choice(keys): rand_value(rng) for _ in range(rng.randrange(6))}


def rand_array(rng: random.Random) -> np.ndarray:
    dt = np.dtype(rng.choice(DTYPES))
    n = rng.choice([0, 1, 3, 1000, rng.randrange(5000)])
    a = np.frombuffer(rng.randbytes(n * dt.itemsize), dtype=dt) if n else np.zeros(0, dt)
    return a


def evil_messages(rng: random.Random, n: int, ids: list[str]):
    for _ in range(n):
        kind = rng.randrange(6)
        if kind == 0:      # random bytes, one or more frames
            yield [rng.randbytes(rng.randrange(1, 300)) for _ in range(rng.randrange(1, 4))]
        elif kind == 1:    # valid envelope, random type, lying body and random arrays
            arrays = [rand_array(rng) for _ in range(rng.randrange(3))]
            src = rng.choice(ids + ["mallory", "x" * 200])
            yield [bytes(f) for f in wire.encode(rng.choice(TYPES), src, epoch=rng.randrange(10**6),
                                                 seq=rng.randrange(10**6), body=rand_body(rng), arrays=arrays)]
        elif kind == 2:    # a valid message with bit flips in its header
            frames = [bytes(f) for f in wire.encode(rng.choice(TYPES), "mallory", body=rand_body(rng))]
            h = bytearray(frames[0])
            for _ in range(rng.randrange(1, 4)):
                h[rng.randrange(len(h))] ^= 1 << rng.randrange(8)
            yield [bytes(h)] + frames[1:]
        elif kind == 3:    # a header whose arrays lie about the frames
            descs = [[rng.choice(DTYPES + ["object", "<U4"]), [rng.choice([-1, 0, 7, 2**40])]]]
            h = msgpack.packb({"v": wire.VERSION, "t": rng.choice(TYPES), "src": "mallory", "body": {},
                               "arrays": descs})
            yield [h, rng.randbytes(rng.randrange(64))]
        elif kind == 4:    # truncated valid message
            frames = [bytes(f) for f in wire.encode(rng.choice(TYPES), "mallory", body=rand_body(rng),
                                                    arrays=[rand_array(rng)])]
            yield [frames[0][: rng.randrange(len(frames[0]))]] + frames[1:]
        else:              # deeply nested or huge containers
            yield [msgpack.packb({"v": wire.VERSION, "t": "ping", "src": "m",
                                  "body": {"a": [[[[[1]]]]] * rng.randrange(1, 50)}})]


async def blast(addr: str, msgs) -> int:
    ctx = zmq.asyncio.Context()
    socks = []
    sent = 0
    try:
        for _ in range(4):   # several connections, as several attackers would be
            s = ctx.socket(zmq.DEALER)
            s.linger = 0
            s.sndhwm = 100_000
            s.connect(addr)
            socks.append(s)
        for i, frames in enumerate(msgs):
            await socks[i % 4].send_multipart(frames)
            sent += 1
            if i % 200 == 0:
                await asyncio.sleep(0)
        await asyncio.sleep(0.5)
    finally:
        for s in socks:
            s.close(0)
        ctx.term()
    return sent


def test_fuzz_peer_and_coordinator(procs, tmp_path):
    addr = f"tcp://127.0.0.1:{free_port()}"
    coord = procs.start("coordinator", "--bind", addr, name="coord")
    wait_for(lambda: status(addr), 10, what="coordinator up")
    log = open(tmp_path / "target.log", "w+")
    target = subprocess.Popen([sys.executable, str(HERE / "fuzz_target.py"), addr, "T"],
                              stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))

    def lines(prefix: str) -> list[list[str]]:
        return [ln.split() for ln in Path(log.name).read_text().splitlines() if ln.startswith(prefix)]

    try:
        t_addr = wait_for(lambda: lines("READY") and lines("READY")[0][1], 20, what="target ready")

        async def main() -> None:
            c = Peer(id="C", coordinators=[addr])
            pongs = []
            c.on("pong", lambda m: pongs.append(m.body.get("i")))
            async with c:
                await c.wait_view(lambda v: len(v.members) == 2)
                rss0 = int(lines("RSS")[-1][1])
                coord_rss0 = _rss(coord.pid)
                rng = random.Random(1234)
                stop = asyncio.Event()

                async def ping() -> None:   # the real peer is served all along
                    i = 0
                    while not stop.is_set():
                        await c.send("T", "ping", {"i": i}, timeout=0.5)
                        i += 1
                        await asyncio.sleep(0.05)

                pinger = asyncio.create_task(ping())
                n1 = await blast(t_addr, evil_messages(rng, 4000, ["C", "T"]))
                n2 = await blast(addr, evil_messages(rng, 4000, ["C", "T"]))
                before = len(pongs)
                await asyncio.sleep(1.0)
                stop.set()
                await pinger
                assert n1 == n2 == 4000
                assert len(pongs) > before, "the target stopped answering the real peer"
                assert target.poll() is None and coord.poll() is None
                st = await asyncio.to_thread(status, addr)
                assert {r["id"] for r in st["members"] if r["state"] == "alive"} == {"C", "T"}
                assert st["malformed"] >= 2000
                assert c.view.epoch == st["epoch"]          # no membership change from any of it
                await asyncio.sleep(1.2)
                last = lines("RSS")[-1]
                assert int(last[3]) >= 1000                 # the target counted what it dropped
                assert float(last[5]) == 0.0                # its parameters were never written
                assert int(last[7]) == 0                    # nor its buffer
                assert int(last[1]) - rss0 < 64 * 1024, f"target RSS grew {rss0} -> {last[1]} kB"
                assert _rss(coord.pid) - coord_rss0 < 64 * 1024

        asyncio.run(main())
    finally:
        target.terminate()
        try:
            target.wait(5)
        except subprocess.TimeoutExpired:
            target.kill()
            target.wait()


def _rss(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1
