"""A member's leave and the close of its connection, read by the coordinator in one
wake-up (a busy coordinator, a member that stopped waiting for its ``bye``), are a
leave: the close came after it. A raw DEALER speaks the wire protocol to an
in-process coordinator whose loop the test holds while the member leaves."""

from __future__ import annotations

import asyncio
import time

import pytest
import zmq
import zmq.asyncio
from swarmtest import until

from swarm import Coordinator, wire
from swarm import transport as tp
from swarm.coordinator.table import DEAD


@pytest.mark.parametrize("before", [0, tp.DRAIN_BATCH + 44])
def test_a_leave_read_together_with_its_connections_close_is_a_leave(before):
    # the close was handled first: its probe found no route, the member was recorded dead
    # as "disconnected", and the leave queued before the close found it dead already
    # (test_membership's graceful leave failed so on a loaded machine). With more than a
    # batch of messages before the leave (``before`` heartbeats), the close was probed
    # after the first batch, still before the leave.
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        async with Coordinator(bind="tcp://127.0.0.1:0", http_bind="") as coord:
            d = ctx.socket(zmq.DEALER)
            d.connect(coord.address)
            try:
                await d.send_multipart(wire.encode("join", "a", body={"addr": "tcp://127.0.0.1:9", "rank": -1,
                                                                      "inc": 7, "last_epoch": 0}))
                assert wire.decode(await asyncio.wait_for(d.recv_multipart(), 5)).t == "welcome"
                await until(lambda: coord.table.epoch >= 1, 5, what="the view with the member")
                for _ in range(before):
                    await d.send_multipart(wire.encode("heartbeat", "a", epoch=1, body={"inc": 7}))
                await d.send_multipart(wire.encode("leave", "a", body={"inc": 7}))
            finally:
                d.close(linger=2000)     # the leave goes out, then the connection closes
            time.sleep(1.0)    # the coordinator's loop is held meanwhile: both wait for it
            await until(lambda: coord.table.get("a").state == DEAD, 5, what="the member dead")
            assert coord.table.get("a").cause == "left"
            assert [e for _, e, who in coord.table.log if who == "a"][-1] == "left"
        ctx.term()

    asyncio.run(main())
