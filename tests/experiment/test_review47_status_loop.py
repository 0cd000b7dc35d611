"""`swarm run`'s status query leaves the calling thread's event loop alone (run_experiment
promises to work from any thread, in or out of a running loop)."""
from __future__ import annotations

import asyncio
import socket

from swarm.experiment.launch import _status


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_status_query_keeps_the_threads_loop() -> None:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)   # a script that set its loop the pre-3.10 way
    try:
        # nobody answers there: the query gives up after its timeout and returns None
        assert _status(f"127.0.0.1:{_closed_port()}") is None
        assert asyncio.get_event_loop() is loop
        assert loop.run_until_complete(asyncio.sleep(0, "still usable")) == "still usable"
    finally:
        asyncio.set_event_loop(None)
        loop.close()
