"""In a child made by os.fork(), a SyncPeer's id, view, address and neighbours() refuse
as its calls do: they returned the parent's copies as of the fork, stale from then on,
for a peer that the child cannot use."""

from __future__ import annotations

import os

# a coordinator process for in-process peers (tests/ is on the path)
from peer.test_syncpeer import coordinator  # noqa: F401 - a fixture
from peer.test_syncpeer_cancel_fork import in_child

from swarm.peer import PeerState, SyncPeer

READS = {"id": lambda p: p.id, "view": lambda p: p.view, "address": lambda p: p.address,
         "neighbours": lambda p: p.neighbours()}


def _reads(a: SyncPeer, w: int) -> None:
    """In the child: read each of READS from ``a`` and write what happened to ``w``."""
    out = []
    for what, read in READS.items():
        try:
            out.append(f"{what}: returned {read(a)!r:.60}")
        except BaseException as e:   # noqa: BLE001 - reported to the parent
            out.append(f"{what}: {type(e).__name__}: {e}")
    os.write(w, "\n".join(out).encode())


def test_a_forked_child_cannot_read_the_parents_id_view_or_address(coordinator):  # noqa: F811
    with SyncPeer(coordinators=[coordinator], id="a", heartbeat_s=0.2) as a, \
            SyncPeer(coordinators=[coordinator], id="b", heartbeat_s=0.2):
        a.wait_view(lambda v: len(v.members) == 2, timeout=10)
        report = in_child(lambda w: _reads(a, w))
        refusal = f"SwarmError: this SyncPeer was started in process {os.getpid()}; a forked child"
        for what in READS:
            # before the fix: "id: returned 'a'", the parent's view, address and neighbours
            assert f"{what}: {refusal}" in report, report
        # the parent reads them as before
        assert a.id == "a" and a.view.ids == ["a", "b"] and a.address.startswith("tcp://")
        assert a.neighbours() == ["b"] and a.peer.state is PeerState.RUNNING
