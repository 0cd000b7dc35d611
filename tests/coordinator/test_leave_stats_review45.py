"""After a by-hand swarm finished normally, the coordinator showed each peer with the
figures of its last heartbeat that carried them (up to a second before the end: 1,216
of 1,500 env steps), as `dead`, with the coordinator's cause `left` in the error column:
a peer that completed its budget read as one that died at 81% of it with an error.
Now the ``leave`` carries the peer's final figures (checked as a heartbeat's are), the
coordinator keeps them, and the status surfaces show the member as left, not with
`left` as its error."""

from __future__ import annotations

import asyncio
import time

import msgpack
# the hand-packed heartbeat and a raw member of test_status.py (tests/ is on the path)
from coordinator.test_status import _beat, _member
from swarmtest import status, until, wait_for

from swarm import wire
from swarm.cli import format_status, query_status
from swarm.coordinator import Coordinator
from swarm.coordinator.report import MAX_STAT_TEXT, PeerRates, format_table, prometheus, status_document
from swarm.peer import Peer


def test_a_peer_that_leaves_hands_its_final_figures_and_is_shown_as_left():
    async def main() -> dict:
        async with Coordinator(bind="tcp://127.0.0.1:*", http_bind="") as coord:
            # unreachable: as a peer that left while one of its links was down sends it
            figures = {"env_steps": 1, "rounds": 1, "done": False, "unreachable": 1}
            p = Peer(id="p0", coordinators=[coord.address], rank=0)
            p.stats = lambda: dict(figures)
            await p.start()
            try:
                await until(lambda: coord.table.get("p0").stats.get("env_steps") == 1, 10, "p0's first figures")
                # the budget is done between two heartbeats that carry figures
                figures.update(env_steps=1500, rounds=150, done=True)
            finally:
                await p.close()
            rec = coord.table.get("p0")
            assert (rec.state, rec.cause) == ("dead", "left")
            return await query_status(coord.address, 2.0)

    st = asyncio.run(asyncio.wait_for(main(), 30))
    (row,) = st["members"]
    assert row["stats"]["env_steps"] == 1500 and row["stats"]["rounds"] == 150 and row["stats"]["done"] is True, \
        row["stats"]
    assert {"msgs_out", "unreachable", "nbrs"} <= set(row["stats"])   # the peer's own figures go with them
    doc = status_document(st, PeerRates())
    (peer,) = doc["peers"]
    assert peer["env_steps"] == 1500 and peer["rounds"] == 150
    assert peer["state"] == "dead" and peer["left"] is True and peer["last_error"] == "", peer
    assert 'swarm_peer_env_steps_total{run="",peer="p0",rank="0"} 1500' in prometheus(doc)
    # a gauge of now: not of a member that is gone (an alert on it fired for a peer that left)
    assert "swarm_peer_unreachable_neighbours{" not in prometheus(doc) and peer["unreachable"] is None
    (line,) = [ln for ln in format_table(doc, width=1000).splitlines() if ln.startswith("p0 ")]
    assert line.split()[2] == "left" and not line.rstrip().endswith("left"), line   # a state, not an error
    (line,) = [ln for ln in format_status(st).splitlines() if ln.startswith("p0 ")]
    assert line.split()[2] == "left", line


def _leave(src: str, inc: int, stats) -> list[bytes]:
    """A leave packed by hand, with ``stats`` as given (wire.encode would refuse some)."""
    return [msgpack.packb({"v": wire.VERSION, "t": "leave", "src": src, "epoch": 1, "seq": 0,
                           "body": {"inc": inc, "stats": stats}, "arrays": []})]


def _bye(d) -> None:
    deadline = time.monotonic() + 10
    while wire.decode(d.recv_multipart()).t != "bye":   # views may come first
        assert time.monotonic() < deadline, "no bye"


def test_the_stats_of_a_leave_are_checked_as_a_heartbeats(procs):
    """Untrusted as a heartbeat's: a leave whose stats are no map leaves the last figures
    as they were, long ones are cut as a heartbeat's are, and a leave the coordinator
    refuses (another incarnation's) changes nothing."""
    coord = procs.coordinator(None, "--set", "coordinator.rejoin_grace_s=0")
    d = _member(coord.addr, ["junk", "long", "other"])
    try:
        for pid in ("junk", "long", "other"):
            d.send_multipart(_beat(pid, {"env_steps": 5}))
        wait_for(lambda: all(r["stats"].get("env_steps") == 5 for r in status(coord.addr)["members"]), 10,
                 what="the members' first figures")
        before = status(coord.addr)["malformed"]

        d.send_multipart(_leave("junk", 7, ["not", "a", "map"]))
        _bye(d)
        d.send_multipart(_leave("long", 7, {"env_steps": 9, "last_error": "x" * 10_000, "deep": {"a": [b"?"]}}))
        _bye(d)
        d.send_multipart(_leave("other", 8, {"env_steps": 9}))   # not its incarnation: refused
        wait_for(lambda: status(coord.addr)["malformed"] == before + 1, 10, what="the foreign leave refused")

        rows = {r["id"]: r for r in status(coord.addr)["members"]}
        junk, long_ = rows["junk"], rows["long"]
        assert (junk["state"], junk["cause"], junk["stats"]) == ("dead", "left", {"env_steps": 5})
        assert long_["state"] == "dead" and long_["stats"]["env_steps"] == 9
        assert long_["stats"]["last_error"] == "x" * MAX_STAT_TEXT and long_["stats"]["deep"] == {"a": [None]}
        assert (rows["other"]["state"], rows["other"]["stats"]) == ("alive", {"env_steps": 5})
    finally:
        d.close(0)
