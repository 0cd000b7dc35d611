"""An async Peer or Coordinator its program never closed (an exception, an early return inside
asyncio.run) must not freeze that program later."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from swarmtest import ROOT

# a session that retries after an error in the user's own code, before close()
PROGRAM = textwrap.dedent("""
    import asyncio, gc, sys
    from swarm import Coordinator, Peer

    async def session(i):
        if sys.argv[1] == "coordinator":
            await Coordinator(bind="tcp://127.0.0.1:*").start()
        else:
            await Peer(coordinators=[sys.argv[1]], id=f"retry-{i}").start()
        raise ConnectionError("the simulator lost its connection")

    for attempt in range(3):
        try:
            asyncio.run(session(attempt))
        except ConnectionError:
            pass
        gc.collect()
        print(f"attempt {attempt} collected", flush=True)
""")


@pytest.mark.parametrize("what", ["peer", "coordinator"])
def test_one_cancelled_by_asyncio_run_closes_its_sockets(procs, what):
    """asyncio.run's clean-up cancelled the peer's (the coordinator's) runner and nothing
    closed its sockets: at the next cyclic collection the context's __del__ called term(),
    which waited for ever for sockets it no longer listed (the whole program hung)."""
    arg = procs.coordinator(None).addr if what == "peer" else what
    try:
        out = subprocess.run([sys.executable, "-c", PROGRAM, arg], cwd=ROOT, capture_output=True,
                             text=True, timeout=40)
    except subprocess.TimeoutExpired as e:   # run() killed it
        raise AssertionError(f"the program hung; it printed {e.stdout!r}") from None
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"attempt {i} collected" for i in range(3)]
