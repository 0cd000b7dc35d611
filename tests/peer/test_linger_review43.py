"""A data socket closed or disconnected part way through a large multipart message, as the
other end closes (review 43): with LINGER 0 libzmq 4.3.5 aborted the process ("Resource
temporarily unavailable (src/session_base.cpp:233)", SIGABRT): a neighbour that left
while gossip to it was half sent set it off. Data links and outboxes now linger
``transport.DATA_LINGER_MS``.

Each race runs in a child process, so that an abort is its exit status, not a dead pytest
worker. In a trial the receiver never reads (``RCVHWM`` 1) and the sender queues 12 MiB
messages, so that libzmq's engine stalls part way through one; then both ends close.
Without the linger the close race aborted within 0 to 21 trials (8 runs of 100; of 40
trials, 26 runs in 28 aborted), the outbox race within 0 to 22 (6 runs of 100) and the
disconnect in about 6 trials in 10; with it 2400 close trials survived."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from swarmtest import ROOT, reaped

#: what each child sets up: 3 arrays of 4 MiB in one message, as uncompressed gossip
_PRELUDE = """
import asyncio, random, sys, time
import numpy as np
import zmq
from swarm import transport as tp, wire

trials = int(sys.argv[1])
rng = random.Random(0)
arrays = [np.ones(1 << 20, np.float32) for _ in range(3)]
frames = wire.encode("g", "p0", arrays=arrays)

def fill(s):
    sent = 0
    while sent < 8 and tp.try_send(s, frames):
        sent += 1
"""

#: a link (``tp.dealer(send_only=True)``, closed with its own linger as Peer._close_link
#: closes it) and a neighbour's ROUTER, each in a context of its own as two processes
_LINK = _PRELUDE + """
for t in range(trials):
    ours, theirs = zmq.Context(), zmq.Context()
    router = tp.router(theirs, hwm=1)
    addr = tp.bind(router, "tcp://127.0.0.1:*")
    link = tp.dealer(ours, hwm=8, heartbeat_s=0.1, heartbeat_timeout_s=0.3, connect_timeout_s=1.0,
                     send_only=True)
    tp.connect(link, addr)
    time.sleep(0.02)
    fill(link)
    time.sleep(0.01 + rng.random() * 0.02)
    if sys.argv[2] == "close":
        router.close(0)   # the neighbour leaves
        link.close()      # and its view reaches us: the link goes
    else:                 # a redial (peer.py's _redial): the neighbour goes within the linger
        link.disconnect(addr)
        time.sleep(0.02)
        router.close(0)
        time.sleep(0.05)
        link.close()
    ours.term()
    theirs.term()
print("survived", trials, flush=True)
"""

#: an outbox (Peer.open_outbox, closed with Peer.close_side) to an inbox that closes
_OUTBOX = _PRELUDE + """
from swarm.coordinator import Coordinator
from swarm.peer import Peer

async def main():
    async with Coordinator(bind="tcp://127.0.0.1:*", http_bind="") as coord:
        async with Peer(id="a", coordinators=[coord.address]) as a, \\
                Peer(id="b", coordinators=[coord.address]):
            await a.wait_view(lambda v: len(v.members) == 2, timeout=10)
            for t in range(trials):
                theirs = zmq.Context()
                inbox = theirs.socket(zmq.PULL)
                inbox.setsockopt(zmq.LINGER, 0)
                inbox.setsockopt(zmq.RCVHWM, 1)
                port = inbox.bind_to_random_port("tcp://127.0.0.1")
                out = a.open_outbox("b", f"tcp://127.0.0.1:{port}")
                await asyncio.sleep(0.02)
                fill(out)
                await asyncio.sleep(0.01 + rng.random() * 0.02)
                inbox.close(0)
                a.close_side(out)
                theirs.term()
    print("survived", trials, flush=True)

asyncio.run(main())
"""


def _survives(script: str, *args: str, timeout: float = 120) -> None:
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with reaped(p):
        out, _ = p.communicate(timeout=timeout)
    assert p.returncode == 0 and "survived" in out, f"exit {p.returncode}: {out[-2000:]}"


def test_a_link_closed_mid_message_as_its_neighbour_leaves():
    _survives(_LINK, "80", "close")


def test_a_link_disconnected_mid_message_as_its_neighbour_leaves():
    _survives(_LINK, "10", "disconnect")


def test_an_outbox_closed_mid_message_as_its_inbox_closes():
    _survives(_OUTBOX, "40")
