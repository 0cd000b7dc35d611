"""Review 44: a member process restarted under its id (a supervisor's Restart=always)
whose join the coordinator reads in the same wake-up as the close of its predecessor's
connection: a coordinator whose loop was held (a blocking call, a loaded host) for the
length of a restart.

The members are real processes (a `Peer` each, ``heartbeat_s`` long so that one that has
joined sends nothing more); the coordinator runs in the test's loop, which the test holds
with blocking waits while the old process dies and the new one joins.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import zmq
from swarmtest import ROOT, until

from swarm import Coordinator
from swarm.coordinator.table import ALIVE

_MEMBER = r"""
import asyncio, sys
from swarm import Peer

async def main():
    p = Peer(coordinators=[sys.argv[1]], id="m", heartbeat_s=60.0)
    try:
        await p.start()
    except Exception as e:
        print("failed:", e, flush=True)
        return
    print("joined", p.incarnation, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await p.close()

asyncio.run(main())
"""


def _member(addr: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _MEMBER, addr], cwd=ROOT, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


async def _line(p: subprocess.Popen) -> str:
    """The next line the member prints: whether its start() joined."""
    return (await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, p.stdout.readline), 30)).strip()


def _hold_until(pred, what: str) -> None:
    """Hold the coordinator's loop (a blocking wait on its thread) until ``pred()``."""
    deadline = time.monotonic() + 30
    while not pred():
        assert time.monotonic() < deadline, f"timed out after 30 s waiting for {what}"
        time.sleep(0.01)


def test_a_restart_whose_join_is_read_with_its_predecessors_close_is_welcomed():
    # The join came in the batch that read the crashed process's close: the coordinator
    # still held the old incarnation alive (its probe runs once the batch is handled), and
    # refused the restart for good: "peer id 'm' is already alive ...; stop the other
    # process first", though it had just read that the other one's connection closed
    async def main() -> None:
        procs: list[subprocess.Popen] = []
        try:
            async with Coordinator(bind="tcp://127.0.0.1:0", http_bind="", rejoin_grace_s=0.0,
                                   heartbeat_timeout_s=60.0) as coord:
                procs.append(_member(coord.address))
                old = procs[0]
                assert (await _line(old)).startswith("joined")
                # all it sends after its join (its linked) read: the router is quiet
                await until(lambda: coord.table.get("m").linked_epoch >= 0, 10, what="the member's linked")
                router, monitor = coord._plain, coord._events
                assert not router.getsockopt(zmq.EVENTS) & zmq.POLLIN
                # from here until the new process's join is queued the loop is held
                old.kill()
                old.wait()
                _hold_until(lambda: monitor.getsockopt(zmq.EVENTS) & zmq.POLLIN, "the old process's close")
                procs.append(_member(coord.address))
                new = procs[1]
                _hold_until(lambda: router.getsockopt(zmq.EVENTS) & zmq.POLLIN, "the new process's join")
                joined = await _line(new)
                assert joined.startswith("joined"), joined
                m = coord.table.get("m")
                assert (m.state, m.incarnation) == (ALIVE, int(joined.split()[1]))
                assert [e[1] for e in coord.table.log if e[2] == "m"] == ["join", "disconnected", "join"]
                new.stdin.write("\n")
                new.stdin.flush()
                assert new.wait(30) == 0
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
                p.stdin.close()
                p.stdout.close()

    asyncio.run(main())
