"""The coordinator's heartbeat path: bare beats, beats with figures, and bad beats.

A raw DEALER speaks the wire protocol to an in-process coordinator, so each
message is exactly the one under test.
"""

from __future__ import annotations

import asyncio

import msgpack
import zmq
import zmq.asyncio

from swarm import Coordinator, wire


def _hb(src: str, inc, stats=None, **head):
    body = {"inc": inc, "linked": 1}
    if stats is not None:
        body["stats"] = stats
    return wire.encode("heartbeat", src, epoch=1, body=body) if not head else [
        msgpack.packb({"v": wire.VERSION, "t": "heartbeat", "src": src, "epoch": 1, "seq": 0, "body": body,
                       "arrays": [], **head})]


async def _until(pred, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.01)


def test_heartbeats_keep_figures_and_reject_bad_beats():
    async def main():
        ctx = zmq.asyncio.Context()
        # takeover_s and zmtp_timeout_s: the 1 MiB header below can hold the loop past the
        # shorter of them (0.3 s) in a loaded run, and the coordinator's stall check then moves
        # the members' deadlines on by the gap (reviews 45, 46), which is no heartbeat; no
        # other coordinator is watched here, and the member is a bare socket
        async with Coordinator(bind="tcp://127.0.0.1:0", http_bind="", rejoin_grace_s=0.0,
                               takeover_s=60.0, zmtp_timeout_s=60.0) as coord:
            d = ctx.socket(zmq.DEALER)
            d.setsockopt(zmq.LINGER, 0)
            d.connect(coord.address)
            try:
                await d.send_multipart(wire.encode("join", "a", body={"addr": "tcp://127.0.0.1:9", "rank": -1,
                                                                      "inc": 7, "last_epoch": 0}))
                assert (await asyncio.wait_for(d.recv_multipart(), 5))  # welcome
                rec = coord.table.get("a")
                await _until(lambda: coord.table.epoch >= 1)

                # a beat with the figures, then bare beats: the figures stay, their time too
                await d.send_multipart(_hb("a", 7, {"env_steps": 100, "rounds": 4}))
                await _until(lambda: coord.heartbeats == 1)
                stats_at = rec.stats_at
                assert rec.stats == {"env_steps": 100, "rounds": 4} and stats_at > 0
                for n in (2, 3):
                    await d.send_multipart(_hb("a", 7))
                    await _until(lambda: coord.heartbeats == n)
                assert rec.stats == {"env_steps": 100, "rounds": 4} and rec.stats_at == stats_at
                assert rec.last_heartbeat > stats_at

                # bad beats: counted as malformed, and they change nothing
                last, bad = rec.last_heartbeat, coord.malformed
                bad_beats = [
                    _hb("a", "7"),                            # inc not an integer
                    _hb("a", True),                           # a bool is not an integer either
                    _hb("a", 7, v=wire.VERSION + 1),           # another protocol version
                    _hb("a", 7, body=[1, 2]),                 # body not a map
                    _hb("a", 7, epoch="1"),                   # epoch not an integer
                    _hb("a", 7) + [b"\0" * 8],                # a frame the header does not describe
                    [b"\xc1"],                                # not msgpack at all
                    _hb("a", 7, {"junk": [[[]] * 70_000] * 2}),  # more maps and arrays than its
                                                              # 1 MiB header limit allows (131,072)
                ]
                for frames in bad_beats:
                    await d.send_multipart(frames)
                await _until(lambda: coord.malformed == bad + len(bad_beats))
                assert coord.heartbeats == 3 and rec.last_heartbeat == last
                assert rec.stats == {"env_steps": 100, "rounds": 4}

                # another incarnation, or an unknown id: told to re-join, nothing counted
                for frames in (_hb("a", 8), _hb("zz", 1)):
                    await d.send_multipart(frames)
                    reply = wire.decode(await asyncio.wait_for(d.recv_multipart(), 5))
                    while reply.t in ("view", "probe"):   # a probe: this bare member was slow to beat (load)
                        reply = wire.decode(await asyncio.wait_for(d.recv_multipart(), 5))
                    assert reply.t == "rejoin"
                assert coord.heartbeats == 3 and coord.status()["heartbeats"] == 3
            finally:
                d.close(0)
        ctx.term()

    asyncio.run(asyncio.wait_for(main(), 60))
