"""Malformed frames from a raw pyzmq client: dropped and counted, service goes on."""

from __future__ import annotations

import asyncio

import msgpack
import numpy as np
import zmq
import zmq.asyncio
from swarmtest import free_port, status, wait_for

from swarm import wire
from swarm.peer import Peer


def garbage_messages() -> list[list[bytes]]:
    good = wire.encode("ping", "evil", body={"x": 1})
    head = lambda **kw: msgpack.packb({"v": wire.VERSION, "t": "ping", "src": "evil", "epoch": 0, "seq": 0,
                                       "body": {}, "arrays": [], **kw})
    return [
        [b"\x00\xff garbage \xc1\xc1"],                                  # not msgpack
        [good[0][: len(good[0]) // 2]],                                  # truncated msgpack
        [msgpack.packb([1, 2, 3])],                                      # header not a map
        [head(v=99)],                                                    # wrong version
        [head(t="no-such-type")],                                        # unknown type
        [head(t=["ping"])],                                              # type not hashable
        [head(src="")],                                                  # bad src
        [head(arrays=[["float32", [4]]]), b"\x00" * 15],                 # length mismatch
        [head(arrays=[["object", [1]]]), b"\x00" * 8],                   # dtype not allowed
        [head(arrays=[["float32", [2]]])],                               # described frame missing
        [head(arrays=[["float32", [-1]]]), b""],                         # negative shape
        [head(arrays=[["uint8", [0, 2**63]]]), b""],                     # empty, but numpy cannot make it
        [head(body=[1, 2])],                                             # body not a map
        [head(), b"extra frame"],                                        # undeclared frame
        [head(epoch="seven")],                                           # epoch not an int
        [b"\xdb\xff\xff\xff\x00"],                                       # str length bomb
        [],                                                              # empty (becomes routing-only)
    ]


async def _blast(addr: str, n_rounds: int = 20) -> None:
    ctx = zmq.asyncio.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(addr)
    for _ in range(n_rounds):
        for frames in garbage_messages():
            if frames:
                await s.send_multipart(frames)
    # an oversize message: the socket's MAXMSGSIZE drops the connection, not the process
    big = ctx.socket(zmq.DEALER)
    big.setsockopt(zmq.LINGER, 0)
    big.connect(addr)
    await big.send_multipart([wire.encode("ping", "evil")[0], np.zeros(3 * 1024 * 1024, np.uint8)])
    await asyncio.sleep(0.3)
    s.close(0)
    big.close(0)
    ctx.term()


def test_garbage_to_peer_and_coordinator(procs):
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs.start("coordinator", "--bind", addr, name="coord")
    wait_for(lambda: status(addr), 10, what="coordinator up")

    async def main() -> None:
        a = Peer(id="a", coordinators=[addr], max_message_mb=2)
        b = Peer(id="b", coordinators=[addr], max_message_mb=2)
        got: list[tuple[str, int]] = []
        b.on("data", lambda m: got.append((m.src, int(m.arrays[0].sum()))))
        await a.start()
        await b.start()
        try:
            await a.wait_view(lambda v: len(v.members) == 2)
            await a.wait_linked()
            await _blast(b.address)
            await _blast(addr)
            await asyncio.sleep(0.2)
            # the peer counted and dropped them, and still serves a real peer
            assert b.counters.malformed >= 20 * 13, b.counters
            assert await a.send("b", "data", arrays=[np.arange(10, dtype=np.int64)], timeout=1.0)
            for _ in range(100):
                if got:
                    break
                await asyncio.sleep(0.02)
            assert got == [("a", 45)]
            st = await asyncio.to_thread(status, addr)
            assert st["malformed"] >= 20 * 13
            assert {r["id"] for r in st["members"] if r["state"] == "alive"} == {"a", "b"}
            assert a.view.epoch == st["epoch"]   # nothing changed the view
        finally:
            await a.close()
            await b.close()

    asyncio.run(main())


def test_limit_over_several_frames_is_dropped_by_the_check_not_the_connection():
    """MAXMSGSIZE applies to each frame: a message over the limit in frames that are
    each under it reaches the check, which drops and counts it; the connection stays.
    Received arrays are writable views that the receiver owns (docs/wire.md, 2-3)."""
    from swarm.coordinator import Coordinator

    async def main() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*") as coord:
            b = Peer(id="b", coordinators=[coord.address], max_message_mb=2)
            got: list = []
            b.on("data", lambda m: got.append(m))
            async with b:
                ctx = zmq.asyncio.Context()
                s = ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, 0)
                s.connect(b.address)
                try:
                    half = np.zeros(1536 * 1024, np.uint8)           # 1.5 MiB a frame, 3 MiB in all
                    head = wire.encode("data", "raw", arrays=[half, half])[0]
                    await s.send_multipart([head, half, half])
                    await s.send_multipart(wire.encode("data", "raw", arrays=[np.arange(4, dtype=np.int32)]))
                    async with asyncio.timeout(5.0):
                        while not got:
                            await asyncio.sleep(0.01)
                finally:
                    s.close(0)
                    ctx.term()
                assert b.counters.malformed == 1
                total = len(head) + 2 * half.nbytes
                assert list(b._bad.by_reason) == [f"message of {total} bytes exceeds the limit 2097152"]
                assert [m.arrays[0].tolist() for m in got] == [[0, 1, 2, 3]]   # same connection, after
                assert got[0].arrays[0].flags.writeable

    asyncio.run(main())
