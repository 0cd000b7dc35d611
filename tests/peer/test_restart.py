"""A peer that comes back under an id another process has taken meanwhile: the
new holder keeps it, and the old process stops instead of rejoining for ever."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

from swarmtest import freeze

from swarm.coordinator import Coordinator
from swarm.peer import Peer


def test_frozen_peer_replaced_under_its_id_stops_when_it_wakes(procs):
    async def main() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*") as coord:
            a = Peer(id="A", coordinators=[coord.address])
            async with a:
                old = procs.start("peer", "--coordinator", coord.address, "--id", "B", name="old-B")
                try:
                    await a.wait_view(lambda v: v.member("B") is not None, timeout=20)
                    old_addr = a.view.member("B").addr
                    freeze(old.pid)       # frozen: declared dead, then replaced
                    await a.wait_view(lambda v: v.member("B") is None, timeout=10)
                    got: list[dict] = []
                    new = Peer(id="B", coordinators=[coord.address])   # another port, same id
                    new.on("data", lambda m: got.append(m.body))
                    async with new:
                        await a.wait_view(lambda v: v.member("B") is not None, timeout=10)
                        assert a.view.member("B").addr == new.address != old_addr
                        os.kill(old.pid, signal.SIGCONT)
                        # the old process learns that it lost its id, and `swarm peer` exits with
                        # the error instead of waiting for a signal. It learns it from the refusal
                        # of a heartbeat's rejoin while running ("another process holds this
                        # peer's place"), or, on a loaded machine, of the rejoin it began when it
                        # woke and found the coordinator silent ("held by a newer process").
                        assert await asyncio.to_thread(old.wait, 20) == 2
                        out = procs.log(old)
                        assert "swarm: error: peer B: coordinator refused the join" in out, out
                        assert ("another process holds this peer's place" in out
                                or "peer id 'B' is held by a newer process" in out), out
                        # refused once, not retried: the logged failure (if any) and the error line
                        assert 1 <= sum("coordinator refused the join" in ln for ln in out.splitlines()) <= 2, out
                        # the swarm goes on with the new holder of B
                        assert a.view.member("B").addr == new.address
                        assert {m.id: m.addr for m in coord.table.alive()} == {"A": a.address, "B": new.address}
                        await a.wait_linked()
                        assert await a.send("B", "data", {"x": 1}, timeout=1.0)
                        async with asyncio.timeout(2.0):
                            while not got:
                                await asyncio.sleep(0.01)
                        assert got == [{"x": 1}]
                finally:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(old.pid, signal.SIGCONT)    # procs ends it by its pid

    asyncio.run(main())
